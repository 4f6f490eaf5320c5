"""End to end in a model: the LeetDecoding paper's Tables 7 and 8 protocol, every method, and decoding speed.

    python perf/bench_models.py [--prompts 2] [--dtypes float32,float16,bfloat16] [--fla PATH] [--out DIR]

The paper's protocol on this GPU: RetNet-1.3B (hidden 2048, 8 heads, r = 256, d = 512) and TransNormerLLM-7B
(hidden 4096, 32 heads, r = d = 128) configurations with random weights, the first two layers kept
(``num_hidden_layers=2``), synthetic prompts of 6 144–8 192 random tokens (``--prompts`` of them, each
length drawn once), batch 1 and 2.  For every dtype, every method (each built-in, its ``_torch``
version, ``auto``) and ``original`` — the layer's plain PyTorch form, the dense (B Cᵀ ⊙ M) V with the
n × n decay mask materialised, as the models' own PyTorch code computes it — the wall time of one
forward pass of the model over the prompt: 7 runs, the highest and lowest dropped, mean ± std.
flash-linear-attention's ``RetNetForCausalLM`` (its own kernels, the same weights) is measured in the
same run when importable (``--fla PATH`` puts unpacked wheels first on ``sys.path``).

Decoding: tokens per second of greedy ``generate()`` of 128 new tokens after a 512-token prompt at
batch 1, 8 and 64, ours (prefill with ``auto``, then ``decode_step`` per token) against fla's model.

Writes ``perf/results/<gpu>/bench_models.{json,md}``.  Without a GPU: a check of the script's logic on
tiny configurations with the ``_torch`` methods (``--quick`` implied), not a measurement.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import leettriton  # noqa: E402
from leettriton.methods import BUILTIN_METHODS  # noqa: E402


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
    scores = (b.float() @ c.float().transpose(-1, -2)) * mask
    return (scores @ v.float()).to(v.dtype)


def configs(gpu: bool):
    from leettriton.models import RetNetConfig, TransNormerConfig
    if gpu:
        retnet = RetNetConfig(hidden_size=2048, num_heads=8, expand_k=1.0, expand_v=2.0, num_hidden_layers=2,
                              vocab_size=32000)
        transnormer = TransNormerConfig(hidden_size=4096, num_heads=32, hidden_dim=4096, glu_dim=11008,
                                        num_hidden_layers=2, vocab_size=64000)
    else:
        retnet = RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, num_hidden_layers=2,
                              vocab_size=64, intermediate_size=48)
        transnormer = TransNormerConfig(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=64, glu_dim=48)
    return {"RetNet-1.3B (2 layers)": retnet, "TransNormerLLM-7B (2 layers)": transnormer}


def wall_times(fn, runs: int, device) -> list[float]:
    """Seconds per call of ``fn`` (after one warm-up), ``runs`` times."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def trimmed(times: list[float]) -> tuple[float, float]:
    """Mean and standard deviation (ms) without the highest and lowest run."""
    kept = sorted(times)[1:-1] if len(times) > 2 else times
    return 1e3 * statistics.mean(kept), (1e3 * statistics.stdev(kept) if len(kept) > 1 else 0.0)


def fla_model(ours, fla_path):
    """fla's RetNetForCausalLM with our model's weights (strict by name), or None when fla is absent."""
    if fla_path:
        sys.path.insert(0, fla_path)
    try:
        from fla.models import RetNetConfig as FlaConfig
        from fla.models import RetNetForCausalLM as FlaModel
    except ImportError:
        return None
    c = ours.config
    fla = FlaModel(FlaConfig(hidden_size=c.hidden_size, num_heads=c.num_heads, expand_k=c.expand_k,
                             expand_v=c.expand_v, num_hidden_layers=c.num_hidden_layers, vocab_size=c.vocab_size,
                             intermediate_size=c.intermediate_size, hidden_ratio=c.hidden_ratio))
    fla.load_state_dict(ours.state_dict(), strict=True)
    return fla


