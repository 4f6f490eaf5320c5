"""Compile kernels ahead of their first launch, in parallel processes (GPU machine).

The autotuner compiles every config of a kernel, one after another, the first
time it meets a key; with a few dozen configs and several dtypes and flags that
is minutes.  This fills Triton's on-disk cache first, with one process per
core, so that tuning, benchmarks and tests find their kernels compiled::

    python -m leettriton.autotune.warm --dtypes float16,bfloat16 --workers 16
    python -m leettriton.autotune.warm --methods lightning_attention --first   # first config only

Launches are recorded on the ``meta`` device (no memory touched), so the
compiled signatures are exactly those of a real launch of the given shape.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch


def _tasks(methods, dtypes, rds, flags, heads, first):
    from .configs import config_dict  # noqa: F401
    from .families import current_family
    from .record import record_launches

    family = current_family()
    tasks = []
    for method, dtype, (r, d), (decay, initial, state) in itertools.product(methods, dtypes, rds, flags):
        calls = record_launches(method, getattr(torch, dtype), B=1, H=heads, n=1024, r=r, d=d, decay=decay,
                                initial=initial, state=state)
        seen = set()
        for kernel, args in calls:
            if kernel.space.name in seen:
                continue
            seen.add(kernel.space.name)
            configs = kernel.space.usable(family, args)
            for cfg in configs[:1] if first else configs:
                tasks.append((method, dtype, r, d, decay, initial, state, heads, kernel.space.name, cfg))
    return tasks


def _compile(task) -> tuple[str, float, str]:
    method, dtype, r, d, decay, initial, state, heads, space, cfg = task
    from .record import record_launches

    start = time.time()
    try:
        for kernel, args in record_launches(method, getattr(torch, dtype), B=1, H=heads, n=1024, r=r, d=d,
                                            decay=decay, initial=initial, state=state):
            if kernel.space.name == space:
                meta = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
                kernel.fn.warmup(grid=(1,), **args, **meta, num_warps=cfg["num_warps"],
                                 num_stages=cfg["num_stages"])
                break
        return space, time.time() - start, ""
    except Exception as e:  # an over-large config is reported, the rest go on
        return space, time.time() - start, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def main(argv=None) -> int:
    from ..methods import BUILTIN_METHODS

    ap = argparse.ArgumentParser(description="Compile kernels ahead of time into Triton's cache.")
    ap.add_argument("--methods", default=",".join(BUILTIN_METHODS))
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--rd", default="128x128", help="comma-separated r x d pairs, e.g. 64x64,128x128")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--flags", default="plain", choices=["plain", "all"],
                    help="plain: decay and no decay, no states; all: every initial/final state combination too")
    ap.add_argument("--first", action="store_true", help="only each kernel's first fitting config")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    opts = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (it compiles for the GPU it runs on)")
    rds = [tuple(int(x) for x in rd.split("x")) for rd in opts.rd.split(",")]
    flags = [(dec, ini, st) for dec in (True, False) for ini in (False, True) for st in (False, True)]
    if opts.flags == "plain":
        flags = [(True, False, False), (False, False, False)]
    tasks = _tasks(opts.methods.split(","), opts.dtypes.split(","), rds, flags, opts.heads, opts.first)
    print(f"compiling {len(tasks)} kernel variants with {opts.workers} processes", flush=True)
    start, failed = time.time(), 0
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=opts.workers, mp_context=ctx) as pool:
        futures = [pool.submit(_compile, t) for t in tasks]
        for i, fut in enumerate(as_completed(futures), 1):
            space, secs, err = fut.result()
            if err:
                failed += 1
                print(f"  [{i}/{len(tasks)}] {space}: {err}", flush=True)
            elif i % 25 == 0 or i == len(tasks):
                print(f"  [{i}/{len(tasks)}] {time.time() - start:.0f} s", flush=True)
    print(f"compiled {len(tasks) - failed} of {len(tasks)} in {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
