"""An experiment, not part of the library: block_based's look-back walk against float64, row by row and segment by
segment, and its counters after the launch (all zero when every published state was read as often as counted).
Needs perf/experiments/lookback_walk.patch applied (perf/results/h200/walk_lookback.log).

    python perf/experiments/lookback_debug.py
"""
import os
import sys
import types

import torch

import leettriton
from leettriton.methods.block_based import space
from leettriton.methods.lightning_attention import kernels as walk
from leettriton.plan import resolve
from leettriton.problem import make_problem

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402

made = []
proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
proxy.zeros = lambda *a, **k: made.append(torch.zeros(*a, **k)) or made[-1]
walk.torch = proxy


for shape in ("1x16x2048x64x64", "1x4x2048x64x64", "1x8x8192x256x512", "1x16x8192x64x64"):
    B, H, n, r, d = (int(x) for x in shape.split("x"))
    for dtype in (torch.float32, torch.bfloat16):
        b, c, v, g = common.shape_inputs(shape, dtype)
        plan = resolve(make_problem(b, c, v, g)[0], "block_based")
        ref = leettriton.reference(b, c, v, g)
        lb = plan.schedule.get("lookback")
        starts = space.lookback_lengths(*lb) if lb else []
        for rep in range(3):
            made.clear()
            out = leettriton.linear_attention(b, c, v, g, method="block_based").double()
            torch.cuda.synchronize()
            err = ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).amax(dim=(0, 1))  # per row
            bounds, t = [], 0
            for length in starts:
                bounds.append((t, min(n, t + length)))
                t += length
            if lb:
                bounds[-1] = (bounds[-1][0], n)
            per_seg = [f"{err[a:e].max().item():.1e}" for a, e in bounds] or [f"{err.max().item():.1e}"]
            left = [int(x.abs().sum().item()) for x in made]
            print(f"{B}x{H}x{n} r{r} d{d} {str(dtype)[6:]} {plan.configs} lookback={lb} rep {rep}: per segment {per_seg}"
                  f" counters left {left}", flush=True)
