"""Where a training step's time goes: torch.profiler over a few forward + backward steps of one method.

    python perf/profile_backward.py --batch 16 --n 8192            # on the GPU: heads 32, r = d = 128, float16
    python perf/profile_backward.py --batch 1 --n 2048 --dtype bfloat16 --method lightning_attention
    python perf/profile_backward.py --batch 16 --n 8192 --compare  # reversed problems against reversed copies

One step is ``o = linear_attention(b, c, v, γ)`` then ``torch.autograd.grad(o, (b, c, v), do)`` with a random
``do`` and the per-head decays of every bench.  Two steps warm up (compile, autotune); the step's wall
time is then timed (median of ``bench.time_ms``), and ``--steps`` steps run under ``torch.profiler``.
Printed: the wall time per step; the GPU time per step of each kernel (reversed copies, chunk walks,
...) with its launches per step; the host (CPU) time of the backward node per step; and the profiler's
own table (``--rows`` rows, by GPU time).

The backward's reversed-time calls run as reversed problems (no copies, docs/design.md §10.3).  ``--copies``
profiles the path that makes reversed copies instead (what a method without reversed addressing takes), by
having ``leettriton.autograd.reversed_call`` decline every call; ``--compare`` first times a step both ways in
the same run, and checks that the two give the same gradients.  ``--one-part`` profiles a bfloat16 backward with
its float32 operands rounded in one part, not two (``Problem.two_part``, docs/design.md §10.4: less accurate
gradients), to measure what the second part costs; float16 has no two-part form, so it changes nothing there.

Without a GPU it runs tiny shapes (heads 2, n 64, r = d = 16) under Triton's interpreter, so the node
and the reversal kernel take their CUDA path's steps: a check of the script's logic, not a measurement.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n", type=int, default=None, help="sequence length (GPU default 8192, CPU 64)")
    ap.add_argument("--heads", type=int, default=None, help="GPU default 32, CPU 2")
    ap.add_argument("--rank", type=int, default=None, help="r (GPU default 128, CPU 16)")
    ap.add_argument("--dim", type=int, default=None, help="d (GPU default 128, CPU 16)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--layout", choices=("bhnd", "bnhd"), default="bhnd")
    ap.add_argument("--no-decay", action="store_true")
    ap.add_argument("--method", default="auto")
    ap.add_argument("--steps", type=int, default=3, help="training steps under the profiler")
    ap.add_argument("--rows", type=int, default=25, help="rows of the profiler's table")
    ap.add_argument("--copies", action="store_true", help="profile the backward on reversed copies")
    ap.add_argument("--compare", action="store_true",
                    help="first time a step with reversed problems and with reversed copies (same run)")
    ap.add_argument("--one-part", action="store_true",
                    help="bfloat16: round the backward's float32 operands in one part (measures the second's cost)")
    args = ap.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"   # before leettriton is imported: the kernels' path on the CPU
    import leettriton
    from leettriton import bench

    device = "cuda" if cuda else "cpu"
    n = args.n or (8192 if cuda else 64)
    heads = args.heads or (32 if cuda else 2)
    r, d = args.rank or (128 if cuda else 16), args.dim or (128 if cuda else 16)
    dtype = bench.parse_dtype(args.dtype)
    env = bench.environment(device)
    print(f"training step of {args.method}: batch {args.batch}, heads {heads}, n {n}, r {r}, d {d}, {args.dtype}, "
          f"layout {args.layout}, {'no decay' if args.no_decay else 'decay per head'}")
    print("  " + ", ".join(f"{k} {env[k]}" for k in ("device", "torch", "triton", "git_sha") if k in env)
          + ("" if cuda else " (Triton interpreter: a logic check, not a measurement)"))

    b, c, v = bench.make_inputs(args.batch, heads, n, r, d, dtype, device, seed=0, layout=args.layout)
    leaves = tuple(x.detach().requires_grad_() for x in (b, c, v))
    gamma = None if args.no_decay else bench.decay_gammas(heads, device)
    do = torch.randn(v.shape, generator=torch.Generator(device).manual_seed(1), device=device).to(dtype)

    def step():
        o = leettriton.linear_attention(*leaves, gamma, method=args.method, layout=args.layout)
        return torch.autograd.grad(o, leaves, do)

    import leettriton.autograd as node
    reversed_call = node.reversed_call

    def use_copies(on: bool) -> None:
        # the copy path: every reversed call declines, so the backward reverses copies (a measurement switch)
        node.reversed_call = (lambda *a, **k: None) if on else reversed_call

    if args.compare:
        got = {}
        for label, on in (("reversed problems", False), ("reversed copies", True)):
            use_copies(on)
            for _ in range(2):
                got[label] = step()
            if cuda:
                torch.cuda.synchronize()
                print(f"  wall time per step, {label}: {bench.time_ms(step)[0]:.3f} ms (median)")
        worst = max(float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30))
                    for x, y in zip(*got.values()))
        print(f"  gradients, reversed problems against reversed copies: largest relative difference {worst:.2e}")
    use_copies(args.copies)
    if args.one_part:   # a measurement switch: the backward's problems built without two_part
        make_problem = node.make_problem
        node.make_problem = lambda *a, **k: make_problem(*a, **{**k, "two_part": False})
    print(f"  profiled: the backward on {'reversed copies' if args.copies else 'reversed problems'}"
          + (", its operands in one part" if args.one_part else ""))
    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
        wall = bench.time_ms(step)[0]
        print(f"  wall time per step: {wall:.3f} ms (median)")

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()

    steps = args.steps
    kernels = collections.defaultdict(lambda: [0.0, 0])
    node_cpu_us = 0.0
    for ev in prof.events():
        if cuda and ev.device_type == torch.autograd.DeviceType.CUDA:
            key = ev.name.split("(")[0][:70]
            kernels[key][0] += ev.device_time_total / 1000.0
            kernels[key][1] += 1
        elif ev.name == "LinearAttentionFunctionBackward":
            node_cpu_us += ev.cpu_time_total
    if cuda:
        total = sum(t for t, _ in kernels.values()) / steps
        print(f"  GPU time per step, by kernel (sum {total:.3f} ms):")
        for key, (t, cnt) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
            print(f"    {t / steps:8.3f} ms  {cnt / steps:5.1f}×  {key}")
    print(f"  backward node, host time per step (under the profiler, which inflates it): "
          f"{node_cpu_us / steps / 1000:.3f} ms")
    sort = "device_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
