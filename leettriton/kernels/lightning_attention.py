"""lightning_attention: not yet available as a Triton kernel."""
from __future__ import annotations

from typing import Mapping, Optional

from ..api import Problem


def lightning_attention_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    raise NotImplementedError("the 'lightning_attention' Triton kernel is not implemented yet; use method='lightning_attention_torch'")
