"""Where the host time of a repeated ``linear_attention(method="auto")`` call goes, float16 against bfloat16.

    python perf/experiments/host_profile.py BxHxNxRxD ...     # from the repository root, on a GPU

Per shape and dtype: 20 warm calls, then 200 calls without a sync (host time per call, and how many launches per
call took the slow path through ``autotune.configs.launch`` instead of a kept compiled Launch), then 200 more
under cProfile (the top 18 functions by own time; cProfile's own overhead inflates every figure).
"""
import sys, time, os, cProfile, pstats, torch
sys.path.insert(0, "perf")
import leettriton, common
from leettriton.autotune import configs
print(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__, os.environ.get("LEETTRITON_GIT_SHA"), flush=True)
real = configs.launch
n_slow = {"n": 0}
def counted(*a, **k):
    n_slow["n"] += 1
    return real(*a, **k)
for name, mod in list(sys.modules.items()):
    if name.startswith("leettriton") and getattr(mod, "launch", None) is real:
        mod.launch = counted
for shape in sys.argv[1:]:
    for dtype in (torch.float16, torch.bfloat16):
        b, c, v, gamma = common.shape_inputs(shape, dtype)
        call = lambda: leettriton.linear_attention(b, c, v, gamma, method="auto")
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        n_slow["n"] = 0
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"== {shape} {dtype}: host {(t1 - t0) / 200 * 1e6:.1f} us/call, slow-path launches per call {n_slow['n'] / 200}", flush=True)
        pr = cProfile.Profile(); pr.enable()
        for _ in range(200):
            call()
        pr.disable(); torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
