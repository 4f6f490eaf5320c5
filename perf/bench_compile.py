"""torch.compile over the models: a training step eager against compiled, and greedy decoding with
``mode="reduce-overhead"`` against leettriton's own CUDA-graph decoder (docs/design.md §4.6).

    python perf/bench_compile.py --out perf/results/h100/bench_compile.json
    python perf/bench_compile.py --device cpu --tiny --out /tmp/bench_compile.json     # a check of the logic

* **Training step**: the 2-layer RetNet-1.3B configuration (hidden 2048, 8 heads, r = 256, d = 512, vocab
  32000, random weights) in ``--dtype`` (default bfloat16), one forward with the loss and its backward
  (gradients set to None between steps), batch ``--batches`` (default 1, 4) of ``--n`` (default 8192) random
  tokens.  ``eager``: the model as it is; ``compiled``: ``torch.compile(loss, fullgraph=True)`` (the default
  mode); fla's ``RetNetForCausalLM`` with the same weights beside it, eager and compiled without
  ``fullgraph`` (its ops are ``torch.compiler.disable``d: the graph breaks are counted), when it imports
  (``--fla PATH`` puts unpacked wheels first on ``sys.path``).  Median of ``--runs`` steps after a warm-up
  step, whose seconds (the compilation) are kept as ``first_call_s``; peak memory on CUDA.
* **Greedy decoding**: tokens per second of a ``--prompt``-token prompt (default 512) then ``--new-tokens``
  (default 128) tokens at batch ``--decode-batches`` (default 1, 8, 64), whole calls (prefill included) ÷
  tokens generated, median of 3 after a warm-up call: ``generate_greedy`` eager (``cuda_graph=False``, the
  reference tokens), ``generate_greedy`` with its own CUDA graph, and the same fixed-buffer decoder
  (:class:`leettriton.models.StaticDecoder`) whose one-token step is ``torch.compile(..., mode=
  "reduce-overhead", fullgraph=True)`` (the compiler's CUDA graphs; its buffers are marked static).
  Each row says whether its tokens equal the eager ones (``tokens_equal``, ``token_match``: the fraction
  that agree).  The compiled step rounds its fused elementwise work as Inductor generates it, so a 16-bit
  logit tie may break the other way: ``--decode-dtype`` (default bfloat16) can be float32 to compare
  tokens without that.

Each row is written to ``--out`` (a JSON file: the environment — command, device, versions, commit, date —
and the rows) as soon as it is measured, and a short table is printed at the end.  ``--device cpu --tiny``
runs tiny configurations with the ``aot_eager`` backend (no C++ compiler needed), CUDA graphs off: a check
of the script, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

import torch


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--tiny", action="store_true", help="tiny configurations (a check of the logic)")
    p.add_argument("--out", default=None, help="JSON file for the rows (default: none)")
    p.add_argument("--dtype", default="bfloat16", help="training step dtype (default bfloat16)")
    p.add_argument("--decode-dtype", default="bfloat16", help="decoding dtype (default bfloat16)")
    p.add_argument("--batches", default="1,4", help="training step batch sizes (default 1,4)")
    p.add_argument("--n", type=int, default=None, help="training step tokens per row (default 8192; tiny 16)")
    p.add_argument("--decode-batches", default=None, help="decoding batch sizes (default 1,8,64; tiny 1,2)")
    p.add_argument("--prompt", type=int, default=None, help="decoding prompt length (default 512; tiny 6)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated (default 128; tiny 4)")
    p.add_argument("--runs", type=int, default=5, help="timed training steps (default 5)")
    p.add_argument("--backend", default=None, help="torch.compile backend (default inductor; cpu: aot_eager)")
    p.add_argument("--fla", metavar="PATH", help="folder with fla and fla-core unpacked (the peer)")
    p.add_argument("--no-fla", action="store_true", help="leave fla's model out")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--no-decode", action="store_true")
    return p.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config(tiny: bool):
    from leettriton.models import RetNetConfig
    if tiny:
        return RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, num_hidden_layers=2,
                            vocab_size=64, intermediate_size=48, initializer_range=0.2)
    return RetNetConfig(hidden_size=2048, num_heads=8, expand_k=1.0, expand_v=2.0, num_hidden_layers=2,
                        vocab_size=32000)


def fla_model(ours, device, dtype):
    """fla's RetNetForCausalLM with our model's weights (strict by name), or None when fla is absent."""
    try:
        from fla.models import RetNetConfig as FlaConfig
        from fla.models import RetNetForCausalLM as FlaModel
    except Exception:   # noqa: BLE001  (absent, or built for another torch)
        return None
    c = ours.config
    with torch.device(device):
        fla = FlaModel(FlaConfig(hidden_size=c.hidden_size, num_heads=c.num_heads, expand_k=c.expand_k,
                                 expand_v=c.expand_v, num_hidden_layers=c.num_hidden_layers, vocab_size=c.vocab_size,
                                 intermediate_size=c.intermediate_size, hidden_ratio=c.hidden_ratio))
    fla.load_state_dict(ours.state_dict(), strict=True)
    return fla.to(dtype=dtype)


class Results:
    """The environment and the rows, rewritten to ``path`` after each row."""

    def __init__(self, path, device, argv):
        from leettriton.bench import environment
        self.path = path
        self.meta = environment(device)
        self.meta["command"] = " ".join(["python", "perf/bench_compile.py", *map(shlex.quote, argv)])
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        row = dict(row)
        self.rows.append(row)
        shown = {k: v for k, v in row.items() if k not in ("times_s",)}
        print("  " + json.dumps(shown, default=str), flush=True)
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "w") as f:
                json.dump({"environment": self.meta, "rows": self.rows}, f, indent=1, default=str)


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def timed(fn, runs: int, device) -> tuple[float, list[float]]:
    """Seconds of a first call (compilation included) and of ``runs`` more."""
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
    return first, times


def train_section(res: Results, args, device, backend) -> None:
    from leettriton.models import RetNetForCausalLM
    dtype = getattr(torch, args.dtype)
    n = args.n or (16 if args.tiny else 8192)
    torch.manual_seed(0)
    with torch.device(device):
        ours = RetNetForCausalLM(config(args.tiny)).to(dtype).train()
    peer = None if args.no_fla else fla_model(ours, device, dtype)
    if peer is not None:
        peer.train()
    models = [("leettriton", ours)] + ([("fla", peer)] if peer is not None else [])
    for B in ints(args.batches):
        ids = torch.randint(0, ours.config.vocab_size, (B, n), device=device)
        for name, model in models:
            def loss(ids, model=model):
                return model(input_ids=ids, labels=ids, use_cache=False).loss

            for mode in ("eager", "compiled"):
                row = {"section": "train_step", "model": name, "mode": mode, "batch": B, "n": n, "dtype": args.dtype,
                       "backend": backend if mode == "compiled" else None}
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                fn = loss
                if mode == "compiled":
                    fn = torch.compile(loss, backend=backend, fullgraph=name == "leettriton")
                    row["fullgraph"] = name == "leettriton"

                def step():
                    model.zero_grad(set_to_none=True)
                    fn(ids).backward()

                try:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    first, times = timed(step, args.runs, device)
                    row.update(first_call_s=first, times_s=times, ms=1e3 * statistics.median(times))
                    if device.type == "cuda":
                        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
                    if mode == "compiled":
                        row["graph_breaks"] = graph_breaks()
                except torch.cuda.OutOfMemoryError:
                    row["status"] = "OOM"
                    torch.cuda.empty_cache()
                except Exception as exc:   # noqa: BLE001  (recorded, not fatal)
                    row["status"] = f"error: {type(exc).__name__}: {exc}"[:400]
                model.zero_grad(set_to_none=True)
                res.add(row)


def compiled_decoder(model, batch: int, length: int, backend: str, device):
    """A StaticDecoder (no CUDA graph of its own) whose one-token step is compiled: with Inductor on CUDA,
    ``mode="reduce-overhead"`` (the compiler's CUDA graphs over the step; the buffers it updates are
    marked static)."""
    from leettriton.models import StaticDecoder
    decoder = StaticDecoder(model, batch, length, cuda_graph=False)
    for t in (*decoder.states, decoder.token, decoder.position):
        torch._dynamo.mark_static_address(t)
    mode = "reduce-overhead" if backend == "inductor" and device.type == "cuda" else None
    step = torch.compile(decoder._forward, backend=backend, mode=mode, fullgraph=True)

    def forward():
        if mode == "reduce-overhead":   # the last step's outputs were read (its token copied in): replay over them
            torch.compiler.cudagraph_mark_step_begin()
        step()

    decoder._forward = forward
    return decoder, mode


def decode_section(res: Results, args, device, backend) -> None:
    from leettriton.models import RetNetForCausalLM
    dtype = getattr(torch, args.decode_dtype)
    torch.manual_seed(0)
    with torch.device(device):
        model = RetNetForCausalLM(config(args.tiny)).to(dtype).eval()
    prompt = args.prompt or (6 if args.tiny else 512)
    new = args.new_tokens or (4 if args.tiny else 128)
    batches = ints(args.decode_batches) if args.decode_batches else ([1, 2] if args.tiny else [1, 8, 64])
    for B in batches:
        ids = torch.randint(0, model.config.vocab_size, (B, prompt), device=device)
        reference = None
        paths = [("generate_greedy eager", lambda: model.generate_greedy(ids, new, cuda_graph=False))]
        if device.type == "cuda":
            paths.append(("generate_greedy cuda graph", lambda: model.generate_greedy(ids, new, cuda_graph=True)))
        paths.append(("compiled step", None))
        for label, call in paths:
            row = {"section": "decode", "path": label, "batch": B, "prompt": prompt, "new_tokens": new,
                   "dtype": args.decode_dtype}
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            try:
                if call is None:
                    decoder, mode = compiled_decoder(model, B, prompt + new, backend, device)
                    row.update(backend=backend, mode=mode)

                    def call(decoder=decoder):
                        return decoder.generate(ids, new)

                with torch.no_grad():
                    tokens = []
                    first, times = timed(lambda: tokens.append(call()), 3, device)
                seconds = statistics.median(times)
                row.update(first_call_s=first, times_s=times, tokens_per_s=B * new / seconds,
                           ms_per_token=1e3 * seconds / new)
                if label == "generate_greedy eager":
                    reference = tokens[-1]
                elif reference is not None:
                    agree = tokens[-1][:, prompt:] == reference[:, prompt:]
                    row.update(tokens_equal=bool(agree.all()), token_match=float(agree.float().mean()))
                if label == "compiled step":
                    row["graph_breaks"] = graph_breaks()
            except torch.cuda.OutOfMemoryError:
                row["status"] = "OOM"
                torch.cuda.empty_cache()
            except Exception as exc:   # noqa: BLE001  (recorded, not fatal)
                row["status"] = f"error: {type(exc).__name__}: {exc}"[:400]
            res.add(row)


def table(rows: list[dict]) -> str:
    lines = []
    train = [r for r in rows if r["section"] == "train_step"]
    if train:
        lines.append("training step (ms, median; first call s; graph breaks)")
        for r in train:
            figure = f"{r['ms']:9.1f} ms  first {r['first_call_s']:7.1f} s" if "ms" in r else r.get("status", "")
            breaks = f"  breaks {r['graph_breaks']}" if "graph_breaks" in r else ""
            lines.append(f"  {r['model']:10s} {r['mode']:8s} batch {r['batch']:3d} n {r['n']:6d}  {figure}{breaks}")
    decode = [r for r in rows if r["section"] == "decode"]
    if decode:
        lines.append("greedy decoding (tokens/s; tokens equal to eager)")
        for r in decode:
            figure = f"{r['tokens_per_s']:10.0f} tok/s" if "tokens_per_s" in r else r.get("status", "")
            equal = f"  equal {r['tokens_equal']} ({r['token_match']:.3f})" if "tokens_equal" in r else ""
            lines.append(f"  batch {r['batch']:3d} {r['path']:28s} {figure}{equal}")
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.fla:
        sys.path.insert(0, args.fla)
    backend = args.backend or ("inductor" if device.type == "cuda" else "aot_eager")
    res = Results(args.out, device, argv)
    print(f"{res.meta['device']}  torch {res.meta['torch']}  triton {res.meta['triton']}  "
          f"git {str(res.meta['git_sha'])[:10]}  backend {backend}", flush=True)
    if not args.no_train:
        train_section(res, args, device, backend)
    if not args.no_decode:
        decode_section(res, args, device, backend)
    print("\n" + table(res.rows), flush=True)
    if args.out:
        print(f"\nwrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
