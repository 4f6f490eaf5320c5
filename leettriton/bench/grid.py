"""The grid: every entry (a method, a peer, a user's function) on every cell, with budgets and ``--resume``.

:func:`run_grid` makes the inputs once per dtype, batch and n, the oracle once per decay,
and measures each entry with :func:`~leettriton.bench.cell.measure`; one result row
(:data:`~leettriton.bench.report.ROW_FIELDS`) per cell.  The grid's shapes are the
LeetDecoding paper's (``PAPER_*``), small ones on a CPU (``CPU_*``) and ``--quick``'s.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..api import linear_attention
from ..methods import BUILTIN_METHODS
from ..problem import Problem
from ..registry import UserMethod, canonical_method
from ..autotune.families import is_interpreting
from ..plan import choose
from ..reference import tolerance
from .cell import Measurement, measure, oracle
from .failures import DeviceFailure, first_line, is_fatal, is_oom, oom_text
from .inputs import decay_gammas, dtype_name, make_inputs, parse_dtype, resolve_device
from .peers import PEER_PRECISION
from .report import echo, progress_line, read_results
from .timing import copy_bandwidth, free_memory, memory_floor_ms, sync

__all__ = ["Entry", "method_entry", "peer_entry", "user_entry", "default_methods", "run_grid", "prime_autotuners",
           "cell_key", "resumable_rows", "grid_gamma"]

PAPER_SEQLENS = (128, 512, 2048, 8192, 12800, 25600, 100000)
PAPER_BATCHES = (1, 16)
PAPER_HEADS = 32
PAPER_RANK = PAPER_DIM = 128

# Small shapes for a machine without a GPU (the PyTorch methods on CPU).
CPU_SEQLENS = (64, 128, 256, 512)
CPU_BATCHES = (1, 2)
CPU_HEADS, CPU_RANK, CPU_DIM = 4, 32, 32
QUICK_SEQLENS = {"cuda": (512, 8192), "cpu": (32, 96)}
QUICK_BATCHES = {"cuda": (1, 16), "cpu": (1,)}
QUICK_SHAPE = {"cuda": (PAPER_HEADS, PAPER_RANK, PAPER_DIM), "cpu": (2, 16, 16)}


@dataclass
class Entry:
    """One line of the tables: a built-in method, a peer or a user's function."""

    label: str
    kind: str                                   # "triton", "torch", "auto", "peer", "user"
    make: Callable[..., Any]                    # make(b, c, v, gamma) -> zero-arg callable / Prepared
    precision: Optional[str] = None             # float32 products' precision, for the tolerance (peers: tf32)
    note: str = ""


def method_entry(name: str, label: Optional[str] = None) -> Entry:
    """An :class:`Entry` calling ``linear_attention(b, c, v, gamma, method=name)``, shown as ``label``."""
    name = canonical_method(name)
    kind = "auto" if name == "auto" else ("torch" if name.endswith("_torch") else
                                          ("triton" if name in BUILTIN_METHODS else "user"))

    def make(b, c, v, gamma):
        return lambda: linear_attention(b, c, v, gamma, method=name)

    return Entry(label or name, kind, make, note="" if label in (None, name) else f"runs {name}")


def peer_entry(name: str, factory: Callable) -> Entry:
    """An :class:`Entry` for a peer from :func:`~leettriton.bench.peers.peers` (float32 judged at the TF32 bound)."""
    return Entry(name, "peer", factory, precision=PEER_PRECISION)


def user_entry(fn: Callable, label: Optional[str] = None) -> Entry:
    """An :class:`Entry` calling ``fn(b, c, v, gamma)``: the user-method contract (docs/design.md §6)."""
    label = label or getattr(fn, "__name__", "user")
    method = UserMethod.wrap(fn)
    return Entry(label, "user", lambda b, c, v, gamma: (lambda: method(b, c, v, gamma)))


def default_methods(device) -> list[str]:
    """Every built-in method, its PyTorch version and ``auto`` on CUDA; the PyTorch versions on CPU."""
    device = resolve_device(device)
    torch_names = [f"{m}_torch" for m in BUILTIN_METHODS]
    if device.type == "cuda":
        return list(BUILTIN_METHODS) + torch_names + ["auto"]
    # Off the GPU, auto runs a PyTorch method -- or, under the interpreter, Triton kernels (too slow here).
    return torch_names + ([] if is_interpreting() else ["auto"])


