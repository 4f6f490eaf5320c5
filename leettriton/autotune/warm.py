"""Compile kernels ahead of their first launch, in parallel processes (GPU machine).

The autotuner compiles every config of a kernel, one after another, the first
time it meets a key; with a few dozen configs and several dtypes and flags that
is minutes.  This fills Triton's on-disk cache first, with one process per
core, so that tuning, benchmarks and tests find their kernels compiled::

    python -m leettriton.autotune.warm --dtypes float16,bfloat16 --workers 16
    python -m leettriton.autotune.warm --methods lightning_attention --first   # first config only
    python -m leettriton.autotune.warm --shapes 1x1024,1x8192,3x3000            # batch x n, at --heads

Launches are recorded on the ``meta`` device (no memory touched), so the
compiled signatures are exactly those of a real launch of the given shape.  A
shape's schedule decides which variants a method launches (batch 1 at long n:
the segmented walk, the segment-state pass and the scan), so ``--shapes`` names
the ones a run will meet; a kernel variant that two shapes share (the same
constexprs and the same specialization of its other arguments) is compiled once.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch


def _specialization(kernel, args) -> tuple:
    """What Triton compiles a launch of ``kernel`` with ``args`` for: its constexprs' values, and of its other
    arguments what Triton specializes on (a tensor's dtype; an integer's being 1, a multiple of 16, 32-bit),
    so that launches of one variant at different shapes are told apart from those of another variant."""
    constexpr, unspecialized = _kinds_of_params(kernel.fn)

    def key(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", str(value.dtype))
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, int):
            return ("int", value == 1, value % 16 == 0, -2 ** 31 <= value < 2 ** 31)
        if isinstance(value, float):
            return ("float",)
        if isinstance(value, (tuple, list)):
            return tuple(key(x) for x in value)
        return repr(value)

    out = []
    for name, value in sorted(args.items()):
        if name in constexpr:
            out.append((name, repr(value)))   # its value is compiled in
        elif name in unspecialized:
            out.append((name, type(value).__name__))
        else:
            out.append((name, key(value)))
    return tuple(out)


def _kinds_of_params(fn) -> tuple[set, set]:
    """({constexpr parameters}, {parameters not specialized}) of a ``triton.jit`` function: from its
    ``params`` when compiled for a GPU; under the interpreter from the Python function's annotations."""
    if hasattr(fn, "params"):
        return ({p.name for p in fn.params if p.is_constexpr},
                {p.name for p in fn.params if p.do_not_specialize})
    import inspect

    signature = inspect.signature(getattr(fn, "fn", fn))
    return ({name for name, p in signature.parameters.items() if "constexpr" in str(p.annotation)}, set())


def _tasks(methods, dtypes, rds, flags, heads, first, shapes=((1, 1024),)):
    """One task per kernel variant and config that the given methods launch at ``shapes`` ((batch, n) pairs, at
    ``heads``), dtypes, widths and flags (decay, initial state, final state): :func:`cases_tasks`."""
    return cases_tasks([(method, dtype, r, d, decay, initial, state, batch, heads, n)
                        for method, dtype, (r, d), (decay, initial, state), (batch, n)
                        in itertools.product(methods, dtypes, rds, flags, shapes)], first)


def cases_tasks(cases, first=False) -> list:
    """One compile task per kernel variant and config that ``cases`` launch, each case (method, dtype name, r,
    d, decay, initial state, final state, batch, heads, n); a variant met again (another case, another method
    sharing the kernel) is not listed twice.  ``first``: only each kernel's first fitting config."""
    from .configs import config_dict  # noqa: F401
    from .families import current_family
    from .record import record_launches

    family = current_family()
    tasks, listed = [], set()
    for method, dtype, r, d, decay, initial, state, batch, heads, n in cases:
        calls = record_launches(method, getattr(torch, dtype), B=batch, H=heads, n=n, r=r, d=d, decay=decay,
                                initial=initial, state=state)
        seen = set()
        for kernel, args in calls:
            if kernel.space.name in seen:
                continue
            seen.add(kernel.space.name)
            variant = (kernel.space.name, _specialization(kernel, args))
            configs = kernel.space.usable(family, args)
            for cfg in configs[:1] if first else configs:
                if (variant, repr(sorted(cfg.items()))) in listed:
                    continue
                listed.add((variant, repr(sorted(cfg.items()))))
                tasks.append((method, dtype, r, d, decay, initial, state, heads, kernel.space.name, cfg, batch, n))
    return tasks


def compile_tasks(tasks, workers: int) -> int:
    """Compile ``tasks`` (:func:`cases_tasks`) into Triton's on-disk cache in ``workers`` processes, printing
    progress and each failure (an over-large config is reported, the rest go on); the number that failed."""
    print(f"compiling {len(tasks)} kernel variants with {workers} processes", flush=True)
    start, failed = time.time(), 0
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_compile, t) for t in tasks]
        for i, fut in enumerate(as_completed(futures), 1):
            space, secs, err = fut.result()
            if err:
                failed += 1
                print(f"  [{i}/{len(tasks)}] {space}: {err}", flush=True)
            elif i % 25 == 0 or i == len(tasks):
                print(f"  [{i}/{len(tasks)}] {time.time() - start:.0f} s", flush=True)
    print(f"compiled {len(tasks) - failed} of {len(tasks)} in {time.time() - start:.0f} s", flush=True)
    return failed


def _compile(task) -> tuple[str, float, str]:
    method, dtype, r, d, decay, initial, state, heads, space, cfg, batch, n = task
    from .record import record_launches

    start = time.time()
    try:
        for kernel, args in record_launches(method, getattr(torch, dtype), B=batch, H=heads, n=n, r=r, d=d,
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
    ap.add_argument("--shapes", default="1x1024",
                    help="comma-separated BATCHxN at --heads, whose launches to compile (e.g. 1x1024,1x8192)")
    ap.add_argument("--flags", default="plain", choices=["plain", "all"],
                    help="plain: decay and no decay, no states; all: every initial/final state combination too")
    ap.add_argument("--first", action="store_true", help="only each kernel's first fitting config")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    opts = ap.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in shape.split("x")) for shape in opts.shapes.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        ap.error(f"--shapes takes BATCHxN pairs (e.g. 1x1024,1x8192), not {opts.shapes!r}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (it compiles for the GPU it runs on)")
    rds = [tuple(int(x) for x in rd.split("x")) for rd in opts.rd.split(",")]
    flags = [(dec, ini, st) for dec in (True, False) for ini in (False, True) for st in (False, True)]
    if opts.flags == "plain":
        flags = [(True, False, False), (False, False, False)]
    tasks = _tasks(opts.methods.split(","), opts.dtypes.split(","), rds, flags, opts.heads, opts.first, shapes)
    compile_tasks(tasks, opts.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
