"""method="auto" against the best single method, on shapes the tune grid does not contain; cold start.

    python perf/bench_auto.py [--quick] [--out perf/results] [--no-cold]

1. For n ∈ {3000, 20000, 70000}, batch·heads ∈ {48, 96}, fp16 / bf16 / fp32, with and without decay
   (heads 16, r = d = 128): ``auto`` (the heuristic file's method and config, no tuning on the call
   path) and every Triton method (each autotuned for the shape) timed in the same run.
   Target: auto within 10% of the best on ≥ 90% of the shapes, never worse than 1.5×.
2. Cold start, each in a fresh process with an empty Triton cache: the wall time of the first ``auto``
   call at a new shape (compile included), then of a second call at another n (no recompile, no
   re-tune); the same for flash-linear-attention's ``chunk_simple_gla`` when installed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

import leettriton
from leettriton.api import BUILTIN_METHODS
from leettriton.bench import decay_gammas, environment, make_inputs, time_ms, write_results

HEADS = 16

COLD_SNIPPET = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
which, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
H, r = 32, 128
g = (1 - torch.exp2(-5 - 3 * torch.arange(H, dtype=torch.float64) / (H - 1))).float().cuda()
def inputs(n):
    x = [torch.randn(1, H, n, r, device="cuda", dtype=torch.float16) for _ in range(3)]
    return x if which == "auto" else [t.transpose(1, 2).contiguous() for t in x]
torch.cuda.synchronize()
if which == "auto":
    import leettriton
    run = lambda b, c, v: leettriton.linear_attention(b, c, v, g)
else:
    from fla.ops.simple_gla import chunk_simple_gla
    run = lambda b, c, v: chunk_simple_gla(b, c, v, g_gamma=g.log(), scale=1.0)
t_import = time.perf_counter() - t0
out = {}
for key, n in (("first_call_s", n1), ("second_call_s", n2)):
    b, c, v = inputs(n)
    torch.cuda.synchronize()
    t = time.perf_counter()
    run(b, c, v)
    torch.cuda.synchronize()
    out[key] = time.perf_counter() - t
out["import_s"] = t_import
print("RESULT " + json.dumps(out))
"""


def shapes(quick: bool, dtypes):
    ns = [3000, 20000] if quick else [3000, 20000, 70000]
    bhs = [48] if quick else [48, 96]
    dtypes = dtypes or (["float16"] if quick else ["float16", "bfloat16", "float32"])
    return [(dt, dec, bh, n) for dt in dtypes for dec in (True, False) for bh in bhs for n in ns]


def auto_vs_best(quick: bool, methods, dtypes=None):
    rows = []
    for dt, dec, bh, n in shapes(quick, dtypes):
        batch = bh // HEADS
        dtype = getattr(torch, dt)
        b, c, v = make_inputs(batch, HEADS, n, 128, 128, dtype, "cuda", seed=n)
        gamma = decay_gammas(HEADS, "cuda") if dec else None
        chosen = leettriton.dispatch.choose(leettriton.api.make_problem(b, c, v, gamma)[0])[0]
        times = {}
        os.environ["LEETTRITON_AUTOTUNE"] = "1"
        for m in methods:
            try:
                times[m] = time_ms(lambda: leettriton.linear_attention(b, c, v, gamma, method=m), rep_ms=50,
                                   max_call_ms=2000)[0]
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                times[m] = None
        t_auto = time_ms(lambda: leettriton.linear_attention(b, c, v, gamma), rep_ms=50)[0]
        timed = {m: t for m, t in times.items() if t is not None}
        best = min(timed, key=timed.get)
        row = dict(dtype=dt, decay=dec, bh=bh, batch=batch, heads=HEADS, n=n, r=128, d=128, auto_ms=t_auto,
                   auto_method=chosen, best_method=best, best_ms=timed[best], ratio=t_auto / timed[best],
                   times_ms=times)
        rows.append(row)
        print(f"{dt} decay={dec} bh={bh} n={n}: auto={t_auto:.3f} ms ({chosen}), best {best}={timed[best]:.3f} ms, "
              f"ratio {row['ratio']:.2f}", flush=True)
        del b, c, v
    return rows


def cold_start(n1: int, n2: int, timeout: float = 420):
    results = {}
    for which in ("auto", "fla_chunk_simple_gla"):
        if which != "auto":
            try:
                __import__("fla.ops.simple_gla")
            except ImportError:
                results[which] = {"note": "flash-linear-attention not installed"}
                continue
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            env.pop("LEETTRITON_AUTOTUNE", None)
            try:
                res = subprocess.run([sys.executable, "-c", COLD_SNIPPET, which, str(n1), str(n2)], env=env,
                                     capture_output=True, text=True, timeout=timeout)
                line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
                results[which] = json.loads(line[0][7:]) if line else {"note": res.stderr[-500:]}
            except subprocess.TimeoutExpired:
                results[which] = {"note": f"more than {timeout:g} s"}
        print(f"cold start {which}: {results[which]}", flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="perf/results")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-start measurement")
    ap.add_argument("--methods", default=",".join(BUILTIN_METHODS))
    ap.add_argument("--dtypes", default=None, help="comma-separated subset of float16,bfloat16,float32")
    ap.add_argument("--cold-timeout", type=float, default=420, help="seconds allowed to each cold-start process")
    opts = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_auto: needs a CUDA device (auto is measured against the kernels on the GPU)")
        return 0
    env = environment("cuda")
    meta = dict(env, command="python perf/bench_auto.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                heuristics=getattr(leettriton.autotune.heuristics.active_heuristics(env["family"]), "path", None))
    rows = auto_vs_best(opts.quick, opts.methods.split(","), opts.dtypes.split(",") if opts.dtypes else None)
    within = sum(r["ratio"] <= 1.10 for r in rows)
    worst = max(r["ratio"] for r in rows)
    cold = {} if opts.no_cold else cold_start(3000, 5000, opts.cold_timeout)
    meta.update(cold_start=cold, within_10pct=f"{within}/{len(rows)}", worst_ratio=worst)
    lines = ["| dtype | decay | batch·heads | n | auto (ms) | auto's method | best | best (ms) | auto / best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['decay']} | {r['bh']} | {r['n']} | {r['auto_ms']:.3f} | {r['auto_method']} "
                     f"| {r['best_method']} | {r['best_ms']:.3f} | {r['ratio']:.2f} |")
    lines += ["", f"auto within 10% of the best on {within} of {len(rows)} shapes (target ≥ 90%); "
              f"worst ratio {worst:.2f} (target ≤ 1.5)", "", "Cold start (fresh process, empty Triton cache), seconds:", "",
              "| | import | first call (n=3000) | second call (n=5000) |", "|---|---|---|---|"]
    for which, res in cold.items():
        if "first_call_s" in res:
            lines.append(f"| {which} | {res['import_s']:.2f} | {res['first_call_s']:.2f} | {res['second_call_s']:.3f} |")
        else:
            lines.append(f"| {which} | {res.get('note')} | | |")
    body = "\n".join(lines)
    name = "bench_auto" + (".quick" if opts.quick else "")
    write_results(rows, meta, os.path.join(opts.out, env["device_slug"], name), title="method='auto' vs the best method",
                  body=body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
