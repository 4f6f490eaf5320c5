"""An experiment, not part of the library: block_based's look-back walk against float64, row by row and segment by
segment, and its counters after the launch (all zero when every published state was read as often as counted).
Needs perf/experiments/lookback_walk.patch applied (perf/results/h200/walk_lookback.log).

    python perf/experiments/lookback_debug.py
"""
import types

import torch

import leettriton
from leettriton.methods.block_based import space
from leettriton.methods.lightning_attention import kernels as walk
from leettriton.plan import resolve
from leettriton.problem import make_problem

made = []
proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
proxy.zeros = lambda *a, **k: made.append(torch.zeros(*a, **k)) or made[-1]
walk.torch = proxy


def reference(b, c, v, g):
    n = b.shape[2]
    i = torch.arange(n, device=b.device)
    e = (i[:, None] - i[None, :]).double()
    m = torch.where(e >= 0, torch.exp(g.double().log()[:, None, None] * e.clamp(min=0)), 0.0)
    return ((b.double() @ c.double().transpose(-1, -2)) * m) @ v.double()


torch.manual_seed(0)
for B, H, n, r, d in [(1, 16, 2048, 64, 64), (1, 4, 2048, 64, 64), (1, 8, 8192, 256, 512), (1, 16, 8192, 64, 64)]:
    for dtype in (torch.float32, torch.bfloat16):
        b, c = (torch.randn(B, H, n, r, device="cuda") / r ** 0.5 for _ in range(2))
        v = torch.randn(B, H, n, d, device="cuda")
        g = 1 - torch.exp2(-5 - 3 * torch.arange(H, device="cuda") / max(1, H - 1))
        b, c, v = b.to(dtype), c.to(dtype), v.to(dtype)
        plan = resolve(make_problem(b, c, v, g)[0], "block_based")
        ref = reference(b, c, v, g)
        lb = plan.schedule.get("lookback")
        starts = space.lookback_lengths(*lb[:1], lb[1], lb[2], lb[3]) if lb else []
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
