"""End to end in a model: the LeetDecoding paper's Tables 7 and 8 protocol, every method, and decoding speed.

    python perf/bench_models.py [--models retnet,transnormer] [--batches 1,2] [--prompts 1] [--dtypes float16]
        [--methods auto,lightning_attention,block_based] [--no-original] [--runs 7] [--autotune]
        [--decode-batches 1,8,64] [--new-tokens 128] [--no-decode] [--fla PATH] [--out DIR]

The paper's protocol on this GPU: RetNet-1.3B (hidden 2048, 8 heads, r = 256, d = 512) and TransNormerLLM-7B
(hidden 4096, 32 heads, r = d = 128) configurations with random weights, the first two layers kept
(``num_hidden_layers=2``), synthetic prompts of 6 144–8 192 random tokens (``--prompts`` of them, each
length drawn once), batch 1 and 2.  For every dtype and method, and ``original`` — the layer's plain PyTorch
form, the dense (B Cᵀ ⊙ M) V with the n × n decay mask materialised, as the models' own PyTorch code
computes it — the wall time of one forward pass of the model over the prompt: ``--runs`` runs after a
warm-up call, the highest and lowest dropped, mean ± std.  (The method changes the attention call only:
the norms, rotary and gates around it are the fused ops of docs/design.md §12.5 in every row, ``original``
included.)  flash-linear-attention's ``RetNetForCausalLM``
(its own kernels, the same weights) is measured in the same run when importable (``--fla PATH`` puts
unpacked wheels first on ``sys.path``).

Decoding: tokens per second of greedy decoding of ``--new-tokens`` tokens after a 512-token prompt at
batch 1, 8 and 64: ours through transformers' ``generate()`` (prefill, then a one-token forward per token
through the cache), ours through ``generate_greedy`` on fixed buffers (``static``: the same one-token step
run eagerly; ``graph``: that step replayed from a CUDA graph), and fla's ``generate()``.

The default run (both models, float16, one prompt, batch 1 and 2, ``auto``, ``lightning_attention``,
``block_based`` and ``original``, 7 runs, decoding) takes a few minutes on an H100.  The full protocol:

    python perf/bench_models.py --prompts 2 --dtypes float32,float16,bfloat16 --methods all --autotune

(``all``: every built-in method, its ``_torch`` version and ``auto``.)  ``--plot FILE.png`` draws the prefill
times, one panel per model and dtype; ``--from-json A.json B.json --plot FILE.png`` draws them from saved
results (e.g. one run per model, each on a GPU of its own) without measuring.

Where the time goes, and why autotuning is off by default.  No prompt length re-tunes anything (ours never
key on n, docs/design.md §5.3; fla marks T ``do_not_specialize``), but on a fresh GPU each kernel's first
call in each dtype compiles and times every config its autotuner keeps: at r = 256, d = 512 several of ours
and up to 48 of fla's per kernel (``perf/check_retnet_checkpoint.py``'s docstring counts them), minutes
before the first cell prints.  So unless ``--autotune`` is given, ``LEETTRITON_AUTOTUNE=0`` (each of our
kernels runs its family's first fitting config; ``auto`` runs the heuristic file's recorded configs either
way) and fla's autotuners keep their first config; the report's notes say which, and each cell prints with
the seconds of its first call (compiles included).  ``--autotune`` lets both sides tune: a fair kernel
comparison, for the full protocol.

A cell slower than ``--budget-s`` is timed once.  Each section is written to
``perf/results/<gpu>/bench_models.json`` as soon as it is done, so a run cut off keeps what it
finished.  Without a GPU: a check of the script's logic on tiny configurations with the ``_torch``
methods (``--quick`` implied), not a measurement.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import leettriton  # noqa: E402
from leettriton.methods import BUILTIN_METHODS  # noqa: E402

MODELS = {"retnet": "RetNet-1.3B (2 layers)", "transnormer": "TransNormerLLM-7B (2 layers)"}


def original(b, c, v, gamma):
    """The paper's "Original": the dense masked product in PyTorch, (B Cᵀ ⊙ M) V with M materialised."""
    n = b.shape[2]
    t = torch.arange(n, device=b.device)
    dist = (t[:, None] - t[None, :]).to(torch.float32)
    causal = dist >= 0
    if gamma is None:
        mask = causal.to(torch.float32).expand(b.shape[1], n, n)
    else:
        lam = torch.log2(gamma.to(torch.float32)).view(-1, 1, 1)
        mask = torch.where(causal, torch.exp2(lam * dist.clamp(min=0)), torch.zeros((), device=b.device))
    scores = (b.float() @ c.float().transpose(-1, -2)).mul_(mask)   # in place: one n × n tensor per head less
    return (scores @ v.float()).to(v.dtype)


