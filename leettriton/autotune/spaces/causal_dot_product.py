"""Configs of the row-by-row recurrence kernel (kernels/causal_dot_product.py).

A program holds the whole key dimension of a [R, BV] slice of the state.  The
loaded rows b_t, c_t take a layout with one 16-byte vector of keys per thread
and the rest of the keys across lanes; the lanes left over, then the warps,
split the BV value columns.  A config is useful when every thread owns 1 to 4
value columns: fewer leaves threads idle, more repeats the row loads per
column and grows the state past what fits in registers next to the
prefetched rows.  Axes: BV (value columns per program), BT (rows per unrolled
block: one memory latency per BT rows), num_warps.  Nothing goes through
shared memory but the [BT, BV] output tile.
"""
from __future__ import annotations

import triton

from ..configs import KernelSpace
from ._util import elem_bytes

_MIN_BV = 4


def key_tile(r: int) -> int:
    """BK: the key dimension padded to a power of two (one program holds all of it)."""
    return triton.next_power_of_2(int(r))


def columns_per_thread(cfg, args) -> float:
    """Value columns each thread owns in the layout the row loads give the state."""
    bk = key_tile(args["R"])
    vec = 16 // elem_bytes(args)                 # keys in one 16-byte load
    lanes_k = min(32, max(1, bk // vec))
    lanes_v = 32 // lanes_k
    warps_k = min(cfg["num_warps"], max(1, bk // (vec * 32)))
    warps_v = cfg["num_warps"] // warps_k
    return cfg["BV"] / (lanes_v * warps_v)


def _bv_cap(args) -> int:
    return max(_MIN_BV, triton.next_power_of_2(int(args["D"])))


def _fwd_fits(cfg, args) -> bool:
    if cfg["BV"] > _bv_cap(args):
        return False
    cols = columns_per_thread(cfg, args)
    # idle threads are only acceptable when the value dimension is too small for the warps
    if cols < 1 and cfg["BV"] < _bv_cap(args):
        return False
    state_per_thread = key_tile(args["R"]) * cfg["BV"] / (32 * cfg["num_warps"])
    return cols <= 4 and state_per_thread <= 64


FWD = KernelSpace(
    name="causal_dot_product.fwd",
    axes={
        "default": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
        "a6000": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
        "a100": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
        "ada": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
        "h100": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
        "h200": dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4], num_stages=[1]),
    },
    cpu=dict(BT=4, BV=32, num_warps=4, num_stages=1),
    smem=lambda cfg, args: cfg["BT"] * cfg["BV"] * 4,
    fits=_fwd_fits,
)
