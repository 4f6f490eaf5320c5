"""``auto`` at short sequences with few batch·heads, under other minimum segment lengths of ``block_based``.

    python perf/short_segments.py --shapes 1x16x2048x64x64,2x16x2048x64x64 --min-segments rule,1024,512,256

For every shape (``BxHxNxRxD``, float16 and bfloat16, decay per head 0.969 … 0.996) and every value of
the fewest rows per segment of ``block_based`` (``rule``: the library's :func:`min_segment`; a number: that for
every width, patched in this process, the plan cache cleared): ``auto``'s plan (the heuristic file's method and configs, the schedule the rule
then gives) timed by the replay of its call's CUDA graph (median, ``triton.testing.do_bench``), and its error
against the float64 reference; then ``lightning_attention`` (one launch, no segments) the same way.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

import leettriton
from leettriton.bench import graph_replay, time_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from leettriton import plan as plans
from leettriton.methods.block_based import space
from leettriton.problem import make_problem


def replay_ms(fn) -> float:
    """Median ms of ``fn``'s call captured in a CUDA graph and replayed (the kernels alone)."""
    return time_ms(graph_replay(fn), warm=False, rep_ms=200)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x16x2048x64x64,2x16x2048x64x64,1x16x4096x64x64,1x32x2048x128x128,"
                                        "1x8x2048x256x512")
    ap.add_argument("--min-segments", default="rule,1024,512,256")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    opts = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    for dt in (getattr(torch, x) for x in opts.dtypes.split(",")):
        for shape in opts.shapes.split(","):
            B, H, n, r, d = (int(x) for x in shape.split("x"))
            b, c, v, gamma = common.shape_inputs(shape, dt)
            ref = leettriton.reference(b, c, v, gamma)
            for label, method, mins in ([("auto", "auto", m) for m in opts.min_segments.split(",")]
                                        + [("lightning_attention", "lightning_attention", "rule")]):
                saved = space.MIN_SEGMENT, space.SHORT_MIN_SEGMENT
                if mins != "rule":
                    space.MIN_SEGMENT = space.SHORT_MIN_SEGMENT = int(mins)
                try:
                    plans.clear_plans()
                    fn = lambda: leettriton.linear_attention(b, c, v, gamma, method=method)  # noqa: E731
                    out = fn()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    p, _ = make_problem(b, c, v, gamma)
                    chosen = plans.resolve(p, method)
                    ms = replay_ms(fn)
                finally:
                    space.MIN_SEGMENT, space.SHORT_MIN_SEGMENT = saved
                    plans.clear_plans()
                print(f"{str(dt)[6:]:8s} {shape:18s} {label:19s} min_segment {mins:>5s}  {ms * 1000:7.1f} us  err {err:.1e}  "
                      f"{chosen.method} {chosen.schedule}", flush=True)


if __name__ == "__main__":
    main()
