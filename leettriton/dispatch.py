"""method="auto": which method and config to run for a problem.

With a heuristic file for the device's family (``LEETTRITON_HEURISTICS=path``,
:func:`leettriton.load_heuristics`, or the packaged ``autotune/heuristics/<family>.json``)
the nearest measured point decides, and its config is launched directly (no
autotune benchmarking on the call path).  Without one, :func:`fallback` decides
and the kernels autotune themselves.
"""
from __future__ import annotations

from typing import Mapping, Optional

from .api import Problem
from .autotune.families import Family, current_family, is_interpreting
from .autotune.heuristics import active_heuristics

_DTYPE_NAMES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}


def fallback(p: Problem, family: Family) -> str:
    """The documented rule used when no heuristic file covers the device.

    * n ≤ 64: ``vanilla`` (one tile: the quadratic form is cheapest);
    * batch·heads·⌈d / 64⌉ ≥ 2 × the family's multiprocessors: ``lightning_attention``
      (the fused walk already fills the GPU);
    * otherwise ``block_based`` (it also splits the sequence into segments).
    """
    B, H, n, r, d = p.shape
    if n <= 64:
        return "vanilla"
    if B * H * max(1, -(-d // 64)) >= 2 * family.num_sms:
        return "lightning_attention"
    return "block_based"


def choose(p: Problem) -> tuple[str, Optional[Mapping]]:
    """The method (and pinned kernel configs, or None to autotune) for ``p``.

    CPU tensors outside the interpreter run ``lightning_attention_torch``.
    """
    B, H, n, r, d = p.shape
    if p.v.device.type == "cpu" and not is_interpreting():
        return "lightning_attention_torch", None
    family = current_family(p.v.device)
    heuristics = active_heuristics(family.name)
    if heuristics is not None:
        hit = heuristics.lookup(_DTYPE_NAMES[str(p.v.dtype)], p.has_decay, r, d, B * H, n)
        if hit is not None:
            return hit
    return fallback(p, family), None


def load_heuristics(path: Optional[str], family: Optional[str] = None):
    """Use the heuristic file at ``path`` for ``method="auto"`` from now on.

    The file must have been measured on ``family`` (default: the current
    device's family; under the interpreter, ``cpu``).  ``path=None`` drops any
    file, so ``auto`` uses :func:`fallback`.  Returns the loaded
    :class:`~leettriton.autotune.heuristics.Heuristics` (or None).

    Raises ``HeuristicsError`` (a ``ValueError``) naming the file when it is
    unreadable, corrupt, or measured on another family.
    """
    from .autotune.heuristics import load_heuristics as _load, set_heuristics

    family = family or current_family().name
    loaded = None if path is None else _load(path, family)
    set_heuristics(loaded, family)
    return loaded