def configs(gpu: bool, wanted):
    from leettriton.models import RetNetConfig, TransNormerConfig
    if gpu:
        every = {"retnet": RetNetConfig(hidden_size=2048, num_heads=8, expand_k=1.0, expand_v=2.0,
                                        num_hidden_layers=2, vocab_size=32000),
                 "transnormer": TransNormerConfig(hidden_size=4096, num_heads=32, hidden_dim=4096, glu_dim=11008,
                                                  num_hidden_layers=2, vocab_size=64000)}
    else:
        every = {"retnet": RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0,
                                        num_hidden_layers=2, vocab_size=64, intermediate_size=48),
                 "transnormer": TransNormerConfig(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=64,
                                                  glu_dim=48)}
    return {key: every[key] for key in wanted}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_times(fn, runs: int, device, budget_s: float) -> tuple[float, list[float]]:
    """Seconds of a first (warm-up) call of ``fn``, then of ``runs`` more; a call slower than ``budget_s``
    ends the series (so a slow cell costs one timed call)."""
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if times[-1] > budget_s:
            break
    return first, times


def trimmed(times: list[float]) -> tuple[float, float]:
    """Mean and standard deviation (ms) without the highest and lowest run."""
    kept = sorted(times)[1:-1] if len(times) > 2 else times
    return 1e3 * statistics.mean(kept), (1e3 * statistics.stdev(kept) if len(kept) > 1 else 0.0)


def fla_model(ours, device, dtype):
    """fla's RetNetForCausalLM with our model's weights (strict by name), or None when fla is absent."""
    try:
        from fla.models import RetNetConfig as FlaConfig
        from fla.models import RetNetForCausalLM as FlaModel
    except ImportError:
        return None
    c = ours.config
    with torch.device(device):
        fla = FlaModel(FlaConfig(hidden_size=c.hidden_size, num_heads=c.num_heads, expand_k=c.expand_k,
                                 expand_v=c.expand_v, num_hidden_layers=c.num_hidden_layers, vocab_size=c.vocab_size,
                                 intermediate_size=c.intermediate_size, hidden_ratio=c.hidden_ratio))
    fla.load_state_dict(ours.state_dict(), strict=True)
    return fla.to(dtype=dtype).eval()


