"""method="auto": which method and config to run for a problem."""
from __future__ import annotations

from typing import Mapping, Optional

from .api import Problem
from .autotune.families import current_family, is_interpreting


def choose(p: Problem) -> tuple[str, Optional[Mapping]]:
    """The method (and pinned kernel configs, or None to autotune) for ``p``.

    Fallback rule, used when no heuristic file covers the device:
    CPU tensors outside the interpreter run ``lightning_attention_torch``;
    otherwise n ≤ 64 runs ``vanilla``, batch·heads large enough to give every
    multiprocessor two programs runs ``lightning_attention``, and the rest
    ``block_based`` (which also parallelises over the sequence).
    """
    B, H, n, r, d = p.shape
    if p.v.device.type == "cpu" and not is_interpreting():
        return "lightning_attention_torch", None
    if n <= 64:
        return "vanilla", None
    family = current_family(p.v.device)
    if B * H * max(1, d // 64) >= 2 * family.num_sms:
        return "lightning_attention", None
    return "block_based", None
