"""An experiment, not part of the library: auto at three layer shapes (and, at RetNet-1.3B's 1 x 8192, two pinned
walks), each timed as the median of three do_bench medians and checked against float64; run once per variant of
perf/experiments/tma_reads.patch by perf/experiments/tma_ab.sh (perf/results/h100/walk_tma.log)."""
import os, sys, torch
import leettriton.autotune.configs as configs
from leettriton import bench
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms, time_ms
from leettriton.plan import resolve, run_problem
from leettriton.problem import make_problem


def layer_inputs(batch, heads, n, r, d, dt):
    """b, c, v (seeded, b and c scaled by r^-1/2) and one decay per head, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(0)
    b, c = (torch.randn(batch, heads, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5 for _ in range(2))
    v = torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g)
    gamma = 1 - torch.exp2(-5 - 3 * torch.arange(heads, device="cuda") / max(1, heads - 1))
    return b, c, v, gamma


def auto_checked(b, c, v, gamma):
    """(the problem, its oracle check, auto's error, the median of three do_bench medians of auto in ms)."""
    check = bench.oracle(b, c, v, gamma)
    p, out = make_problem(b, c, v, gamma)
    out.fill_(float("nan")); run_problem(p, "auto"); torch.cuda.synchronize(); err = check.error(out)
    ts = sorted(time_ms(lambda: run_problem(p, "auto"))[0] for _ in range(3))
    return p, out, check, err, ts[1]


def main():
    configs._fits = lambda *a: True
    tag = sys.argv[1]
    bw = copy_bandwidth()
    for heads, r, d, shapes in ((8, 256, 512, ("1x8192", "2x8192")), (32, 128, 128, ("1x32768", "1x8192", "2x8192")), (16, 64, 64, ("1x8192",))):
        for dtype in ("float16", "bfloat16"):
            dt = getattr(torch, dtype)
            for shape in shapes:
                batch, n = (int(x) for x in shape.split("x"))
                b, c, v, gamma = layer_inputs(batch, heads, n, r, d, dt)
                p = out = check = None
                try:
                    p, out, check, err, t = auto_checked(b, c, v, gamma)
                    floor = memory_floor_ms(batch, heads, n, r, d, dt, bw)
                    extra = ""
                    if r == 256 and shape == "1x8192":
                        st = {"BT": 64, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 4}
                        for wc in ({"BT": 64, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 2},
                                   {"BT": 32, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 4}):
                            pin = {"block_based.fwd": wc, "segments.state": st}
                            run_problem(p, "block_based", pin)
                            t2 = sorted(time_ms(lambda: run_problem(p, "block_based", pin))[0] for _ in range(3))[1]
                            extra += f"  [BT{wc['BT']} s{wc['num_stages']}: {t2:.4f} err {check.error(out):.1e}]"
                    print(f"{tag:8s} {heads},{r},{d} {dtype} {shape}: {t:.4f} ms ({t/floor:.2f}x floor) err {err:.1e}{extra}", flush=True)
                except Exception as e:
                    print(f"{tag:8s} {heads},{r},{d} {dtype} {shape}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                del b, c, v, p, out, check
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
