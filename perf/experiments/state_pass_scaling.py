"""An experiment, not part of the library: the segment-state pass alone, at RetNet-1.3B's layer shape
(r = 256, d = 512, 1 × 8192, segments of 2048 rows, the three before the last), for 4 to 33 heads.

With the 256 × 128 tiles on 8 warps and 4 stages (h100.json's choice there) the pass runs
3 · heads · 4 programs of 2048 rows, one per multiprocessor. Whether its time grows with the programs
in a wave tells whether the pass is bound by the memory system or by each program's own chain.

    python perf/experiments/state_pass_scaling.py
"""
import torch

from leettriton.bench.timing import time_ms
from leettriton.kernels.segments import segment_local_states
from leettriton.problem import make_problem

CONFIG = {"segments.state": {"BT": 64, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 4}}

for heads in (4, 8, 9, 10, 11, 12, 16, 22, 33):
    b, c = (torch.randn(1, heads, 8192, 256, device="cuda", dtype=torch.float16) * 0.0625 for _ in range(2))
    v = torch.randn(1, heads, 8192, 512, device="cuda", dtype=torch.float16)
    gamma = 1 - torch.exp2(-5 - 3 * torch.arange(heads, device="cuda") / 7)
    p, out = make_problem(b, c, v, gamma)
    ms = sorted(time_ms(lambda: segment_local_states(p, 2048, CONFIG, last=False))[0] for _ in range(3))[1]
    programs = heads * 3 * 4
    waves = -(-programs // 132)
    print(f"heads {heads:3d} programs {programs:4d} waves {programs / 132:.2f}  pass {ms * 1e3:.1f} us  "
          f"per-unit-wave {ms * 1e3 / waves:.1f} us", flush=True)
