"""recursion: not yet available as a Triton kernel."""
from __future__ import annotations

from typing import Mapping, Optional

from ..api import Problem


def recursion_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    raise NotImplementedError("the 'recursion' Triton kernel is not implemented yet; use method='recursion_torch'")
