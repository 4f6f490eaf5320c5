"""Configs of the row-by-row recurrence kernel (kernels/causal_dot_product.py).

Axes: BV (value columns per program), BT (rows per block: one load and one
store per block, and the prefetch distance), num_warps.  The key dimension is
not an axis: a program holds all of it (BK = r padded to a power of two).

The kernel's row loads give the state a layout with one 16-byte vector of keys
per thread, keys across lanes, then value columns across the lanes left over
and the warps.  :func:`layout` predicts that split; a config is kept when

* its lanes and warps all land on keys and value columns (none left over for
  the rows of a block, which would turn picking a row into a cross-thread
  reduction) -- lanes may, for tiny d, when BV is already as large as d allows;
* each thread owns at most two value columns (each column repeats the row
  loads), and the prefetched blocks fit in registers.
"""
from __future__ import annotations

import triton

from ..configs import KernelSpace
from ._util import elem_bytes

_MIN_BV = 4
_MAX_REGS = 200  # ptxas keeps ~30 registers for addresses and predicates on top of this estimate


def key_tile(r: int) -> int:
    """BK: the key dimension padded to a power of two (one program holds all of it)."""
    return triton.next_power_of_2(int(r))


def layout(cfg, args) -> dict:
    """How the [BT, BK, BV] row blocks (and the state) are spread over a program.

    Returns the lanes and warps along keys, values and rows, and the value
    columns per thread.
    """
    bk, bv, warps = key_tile(args["R"]), cfg["BV"], cfg["num_warps"]
    vec = min(bk, 16 // elem_bytes(args))                  # keys per thread (one 16-byte load)
    lanes_k = min(32, bk // vec)
    lanes_v = min(32 // lanes_k, bv)
    lanes_t = 32 // (lanes_k * lanes_v)
    warps_k = min(warps, bk // (vec * lanes_k))
    warps_v = min(warps // warps_k, max(1, bv // lanes_v))
    warps_t = warps // (warps_k * warps_v)
    return dict(vec=vec, lanes_k=lanes_k, lanes_v=lanes_v, lanes_t=lanes_t, warps_k=warps_k,
                warps_v=warps_v, warps_t=warps_t, cols=max(1, bv // (lanes_v * warps_v)))


def registers(cfg, args) -> float:
    """32-bit registers per thread for the state and two blocks of rows (current and next)."""
    lay = layout(cfg, args)
    state = lay["vec"] * lay["cols"]
    row = 2 * state * elem_bytes(args) / 4 + lay["cols"]  # b and c (packed), v
    return state + 2 * cfg["BT"] * row


def _bv_cap(args) -> int:
    return max(_MIN_BV, triton.next_power_of_2(int(args["D"])))


def _fwd_fits(cfg, args) -> bool:
    if cfg["BV"] > _bv_cap(args):
        return False
    lay = layout(cfg, args)
    if lay["warps_t"] > 1 or (lay["lanes_t"] > 1 and cfg["BV"] < _bv_cap(args)):
        return False
    return lay["cols"] <= 2 and registers(cfg, args) <= _MAX_REGS


def _fwd_smem(cfg, args) -> int:
    # relayouts through shared memory: the initial and final state, then the output tile of a block
    return max(key_tile(args["R"]) * cfg["BV"] * 4, cfg["BT"] * cfg["BV"] * elem_bytes(args))


_AXES = dict(BT=[4, 8], BV=[4, 8, 16, 32, 64], num_warps=[1, 2, 4, 8], num_stages=[1])

FWD = KernelSpace(
    name="causal_dot_product.fwd",
    axes={
        "default": _AXES,
        "a6000": _AXES,
        "a100": _AXES,
        "ada": _AXES,
        "h100": _AXES,
        "h200": _AXES,
    },
    cpu=dict(BT=4, BV=64, num_warps=4, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
)