def _auto_choice(b, c, v, gamma) -> str:
    try:
        p = Problem(b, c, v, gamma, None, v, None, "ieee")   # out is never written by choose()
        return f"auto → {choose(p)[0]}"
    except Exception as exc:  # noqa: BLE001  (informative only)
        return f"auto → ? ({first_line(exc)})"



PREDICT_FACTOR = 5.0
"""A cell predicted to take longer than this many budgets is skipped without being run."""


def _predicted_ms(history: Sequence[tuple], n: int) -> float:
    """Time at ``n`` extrapolated from the last two (n, ms) points, growth exponent clamped to [1, 2].

    With one point, linear growth (every method is at least linear in n); with none, 0.
    """
    if not history:
        return 0.0
    n1, t1 = history[-1]
    alpha = 1.0
    if len(history) >= 2:
        n0, t0 = history[-2]
        if n1 > n0 and t0 > 0 and t1 > 0:
            alpha = min(2.0, max(1.0, math.log(t1 / t0) / math.log(n1 / n0)))
    return t1 * (n / n1) ** alpha if n > n1 else t1


def run_grid(entries: Sequence[Entry], *, dtypes: Sequence, batches: Sequence[int], seqlens: Sequence[int],
             decays: Sequence[bool], heads: int, r: int, d: int, device=None, gamma=None, check: bool = True,
             budget_s: float = 2.0, warmup_ms: float = 25, rep_ms: float = 100, bandwidth: Optional[float] = None,
             seed: int = 0, log: Optional[Callable[[str], None]] = None,
             deadline: Optional[float] = None, done: Optional[Mapping[tuple, dict]] = None) -> list[dict]:
    """Measure every entry on every cell of the grid; one result row (:data:`ROW_FIELDS`) per cell.

    ``deadline`` (a ``time.time()`` value): cells reached after it are ``skipped``, so a run
    bounded in time still writes its tables.

    For each dtype, batch and n the inputs are made once; for each decay the oracle is
    computed once (on :func:`error_subset`) and shared by the entries.  Once an entry's
    cell takes longer than ``budget_s``, its larger n (same dtype, batch and decay) are
    ``skipped``; so is a cell whose time, extrapolated from the entry's two previous
    cells (:func:`_predicted_ms`), exceeds ``PREDICT_FACTOR × budget_s``.  ``gamma``
    replaces :func:`decay_gammas` for the decayed cells (a float or a ``(heads,)``
    tensor).  One progress line per cell goes to ``log``.

    ``done``: rows of an earlier run keyed by :func:`cell_key` (``--resume``); those cells
    are taken as they are, not measured again (their times still count for the budget).
    """
    device = resolve_device(device)
    show_floor = device.type == "cuda"   # a CPU's memory floor says nothing of the kernels: not printed
    done = done or {}
    log = log or echo
    bandwidth = bandwidth or copy_bandwidth(device)
    if done:
        try:
            prime_autotuners(entries, dtypes=dtypes, batch=batches[0], n=min(seqlens), decays=decays, heads=heads,
                             r=r, d=d, device=device, gamma=gamma, seed=seed, log=log)
        except DeviceFailure as exc:
            exc.rows = list(done.values())   # the earlier run's rows are kept
            raise
    rows: list[dict] = []
    over_budget: dict[tuple, str] = {}
    history: dict[tuple, list] = {}
    total = len(dtypes) * len(batches) * len(seqlens) * len(decays) * len(entries)
    count = 0
    for dt in dtypes:
        dt = parse_dtype(dt)
        for batch in batches:
            for n in sorted(seqlens):
                def pending(decay):
                    return any(cell_key(e.label, dt, batch, heads, n, r, d, decay) not in done for e in entries)

                inputs_note = None
                b = c = v = None
                try:
                    if any(pending(x) for x in decays):
                        b, c, v = make_inputs(batch, heads, n, r, d, dt, device, seed=seed)
                except Exception as exc:  # noqa: BLE001
                    if not is_oom(exc):
                        raise
                    b = c = v = None
                    inputs_note = f"inputs do not fit ({oom_text(exc)})"
                    free_memory()
                for decay in decays:
                    g = grid_gamma(decay, gamma, heads, device)
                    floor = memory_floor_ms(batch, heads, n, r, d, dt, bandwidth)
                    orc, orc_note = None, ""
                    if check and b is not None and pending(decay):
                        try:
                            orc = oracle(b, c, v, g)
                        except Exception as exc:  # noqa: BLE001
                            if not is_oom(exc):
                                raise
                            orc_note = "oracle OOM: error not checked"
                            free_memory()
                    for entry in entries:
                        count += 1
                        key = (dt, batch, decay, entry.label)
                        tol = tolerance(dt, entry.precision)
                        note = ""
                        earlier = done.get(cell_key(entry.label, dt, batch, heads, n, r, d, decay))
                        if earlier is not None:
                            rows.append(earlier)
                            if earlier.get("median_ms") is not None:
                                history.setdefault(key, []).append((n, earlier["median_ms"]))
                                if earlier["median_ms"] > budget_s * 1e3:
                                    over_budget[key] = (f"n = {n} took {earlier['median_ms'] / 1e3:.1f} s > budget "
                                                        f"{budget_s:g} s")
                            log(progress_line(count, total, earlier, floor=show_floor) + "  (from the earlier run)")
                            continue
                        if deadline is not None and time.time() > deadline:
                            m = Measurement("skipped", note="the run's time limit was reached")
                        elif b is None:
                            m = Measurement("OOM", note=inputs_note)
                        elif key in over_budget:
                            m = Measurement("skipped", note=over_budget[key])
                        elif _predicted_ms(history.get(key, []), n) > PREDICT_FACTOR * budget_s * 1e3:
                            pred = _predicted_ms(history[key], n)
                            over_budget[key] = (f"predicted ~{pred / 1e3:.0f} s at n = {n} from the smaller n "
                                                f"(> {PREDICT_FACTOR:g} × budget {budget_s:g} s)")
                            m = Measurement("skipped", note=over_budget[key])
                        else:
                            cold = budget_s * 1e3 if entry.kind in ("torch", "user") else None
                            try:
                                m = measure(lambda: entry.make(b, c, v, g), check=orc, tol=tol, device=device,
                                            warmup_ms=warmup_ms, rep_ms=rep_ms, budget_ms=budget_s * 1e3,
                                            cold_budget_ms=cold)
                            except DeviceFailure as exc:
                                # the faulting cell gets its row, so that --resume goes on after it
                                rows.append(dict(method=entry.label, kind=entry.kind, dtype=dtype_name(dt),
                                                 batch=batch, heads=heads, n=n, r=r, d=d, decay=bool(decay),
                                                 median_ms=None, p20_ms=None, p80_ms=None, floor_ms=floor,
                                                 ratio=None, rel_err=None, err_scope=None, tol=tol, correct=None,
                                                 status="error", note=f"kernel fault, the process stopped: {exc}"))
                                exc.rows = rows          # what was measured before the fault, and the fault
                                log(f"{entry.label} at {dtype_name(dt)} batch {batch} n {n}: {exc}")
                                raise
                            if m.median_ms is not None:
                                history.setdefault(key, []).append((n, m.median_ms))
                            if m.median_ms is not None and m.median_ms > budget_s * 1e3:
                                over_budget[key] = f"n = {n} took {m.median_ms / 1e3:.1f} s > budget {budget_s:g} s"
                            if entry.kind == "auto" and m.status in ("ok", "WRONG"):
                                note = _auto_choice(b, c, v, g)
                        notes = [x for x in (entry.note, note, m.note, orc_note if m.status in ("ok", "WRONG") else "")
                                 if x]
                        row = dict(method=entry.label, kind=entry.kind, dtype=dtype_name(dt), batch=batch, heads=heads,
                                   n=n, r=r, d=d, decay=bool(decay), median_ms=m.median_ms, p20_ms=m.p20_ms,
                                   p80_ms=m.p80_ms, floor_ms=floor,
                                   ratio=None if m.median_ms is None else m.median_ms / floor,
                                   rel_err=m.rel_err, err_scope=orc.scope if (orc is not None and m.rel_err is not None)
                                   else None, tol=tol,
                                   correct=None if m.rel_err is None else m.status != "WRONG",
                                   status=m.status, note="; ".join(notes))
                        rows.append(row)
                        log(progress_line(count, total, row, floor=show_floor))
                    orc = None
                b = c = v = None
                free_memory()
    return rows


