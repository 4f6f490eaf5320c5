"""The chunk walk's rule for tensor descriptors, against reading always through descriptors and always through pointers.

At r > 128 the walk reads its rows through tensor descriptors (the copy engine on sm_90) where more than
half the multiprocessors get a program (``reads_by_descriptor`` in methods/lightning_attention/kernels.py,
docs/design.md §3.4).  For each layer shape of ``bench_model_shapes`` asked for, each batch × n and each
method asked for (``auto`` as the library runs it; a method with the configs of ``h100.json``'s nearest
point), three calls run on the same inputs in five alternating rounds (``bench_auto.confirm_rounds``), each
checked against the float64 oracle: the rule as it is, descriptors wherever the rows allow one (the rule
without its count of programs), and pointers only.  One line per cell: the median ms of each, and each as
a multiple of the memory floor.

    python perf/walk_descriptors.py --models retnet --shapes 1x2048,1x8192,2x8192 --methods auto,lightning_attention
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_auto import confirm_rounds  # noqa: E402
from bench_model_shapes import MODELS  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms  # noqa: E402
from leettriton.methods.lightning_attention import kernels as walk  # noqa: E402
from leettriton.plan import run_problem  # noqa: E402
from leettriton.problem import make_problem  # noqa: E402


RULE = walk.reads_by_descriptor


def with_rule(fn, rule):
    """``fn`` with the walk's descriptor rule replaced by ``rule(p, segments)`` for the length of the call."""
    def call():
        walk.reads_by_descriptor = rule
        try:
            fn()
        finally:
            walk.reads_by_descriptor = RULE
    return call


def file_configs(method, dtype, decay, r, d, bh, n):
    """``method``'s configs at the point of the heuristic file in use that ``auto`` takes for this shape."""
    from leettriton.autotune.families import current_family
    from leettriton.autotune.heuristics import active_heuristics
    family = current_family().name
    point = active_heuristics(family, leettriton.METHODS).nearest_point(dtype, decay, r, d, bh, n)
    if point is None or method not in point.get("configs", {}):
        raise SystemExit(f"the {family} heuristic file has no configs of {method} at the point nearest to "
                         f"{dtype} decay={decay} r={r} d={d} bh={bh} n={n}")
    return point["configs"][method]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="retnet", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--shapes", default="1x8192,2x8192,1x32768", help="comma-separated BATCHxN")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--methods", default="auto", help="comma-separated: auto and built-in methods")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  copy {bw / 1e9:.0f} GB/s", flush=True)
    for model in args.models.split(","):
        label, heads, r, d = MODELS[model]
        for dtype in args.dtypes.split(","):
            dt = getattr(torch, dtype)
            for shape in args.shapes.split(","):
                batch, n = (int(x) for x in shape.split("x"))
                b, c, v = bench.make_inputs(batch, heads, n, r, d, dt, device)
                gamma = bench.decay_gammas(heads, device)
                check = bench.oracle(b, c, v, gamma)
                p, out = make_problem(b, c, v, gamma)
                floor = memory_floor_ms(batch, heads, n, r, d, dt, bw)
                for method in args.methods.split(","):
                    configs = None if method == "auto" else file_configs(method, dtype, True, r, d, batch * heads, n)
                    run = lambda: run_problem(p, method, configs)  # noqa: E731
                    calls = {"rule": run,
                             "descriptors": with_rule(run, lambda p, segments=1: RULE(p, 1 << 30)),
                             "pointers": with_rule(run, lambda p, segments=1: False)}
                    errors = {}
                    for name, fn in calls.items():
                        out.fill_(float("nan"))
                        fn()
                        errors[name] = check.error(out)
                    ms = confirm_rounds(calls)
                    print(f"{label} ({heads}, {r}, {d}) {dtype} {batch} x {n} {method}: " + "  ".join(
                        f"{name} {ms[name]:.4f} ms ({ms[name] / floor:.2f}x, err {errors[name]:.1e})" for name in calls),
                        flush=True)
                del b, c, v, p, out, check
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
