"""``python -m leettriton.bench``: every method over the LeetDecoding paper's grid, printed as its tables.

The grid is the paper's: heads 32, r = d = 128, batch 1 and 16,
n ∈ {128, 512, 2048, 8192, 12800, 25600, 100000}, with and without decay, here in
float16 by default (``--dtype``).  Each cell reports

* the median time of one call (``triton.testing.do_bench``, p20/p80 beside it),
  after a warm call that absorbs compilation and autotuning;
* the ratio to the **memory floor**: the bytes of b, c, v and o read/written once,
  divided by the copy bandwidth measured at the start of the run;
* the relative error ‖o − o_ref‖ / ‖o_ref‖ against the float64 oracle
  (:func:`leettriton.reference`, computed in float64 on the inputs' device).  When
  batch·heads·n exceeds :data:`ERR_MAX_ROWS` rows, the error is taken on an evenly
  spaced subset of batch elements and heads (always the whole sequence, so late
  positions are checked); the row's ``err_scope`` says which, e.g. ``b1/16 h20/32``;
* ``OOM`` where memory runs out, ``n/a`` for a method that is not implemented,
  ``skipped`` for the larger n of a method once one of its cells took longer than
  the cell budget (``--budget-s``, 2 s by default) or is predicted, from its smaller
  n, to take more than five budgets.

Decay: γ_h = 1 − 2^(−5 − 3·h/(H−1)) for head h of H (:func:`decay_gammas`), which spans
0.969 … 0.996 as in BASELINES.md (RetNet's choice stretched over the heads).  Inputs are
standard normal, b scaled by r^(−1/2) as a caller scales queries.

    python -m leettriton.bench                                # the full grid, fp16
    python -m leettriton.bench --quick                        # about a minute
    python -m leettriton.bench --dtype bfloat16 --methods lightning_attention,block_based --peers
    python -m leettriton.bench --json bench.json --csv bench.csv --plot bench.png
    python -m leettriton.bench --json bench.json --resume     # go on with an interrupted run
    python -m leettriton.bench --from-json bench.json --plot bench.png   # tables and plot, no measuring

A kernel fault (a peer's, say) leaves the CUDA context unusable: the run then stops,
writes what it measured with the faulting cell marked ``error``, and exits 1;
``--resume`` in a fresh process keeps those cells and measures the rest.  On a machine
without a GPU it runs the PyTorch methods on small shapes.

The module's helpers (:func:`time_ms`, :func:`copy_bandwidth`, :func:`memory_floor_ms`,
:func:`environment`, :func:`make_inputs`, :func:`decay_gammas`, :func:`peers`,
:func:`rel_error`, :func:`measure`, :func:`write_results`) are shared by the scripts in
``perf/``, and :func:`benchmark_method` times a researcher's own method beside the
built-in ones.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch

from .. import api
from ..api import BUILTIN_METHODS, linear_attention
from ..autotune.families import is_interpreting
from ..reference import reference

__all__ = [
    "benchmark_method", "main", "time_ms", "copy_bandwidth", "memory_floor_ms", "environment", "make_inputs",
    "decay_gammas", "peers", "peer_decode", "rel_error", "measure", "write_results", "write_csv", "format_tables",
    "gpu_slug", "parse_dtype", "markdown_table", "dtype_name", "error_subset", "oracle", "Oracle", "Measurement",
    "Prepared", "Entry", "method_entry", "peer_entry", "user_entry", "run_grid", "default_device", "default_methods",
    "free_memory", "sync", "plot", "DeviceFailure", "TOLERANCES", "TF32_TOLERANCE", "ROW_FIELDS", "CHUNKED_PEERS",
]

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

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
"""Relative-error bound per input dtype (DESIGN §6; float32 is for precision "ieee")."""
TF32_TOLERANCE = 2e-3
"""Bound for float32 computed through TF32 (the peers do this by design)."""

ERR_MAX_ROWS = 1 << 21
"""Most (batch, head, position) rows the oracle computes for one cell (1 GiB of float64 output at d = 128)."""

ROW_FIELDS = ["method", "kind", "dtype", "batch", "heads", "n", "r", "d", "decay", "median_ms", "p20_ms", "p80_ms",
              "floor_ms", "ratio", "rel_err", "err_scope", "tol", "correct", "status", "note"]
"""Keys of every result row (CSV column order)."""

_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


# --------------------------------------------------------------------------- small helpers

def parse_dtype(x) -> torch.dtype:
    """``torch.float16`` from ``"float16"``, ``"fp16"``, ``"half"`` or a dtype (likewise bf16, fp32)."""
    if isinstance(x, torch.dtype):
        if x not in TOLERANCES:
            raise ValueError(f"dtype must be float16, bfloat16 or float32, got {x}")
        return x
    if not isinstance(x, str) or x.lower() not in _DTYPES:
        raise ValueError(f"dtype must be one of float16, bfloat16, float32 (or fp16, bf16, fp32), got {x!r}")
    return _DTYPES[x.lower()]


def dtype_name(dtype: torch.dtype) -> str:
    """``"float16"`` for ``torch.float16``."""
    return str(dtype).replace("torch.", "")


def default_device() -> torch.device:
    """``cuda`` when a GPU is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _device(device) -> torch.device:
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def sync(device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def free_memory() -> None:
    """Drop unreferenced tensors and return cached GPU memory to the driver."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def decay_gammas(heads: int, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One γ per head, γ_h = 1 − 2^(−5 − 3·h/(H−1)): 0.96875 for head 0 … 0.99609 for the last.

    The paper's range of per-head decays (BASELINES.md), RetNet's ``1 − 2^(−5−h)`` spread
    evenly in the exponent over however many heads there are.  Shape ``(heads,)``.
    """
    h = torch.arange(heads, dtype=torch.float64)
    x = h / max(heads - 1, 1)
    return (1.0 - torch.exp2(-5.0 - 3.0 * x)).to(device=device or "cpu", dtype=dtype)


def make_inputs(batch: int, heads: int, n: int, r: int, d: int, dtype=torch.float16, device=None, *,
                seed: int = 0, layout: str = "bhnd") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random b, c ``(·, r)`` and v ``(·, d)``: standard normal (never zeros), b scaled by r^(−1/2).

    ``layout="bhnd"`` gives ``(batch, heads, n, ·)``, ``"bnhd"`` gives ``(batch, n, heads, ·)``;
    both contiguous.  The same seed gives the same numbers.
    """
    dtype = parse_dtype(dtype)
    device = _device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def shape(k):
        return (batch, heads, n, k) if layout == "bhnd" else (batch, n, heads, k)

    b = torch.randn(shape(r), generator=gen, device=device, dtype=dtype)
    b.mul_(r ** -0.5)
    c = torch.randn(shape(r), generator=gen, device=device, dtype=dtype)
    v = torch.randn(shape(d), generator=gen, device=device, dtype=dtype)
    return b, c, v


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 on ref's device; NaN when out holds a NaN or an infinity."""
    o = out.detach().to(device=ref.device, dtype=torch.float64)
    if tuple(o.shape) != tuple(ref.shape):
        raise ValueError(f"output of shape {tuple(out.shape)} cannot be compared with the reference's "
                         f"{tuple(ref.shape)}")
    if not bool(torch.isfinite(o).all()):
        return float("nan")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(o - ref).item()
    return num / den if den > 0 else num


def _quantiles(samples: Sequence[float], qs: Sequence[float]) -> list[float]:
    s = sorted(samples)
    out = []
    for q in qs:
        pos = q * (len(s) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append(s[lo] + (s[hi] - s[lo]) * (pos - lo))
    return out


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


_FATAL_MARKERS = ("illegal memory access", "unspecified launch failure", "device-side assert", "misaligned address",
                  "an illegal instruction", "cuda error: unknown error")


class DeviceFailure(RuntimeError):
    """The CUDA context is unusable after a kernel fault: later cells cannot be measured.

    Raised out of :func:`run_grid` with ``rows``: the rows measured before the fault.
    """

    rows: list = []


def _is_fatal(exc: BaseException) -> bool:
    return any(m in str(exc).lower() for m in _FATAL_MARKERS)


def _oom_text(exc: BaseException) -> str:
    m = re.search(r"Tried to allocate [\d.]+ [KMGT]?i?B", str(exc))
    return m.group(0).lower() if m else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


# --------------------------------------------------------------------------- timing

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
    device = _device(device)
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
    device = _device(device)
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


# --------------------------------------------------------------------------- environment

def _git(*args) -> Optional[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        res = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def gpu_slug(name: str) -> str:
    """A short folder name for a device: ``"NVIDIA H100 80GB HBM3"`` → ``"h100"``, ``"cpu"`` → ``"cpu"``."""
    tokens = [t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in ("nvidia", "geforce", "tesla", "quadro")]
    if not tokens:
        return "unknown"
    if re.search(r"\d", tokens[0]) or len(tokens) == 1:
        return tokens[0]
    return f"{tokens[0]}-{tokens[1]}"


def environment(device=None) -> dict:
    """Where a measurement was taken: device, versions, git SHA, date (no host name).

    Keys: ``device`` (GPU name or ``"cpu"``), ``device_slug``, ``capability``, ``sm_count``,
    ``memory_gib``, ``family``, ``torch``, ``triton``, ``cuda``, ``python``, ``leettriton``,
    ``git_sha`` (``LEETTRITON_GIT_SHA`` when set: a tree copied without its git metadata), ``git_dirty``, ``date`` (UTC, ISO 8601), ``interpreter``, ``platform``.
    """
    import triton

    from .. import __version__

    device = _device(device)
    env: dict[str, Any] = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2 ** 30, 1))
    else:
        env.update(device="cpu", capability=None, sm_count=None, memory_gib=None,
                   cpu=platform.processor() or platform.machine(), cpu_threads=torch.get_num_threads())
    env["device_slug"] = gpu_slug(env["device"])
    try:
        from ..autotune.families import current_family

        env["family"] = current_family(device).name
    except Exception:  # noqa: BLE001  (the family is informative only)
        env["family"] = None
    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    if os.environ.get("LEETTRITON_GIT_SHA"):
        # a copy of the tree made elsewhere (a benchmark machine), whose git metadata, if any,
        # is not that of the code: the caller names the commit
        sha, dirty = os.environ["LEETTRITON_GIT_SHA"], None
    env.update(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
               python=platform.python_version(), leettriton=__version__, git_sha=sha,
               git_dirty=None if dirty is None else bool(dirty),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               interpreter=is_interpreting(), platform=f"{platform.system()} {platform.machine()}")
    return env


# --------------------------------------------------------------------------- peers

@dataclass
class Prepared:
    """A zero-argument call of a method on inputs prepared once, and how to read its output as bhnd."""

    run: Callable[[], Any]
    to_bhnd: Callable[[Any], torch.Tensor] = field(default=lambda o: o)

    def __call__(self):
        return self.run()


def _fla_chunk(b, c, v, gamma) -> Prepared:
    from fla.ops.simple_gla import chunk_simple_gla

    q, k, vv = (x.transpose(1, 2).contiguous() for x in (b, c, v))        # fla wants [B, T, H, K]
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()   # ln γ per head, (H,)
    return Prepared(lambda: chunk_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0], lambda o: o.transpose(1, 2))


