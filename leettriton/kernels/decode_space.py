"""Configs of the one-token decode step (kernels/decode.py).

The step streams the float32 state once in and once out.  A program owns a
[R, BV] column slice of one head's state and walks it in [BK, BV] tiles.  On
the GPU BK covers all of r (loads are not pipelined across tiles, so one tile
puts the whole slice in flight at once and the occupancy of the SMs hides the
latency); a config is kept when each thread then holds 8 to 32 state elements
(2 to 8 sixteen-byte loads in flight).  Narrow BV gives small batches more
programs; wide BV suits large batches.
"""
from __future__ import annotations


from ..autotune.configs import KernelSpace
from ..autotune.sizing import next_power_of_2, regs_per_thread

_MIN_BV = 4  # one 16-byte vector of float32


def key_tile(r: int) -> int:
    """BK: the whole key dimension, padded to a power of two (at least 16)."""
    return max(16, next_power_of_2(int(r)))


def _bv_cap(args) -> int:
    return max(_MIN_BV, next_power_of_2(int(args["D"])))


def _step_keep(cfg) -> bool:
    """The shape-independent part: at most 32 state elements per thread, and 8 or more
    unless the program is the smallest (tiny states cannot give every thread 8)."""
    per_thread = regs_per_thread(cfg["BK"] * cfg["BV"], cfg["num_warps"])
    if cfg["BK"] > 256 and cfg["num_warps"] != 8:  # wide keys (r > 256): the most threads per program
        return False
    return per_thread <= 32 and (per_thread >= 8 or cfg["num_warps"] == 2)


def _step_fits(cfg, args) -> bool:
    if cfg["BK"] != key_tile(args["R"]) or cfg["BV"] > _bv_cap(args) or not _step_keep(cfg):
        return False
    per_thread = regs_per_thread(cfg["BK"] * cfg["BV"], cfg["num_warps"])
    return per_thread >= 8 or cfg["BV"] == _bv_cap(args)


_AXES = dict(BK=[16, 32, 64, 128, 256, 512, 1024], BV=[4, 8, 16, 32, 64], num_warps=[2, 4, 8], num_stages=[1])

STEP = KernelSpace(
    name="decode.step",
    axes={family: _AXES for family in ("default", "a6000", "a100", "ada", "h100", "h200")},
    cpu=dict(BK=32, BV=32, num_warps=4, num_stages=1),  # loops over key tiles: exercises that path
    # b_t relaid out to the tile's rows, and the reduction over keys across warps (measured ≤ this)
    smem=lambda cfg, args: 4 * (cfg["BK"] + 8 * cfg["BV"]),
    fits=_step_fits,
    keep=_step_keep,
)


TOKENS = KernelSpace(
    name="decode.tokens",
    axes={family: _AXES for family in ("default", "a6000", "a100", "ada", "h100", "h200")},
    cpu=dict(BK=32, BV=32, num_warps=4, num_stages=1),
    smem=lambda cfg, args: 4 * (cfg["BK"] + 8 * cfg["BV"]),
    fits=_step_fits,
    keep=_step_keep,
)
"""``decode_tokens``' k-token step, slotted or not (kernels/decode.py ``_decode_tokens_kernel``): the one-token
step's tiles, tuned apart (its programs may walk k tokens).  The one-token slotted step runs the one-token
kernel, in ``STEP``."""
