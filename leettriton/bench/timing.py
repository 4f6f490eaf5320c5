"""Timing: one call's median and spread, the copy bandwidth and the memory floor.

On CUDA :func:`time_ms` is ``triton.testing.do_bench``'s median (p20/p80 beside it).
On the CPU it is :func:`cpu_time_ms`: wall-clock (``time.perf_counter``) samples after
warm-up calls, on one thread, garbage collection paused.  CPU times are those of the PyTorch methods
(or the Triton interpreter) on small shapes: they say nothing of GPU performance.
"""
from __future__ import annotations

import gc
import math
import time
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from .inputs import parse_dtype, resolve_device

__all__ = ["sync", "free_memory", "time_ms", "cpu_time_ms", "graph_replay", "copy_bandwidth", "memory_floor_ms"]

CPU_MIN_SAMPLES = 5
"""Fewest timed calls behind a CPU median (a call slower than a third of ``rep_ms``: three)."""
CPU_MAX_SAMPLES = 200
"""Most timed calls behind a CPU median."""
CPU_THREADS = 1
"""PyTorch intra-op threads while timing on the CPU (:func:`cpu_time_ms`)."""


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
    once, so that a slow method costs a few calls, not a dozen.  On CPU, :func:`cpu_time_ms`.

    Example::

        >>> med, p20, p80 = time_ms(lambda: leettriton.linear_attention(b, c, v, 0.99))
    """
    device = resolve_device(device)
    if device.type != "cuda":
        return cpu_time_ms(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, warm=warm, max_call_ms=max_call_ms)
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
    med, p20, p80 = _quantiles(samples, (0.5, 0.2, 0.8))
    return med, p20, p80


def graph_replay(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` (a call on the current CUDA device) captured once in a CUDA graph: the graph's ``replay``, which
    runs the call's kernels and nothing of the host's (timed with :func:`time_ms`: the GPU time alone).

    ``fn`` runs once on the capture stream first (compiling and tuning there, as torch asks of a capture);
    a call that cannot be captured (a device sync, a host read of a device value) raises torch's
    ``RuntimeError``, and so does one whose capture recorded no work (its kernels went to another stream or
    device, or it launched none): its replay would be timed at nothing.  The replay's outputs live in the
    graph's own memory, kept while the replay is.

    Example::

        >>> replay = graph_replay(lambda: leettriton.linear_attention(b, c, v, 0.99))
        >>> med, p20, p80 = time_ms(replay, warm=False)
    """
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph, stream=stream):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for w in caught:
        if EMPTY_GRAPH in str(w.message):   # torch says so only as a warning, when the capture ends
            raise RuntimeError("graph_replay: the call's capture recorded no work (its kernels ran on another "
                               "stream or device, or it launched none); its replay would be timed at nothing")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return graph.replay


EMPTY_GRAPH = "The CUDA Graph is empty"
"""How torch's warning at the end of a capture that recorded nothing begins (:func:`graph_replay`)."""


def cpu_time_ms(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100, warm: bool = True,
                max_call_ms: Optional[float] = None,
                threads: Optional[int] = CPU_THREADS) -> tuple[float, float, float]:
    """(median, p20, p80) wall-clock milliseconds of one call of ``fn`` on the CPU.

    One warm call (``warm=True``), then one timed call: if it is slower than ``max_call_ms``
    it is the measurement, and if slower than ``rep_ms / 3`` two more are timed (three in
    all).  Otherwise ``fn`` runs untimed for ``warmup_ms`` (allocator, caches),
    then is timed call by call with ``time.perf_counter`` until ``rep_ms`` has passed and at
    least :data:`CPU_MIN_SAMPLES` calls were timed (at most :data:`CPU_MAX_SAMPLES`).  The
    garbage collector is paused meanwhile, so that one call does not pay for the others.

    ``threads``: PyTorch's intra-op threads while timing (default :data:`CPU_THREADS`, one;
    None leaves the setting alone).  On the small shapes a CPU run uses, a thread pool gains
    nothing, and on a busy machine each call waits for its descheduled workers: timings
    then come in multiples of the scheduler's tick, far longer than the call, whatever
    the method.

    Example::

        >>> med, p20, p80 = cpu_time_ms(lambda: leettriton.linear_attention(b, c, v, 0.99))
    """
    def one() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    if warm:
        fn()
    collecting = gc.isenabled()
    threads_before = torch.get_num_threads()
    gc.disable()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        begin = time.perf_counter()
        first = one()
        if max_call_ms is not None and first > max_call_ms:
            return first, first, first
        if first > rep_ms / 3:
            samples = [first, one(), one()]
        else:
            while (time.perf_counter() - begin) * 1e3 < warmup_ms:
                fn()
            samples = []
            begin = time.perf_counter()
            while len(samples) < CPU_MAX_SAMPLES and (len(samples) < CPU_MIN_SAMPLES
                                                      or (time.perf_counter() - begin) * 1e3 < rep_ms):
                samples.append(one())
    finally:
        if threads is not None:
            torch.set_num_threads(threads_before)
        if collecting:
            gc.enable()
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
