"""A researcher's own method: checked against the fp64 oracle, then timed beside the built-in ones."""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from ..methods import BUILTIN_METHODS
from ..reference import reference, tolerance
from .cell import rel_error
from .failures import first_line
from .grid import default_methods, grid_gamma, method_entry, run_grid, user_entry
from .inputs import dtype_name, make_inputs, parse_dtype, resolve_device
from .report import echo, format_tables

__all__ = ["benchmark_method"]


def benchmark_method(fn: Callable, device="cuda", dtype="float16", batch_size: int = 1, is_weight_decay: bool = True,
                     gamma=None, seqlens: Optional[Sequence[int]] = None, heads: int = 32, rank: int = 128,
                     dim: int = 128, *, methods: Optional[Sequence[str]] = None, name: Optional[str] = None,
                     budget_s: float = 2.0, rep_ms: float = 100, verbose: bool = True) -> list[dict]:
    """Check a method of your own against the fp64 oracle, then time it beside ``auto`` and the built-ins.

    Args:
        fn: ``fn(b, c, v, gamma) -> o`` with ``b, c`` ``(batch, heads, n, rank)`` and ``v``
            ``(batch, heads, n, dim)`` tensors (layout bhnd), ``gamma`` a ``(heads,)`` float32
            tensor or None (no decay); ``o`` is ``(batch, heads, n, dim)``.
        device: ``"cuda"`` (default; falls back to ``"cpu"``, with a message, without a GPU) or ``"cpu"``.
        dtype: ``"float16"`` (default), ``"bfloat16"`` or ``"float32"``.
        batch_size, heads, rank, dim: the problem (the paper's heads 32, r = d = 128 by default).
        is_weight_decay: use a decay γ per head (:func:`decay_gammas`, 0.969 … 0.996) — or
            ``gamma`` (a float or a ``(heads,)`` tensor) when given.
        seqlens: sequence lengths to time; default (512, 2048, 8192, 25600) on CUDA and
            (64, 128, 256) on CPU.
        methods: methods to time beside ``fn`` (default: ``auto`` and the six Triton
            methods on CUDA, the PyTorch methods on CPU).

    First ``fn`` runs on a small problem (batch min(batch_size, 2), n = 300) and its
    relative error against :func:`leettriton.reference` is printed; above the dtype's
    tolerance (float32 1e-5, float16 2e-3, bfloat16 1e-2) every row of ``fn`` is
    flagged ``WRONG`` — it is still timed.  Each timed cell is checked too.

    Returns:
        The result rows (dicts with the keys of :data:`~leettriton.bench.report.ROW_FIELDS`); the table
        is printed.

    Example::

        >>> def mine(b, c, v, gamma):
        ...     return leettriton.linear_attention(b, c, v, gamma, method="block_based")
        >>> rows = leettriton.benchmark_method(mine, dtype="float16", batch_size=16)
    """
    log = echo if verbose else (lambda _s: None)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log("benchmark_method: no CUDA device here; running on the CPU with the PyTorch methods")
        dev = torch.device("cpu")
    dev = resolve_device(dev)
    dt = parse_dtype(dtype)
    if seqlens is None:
        seqlens = (512, 2048, 8192, 25600) if dev.type == "cuda" else (64, 128, 256)
    if methods is None:
        methods = (["auto"] + list(BUILTIN_METHODS)) if dev.type == "cuda" else default_methods(dev)
    label = name or f"yours: {getattr(fn, '__name__', 'fn')}"
    tol = tolerance(dt)

    # 1. correctness on a small problem
    cb = max(1, min(batch_size, 2))
    cn = 300
    b, c, v = make_inputs(cb, heads, cn, rank, dim, dt, dev, seed=1)
    g = grid_gamma(is_weight_decay, gamma, heads, dev)
    what = (f"batch {cb}, heads {heads}, n {cn}, r {rank}, d {dim}, {dtype_name(dt)}, "
            f"{'with decay' if g is not None else 'no decay'}")
    check_err, check_msg = None, ""
    try:
        with torch.no_grad():
            out = fn(b, c, v, g)
            check_err = rel_error(out, reference(b, c, v, g))
    except Exception as exc:  # noqa: BLE001  (reported, then timed anyway)
        check_msg = f"check failed: {first_line(exc)}"
    del b, c, v
    correct = check_err is not None and check_err <= tol
    if check_err is not None:
        if correct:
            check_msg = f"check ({what}): rel err {check_err:.2e} ≤ tolerance {tol:.0e}: correct"
        else:
            shown = "NaN/inf" if math.isnan(check_err) else f"{check_err:.2e}"
            check_msg = (f"check ({what}): rel err {shown} > tolerance {tol:.0e}: WRONG — the output does not match "
                         f"the fp64 oracle (timed anyway)")
    log(f"benchmark_method: {check_msg}")

    # 2. timing beside the built-in methods
    entries = [user_entry(fn, label)] + [method_entry(m) for m in methods]
    entries[0].note = "" if correct else "failed the correctness check"
    with torch.no_grad():
        rows = run_grid(entries, dtypes=[dt], batches=[batch_size], seqlens=seqlens, decays=[g is not None],
                        heads=heads, r=rank, d=dim, device=dev, gamma=gamma if is_weight_decay else None,
                        budget_s=budget_s, rep_ms=rep_ms, log=log)
    for row in rows:
        if row["method"] == label:
            row["check_rel_err"] = check_err
            row["check_ok"] = correct
            if not correct and row["status"] == "ok":
                row["status"] = "WRONG"
    log("")
    log(format_tables(rows))
    return rows