def method_list(text, gpu):
    if text == "all":
        return ["auto", *BUILTIN_METHODS, *(f"{m}_torch" for m in BUILTIN_METHODS)]
    if text:
        return text.split(",")
    return ["auto", "lightning_attention", "block_based"] if gpu else ["auto", "lightning_attention_torch",
                                                                       "block_based_torch"]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--models", default="retnet,transnormer", help="comma-separated: retnet, transnormer")
    p.add_argument("--batches", default="1,2", help="prefill batch sizes (default 1,2)")
    p.add_argument("--prompts", type=int, default=1, help="prompts per model, lengths 6144–8192 (default 1)")
    p.add_argument("--dtypes", default=None, help="comma-separated (default float16; without a GPU float32)")
    p.add_argument("--methods", default=None, help="comma-separated, or 'all' (every built-in, its _torch, auto); "
                   "default auto,lightning_attention,block_based")
    p.add_argument("--no-original", action="store_true", help="skip the dense PyTorch form ('original')")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--autotune", action="store_true",
                   help="let our kernels and fla's tune (default: first configs, auto from the heuristic file)")
    p.add_argument("--fla", metavar="PATH", help="folder with fla and fla-core unpacked (the peer)")
    p.add_argument("--no-decode", action="store_true", help="skip the decoding measurement")
    p.add_argument("--decode-batches", default=None, help="decoding batch sizes (default 1,8,64)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per decoding call (default 128)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the prefill times (needs matplotlib)")
    p.add_argument("--from-json", metavar="FILE.json", nargs="+",
                   help="measure nothing: draw --plot from these result files (e.g. one per model)")
    args = p.parse_args(common.cli_argv(argv))
    if args.from_json:
        if not args.plot:
            p.error("--from-json draws a plot: give --plot FILE.png")
        rows = [row for path in args.from_json for row in json.load(open(path))["rows"]]
        plot_prefill(rows, args.plot)
        return
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        p.error(f"--models takes {sorted(MODELS)}, got {unknown}")
    device = common.device_of(args)
    gpu = device.type == "cuda"
    # read by our autotuners at each new key, and by fla's when they are built (at its import, below)
    if args.autotune:
        os.environ["LEETTRITON_AUTOTUNE"] = "1"
    else:
        os.environ.setdefault("LEETTRITON_AUTOTUNE", "0")
        common.keep_first_config("fla.")
    if args.fla:
        sys.path.insert(0, args.fla)
    rep = common.Report("bench_models", "End to end: two layers of RetNet-1.3B and TransNormerLLM-7B",
                        common.cli_argv(argv), device, quick=args.quick or not gpu)
    rep.note(f"LEETTRITON_AUTOTUNE={os.environ['LEETTRITON_AUTOTUNE']}; fla's autotuners "
             f"{'tune' if args.autotune else 'keep their first config'} ("
             f"{'--autotune' if args.autotune else 'default; --autotune lets both sides tune'}); auto launches "
             f"the heuristic file's configs either way")
    if "original" not in leettriton.METHODS:
        leettriton.register_method("original", original)
    methods = method_list(args.methods, gpu) + ([] if args.no_original else ["original"])
    gen = torch.Generator().manual_seed(0)
    lengths = [int(torch.randint(6144, 8193, (1,), generator=gen)) for _ in range(args.prompts)] if gpu else [40]
    batches = ints(args.batches)
    rep.note(f"prompt lengths {lengths}; batch {batches}; {args.runs} runs per cell after a warm-up, highest and "
             f"lowest dropped; a cell slower than {args.budget_s} s is timed once")
    from leettriton.models import RetNetForCausalLM, TransNormerForCausalLM
    classes = {"retnet": RetNetForCausalLM, "transnormer": TransNormerForCausalLM}
    for key, config in configs(gpu, args.models.split(",")).items():
        name = MODELS[key]
        torch.manual_seed(0)
        with torch.device(device):
            model = classes[key](config).eval()
        for dtype_name in (args.dtypes or ("float16" if gpu else "float32")).split(","):
            dtype = getattr(torch, dtype_name)
            model = model.to(dtype=dtype)
            peer = fla_model(model, device, dtype) if key == "retnet" else None
            body = []
            for B in batches:
                for n in lengths:
                    ids = torch.randint(0, config.vocab_size, (B, n), generator=gen).to(device)
                    cells = [("fla", peer, None)] if peer is not None else []
                    cells += [(m, model, m) for m in methods]
                    line = [B, n]
                    for label, m, method in cells:
                        line.append(prefill_cell(rep, m, method, ids, args, device,
                                                 {"model": name, "dtype": dtype_name, "batch": B, "n": n,
                                                  "method": label}))
                    body.append(line)
            headers = ["batch", "n"] + (["fla"] if peer is not None else []) + methods
            kept = max(args.runs - 2, 1)
            rep.section(f"{name}, {dtype_name}: forward over the prompt, ms (mean ± std of {kept} of {args.runs} runs)",
                        headers, body, text="fla: flash-linear-attention's RetNetForCausalLM with the same weights."
                        if peer is not None else "")
            for B in batches:
                for n in lengths:
                    ours = common.find(rep.rows, model=name, dtype=dtype_name, batch=B, n=n, method="auto")
                    theirs = common.find(rep.rows, model=name, dtype=dtype_name, batch=B, n=n, method="fla")
                    if ours and theirs and ours.get("mean_ms") and theirs.get("mean_ms"):
                        ratio = theirs["mean_ms"] / ours["mean_ms"]
                        rep.target(f"{name} {dtype_name} forward, {B} × {n}: fla ÷ ours (auto)", f"{ratio:.2f}×",
                                   "> 1×", ratio > 1.0)
            rep.save(args.out)
            if not args.no_decode:
                decode_section(rep, name, model, peer, dtype_name, device, gpu, args)
                rep.save(args.out)
            del peer
        del model
        if gpu:
            torch.cuda.empty_cache()
    rep.finish(args.out)
    if args.plot:
        plot_prefill(rep.rows, args.plot)


