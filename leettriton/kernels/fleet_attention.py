"""fleet_attention: not yet available as a Triton kernel."""
from __future__ import annotations

from typing import Mapping, Optional

from ..api import Problem


def fleet_attention_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    raise NotImplementedError("the 'fleet_attention' Triton kernel is not implemented yet; use method='fleet_attention_torch'")
