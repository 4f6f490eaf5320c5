"""Host time against GPU time of repeated ``linear_attention(method="auto")`` calls, float16 and bfloat16.

    python perf/experiments/host_time_shapes.py [BxHxNxRxD ...]     # from the repository root, on a GPU

Per shape and dtype (inputs of ``perf/common.py``'s ``shape_inputs``), after 20 warm calls: five times 100 calls
issued back to back with no sync between them. ``host/call`` is the issue loop's wall time per call (the GPU runs
behind, so this is the host's time: leettriton's Python, the allocations and the launches), ``wall/call`` the same
with the closing sync (the larger of host and GPU), ``gpu`` the call's CUDA-graph replay (do_bench median). The
medians of the five runs are printed, then each run's host time.
"""
import sys, time, os, torch
sys.path.insert(0, "perf")
import leettriton, common
from leettriton.bench import graph_replay, time_ms
print(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__, os.environ.get("LEETTRITON_GIT_SHA"), flush=True)
shapes = sys.argv[1:] or ["1x16x8192x64x64", "2x16x8192x64x64", "2x16x2048x64x64", "1x16x2048x64x64", "1x32x2048x128x128", "1x8x2048x256x512", "1x8x8192x256x512"]
for shape in shapes:
    for dtype in (torch.float16, torch.bfloat16):
        b, c, v, gamma = common.shape_inputs(shape, dtype)
        call = lambda: leettriton.linear_attention(b, c, v, gamma, method="auto")
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        host, wall = [], []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / 100 * 1e6); wall.append((t2 - t0) / 100 * 1e6)
        g = graph_replay(call)
        gpu = time_ms(g, warm=True, rep_ms=100)[0] * 1e3
        print(f"{shape:20s} {str(dtype)[6:]:9s} host/call {sorted(host)[2]:6.1f} us  wall/call {sorted(wall)[2]:6.1f} us  gpu {gpu:6.1f} us  (host runs {' '.join(f'{h:.0f}' for h in host)})", flush=True)
