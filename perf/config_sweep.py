"""Run every config of every kernel of the given methods, each in its own process, on the GPU.

    python perf/config_sweep.py --methods lightning_attention,block_based --dtype float16 \
        --shape 1,32,2048,128,128 --workers 8

Each (method, kernel, config) runs once, pinned, with ``CUDA_LAUNCH_BLOCKING=1`` in a fresh
process (so one faulting config cannot hide the others) while the method's other kernels run
their first config, and its output and final state are compared with the float64 oracle.  Prints one line per config: error, or the failure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CHILD = r"""
import json, sys, torch, leettriton
from leettriton.plan import run_problem
from leettriton.problem import make_problem
method, space, cfg, dtype, shape, decay = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5]), sys.argv[6] == "1"
B, H, n, r, d = shape
g = torch.Generator(device="cuda").manual_seed(0)
dt = getattr(torch, dtype)
b, c = (torch.randn(B, H, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5 for _ in range(2))
v = torch.randn(B, H, n, d, device="cuda", dtype=dt, generator=g)
s0 = torch.randn(B, H, r, d, device="cuda", generator=g)
gamma = (1 - torch.exp2(-5 - 3 * torch.arange(H, device="cuda") / max(H - 1, 1))).float() if decay else None
p, out = make_problem(b, c, v, gamma, initial_state=s0, return_state=True)
out.fill_(float("nan")); p.state.fill_(float("nan"))
run_problem(p, method, {space: cfg})
torch.cuda.synchronize()
ref, ref_s = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
e = ((out.double() - ref).norm() / ref.norm()).item()
es = ((p.state.double() - ref_s).norm() / ref_s.norm()).item()
print("RESULT " + json.dumps([e, es]))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="lightning_attention,block_based,fleet_attention,recursion,"
                                          "causal_dot_product,vanilla")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--shape", default="1,32,2048,128,128", help="B,H,n,r,d")
    ap.add_argument("--no-decay", action="store_true")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="at most this many configs per kernel (0: all)")
    ap.add_argument("--extra", default="{}", help='JSON {kernel space: [config, ...]} to run besides the family\'s')
    opts = ap.parse_args(argv)

    import torch

    from leettriton.autotune import current_family
    from leettriton.autotune.record import record_launches

    shape = [int(x) for x in opts.shape.split(",")]
    family = current_family()
    jobs = []
    for method in opts.methods.split(","):
        seen = set()
        for kernel, args in record_launches(method, getattr(torch, opts.dtype), *shape, decay=not opts.no_decay,
                                            initial=True, state=True):
            if kernel.space.name in seen:
                continue
            seen.add(kernel.space.name)
            configs = kernel.space.usable(family, args)
            for cfg in configs[:opts.limit or None] + json.loads(opts.extra).get(kernel.space.name, []):
                jobs.append((method, kernel.space.name, cfg))
    # the kernels not under test run their family's first config: a deterministic baseline
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", LEETTRITON_AUTOTUNE="0")

    def run(job):
        method, space, cfg = job
        cmd = [sys.executable, "-c", CHILD, method, space, json.dumps(cfg), opts.dtype, json.dumps(shape),
               "0" if opts.no_decay else "1"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        except subprocess.TimeoutExpired:
            return job, "TIMEOUT"
        line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
        if line:
            e, es = json.loads(line[0][7:])
            return job, f"err {e:.2e} state {es:.2e}"
        tail = [x for x in res.stderr.strip().splitlines() if x.strip()]
        return job, "FAIL " + (tail[-1][:200] if tail else f"rc={res.returncode}")

    print(f"{len(jobs)} configs on {family.name}, shape {shape}, {opts.dtype}", flush=True)
    with ThreadPoolExecutor(opts.workers) as pool:
        for (method, space, cfg), verdict in pool.map(run, jobs):
            print(f"{method:20s} {space:26s} {json.dumps(cfg)}: {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