def _fla_recurrent(b, c, v, gamma) -> Prepared:
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    q, k, vv = (x.transpose(1, 2).contiguous() for x in (b, c, v))
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()
    return Prepared(lambda: fused_recurrent_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0], lambda o: o.transpose(1, 2))


def _lightning_attn2(b, c, v, gamma) -> Prepared:
    from lightning_attn.ops.triton import lightning_attn2, lightning_attn2_no_decay

    q, k, vv = (x.contiguous() for x in (b, c, v))                       # (b, h, n, d) already
    if gamma is None:
        return Prepared(lambda: lightning_attn2_no_decay(q, k, vv))
    s = (-torch.log(gamma.double())).float().view(-1, 1, 1).contiguous()   # s = −ln γ, (h, 1, 1)
    return Prepared(lambda: lightning_attn2(q, k, vv, s))


_PEERS = {
    # name: (module to import, package, factory)
    "fla_chunk_simple_gla": ("fla.ops.simple_gla", "fla-core", _fla_chunk),
    "lightning_attn2": ("lightning_attn.ops.triton", "lightning-attn", _lightning_attn2),
    "fla_fused_recurrent_simple_gla": ("fla.ops.simple_gla", "fla-core", _fla_recurrent),
}
CHUNKED_PEERS = ("fla_chunk_simple_gla", "lightning_attn2")


