"""One pinned ``block_based`` call at a RetNet-1.3B-style layer, for a profiler to attach to.

    ncu --clock-control none -k regex:'chunk_walk|segment_state' --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats ... \\
        python perf/ncu_block_based.py '{"BT": 32, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}' float16 [n]

Batch 1, heads 8, r = 256, d = 512, n rows (8192 unless given), the inputs and per-head γ of the
benchmarks (``leettriton.bench.inputs``); the walk
pinned to the config given (run as given, inside the family's space or not), the segment-state kernel to
{BT 64, BK 128, BV 64, 4 warps, 3 stages}: no autotuning launch in between.  Three calls, so that a
profiler can skip the first (compilation) launches.
"""
from __future__ import annotations

import json
import sys

import torch

import leettriton  # noqa: F401  (registers the kernels)
import leettriton.autotune.configs as configs
from leettriton.bench.inputs import decay_gammas, make_inputs
from leettriton.plan import run_problem
from leettriton.problem import make_problem

STATE = {"BT": 64, "BK": 128, "BV": 64, "num_warps": 4, "num_stages": 3}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg, dt = json.loads(argv[0]), getattr(torch, argv[1])
    n = int(argv[2]) if len(argv) > 2 else 8192
    batch, heads, r, d = 1, 8, 256, 512
    configs._fits = lambda *a: True   # run the config as given
    b, c, v = make_inputs(batch, heads, n, r, d, dt, "cuda")
    p, _ = make_problem(b, c, v, decay_gammas(heads, "cuda"))
    pinned = {"block_based.fwd": cfg, "segments.state": STATE}
    for _ in range(3):
        run_problem(p, "block_based", pinned)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
