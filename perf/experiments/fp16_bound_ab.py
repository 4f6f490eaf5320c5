"""An experiment, not part of the library: auto at layer shapes in float16, each timed as the median of three do_bench
medians and checked against float64; run once per variant (LT_X_BOUND=0 / 1, perf/experiments/fp16_bound_scale.patch)
by perf/experiments/fp16_bound_ab.sh (perf/results/h100/walk_fp16_bound.log).  Inputs and timing: tma_ab.py's."""
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tma_ab import auto_checked, layer_inputs  # noqa: E402
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms  # noqa: E402
tag = sys.argv[1]
bw = copy_bandwidth()
for heads, r, d, shapes in ((8, 256, 512, ("1x8192", "1x32768", "2x8192")), (32, 128, 128, ("1x32768", "1x100000", "1x8192", "2x8192")), (16, 64, 64, ("1x8192",))):
    for shape in shapes:
        batch, n = (int(x) for x in shape.split("x"))
        b, c, v, gamma = layer_inputs(batch, heads, n, r, d, torch.float16)
        p, out, check, err, t = auto_checked(b, c, v, gamma)
        floor = memory_floor_ms(batch, heads, n, r, d, torch.float16, bw)
        print(f"{tag:8s} {heads},{r},{d} float16 {shape}: {t:.4f} ms ({t/floor:.2f}x floor) err {err:.1e}", flush=True)
        del b, c, v, p, out, check
        torch.cuda.empty_cache()
