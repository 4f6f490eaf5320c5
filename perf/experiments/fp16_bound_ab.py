"""An experiment, not part of the library: auto at layer shapes in float16, each timed as the median of three do_bench
medians and checked against float64; run once per variant (LT_X_BOUND=0 / 1, perf/experiments/fp16_bound_scale.patch)
by perf/experiments/fp16_bound_ab.sh (perf/results/h100/walk_fp16_bound.log)."""
import sys, torch
from leettriton import bench
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms, time_ms
from leettriton.plan import run_problem
from leettriton.problem import make_problem
tag = sys.argv[1]
bw = copy_bandwidth()
for heads, r, d, shapes in ((8, 256, 512, ("1x8192", "1x32768", "2x8192")), (32, 128, 128, ("1x32768", "1x100000", "1x8192", "2x8192")), (16, 64, 64, ("1x8192",))):
    for dtype in ("float16",):
        dt = getattr(torch, dtype)
        for shape in shapes:
            batch, n = (int(x) for x in shape.split("x"))
            g = torch.Generator(device="cuda").manual_seed(0)
            b, c = (torch.randn(batch, heads, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5 for _ in range(2))
            v = torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g)
            gamma = 1 - torch.exp2(-5 - 3 * torch.arange(heads, device="cuda") / max(1, heads - 1))
            check = bench.oracle(b, c, v, gamma)
            p, out = make_problem(b, c, v, gamma)
            out.fill_(float("nan")); run_problem(p, "auto"); torch.cuda.synchronize(); err = check.error(out)
            ts = sorted(time_ms(lambda: run_problem(p, "auto"))[0] for _ in range(3))
            floor = memory_floor_ms(batch, heads, n, r, d, dt, bw)
            print(f"{tag:8s} {heads},{r},{d} {dtype} {shape}: {ts[1]:.4f} ms ({ts[1]/floor:.2f}x floor) err {err:.1e}", flush=True)
            del b, c, v, p, out, check
            torch.cuda.empty_cache()
