"""Per-kernel GPU time of leettriton methods at one shape, each tuned at that shape.

    python perf/profile_kernels.py --batch 1 --n 100000 --methods recursion block_based lightning_attention
    python perf/profile_kernels.py --out perf/results/h100/profile.md ...   # also write the table

For every method: the autotuners' caches are cleared (so each kernel picks its config at this
shape, not at whatever shape it met first), one call tunes and warms, then ``--iters`` calls run
under ``torch.profiler``.  The table gives each kernel's GPU time per call, its launches per call,
the bytes it must at least move where that is known (b, c, v read and o written once), and the
chosen configs.  heads 32, r = d = 128 by default, decay per head as in the main benchmark.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

import leettriton
from leettriton import bench
from leettriton.autotune import KERNELS, chosen_config


def profile(method: str, b, c, v, g, iters: int) -> tuple[float, list[tuple[str, float, float]], dict]:
    """(wall ms per call, [(kernel, GPU ms per call, launches per call)], chosen configs)."""
    for kernel in KERNELS.values():
        kernel.cache.clear()
    fn = lambda: leettriton.linear_attention(b, c, v, g, method=method)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    configs = {}
    for name, kernel in KERNELS.items():
        cfg = chosen_config(kernel) if kernel.cache else None
        if cfg:
            configs[name] = cfg
    wall = bench.time_ms(fn)[0]
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            key = ev.name.split("(")[0][:60]
            per[key][0] += ev.device_time_total / 1000.0
            per[key][1] += 1
    rows = sorted(((k, t / iters, cnt / iters) for k, (t, cnt) in per.items()), key=lambda x: -x[1])
    return wall, rows, configs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n", type=int, nargs="+", default=[100000])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--no-decay", action="store_true")
    ap.add_argument("--methods", nargs="+", default=["recursion", "block_based", "lightning_attention"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", help="also write the tables (Markdown) to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_kernels needs a CUDA GPU")
        return 2
    dtype = bench.parse_dtype(args.dtype)
    env = bench.environment("cuda")
    lines = ["# per-kernel GPU time", "", f"- command: python {' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}"]
    lines += [f"- {k}: {env[k]}" for k in ("device", "torch", "triton", "git_sha", "date") if k in env]
    bw = bench.copy_bandwidth("cuda")
    lines.append(f"- copy bandwidth: {bw / 1e9:.0f} GB/s")
    for n in args.n:
        b, c, v = bench.make_inputs(args.batch, args.heads, n, args.rank, args.dim, dtype, "cuda", seed=n)
        g = None if args.no_decay else bench.decay_gammas(args.heads, "cuda")
        floor = bench.memory_floor_ms(args.batch, args.heads, n, args.rank, args.dim, dtype, bw)
        lines += ["", f"## {args.dtype}, batch {args.batch}, heads {args.heads}, n {n}, r {args.rank}, d {args.dim}, "
                      f"{'no decay' if g is None else 'decay'}; memory floor {floor:.3f} ms", ""]
        for m in args.methods:
            try:
                wall, rows, cfgs = profile(m, b, c, v, g, args.iters)
            except Exception as exc:  # noqa: BLE001 - reported, the other methods go on
                lines += [f"**{m}**: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", ""]
                print(lines[-2], flush=True)
                continue
            gpu = sum(t for _, t, _ in rows)
            lines += [f"**{m}**: do_bench median {wall:.3f} ms ({wall / floor:.2f}× floor), GPU kernels "
                      f"{gpu:.3f} ms per call", "", "| kernel | GPU ms per call | launches per call |", "|---|---|---|"]
            lines += [f"| {k} | {t:.3f} | {cnt:g} |" for k, t, cnt in rows]
            lines += ["", "configs: " + "; ".join(f"{k} {v}" for k, v in cfgs.items()), ""]
            print("\n".join(lines[-len(rows) - 6:]), flush=True)
        del b, c, v
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
