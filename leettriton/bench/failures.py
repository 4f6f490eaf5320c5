"""How a failed call is classified: out of memory, a kernel fault that ends the CUDA context, or an error."""
from __future__ import annotations

import re

import torch

__all__ = ["DeviceFailure", "is_oom", "is_fatal", "oom_text", "first_line"]


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (or the host) ran out of memory."""
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


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` is a kernel fault after which the CUDA context is unusable."""
    return any(m in str(exc).lower() for m in _FATAL_MARKERS)


def oom_text(exc: BaseException) -> str:
    """``"tried to allocate 1.50 gib"`` from an out-of-memory error, else its first line."""
    m = re.search(r"Tried to allocate [\d.]+ [KMGT]?i?B", str(exc))
    return m.group(0).lower() if m else first_line(exc)


def first_line(exc: BaseException) -> str:
    """``"ValueError: <first line of the message>"``, at most 200 characters."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
