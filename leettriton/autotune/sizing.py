"""Small helpers the config spaces share."""
from __future__ import annotations

from typing import Any, Mapping



def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for non-negative ints.

    Host code calls this (grids, segment counts) on every launch: it is plain
    integer arithmetic, where ``triton.cdiv`` is a constexpr function whose
    wrapper costs microseconds per call in recent Triton releases.
    """
    return -(-a // b)


def next_power_of_2(x: int) -> int:
    """Smallest power of two ≥ x (1 for x ≤ 1), as ``triton.next_power_of_2`` on the host, but plain."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def elem_bytes(args: Mapping[str, Any], name: str = "v_ptr") -> int:
    """Bytes per element of the input tensor ``args[name]`` (2 when absent)."""
    t = args.get(name)
    return t.element_size() if hasattr(t, "element_size") else 2


def pow2(x: int) -> int:
    """Smallest power of two ≥ max(x, 16) (the least ``tl.dot`` tile)."""
    return max(16, next_power_of_2(int(x)))


def regs_per_thread(fp32_elements: int, num_warps: int) -> float:
    """32-bit registers each thread needs to hold ``fp32_elements`` values spread over the program."""
    return fp32_elements / (32 * num_warps)