def main(argv=None) -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=2, help="prompts per model, lengths 6144–8192 (default 2)")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--methods", default=None, help="comma-separated (default: every built-in, its _torch, auto)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--fla", metavar="PATH", help="folder with fla and fla-core unpacked (the peer)")
    p.add_argument("--no-decode", action="store_true", help="skip the decoding measurement")
    args = p.parse_args(common.cli_argv(argv))
    device = common.device_of(args)
    gpu = device.type == "cuda"
    rep = common.Report("bench_models", "End to end: two layers of RetNet-1.3B and TransNormerLLM-7B",
                        common.cli_argv(argv), device, quick=args.quick or not gpu)
    if "original" not in leettriton.METHODS:
        leettriton.register_method("original", original)
    methods = args.methods.split(",") if args.methods else (
        ["auto", *BUILTIN_METHODS, *(f"{m}_torch" for m in BUILTIN_METHODS), "original"] if gpu
        else ["auto", "lightning_attention_torch", "block_based_torch", "original"])
    gen = torch.Generator().manual_seed(0)
    lengths = [int(torch.randint(6144, 8193, (1,), generator=gen)) for _ in range(args.prompts)] if gpu else [40]
    rep.note(f"prompt lengths {lengths}; batch 1 and 2; {args.runs} runs per cell, highest and lowest dropped")
    from leettriton.models import RetNetForCausalLM, TransNormerForCausalLM
    classes = {"RetNet-1.3B (2 layers)": RetNetForCausalLM, "TransNormerLLM-7B (2 layers)": TransNormerForCausalLM}
    for name, config in configs(gpu).items():
        torch.manual_seed(0)
        base = classes[name](config).eval()
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            model = base.to(device=device, dtype=dtype)
            peer = fla_model(model, args.fla) if "RetNet" in name else None
            peer = peer.to(device=device, dtype=dtype).eval() if peer is not None else None
            body = []
            for B in (1, 2):
                for n in lengths:
                    ids = torch.randint(0, config.vocab_size, (B, n), generator=gen).to(device)
                    cells = [("fla RetNetForCausalLM", peer, None)] if peer is not None else []
                    cells += [(m, model, m) for m in methods]
                    line = [B, n]
                    for label, m, method in cells:
                        if method is not None:
                            m.set_attention_method(method)
                        row = {"model": name, "dtype": dtype_name, "batch": B, "n": n, "method": label}
                        try:
                            with torch.no_grad():
                                times = wall_times(lambda: m(ids, use_cache=False), args.runs, device)
                            row["mean_ms"], row["std_ms"] = trimmed(times)
                            row["times_s"] = times
                            line.append(f"{row['mean_ms']:.1f} ± {row['std_ms']:.1f}")
                        except torch.cuda.OutOfMemoryError:
                            row["status"] = "OOM"
                            line.append("OOM")
                            torch.cuda.empty_cache()
                        except Exception as exc:   # a method that cannot run this shape: recorded, not fatal
                            row["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
                            line.append("ERR")
                        rep.rows.append(row)
                    body.append(line)
            headers = ["batch", "n"] + (["fla"] if peer is not None else []) + methods
            kept = max(args.runs - 2, 1)
            rep.section(f"{name}, {dtype_name}: forward over the prompt, ms (mean ± std of {kept} of {args.runs} runs)",
                        headers, body)
            if not args.no_decode:
                decode_section(rep, name, model, peer, dtype_name, device, gpu)
            del peer
    rep.finish(args.out)


def decode_section(rep, name, model, peer, dtype_name, device, gpu) -> None:
    """Tokens per second of greedy generate(), ours against fla's model."""
    new, prompt = (128, 512) if gpu else (4, 8)
    body = []
    model.set_attention_method("auto")
    for B in ((1, 8, 64) if gpu else (1, 2)):
        ids = torch.randint(0, model.config.vocab_size, (B, prompt), device=device)
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0)
        line = [B]
        for label, m in (("ours", model), ("fla", peer)):
            if m is None:
                line.append("—")
                continue
            with torch.no_grad():
                times = wall_times(lambda: m.generate(ids, **kw), 3, device)
            seconds = statistics.median(times)
            tps = B * new / seconds
            rep.rows.append({"model": name, "dtype": dtype_name, "batch": B, "decode": label, "new_tokens": new,
                             "prompt": prompt, "seconds": seconds, "tokens_per_s": tps})
            line.append(f"{tps:.0f}")
        body.append(line)
    rep.section(f"{name}, {dtype_name}: greedy generate(), tokens/s (prompt {prompt}, {new} new tokens, "
                f"median of 3)", ["batch", "ours", "fla"], body)


if __name__ == "__main__":
    main()
