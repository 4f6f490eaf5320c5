"""Configs of the row reversal (kernels/reverse.py).

The reversal is a copy: each program moves a [BN, BD] tile of rows (BD ≤ 128 columns, the whole of
r or d = 128 in one tile) and nothing else, so a config only sets how many rows a program owns and
how many threads share them.  A config is kept when each thread holds 16 to 64 elements of a full
128-column tile (4 to 16 sixteen-byte accesses of 16-bit data in flight).
"""
from __future__ import annotations

import functools

from ..autotune.configs import KernelSpace
from ..autotune.sizing import next_power_of_2

MAX_BD = 128
"""The widest column tile: wider rows are copied in slices of 128 columns."""


@functools.lru_cache(maxsize=None)
def column_tile(dim: int) -> int:
    """BD for rows of ``dim`` columns: ``dim`` padded to a power of two (at least 16), at most :data:`MAX_BD`."""
    return min(MAX_BD, max(16, next_power_of_2(int(dim))))


def _keep(cfg) -> bool:
    per_thread = cfg["BN"] * MAX_BD // (32 * cfg["num_warps"])
    return 16 <= per_thread <= 64


_AXES = dict(BN=[32, 64, 128], num_warps=[4, 8], num_stages=[1])

ROWS = KernelSpace(
    name="reverse.rows",
    axes={"default": _AXES},  # a copy: the same list on every GPU
    cpu=dict(BN=16, num_warps=4, num_stages=1),  # several row blocks, a partial last one, on small tests
    smem=lambda cfg, args: 0,  # registers only: a tile is loaded and stored, never shared
    keep=_keep,
)
