"""Small helpers the config spaces share."""
from __future__ import annotations

from typing import Any, Mapping

import triton


def elem_bytes(args: Mapping[str, Any], name: str = "v_ptr") -> int:
    """Bytes per element of the input tensor ``args[name]`` (2 when absent)."""
    t = args.get(name)
    return t.element_size() if hasattr(t, "element_size") else 2


def pow2(x: int) -> int:
    """Smallest power of two ≥ max(x, 16) (the least ``tl.dot`` tile)."""
    return max(16, triton.next_power_of_2(int(x)))


def regs_per_thread(fp32_elements: int, num_warps: int) -> float:
    """32-bit registers each thread needs to hold ``fp32_elements`` values spread over the program."""
    return fp32_elements / (32 * num_warps)
