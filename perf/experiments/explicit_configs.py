"""Where explicit (autotuned) block_based's time goes against auto's at 1 × 32 heads × n (r = d = 128, decay): each
call timed by graph replay with the configs and schedule it ran; then block_based with the file's walk config pinned (the
rest autotuned), with the explicit walk's config beside the file's others, and with all the file's.  The n run in the order
given (``python perf/experiments/explicit_configs.py 2048,8192,100000``), so the autotuners choose at the first that meets
their keys.  ``configs`` is each autotuner's last choice: for ``auto`` (the file's configs, pinned) not what ran."""
import json, sys, torch, triton
import leettriton
from leettriton.autotune import recording, chosen_configs, KERNELS
from leettriton.plan import resolve, choose
from leettriton.problem import make_problem
from leettriton.bench.timing import graph_replay
dev = "cuda"
H = 32
gamma = 1 - torch.exp2(-5 - torch.arange(H, device=dev, dtype=torch.float32) * 3 / (H - 1))
def t(fn):
    return triton.testing.do_bench(graph_replay(fn), warmup=25, rep=200, return_mode="median")
for dtype in (torch.float16, torch.bfloat16):
    for n in [int(x) for x in sys.argv[1].split(",")]:
        g = torch.Generator(device=dev).manual_seed(n)
        b, c = (torch.randn(1, H, n, 128, device=dev, generator=g, dtype=dtype) * 128 ** -0.5 for _ in range(2))
        v = torch.randn(1, H, n, 128, device=dev, generator=g, dtype=dtype)
        row = dict(dtype=str(dtype)[6:], n=n)
        for method in ("block_based", "auto"):
            fn = lambda: leettriton.linear_attention(b, c, v, gamma, method=method)
            with recording() as log:
                fn()
            torch.cuda.synchronize()
            row[method] = dict(ms=round(t(fn), 4), configs=chosen_configs(log))
        p, _ = make_problem(b, c, v, gamma)
        plan = resolve(p, "block_based")
        row["block_based"]["schedule"] = dict(plan.schedule)
        row["auto"]["schedule"] = dict(resolve(p, "auto").schedule)
        file_cfg = choose(p)[1] or {}
        from leettriton.plan import run_problem
        for label, pin in (("file walk only", {k: v_ for k, v_ in file_cfg.items() if k == "block_based.fwd"}),
                           ("explicit walk + file state/scan", {**file_cfg, "block_based.fwd": row["block_based"]["configs"].get("block_based.fwd")}),
                           ("all file", file_cfg)):
            if not pin or None in pin.values():
                continue
            fn = lambda: run_problem(make_problem(b, c, v, gamma)[0], "block_based", pin)
            with recording() as log:
                fn()
            torch.cuda.synchronize()
            row[label] = dict(ms=round(t(fn), 4), configs=chosen_configs(log))
        print("ROW " + json.dumps(row), flush=True)
        del b, c, v
