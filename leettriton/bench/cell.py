"""One cell of a benchmark: the float64 oracle on a subset, then :func:`measure` (prepare, check, time).

:func:`measure` never raises for the usual failures (not implemented, out of memory, an
exception): they become the cell's status.  Only a kernel fault that leaves the CUDA
context unusable raises (:class:`~leettriton.bench.failures.DeviceFailure`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..reference import reference
from .failures import DeviceFailure, first_line, is_fatal, is_oom, oom_text
from .inputs import resolve_device
from .timing import free_memory, sync, time_ms

__all__ = ["ERR_MAX_ROWS", "rel_error", "error_subset", "Oracle", "oracle", "Measurement", "measure"]

ERR_MAX_ROWS = 1 << 21
"""Most (batch, head, position) rows the oracle computes for one cell (1 GiB of float64 output at d = 128)."""


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 on ref's device; NaN when out holds a NaN or an infinity."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output of shape {tuple(out.shape)} cannot be compared with the reference's "
                         f"{tuple(ref.shape)}")
    # one leading slice at a time: the float64 copies of a long output (1 M rows × 32 heads × 128 in
    # bfloat16 would be 32 GB whole) stay the size of one slice
    num2 = den2 = 0.0
    for o_part, r_part in zip(_slices(out.detach()), _slices(ref)):
        o_part = o_part.to(device=ref.device, dtype=torch.float64)
        if not bool(torch.isfinite(o_part).all()):
            return float("nan")
        r_part = r_part.to(torch.float64)
        num2 += torch.linalg.vector_norm(o_part - r_part).item() ** 2
        den2 += torch.linalg.vector_norm(r_part).item() ** 2
    num, den = num2 ** 0.5, den2 ** 0.5
    return num / den if den > 0 else num


def _slices(x: torch.Tensor):
    """``x`` cut along its leading dimensions into slices of at most 2^25 elements (whole rows kept)."""
    if x.dim() <= 1 or x.numel() <= 1 << 25:
        yield x
        return
    for part in x.unbind(0):
        yield from _slices(part)


def error_subset(batch: int, heads: int, n: int, max_rows: int = ERR_MAX_ROWS) -> tuple[list, list, str]:
    """Batch and head indices on which to compute the error, and a label like ``"b1/16 h20/32"``.

    Everything when batch·heads·n ≤ ``max_rows``; otherwise evenly spaced batch elements,
    then evenly spaced heads (the first and the last included: the extreme decays).
    """
    pairs = max(1, max_rows // max(n, 1))
    if batch * heads <= pairs:
        return list(range(batch)), list(range(heads)), "all"
    nb = max(1, min(batch, pairs // heads))
    nh = max(1, min(heads, pairs // nb))

    def spread(k, total):
        if k >= total:
            return list(range(total))
        if k == 1:
            return [0]
        return sorted({round(i * (total - 1) / (k - 1)) for i in range(k)})

    bi, hi = spread(nb, batch), spread(nh, heads)
    return bi, hi, f"b{len(bi)}/{batch} h{len(hi)}/{heads}"


def _select(x: torch.Tensor, bi: list, hi: list) -> torch.Tensor:
    if len(bi) < x.shape[0]:
        x = x.index_select(0, torch.tensor(bi, device=x.device))
    if len(hi) < x.shape[1]:
        x = x.index_select(1, torch.tensor(hi, device=x.device))
    return x


@dataclass
class Oracle:
    """The float64 reference output on a subset of (batch, head) pairs."""

    ref: torch.Tensor
    bi: list
    hi: list
    scope: str

    def error(self, out_bhnd: torch.Tensor) -> float:
        return rel_error(_select(out_bhnd, self.bi, self.hi), self.ref)


def oracle(b, c, v, gamma, *, max_rows: int = ERR_MAX_ROWS) -> Oracle:
    """The fp64 oracle (:func:`leettriton.reference`) for bhnd inputs, on :func:`error_subset`."""
    B, H, n, _ = b.shape
    bi, hi, scope = error_subset(B, H, n, max_rows)
    g = None if gamma is None else _select(gamma.view(1, -1), [0], hi).view(-1)
    ref = reference(_select(b, bi, hi), _select(c, bi, hi), _select(v, bi, hi), g)
    return Oracle(ref, bi, hi, scope)


@dataclass
class Measurement:
    """What :func:`measure` found for one cell."""

    status: str                       # "ok", "WRONG", "n/a", "OOM", "error", "skipped"
    median_ms: Optional[float] = None
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    rel_err: Optional[float] = None
    note: str = ""


def measure(prepare: Callable[[], Callable[[], Any]], *, to_bhnd: Optional[Callable] = None,
            check: Optional[Oracle] = None, tol: Optional[float] = None, device=None, warmup_ms: float = 25,
            rep_ms: float = 100, budget_ms: Optional[float] = None, cold_budget_ms: Optional[float] = None,
            timed: bool = True) -> Measurement:
    """Prepare, warm up, check and time one method on one problem, never raising for the usual failures.

    ``prepare()`` returns the zero-argument call to time (a :class:`Prepared` brings its own
    ``to_bhnd``).  The warm call's output is compared with ``check`` (an :class:`Oracle`)
    when given: an error above ``tol`` (or a NaN) gives status ``"WRONG"`` — the time is
    still measured.  ``NotImplementedError`` gives ``"n/a"``, running out of memory
    ``"OOM"`` (memory is freed and the caller can go on), any other exception ``"error"``
    with its first line in ``note``.  A kernel fault that leaves the CUDA context unusable
    raises :class:`DeviceFailure`.

    ``budget_ms``: a call slower than this is timed once only.  ``cold_budget_ms``: when
    the warm call alone takes longer (meant for methods that compile nothing), its time is
    reported as the measurement and nothing more is run.  ``timed=False``: one call, checked,
    not timed.
    """
    device = resolve_device(device)
    result = Measurement("error")
    fatal = None
    stage = "preparing the inputs"
    fn = out = None
    try:
        fn = prepare()
        stage = "running"
        if to_bhnd is None:
            to_bhnd = getattr(fn, "to_bhnd", lambda o: o)
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        cold_ms = (time.perf_counter() - t0) * 1e3
        if check is not None:
            result.rel_err = check.error(to_bhnd(out))
        out = None
        if not timed:
            pass
        elif cold_budget_ms is not None and cold_ms > cold_budget_ms:
            result.median_ms = result.p20_ms = result.p80_ms = cold_ms
            result.note = f"timed once (first call {cold_ms / 1e3:.1f} s)"
        else:
            result.median_ms, result.p20_ms, result.p80_ms = time_ms(
                fn, warm=False, warmup_ms=warmup_ms, rep_ms=rep_ms, max_call_ms=budget_ms, device=device)
            if budget_ms is not None and result.median_ms > budget_ms:
                result.note = "timed once"
        bad = result.rel_err is not None and tol is not None and not (result.rel_err <= tol)
        result.status = "WRONG" if bad else "ok"
    except NotImplementedError as exc:
        result = Measurement("n/a", note=first_line(exc))
    except Exception as exc:  # noqa: BLE001  (one failing cell must not end the run)
        if is_oom(exc):
            result = Measurement("OOM", note=f"while {stage}: {oom_text(exc)}")
        else:
            result = Measurement("error", note=first_line(exc))
            if is_fatal(exc):
                fatal = first_line(exc)
    fn = out = None  # noqa: F841  (drop the prepared inputs and the output before freeing)
    if result.status in ("OOM", "error"):
        try:
            free_memory()
        except Exception as exc:  # noqa: BLE001  (a fault of the failed call, reported late)
            if not is_fatal(exc):
                raise
            fatal = fatal or first_line(exc)
    if fatal is not None:
        raise DeviceFailure(fatal)
    return result