def plot_prefill(rows, path: str) -> None:
    """The paper's end-to-end figure: one panel per (model, dtype), the forward's mean time per method
    (log scale; mean over the prompts) at each batch size, fla's model among them."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(f"--plot: matplotlib is not installed (pip install matplotlib); {path} not written")
        return
    cells = [r for r in rows if r.get("mean_ms") and "method" in r]
    panels = list(dict.fromkeys((r["model"], r["dtype"]) for r in cells))
    if not panels:
        print(f"--plot: no prefill time in the rows; {path} not written")
        return
    models = list(dict.fromkeys(m for m, _ in panels))
    dtypes = list(dict.fromkeys(d for _, d in panels))
    fig, axes = plt.subplots(len(models), len(dtypes), figsize=(5.2 * len(dtypes), 0.5 + 3.6 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            mine = [r for r in cells if r["model"] == model and r["dtype"] == dtype]
            methods = list(dict.fromkeys(r["method"] for r in mine))
            batches = sorted({r["batch"] for r in mine})
            width = 0.8 / max(len(batches), 1)
            for k, batch in enumerate(batches):
                times = []
                for method in methods:
                    got = [r["mean_ms"] for r in mine if r["method"] == method and r["batch"] == batch]
                    times.append(sum(got) / len(got) if got else float("nan"))
                ax.barh([y + k * width for y in range(len(methods))], times, height=width, label=f"batch {batch}")
            ax.set_yticks([y + width * (len(batches) - 1) / 2 for y in range(len(methods))])
            ax.set_yticklabels(methods, fontsize=7)
            ax.invert_yaxis()
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("forward over the prompt, ms (log)")
            ax.set_title(f"{model}, {dtype}", fontsize=9)
            ax.grid(axis="x", which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def prefill_cell(rep, model, method, ids, args, device, row) -> str:
    """Time one forward pass of ``model`` over ``ids`` (with ``method`` set, unless None): a table cell."""
    if method is not None:
        model.set_attention_method(method)
    try:
        with torch.no_grad():
            first, times = wall_times(lambda: model(ids, use_cache=False), args.runs, device, args.budget_s)
        row["mean_ms"], row["std_ms"] = trimmed(times)
        row["first_call_s"], row["times_s"] = first, times
        text = f"{row['mean_ms']:.1f} ± {row['std_ms']:.1f}" if len(times) > 1 else f"{row['mean_ms']:.0f} (1 run)"
    except torch.cuda.OutOfMemoryError:
        row["status"], text = "OOM", "OOM"
    except Exception as exc:   # a method that cannot run this shape: recorded, not fatal
        row["status"], text = f"error: {type(exc).__name__}: {exc}"[:300], "ERR"
    if device.type == "cuda" and row.get("status"):
        torch.cuda.empty_cache()
    rep.rows.append(row)
    first = f" (first call {row['first_call_s']:.1f} s)" if "first_call_s" in row else ""
    print(f"  {row['model']} {row['dtype']} batch {row['batch']} n {row['n']} {row['method']}: {text} ms{first}"
          + (f" [{row['status']}]" if row.get("status") else ""), flush=True)
    return text


def decode_section(rep, name, model, peer, dtype_name, device, gpu, args) -> None:
    """Tokens per second of greedy decoding: ours through generate(), on fixed buffers (eager, CUDA graph), fla's."""
    new = args.new_tokens or (128 if gpu else 4)
    prompt = 512 if gpu else 8
    batches = ints(args.decode_batches) if args.decode_batches else ([1, 8, 64] if gpu else [1, 2])
    model.set_attention_method("auto")
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    paths = [("ours generate()", model, lambda m, ids: m.generate(ids, attention_mask=torch.ones_like(ids), **kw)),
             ("ours static", model, lambda m, ids: m.generate_greedy(ids, max_new_tokens=new, cuda_graph=False))]
    if gpu:
        paths.append(("ours graph", model, lambda m, ids: m.generate_greedy(ids, max_new_tokens=new,
                                                                             cuda_graph=True)))
    if peer is not None:
        paths.append(("fla generate()", peer,
                      lambda m, ids: m.generate(ids, attention_mask=torch.ones_like(ids), **kw)))
    body = []
    for B in batches:
        ids = torch.randint(0, model.config.vocab_size, (B, prompt), device=device)
        line = [B]
        for label, m, call in paths:
            row = {"model": name, "dtype": dtype_name, "batch": B, "decode": label, "new_tokens": new,
                   "prompt": prompt}
            try:
                with torch.no_grad():
                    first, times = wall_times(lambda: call(m, ids), 3, device, float("inf"))
                seconds = statistics.median(times)
                row.update(seconds=seconds, first_call_s=first, times_s=times, tokens_per_s=B * new / seconds,
                           ms_per_step=1e3 * seconds / new)
                text = f"{row['tokens_per_s']:.0f} ({row['ms_per_step']:.2f} ms)"
            except torch.cuda.OutOfMemoryError:
                row["status"], text = "OOM", "OOM"
                torch.cuda.empty_cache()
            except Exception as exc:   # recorded, not fatal
                row["status"], text = f"error: {type(exc).__name__}: {exc}"[:300], "ERR"
            rep.rows.append(row)
            line.append(text)
            print(f"  {name} {dtype_name} decode batch {B} {label}: {text}", flush=True)
        body.append(line)
    rep.section(f"{name}, {dtype_name}: greedy decoding, tokens/s (ms per generated token; prompt {prompt}, "
                f"{new} new tokens, median of 3)", ["batch"] + [label for label, _, _ in paths], body,
                text="Whole calls (the prompt's prefill included) ÷ tokens generated.  generate(): transformers' "
                     "loop, one forward through the cache per token; static: generate_greedy on fixed buffers "
                     "(StaticDecoder), the one-token step run eagerly; graph: that step replayed from a CUDA graph "
                     "(captured in the warm-up call).")
    for B in batches:
        ours = common.find(rep.rows, model=name, dtype=dtype_name, batch=B, decode="ours graph")
        theirs = common.find(rep.rows, model=name, dtype=dtype_name, batch=B, decode="fla generate()")
        if ours and theirs and ours.get("tokens_per_s") and theirs.get("tokens_per_s"):
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
            rep.target(f"{name} {dtype_name} decoding, batch {B}: ours (graph) ÷ fla tokens/s", f"{ratio:.2f}×",
                       "≥ 2×" if B == 1 else "> 1×", ratio >= (2.0 if B == 1 else 1.0))


if __name__ == "__main__":
    main()
