"""Timing: one call's median and spread, the copy bandwidth and the memory floor.

On CUDA :func:`time_ms` is ``triton.testing.do_bench``'s median (p20/p80 beside it).
On the CPU it is the median of wall-clock samples.
"""
from __future__ import annotations

import gc
import math
import time
from typing import Any, Callable, Optional, Sequence

import torch

from .inputs import parse_dtype, resolve_device

__all__ = ["sync", "free_memory", "time_ms", "copy_bandwidth", "memory_floor_ms"]


def sync(device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def free_memory() -> None:
    """Drop unreferenced tensors and return cached GPU memory to the driver."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _quantiles(samples: Sequence[float], qs: Sequence[float]) -> list[float]:
    s = sorted(samples)
    out = []
    for q in qs:
        pos = q * (len(s) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append(s[lo] + (s[hi] - s[lo]) * (pos - lo))
    return out



def time_ms(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100, warm: bool = True,
            max_call_ms: Optional[float] = None, device=None) -> tuple[float, float, float]:
    """(median, p20, p80) milliseconds of one call of ``fn``.

    One warm call first (``warm=True``) so that compilation and autotuning are not timed.
    On CUDA, ``triton.testing.do_bench(fn, warmup_ms, rep_ms, quantiles=[0.5, 0.2, 0.8])``
    (it clears the L2 cache before each call).  A call slower than ``rep_ms / 3`` is
    timed three times with CUDA events instead, and one slower than ``max_call_ms`` only
    once, so that a slow method costs a few calls, not a dozen.  On CPU, wall-clock
    samples until ``rep_ms`` has passed (at least three).

    Example::

        >>> med, p20, p80 = time_ms(lambda: leettriton.linear_attention(b, c, v, 0.99))
    """
    device = resolve_device(device)
    if device.type == "cuda":
        if warm:
            fn()
        torch.cuda.synchronize(device)

        def one() -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        first = one()
        if max_call_ms is not None and first > max_call_ms:
            return first, first, first
        if first > rep_ms / 3:
            samples = [first, one(), one()]
        else:
            import triton.testing

            med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
            return float(med), float(p20), float(p80)
    else:
        if warm:
            fn()
        samples = []
        begin = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
            if max_call_ms is not None and len(samples) == 1 and samples[0] > max_call_ms:
                break
            elapsed = (time.perf_counter() - begin) * 1e3
            if (len(samples) >= 3 and elapsed >= rep_ms) or len(samples) >= 200:
                break
    med, p20, p80 = _quantiles(samples, (0.5, 0.2, 0.8))
    return med, p20, p80


_BANDWIDTH: dict[str, float] = {}


def copy_bandwidth(device=None, *, nbytes: Optional[int] = None, refresh: bool = False) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written).

    A ``nbytes`` buffer (default 1 GiB on CUDA, or a quarter of the free memory if less;
    64 MiB on CPU) copied into another, timed with :func:`time_ms`.  Measured once per
    device and process (``refresh=True`` measures again).
    """
    device = resolve_device(device)
    key = str(device)
    if key in _BANDWIDTH and not refresh and nbytes is None:
        return _BANDWIDTH[key]
    if nbytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            nbytes = min(1 << 30, free // 4)
        else:
            nbytes = 64 << 20
    numel = max(1, nbytes // 4)
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    med, _, _ = time_ms(lambda: dst.copy_(src), device=device, rep_ms=200)
    bw = 2 * numel * 4 / (med * 1e-3)
    del src, dst
    free_memory()
    _BANDWIDTH[key] = bw
    return bw


def memory_floor_ms(batch: int, heads: int, n: int, r: int, d: int, dtype, bandwidth: float) -> float:
    """Milliseconds to read b, c, v and write o once at ``bandwidth`` bytes/s."""
    esize = torch.empty((), dtype=parse_dtype(dtype)).element_size()
    nbytes = batch * heads * n * (2 * r + 2 * d) * esize
    return nbytes / bandwidth * 1e3
