"""auto's plan at given shapes, timed with and without host launch time, beside each method autotuned.

    python perf/auto_plan_check.py --shapes 1x32x5000,1x32x8192,1x32x12000 --dtypes float16,bfloat16

For each shape (batch × heads × n, r = d = 128 unless given, with decay): auto's method, configs and
schedule; ``auto`` timed as perf/bench_auto.py times it (``time_ms``: CUDA events around each call,
so host time that leaves the GPU idle counts) and as a replayed CUDA graph (``leettriton.bench.graph_replay``: GPU time alone); the same
for ``block_based`` and ``lightning_attention`` autotuned at the shape (their caches cleared first).
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

import leettriton
from leettriton.autotune import KERNELS
from leettriton.bench import graph_replay, time_ms
from leettriton.bench.inputs import decay_gammas, make_inputs
from leettriton.plan import resolve
from leettriton.problem import make_problem


def graph_ms(fn) -> float:
    """Median ms of ``fn`` captured once in a CUDA graph and replayed (no host time)."""
    fn()
    return float(triton.testing.do_bench(graph_replay(fn), warmup=25, rep=100, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x32x5000,1x32x8192,1x32x12000")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--r", type=int, default=128)
    ap.add_argument("--d", type=int, default=128)
    opts = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    for dt in opts.dtypes.split(","):
        for shape in opts.shapes.split(","):
            batch, heads, n = (int(x) for x in shape.split("x"))
            b, c, v = make_inputs(batch, heads, n, opts.r, opts.d, getattr(torch, dt), "cuda", seed=n)
            gamma = decay_gammas(heads, "cuda")
            plan = resolve(make_problem(b, c, v, gamma)[0], "auto")
            print(f"{dt} {batch}×{heads}×{n}: auto runs {plan.method} {json.dumps(plan.configs)} "
                  f"schedule {json.dumps(dict(plan.schedule))}", flush=True)
            for m in ("auto", "block_based", "lightning_attention"):
                if m != "auto":
                    for kernel in KERNELS.values():
                        kernel.cache.clear()
                call = (lambda m=m: leettriton.linear_attention(b, c, v, gamma, method=m))
                events = time_ms(call, rep_ms=50)[0]
                try:
                    graph = f"{graph_ms(call):.3f} ms"
                except Exception as e:  # noqa: BLE001 (a launch path that cannot be captured: say so)
                    graph = f"not captured ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
                print(f"    {m:20s} events {events:.3f} ms   graph {graph}", flush=True)


if __name__ == "__main__":
    main()
