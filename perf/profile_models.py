"""Where a model's prefill spends its GPU time: per-kernel time of one forward, ours beside fla's RetNet.

    python perf/profile_models.py [--models retnet,transnormer] [--n 7421] [--batch 1] [--dtype float16]
        [--method auto] [--iters 5] [--fla PATH] [--out FILE]

The configurations of ``perf/bench_models.py`` (RetNet-1.3B and TransNormerLLM-7B, two layers, random
weights; fla's ``RetNetForCausalLM`` with the same weights when importable).  For each model: one warm-up
forward, then ``--iters`` forwards under ``torch.profiler``; the table gives each kernel's GPU time per
forward and its launches per forward, the kernels grouped as GEMM, attention (leettriton's kernels, fla's
chunk/retention kernels), and the rest ("elementwise": norms, rotary, gates, casts, copies, adds), with the
totals and the wall time of a forward.  Without a GPU: a check of the script's logic on the tiny
configurations of ``bench_models.py`` (CPU operator times), not a measurement.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_models import configs, fla_model  # noqa: E402

HAS_GPU = torch.cuda.is_available()
_GEMM = ("gemm", "sm90_", "sm80_", "cutlass", "cublas", "ampere_", "nvjet", "aten::mm", "aten::addmm",
         "aten::linear", "aten::matmul", "aten::bmm")
_ATTENTION = ("_walk", "_vanilla", "_segment", "_scan", "_decode", "_causal_dot", "_recursion", "_block", "chunk_",
              "fused_chunk", "parallel_", "retention", "_lightning", "linear_attention")


def kind_of(name: str) -> str:
    low = name.lower()
    if any(k in low for k in _GEMM):
        return "GEMM"
    if any(k in low for k in _ATTENTION):
        return "attention"
    return "elementwise"


def profile(forward, device, iters: int):
    """(wall ms per forward, [(kernel, ms per forward, launches per forward)]): GPU kernels on CUDA, CPU
    operators (top level only) without a GPU."""
    with torch.no_grad():
        forward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            forward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = 1e3 * (time.perf_counter() - t0) / iters
        acts = [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else \
            [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(iters):
                forward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    per = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if device.type == "cuda":
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            ms = ev.device_time_total / 1000.0
        else:
            if ev.cpu_parent is not None:
                continue
            ms = ev.cpu_time_total / 1000.0
        key = ev.name.split("(")[0][:80]
        per[key][0] += ms
        per[key][1] += 1
    return wall, sorted(((k, t / iters, c / iters) for k, (t, c) in per.items()), key=lambda x: -x[1])


def table(title: str, wall: float, rows) -> str:
    totals = collections.Counter()
    launches = collections.Counter()
    for name, ms, count in rows:
        totals[kind_of(name)] += ms
        launches[kind_of(name)] += count
    lines = [f"### {title}", "",
             f"wall {wall:.3f} ms per forward; kernel time {sum(totals.values()):.3f} ms: "
             + ", ".join(f"{k} {totals[k]:.3f} ms ({launches[k]:.0f} launches)"
                         for k in ("GEMM", "attention", "elementwise")), "",
             "| kernel | group | ms per forward | launches per forward |", "|---|---|---:|---:|"]
    lines += [f"| `{name}` | {kind_of(name)} | {ms:.4f} | {count:.0f} |" for name, ms, count in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="retnet,transnormer")
    p.add_argument("--n", type=int, default=None, help="prompt length (default 7421; without a GPU 37)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default=None, help="default float16 (without a GPU float32)")
    p.add_argument("--method", default=None, help="our attention method (default auto; without a GPU "
                                                   "lightning_attention_torch)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--fla", metavar="PATH", help="a folder with fla and fla-core unpacked, put first on sys.path")
    p.add_argument("--out", metavar="FILE", help="also write the tables (Markdown) to this file")
    args = p.parse_args(argv)
    if args.fla:
        sys.path.insert(0, args.fla)
    device = torch.device("cuda" if HAS_GPU else "cpu")
    dtype = getattr(torch, args.dtype or ("float16" if HAS_GPU else "float32"))
    n = args.n or (7421 if HAS_GPU else 37)
    method = args.method or ("auto" if HAS_GPU else "lightning_attention_torch")
    from leettriton.models import RetNetForCausalLM, TransNormerForCausalLM
    classes = {"retnet": RetNetForCausalLM, "transnormer": TransNormerForCausalLM}
    out = [f"## One prefill forward: batch {args.batch}, {n} tokens, {str(dtype).replace('torch.', '')}, "
           f"our method {method!r}, {torch.cuda.get_device_name(device) if HAS_GPU else 'CPU (logic check)'}\n"]
    print(out[0], flush=True)
    for key, config in configs(HAS_GPU, args.models.split(",")).items():
        start = len(out)
        torch.manual_seed(0)
        config.attention_method = method
        model = classes[key](config).eval()       # built on the host, then moved (as bench_models.py does)
        ids = torch.randint(0, config.vocab_size, (args.batch, n), generator=torch.Generator().manual_seed(1))
        ids = ids.to(device)
        peer = fla_model(model, device, dtype) if key == "retnet" else None
        model = model.to(device=device, dtype=dtype)
        wall, rows = profile(lambda: model(input_ids=ids, use_cache=False), device, args.iters)
        out.append(table(f"leettriton {key}", wall, rows))
        if peer is not None:
            wall, rows = profile(lambda: peer(input_ids=ids, use_cache=False), device, args.iters)
            out.append(table(f"fla {key}", wall, rows))
        elif key == "retnet":
            out.append("(fla not importable: its RetNet not profiled)\n")
        print("\n".join(out[start:]), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(out))


if __name__ == "__main__":
    main()