def _version_of(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001
        return "?"


def _import_peer(module: str) -> Optional[str]:
    """None when ``module`` imports, else why not."""
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (a broken install is reported, not fatal)
        return _first_line(exc)
    return None


def peers(device=None, names: Optional[Iterable[str]] = None, notes: Optional[list] = None) -> dict:
    """Installed peer implementations: name → ``factory(b, c, v, gamma) -> Prepared``.

    ``b, c, v`` are ``(batch, heads, n, ·)`` tensors, ``gamma`` a ``(heads,)`` tensor or None.
    The factory converts layouts and decays once (outside any timed region) and returns a
    zero-argument callable; ``Prepared.to_bhnd(output)`` views its output as bhnd.

    * ``fla_chunk_simple_gla``: flash-linear-attention's ``chunk_simple_gla`` with
      ``g_gamma = ln γ`` (float32, ``(H,)``), ``scale=1.0``, ``[B, T, H, K]`` inputs;
    * ``lightning_attn2``: lightning-attn's ``lightning_attn2(q, k, v, s)`` with
      ``s = −ln γ`` of shape ``(h, 1, 1)`` (``lightning_attn2_no_decay`` without decay);
    * ``fla_fused_recurrent_simple_gla``: fla's token-by-token kernel.

    The peers are Triton kernels written for CUDA: on another device the result is empty.
    Each missing peer adds a line to ``notes`` (when given) saying why.
    """
    device = _device(device)
    names = list(names) if names is not None else list(_PEERS)
    found = {}
    for name in names:
        module, package, factory = _PEERS[name]
        if device.type != "cuda":
            why = "needs a CUDA device"
        else:
            why = _import_peer(module)
        if why is None:
            found[name] = factory
            if notes is not None:
                notes.append(f"peer {name}: {package} {_version_of(package)}")
        elif notes is not None:
            extra = "" if device.type != "cuda" else f" (pip install {package})"
            notes.append(f"peer {name}: not available: {why}{extra}")
    return found


def _fla_decode(b_t, c_t, v_t, state, gamma) -> Prepared:
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    q, k, vv = (x.unsqueeze(1).contiguous() for x in (b_t, c_t, v_t))   # [B, 1, H, K]: one token
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()
    return Prepared(lambda: fused_recurrent_simple_gla(q, k, vv, g_gamma=g, scale=1.0, initial_state=state,
                                                       output_final_state=True),
                    lambda res: res[0].squeeze(1))


def peer_decode(device=None, notes: Optional[list] = None):
    """fla's one-token step, or None: ``factory(b_t, c_t, v_t, state, gamma) -> Prepared``.

    ``b_t, c_t``: ``(batch, heads, r)``, ``v_t``: ``(batch, heads, d)``, ``state``: float32
    ``(batch, heads, r, d)`` — fla's ``[B, H, K, V]`` state layout, so no conversion — and
    ``gamma`` ``(heads,)`` or None.  Runs ``fused_recurrent_simple_gla`` on one token with
    ``initial_state=state``, ``output_final_state=True`` (fla returns a new state; ours is
    updated in place).  ``to_bhnd`` returns o_t as ``(batch, heads, d)``.
    """
    device = _device(device)
    why = "needs a CUDA device" if device.type != "cuda" else _import_peer("fla.ops.simple_gla")
    if why is not None:
        if notes is not None:
            notes.append(f"peer fla_fused_recurrent_simple_gla (decode): not available: {why}")
        return None
    if notes is not None:
        notes.append(f"peer fla_fused_recurrent_simple_gla (decode): fla-core {_version_of('fla-core')}")

    return _fla_decode


# --------------------------------------------------------------------------- oracle and one cell

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
    device = _device(device)
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
        result = Measurement("n/a", note=_first_line(exc))
    except Exception as exc:  # noqa: BLE001  (one failing cell must not end the run)
        if _is_oom(exc):
            result = Measurement("OOM", note=f"while {stage}: {_oom_text(exc)}")
        else:
            result = Measurement("error", note=_first_line(exc))
            if _is_fatal(exc):
                fatal = _first_line(exc)
    fn = out = None  # noqa: F841  (drop the prepared inputs and the output before freeing)
    if result.status in ("OOM", "error"):
        try:
            free_memory()
        except Exception as exc:  # noqa: BLE001  (a fault of the failed call, reported late)
            if not _is_fatal(exc):
                raise
            fatal = fatal or _first_line(exc)
    if fatal is not None:
        raise DeviceFailure(fatal)
    return result


# --------------------------------------------------------------------------- the grid

@dataclass
class Entry:
    """One line of the tables: a built-in method, a peer or a user's function."""

    label: str
    kind: str                                   # "triton", "torch", "auto", "peer", "user"
    make: Callable[..., Any]                    # make(b, c, v, gamma) -> zero-arg callable / Prepared
    tol_override: Optional[dict] = None         # per-dtype tolerance replacing TOLERANCES
    note: str = ""


def method_entry(name: str, label: Optional[str] = None) -> Entry:
    """An :class:`Entry` calling ``linear_attention(b, c, v, gamma, method=name)``, shown as ``label``."""
    name = api.canonical_method(name)
    kind = "auto" if name == "auto" else ("torch" if name.endswith("_torch") else
                                          ("triton" if name in BUILTIN_METHODS else "user"))

    def make(b, c, v, gamma):
        return lambda: linear_attention(b, c, v, gamma, method=name)

    return Entry(label or name, kind, make, note="" if label in (None, name) else f"runs {name}")


def peer_entry(name: str, factory: Callable) -> Entry:
    """An :class:`Entry` for a peer from :func:`peers` (float32 judged at the TF32 bound: peers use TF32)."""
    return Entry(name, "peer", factory, tol_override={torch.float32: TF32_TOLERANCE})


def user_entry(fn: Callable, label: Optional[str] = None) -> Entry:
    """An :class:`Entry` calling ``fn(b, c, v, gamma)`` (the :func:`benchmark_method` convention)."""
    label = label or getattr(fn, "__name__", "user")
    return Entry(label, "user", lambda b, c, v, gamma: (lambda: fn(b, c, v, gamma)))


def default_methods(device) -> list[str]:
    """Every built-in method, its PyTorch version and ``auto`` on CUDA; the PyTorch versions on CPU."""
    device = _device(device)
    torch_names = [f"{m}_torch" for m in BUILTIN_METHODS]
    if device.type == "cuda":
        return list(BUILTIN_METHODS) + torch_names + ["auto"]
    # Off the GPU, auto runs a PyTorch method -- or, under the interpreter, Triton kernels (too slow here).
    return torch_names + ([] if is_interpreting() else ["auto"])


def _auto_choice(b, c, v, gamma) -> str:
    try:
        from ..dispatch import choose

        lam = None if gamma is None else torch.log2(gamma.float())
        p = api.Problem(b, c, v, lam, None, v, None, "ieee")   # out is never written by choose()
        return f"auto → {choose(p)[0]}"
    except Exception as exc:  # noqa: BLE001  (informative only)
        return f"auto → ? ({_first_line(exc)})"


def _print(text: str) -> None:
    print(text, flush=True)


def _fmt_ms(ms: Optional[float]) -> str:
    if ms is None:
        return "—"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


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
    device = _device(device)
    done = done or {}
    log = log or _print
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
                    if not _is_oom(exc):
                        raise
                    b = c = v = None
                    inputs_note = f"inputs do not fit ({_oom_text(exc)})"
                    free_memory()
                for decay in decays:
                    g = _grid_gamma(decay, gamma, heads, device)
                    floor = memory_floor_ms(batch, heads, n, r, d, dt, bandwidth)
                    orc, orc_note = None, ""
                    if check and b is not None and pending(decay):
                        try:
                            orc = oracle(b, c, v, g)
                        except Exception as exc:  # noqa: BLE001
                            if not _is_oom(exc):
                                raise
                            orc_note = "oracle OOM: error not checked"
                            free_memory()
                    for entry in entries:
                        count += 1
                        key = (dt, batch, decay, entry.label)
                        tol = (entry.tol_override or {}).get(dt, TOLERANCES[dt])
                        note = ""
                        earlier = done.get(cell_key(entry.label, dt, batch, heads, n, r, d, decay))
                        if earlier is not None:
                            rows.append(earlier)
                            if earlier.get("median_ms") is not None:
                                history.setdefault(key, []).append((n, earlier["median_ms"]))
                                if earlier["median_ms"] > budget_s * 1e3:
                                    over_budget[key] = (f"n = {n} took {earlier['median_ms'] / 1e3:.1f} s > budget "
                                                        f"{budget_s:g} s")
                            log(_progress_line(count, total, earlier) + "  (from the earlier run)")
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
                        log(_progress_line(count, total, row))
                    orc = None
                b = c = v = None
                free_memory()
    return rows


def _grid_gamma(decay: bool, gamma, heads: int, device) -> Optional[torch.Tensor]:
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
    log = log or _print
    primed = []
    for dt in dtypes:
        b, c, v = make_inputs(batch, heads, n, r, d, parse_dtype(dt), device, seed=seed)
        for decay in decays:
            g = _grid_gamma(decay, gamma, heads, device)
            for entry in entries:
                if entry.kind not in PRIMED_KINDS:
                    continue
                try:
                    fn = entry.make(b, c, v, g)
                    fn()
                    primed.append(entry.label)
                except Exception as exc:  # noqa: BLE001  (its cells report it)
                    if _is_fatal(exc):
                        raise DeviceFailure(_first_line(exc)) from exc
                    log(f"priming {entry.label}: {type(exc).__name__}: {_first_line(exc)}")
        b = c = v = None
        free_memory()
    sync(device)
    log(f"primed the autotuners of {len(set(primed))} methods at batch {batch}, n {n} (as the earlier run met them first)")
    return primed


def cell_key(method: str, dtype, batch: int, heads: int, n: int, r: int, d: int, decay: bool) -> tuple:
    """The identity of one cell of the grid (one row): what ``--resume`` matches on."""
    return (method, dtype_name(parse_dtype(dtype)), int(batch), int(heads), int(n), int(r), int(d), bool(decay))


def read_results(path: str, option: str) -> tuple[dict, list]:
    """``(meta, rows)`` of a file written by ``--json``; ValueError naming ``option`` and the file otherwise."""
    with open(path) as f:
        try:
            doc = json.load(f)
            return doc["meta"], doc["rows"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{option}: {path} is not a leettriton.bench --json file ({exc})") from None


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


def _progress_line(count: int, total: int, row: dict) -> str:
    width = len(str(total))
    head = (f"[{count:>{width}}/{total}] {row['dtype']:<8} B={row['batch']:<3} n={row['n']:<6} "
            f"{'decay' if row['decay'] else 'plain'} {row['method']:<28}")
    if row["median_ms"] is not None:
        err = "" if row["rel_err"] is None else f"  err {row['rel_err']:.1e} ({row['err_scope']})"
        body = (f"{_fmt_ms(row['median_ms']):>10} (p20 {row['p20_ms']:.4g}, p80 {row['p80_ms']:.4g})  "
                f"{row['ratio']:.1f}x floor{err}  {row['status']}")
    else:
        body = row["status"]
    if row["note"]:
        body += f"  [{row['note']}]"
    return f"{head} {body}"


# --------------------------------------------------------------------------- tables and files

def markdown_table(headers: Sequence, body: Sequence[Sequence]) -> str:
    """A GitHub-flavoured Markdown table (tabulate when installed)."""
    try:
        from tabulate import tabulate

        return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    except ImportError:
        lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in body]
        return "\n".join(lines)


def _status_cell(row: dict) -> str:
    if row["status"] in ("ok", "WRONG") and row["median_ms"] is not None:
        return None
    return {"n/a": "n/a", "OOM": "OOM", "skipped": "skip", "error": "ERR"}.get(row["status"], row["status"])


def format_tables(rows: Sequence[dict], *, meta: Optional[dict] = None) -> str:
    """The paper's tables: one per dtype, batch and decay, a method per line and an n per column.

    Time cells read ``median (ratio × memory floor)``; the fastest correct method of a
    column is in bold.  A second table per group gives the relative errors.  Legend:
    ``n/a`` not implemented, ``OOM`` out of memory, ``skip`` larger n skipped after a cell
    exceeded the time budget, ``ERR`` an exception (see the rows' notes), ``WRONG`` error
    above the dtype's tolerance.
    """
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["batch"], row["decay"], row["heads"], row["r"], row["d"]), []).append(row)
    out = []
    for (dt, batch, decay, heads, r, d), grp in groups.items():
        ns = sorted({row["n"] for row in grp})
        methods = list(dict.fromkeys(row["method"] for row in grp))
        cell = {(row["method"], row["n"]): row for row in grp}
        floor = {row["n"]: row["floor_ms"] for row in grp}
        best = {}
        for n in ns:
            ok = [row for row in grp if row["n"] == n and row["status"] == "ok" and row["median_ms"] is not None]
            if ok:
                best[n] = min(ok, key=lambda x: x["median_ms"])["method"]
        decay_txt = "with decay" if decay else "without decay"
        out.append(f"### {dt}, batch {batch}, {decay_txt} — heads {heads}, r = {r}, d = {d}\n")
        body = [["memory floor"] + [_fmt_ms(floor[n]) for n in ns]]
        for m in methods:
            line = [m]
            for n in ns:
                row = cell.get((m, n))
                if row is None:
                    line.append("")
                    continue
                status = _status_cell(row)
                if status is not None:
                    line.append(status)
                    continue
                txt = f"{_fmt_ms(row['median_ms'])} ({row['ratio']:.1f}×)"
                if row["status"] == "WRONG":
                    txt += " WRONG"
                if best.get(n) == m:
                    txt = f"**{txt}**"
                line.append(txt)
            body.append(line)
        out.append(markdown_table(["median (× floor)"] + [f"n = {n}" for n in ns], body))
        ebody = []
        scopes = set()
        for m in methods:
            line = [m]
            for n in ns:
                row = cell.get((m, n))
                if row is None:
                    line.append("")
                elif row["rel_err"] is None:
                    line.append(_status_cell(row) or "—")
                else:
                    e = row["rel_err"]
                    txt = "NaN/inf" if math.isnan(e) else f"{e:.1e}"
                    if row["status"] == "WRONG":
                        txt += f" WRONG (> {row['tol']:.0e})" if row.get("tol") else " WRONG"
                    line.append(txt)
                    if row["err_scope"] and row["err_scope"] != "all":
                        scopes.add(f"n = {n}: {row['err_scope']}")
            ebody.append(line)
        out.append("\nRelative error against the float64 oracle:\n")
        out.append(markdown_table(["rel. error"] + [f"n = {n}" for n in ns], ebody))
        if scopes:
            out.append("\nError computed on a subset of (batch, head) pairs: " + ", ".join(sorted(scopes)) + ".")
        notes = [f"{m} n = {n}: {cell[(m, n)]['note']}" for m in methods for n in ns
                 if (m, n) in cell and cell[(m, n)]["note"] and cell[(m, n)]["status"] != "n/a"]
        if notes:
            out.append("\nNotes:\n" + "\n".join(f"- {x}" for x in notes))
        out.append("")
    return "\n".join(out)


