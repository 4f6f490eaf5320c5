"""The chunk walk reading b, c and v through tensor descriptors, against reading them through pointers.

At r > 128 the walk reads its rows through tensor descriptors (the copy engine on sm_90:
``reads_by_descriptor`` in methods/lightning_attention/kernels.py, docs/design.md §3.4).  For each
layer shape of ``bench_model_shapes`` asked for and each batch × n, ``auto``'s call as the library makes
it and the same call with that rule switched off (every read through pointers) run on the same inputs,
in five alternating rounds (``bench_auto.confirm_rounds``), both checked against the float64 oracle.
One line per cell: the median ms of each, their ratio, and each as a multiple of the memory floor.

    python perf/walk_descriptors.py --models retnet --shapes 1x8192,2x8192,1x32768
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_auto import confirm_rounds  # noqa: E402
from bench_model_shapes import MODELS  # noqa: E402

from leettriton import bench  # noqa: E402
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms  # noqa: E402
from leettriton.methods.lightning_attention import kernels as walk  # noqa: E402
from leettriton.plan import run_problem  # noqa: E402
from leettriton.problem import make_problem  # noqa: E402


def by_pointer(fn):
    """``fn`` with the walk's descriptor rule switched off for the length of the call."""
    def call():
        rule, walk.reads_by_descriptor = walk.reads_by_descriptor, lambda p: False
        try:
            fn()
        finally:
            walk.reads_by_descriptor = rule
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="retnet", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--shapes", default="1x8192,2x8192,1x32768", help="comma-separated BATCHxN")
    ap.add_argument("--dtypes", default="float16,bfloat16")
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
                tma = walk.reads_by_descriptor(p)
                calls = {"descriptors": lambda: run_problem(p, "auto"),
                         "pointers": by_pointer(lambda: run_problem(p, "auto"))}
                errors = {}
                for name, fn in calls.items():
                    out.fill_(float("nan"))
                    fn()
                    errors[name] = check.error(out)
                ms = confirm_rounds(calls)
                floor = memory_floor_ms(batch, heads, n, r, d, dt, bw)
                print(f"{label} ({heads}, {r}, {d}) {dtype} {batch} x {n}: rule {'on' if tma else 'off'}  "
                      f"descriptors {ms['descriptors']:.4f} ms ({ms['descriptors'] / floor:.2f}x floor, err "
                      f"{errors['descriptors']:.1e})  pointers {ms['pointers']:.4f} ms ({ms['pointers'] / floor:.2f}x "
                      f"floor, err {errors['pointers']:.1e})  ratio {ms['descriptors'] / ms['pointers']:.3f}",
                      flush=True)
                del b, c, v, p, out, check
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
