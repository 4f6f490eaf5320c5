"""One method, autotuned, on one shape: for running under compute-sanitizer on the GPU.

    compute-sanitizer --tool memcheck python perf/sanitize_one.py lightning_attention 1,32,2048,128,128 float16
"""
import sys

import torch

import leettriton

method, shape, dtype = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], getattr(torch, sys.argv[3])
B, H, n, r, d = shape
b, c = (torch.randn(B, H, n, r, device="cuda", dtype=dtype) * r ** -0.5 for _ in range(2))
v = torch.randn(B, H, n, d, device="cuda", dtype=dtype)
gamma = (1 - torch.exp2(-5 - 3 * torch.arange(H, device="cuda") / max(H - 1, 1))).float()
out = leettriton.linear_attention(b, c, v, gamma, method=method)
torch.cuda.synchronize()
ref = leettriton.reference(b, c, v, gamma)
print(method, "rel err", ((out.double() - ref).norm() / ref.norm()).item())
