"""The benchmarks' problems: dtypes, devices, the per-head decays and the random inputs.

Pure helpers (torch only, nothing of the command line): :func:`decay_gammas` and
:func:`make_inputs` define what every benchmark, ``perf/`` script and the tuner measure.
"""
from __future__ import annotations

import torch

__all__ = ["parse_dtype", "dtype_name", "default_device", "resolve_device", "decay_gammas", "make_inputs"]

_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def parse_dtype(x) -> torch.dtype:
    """``torch.float16`` from ``"float16"``, ``"fp16"``, ``"half"`` or a dtype (likewise bf16, fp32)."""
    if isinstance(x, torch.dtype):
        if x not in _DTYPES.values():
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


def resolve_device(device) -> torch.device:
    """``device`` as a ``torch.device`` (default: :func:`default_device`), a CUDA device with its index."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def decay_gammas(heads: int, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One γ per head, γ_h = 1 − 2^(−5 − 3·h/(H−1)): 0.96875 for head 0 … 0.99609 for the last.

    The paper's range of per-head decays, RetNet's ``1 − 2^(−5−h)`` spread
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
    device = resolve_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def shape(k):
        return (batch, heads, n, k) if layout == "bhnd" else (batch, n, heads, k)

    b = torch.randn(shape(r), generator=gen, device=device, dtype=dtype)
    b.mul_(r ** -0.5)
    c = torch.randn(shape(r), generator=gen, device=device, dtype=dtype)
    v = torch.randn(shape(d), generator=gen, device=device, dtype=dtype)
    return b, c, v