def grid_gamma(decay: bool, gamma, heads: int, device) -> Optional[torch.Tensor]:
    """The ``(heads,)`` float32 γ of a decayed cell (``gamma``, or :func:`decay_gammas`), None without decay."""
    if not decay:
        return None
    if gamma is None:
        return decay_gammas(heads, device)
    if isinstance(gamma, torch.Tensor):
        return gamma.detach().reshape(heads).to(device=device, dtype=torch.float32)
    return torch.full((heads,), float(gamma), device=device, dtype=torch.float32)


PRIMED_KINDS = ("triton", "peer")


def prime_autotuners(entries: Sequence[Entry], *, dtypes: Sequence, batch: int, n: int, decays: Sequence[bool],
                     heads: int, r: int, d: int, device, gamma=None, seed: int = 0,
                     log: Optional[Callable[[str], None]] = None) -> list[str]:
    """Call every Triton method and peer once at the grid's first cell (per dtype and decay).

    The kernels' autotuners choose a config per key, and n is not in the key: a run over
    the grid tunes each at its first, smallest cell.  A resumed run starts in a fresh
    process at a later cell, where tuning would time every config at that (perhaps huge)
    shape -- minutes per kernel -- and then choose differently from the earlier run.
    Calling each entry once here first makes them choose where the earlier run did.
    Returns the labels primed; a failure is logged and left to the cell's own measurement.
    """
    log = log or echo
    primed = []
    for dt in dtypes:
        b, c, v = make_inputs(batch, heads, n, r, d, parse_dtype(dt), device, seed=seed)
        for decay in decays:
            g = grid_gamma(decay, gamma, heads, device)
            for entry in entries:
                if entry.kind not in PRIMED_KINDS:
                    continue
                try:
                    fn = entry.make(b, c, v, g)
                    fn()
                    primed.append(entry.label)
                except Exception as exc:  # noqa: BLE001  (its cells report it)
                    if is_fatal(exc):
                        raise DeviceFailure(first_line(exc)) from exc
                    log(f"priming {entry.label}: {type(exc).__name__}: {first_line(exc)}")
        b = c = v = None
        free_memory()
    sync(device)
    log(f"primed the autotuners of {len(set(primed))} methods at batch {batch}, n {n} (as the earlier run met them first)")
    return primed


def cell_key(method: str, dtype, batch: int, heads: int, n: int, r: int, d: int, decay: bool) -> tuple:
    """The identity of one cell of the grid (one row): what ``--resume`` matches on."""
    return (method, dtype_name(parse_dtype(dtype)), int(batch), int(heads), int(n), int(r), int(d), bool(decay))



def resumable_rows(path: str, meta: Mapping) -> dict:
    """The rows of an earlier run in ``path`` (a ``--json`` file) that ``--resume`` keeps, by :func:`cell_key`.

    Cells skipped for the run's time limit are measured again; every other row (a fault
    included) is kept.  The file must come from the same device and library versions.
    """
    old_meta, old_rows = read_results(path, "--resume")
    for k in ("device", "torch", "triton", "leettriton"):
        if old_meta.get(k) != meta.get(k):
            raise ValueError(f"--resume: {path} was measured with {k} = {old_meta.get(k)!r}, this run has "
                             f"{meta.get(k)!r}; resume only a run of the same device and versions")
    return {cell_key(x["method"], x["dtype"], x["batch"], x["heads"], x["n"], x["r"], x["d"], x["decay"]): x
            for x in old_rows if not (x["status"] == "skipped" and "time limit" in (x.get("note") or ""))}