def _meta_lines(meta: dict) -> str:
    keys = ["command", "device", "capability", "family", "copy_bandwidth_gbs", "torch", "triton", "cuda", "leettriton",
            "git_sha", "git_dirty", "date", "interpreter"]
    lines = [f"- {k}: {meta[k]}" for k in keys if k in meta and meta[k] is not None]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in keys and not isinstance(v, (dict, list))
              and v is not None]
    for k, v in meta.items():
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            lines.append(f"- {k}:")
            lines += [f"  - {x}" for x in v]
    return "\n".join(lines)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _base(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext.lower() in (".json", ".md", ".csv") else path


def write_results(rows: Sequence[dict], meta: dict, path: str, *, title: str = "leettriton benchmark",
                  body: Optional[str] = None) -> tuple[str, str]:
    """Write ``<path>.json`` (``{"meta": ..., "rows": [...]}``) and ``<path>.md`` (header + tables).

    ``path`` may end in ``.json`` or ``.md`` (the extension is replaced).  A NaN error is
    written as ``null`` in JSON.  ``body`` replaces the default Markdown tables
    (:func:`format_tables`).  Returns the two paths.
    """
    base = _base(path)
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    jpath, mpath = base + ".json", base + ".md"
    with open(jpath, "w") as f:
        json.dump(_json_safe({"meta": meta, "rows": list(rows)}), f, indent=1)
        f.write("\n")
    with open(mpath, "w") as f:
        f.write(f"# {title}\n\n{_meta_lines(meta)}\n\n")
        f.write(body if body is not None else format_tables(rows, meta=meta))
        f.write("\n")
    return jpath, mpath


def write_csv(rows: Sequence[dict], meta: dict, path: str) -> str:
    """Write the rows as CSV (:data:`ROW_FIELDS` columns) after ``# key: value`` header lines."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for k, v in meta.items():
            if not isinstance(v, (dict, list)):
                f.write(f"# {k}: {v}\n")
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)
    return path


def _plot_styles(methods: Iterable[str]) -> dict:
    """One look per line: a built-in method and its PyTorch version share a colour (solid, dashed),
    ``auto`` is a thick black line, peers and other functions get their own colours and markers."""
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    others = ["tab:pink", "tab:olive", "tab:cyan", "tab:gray", "gold", "navy"]
    markers = ["s", "^", "D", "v", "P", "X"]
    style, k = {}, 0
    for m in methods:
        base = m[:-len("_torch")] if m.endswith("_torch") else m
        if m == "auto":
            style[m] = dict(color="black", lw=2.2, marker="o", ms=3, zorder=5)
        elif base in BUILTIN_METHODS:
            style[m] = dict(color=palette[BUILTIN_METHODS.index(base) % len(palette)],
                            ls="--" if m.endswith("_torch") else "-", marker="o", ms=3)
        else:
            style[m] = dict(color=others[k % len(others)], ls="-.", marker=markers[k % len(markers)], ms=4)
            k += 1
    return style


def plot(rows: Sequence[dict], path: str, *, log: Callable[[str], None] = print) -> Optional[str]:
    """Latency against n on log-log axes, one panel per dtype/batch/decay, one line per method.

    Needs matplotlib (``pip install matplotlib``); without it, says so and writes nothing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"--plot: matplotlib is not installed (pip install matplotlib, or leettriton[plot]); {path} not written")
        return None
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["batch"], row["decay"]), []).append(row)
    ncols = min(2, len(groups)) or 1
    nrows = max(1, math.ceil(len(groups) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4.8 * nrows), squeeze=False)
    style = _plot_styles(dict.fromkeys(row["method"] for row in rows))
    for ax, ((dt, batch, decay), grp) in zip(axes.flat, groups.items()):
        for m in dict.fromkeys(row["method"] for row in grp):
            pts = sorted((row["n"], row["median_ms"]) for row in grp
                         if row["method"] == m and row["status"] in ("ok", "WRONG") and row["median_ms"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=m, **style[m])
        fl = sorted({(row["n"], row["floor_ms"]) for row in grp})
        ax.plot([p[0] for p in fl], [p[1] for p in fl], ":", color="0.5", label="memory floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel("median ms")
        ax.set_title(f"{dt}, batch {batch}, {'decay' if decay else 'no decay'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- benchmark_method

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
        The result rows (dicts with the keys of :data:`ROW_FIELDS`); the table is printed.

    Example::

        >>> def mine(b, c, v, gamma):
        ...     return leettriton.linear_attention(b, c, v, gamma, method="block_based")
        >>> rows = leettriton.benchmark_method(mine, dtype="float16", batch_size=16)
    """
    log = _print if verbose else (lambda _s: None)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log("benchmark_method: no CUDA device here; running on the CPU with the PyTorch methods")
        dev = torch.device("cpu")
    dev = _device(dev)
    dt = parse_dtype(dtype)
    if seqlens is None:
        seqlens = (512, 2048, 8192, 25600) if dev.type == "cuda" else (64, 128, 256)
    if methods is None:
        methods = (["auto"] + list(BUILTIN_METHODS)) if dev.type == "cuda" else default_methods(dev)
    label = name or f"yours: {getattr(fn, '__name__', 'fn')}"
    tol = TOLERANCES[dt]

    # 1. correctness on a small problem
    cb = max(1, min(batch_size, 2))
    cn = 300
    b, c, v = make_inputs(cb, heads, cn, rank, dim, dt, dev, seed=1)
    g = _grid_gamma(is_weight_decay, gamma, heads, dev)
    what = (f"batch {cb}, heads {heads}, n {cn}, r {rank}, d {dim}, {dtype_name(dt)}, "
            f"{'with decay' if g is not None else 'no decay'}")
    check_err, check_msg = None, ""
    try:
        with torch.no_grad():
            out = fn(b, c, v, g)
            check_err = rel_error(out, reference(b, c, v, g))
    except Exception as exc:  # noqa: BLE001  (reported, then timed anyway)
        check_msg = f"check failed: {_first_line(exc)}"
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


# --------------------------------------------------------------------------- CLI

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m leettriton.bench",
        description="Time every leettriton method over the LeetDecoding paper's grid and print its tables "
                    "(median ms, ratio to the memory floor, relative error against the fp64 oracle).")
    p.add_argument("--quick", action="store_true", help="a one-minute version: batch 1 and 16, n 512 and 8192, "
                   "with decay (CPU: tiny shapes)")
    p.add_argument("--methods", help="comma-separated methods (paper spellings accepted; default: every method, "
                   "its _torch version and auto; on CPU the _torch versions)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16, float32, or a comma list")
    p.add_argument("--batch", type=_ints, help="comma list of batch sizes (default 1,16)")
    p.add_argument("--n", type=_ints, help="comma list of sequence lengths (default the paper's)")
    p.add_argument("--heads", type=int, help="heads (default 32)")
    p.add_argument("--r", type=int, help="rank of b and c (default 128)")
    p.add_argument("--d", type=int, help="dim of v (default 128)")
    p.add_argument("--decay", choices=("both", "on", "off"), help="with decay, without, or both (default both; "
                   "--quick: on)")
    p.add_argument("--peers", action="store_true", help="add fla chunk_simple_gla and lightning_attn2 when installed")
    p.add_argument("--budget-s", type=float, default=2.0, help="skip larger n of a method once a cell takes longer "
                   "(default 2 s)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench repetition time (default 100, quick 50)")
    p.add_argument("--warmup-ms", type=float, default=25, help="do_bench warm-up time (default 25)")
    p.add_argument("--no-check", action="store_true", help="skip the error against the fp64 oracle")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-json", metavar="FILE",
                   help="measure nothing: print the tables of an earlier --json file (and draw --plot from it)")
    p.add_argument("--resume", action="store_true",
                   help="keep the cells already in the --json file (an interrupted run, or one stopped by a "
                   "kernel fault) and measure the rest")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="skip the cells reached after this long (the tables mark them), so the run ends in time")
    p.add_argument("--json", metavar="FILE", help="write the rows and run header as JSON, and the tables beside "
                   "it as .md")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV with the run header as # lines")
    p.add_argument("--plot", metavar="FILE.png", help="latency against n, log-log, per method (needs matplotlib)")
    return p


def _replay(path: str, plot_path: Optional[str]) -> list[dict]:
    """``--from-json``: the tables (and plot) of a run written earlier with ``--json``."""
    try:
        meta, rows = read_results(path, "--from-json")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    _print(format_tables(rows, meta=meta))
    if plot_path and plot(rows, plot_path, log=_print):
        _print(f"wrote {plot_path}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    """Run the benchmark as ``python -m leettriton.bench [options]``; returns the result rows."""
    args = _parser().parse_args(argv)
    if args.from_json:
        return _replay(args.from_json, args.plot)
    start = time.time()
    device = _device(args.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    log = _print
    dtypes = [parse_dtype(x) for x in args.dtype.split(",") if x]

    if args.quick:
        heads, r, d = QUICK_SHAPE[kind]
        batches, seqlens, decay = QUICK_BATCHES[kind], QUICK_SEQLENS[kind], "on"
    elif kind == "cuda":
        heads, r, d = PAPER_HEADS, PAPER_RANK, PAPER_DIM
        batches, seqlens, decay = PAPER_BATCHES, PAPER_SEQLENS, "both"
    else:
        heads, r, d = CPU_HEADS, CPU_RANK, CPU_DIM
        batches, seqlens, decay = CPU_BATCHES, CPU_SEQLENS, "both"
    heads = args.heads or heads
    r = args.r or r
    d = args.d or d
    batches = args.batch or batches
    seqlens = args.n or seqlens
    decay = args.decay or decay
    decays = {"both": [True, False], "on": [True], "off": [False]}[decay]
    rep_ms = args.rep_ms or (50 if args.quick else 100)

    if args.methods:
        names = [x.strip() for x in args.methods.split(",") if x.strip()]
        names = default_methods(device) if names == ["all"] else names
    else:
        names = default_methods(device)
    entries = [method_entry(x) for x in names]
    notes: list[str] = []
    if args.peers:
        for name, factory in peers(device, CHUNKED_PEERS, notes).items():
            entries.append(peer_entry(name, factory))

    if kind == "cpu":
        log("No CUDA device: running the PyTorch methods on small CPU shapes "
            f"(heads {heads}, r = {r}, d = {d}); the paper's grid needs a GPU."
            + (" TRITON_INTERPRET=1: Triton methods run in the interpreter." if is_interpreting() else ""))
    meta = environment(device)
    meta["command"] = "python -m leettriton.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    bw = copy_bandwidth(device)
    meta["copy_bandwidth_gbs"] = round(bw / 1e9, 1)
    meta.update(grid=dict(dtypes=[dtype_name(x) for x in dtypes], batches=list(batches), seqlens=list(seqlens),
                          decays=decays, heads=heads, r=r, d=d),
                decay_formula="gamma_h = 1 - 2^(-5 - 3*h/(H-1))",
                timing=(f"triton.testing.do_bench median, rep {rep_ms:g} ms, warm-up {args.warmup_ms:g} ms"
                        if kind == "cuda" else f"wall-clock median over >= {rep_ms:g} ms") + ", one warm call first",
                budget_s=args.budget_s,
                err_max_rows=ERR_MAX_ROWS, peers=notes)
    log(f"{meta['device']}  copy bandwidth {bw / 1e9:.1f} GB/s  torch {meta['torch']}  triton {meta['triton']}  "
        f"git {str(meta['git_sha'])[:10]}")
    for x in notes:
        log(x)
    log(f"methods: {', '.join(e.label for e in entries)}")
    log(f"grid: dtypes {','.join(dtype_name(x) for x in dtypes)}, batch {list(batches)}, n {list(seqlens)}, "
        f"decay {decay}, heads {heads}, r {r}, d {d}")

    done: dict = {}
    if args.resume:
        if not args.json:
            raise SystemExit("--resume needs --json FILE: the run to go on with")
        if os.path.exists(_base(args.json) + ".json"):
            done = resumable_rows(_base(args.json) + ".json", meta)
            log(f"resuming: {len(done)} cells kept from {_base(args.json)}.json")
            earlier_meta, _ = read_results(_base(args.json) + ".json", "--resume")
            meta["resumed_cells"] = len(done)
            meta["resumed_from"] = {k: earlier_meta.get(k) for k in ("date", "git_sha", "command")}
    failure = None
    rows: list[dict] = []
    with torch.no_grad():
        try:
            rows = run_grid(entries, dtypes=dtypes, batches=batches, seqlens=seqlens, decays=decays, heads=heads,
                            r=r, d=d, device=device, check=not args.no_check, budget_s=args.budget_s,
                            warmup_ms=args.warmup_ms, rep_ms=rep_ms, bandwidth=bw, seed=args.seed, log=log,
                            deadline=None if args.max_minutes is None else start + 60 * args.max_minutes,
                            done=done)
        except DeviceFailure as exc:
            failure = str(exc)
            rows = exc.rows
            log(f"stopping: the CUDA context is unusable after a kernel fault ({failure}); the tables below hold "
                f"what was measured before it")
            meta["stopped_early"] = failure
    log("")
    log(format_tables(rows, meta=meta))
    if args.json:
        jpath, mpath = write_results(rows, meta, args.json)
        log(f"wrote {jpath} and {mpath}")
    if args.csv:
        log(f"wrote {write_csv(rows, meta, args.csv)}")
    if args.plot:
        if plot(rows, args.plot, log=log):
            log(f"wrote {args.plot}")
    if failure is not None:
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
