"""block_based: not yet available as a Triton kernel."""
from __future__ import annotations

from typing import Mapping, Optional

from ..api import Problem


def block_based_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    raise NotImplementedError("the 'block_based' Triton kernel is not implemented yet; use method='block_based_torch'")
