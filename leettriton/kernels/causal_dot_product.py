"""causal_dot_product: not yet available as a Triton kernel."""
from __future__ import annotations

from typing import Mapping, Optional

from ..api import Problem


def causal_dot_product_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    raise NotImplementedError("the 'causal_dot_product' Triton kernel is not implemented yet; use method='causal_dot_product_torch'")
