"""Configs of the segment-state kernels (kernels/segments.py)."""
from __future__ import annotations

import math

from ..autotune.configs import KernelSpace
from ..autotune.families import Family
from ..autotune.sizing import cdiv, elem_bytes, pow2, regs_per_thread


def _state_smem(cfg, args) -> int:
    return cfg["num_stages"] * cfg["BT"] * (cfg["BK"] + cfg["BV"]) * elem_bytes(args)


def _state_fits(cfg, args) -> bool:
    if cfg["BK"] > pow2(args["R"]) or cfg["BV"] > pow2(args["D"]):
        return False
    if elem_bytes(args) == 4:
        # float32 tiles (and, for "ieee", CUDA-core products) spill beyond 64 × 64 states and 64-row steps
        return cfg["BK"] * cfg["BV"] <= 64 * 64 and cfg["BT"] <= 64
    # up to 64 accumulator registers a thread; the 8-warp 256 × 128 tile (r > 128 only) holds 128
    return regs_per_thread(cfg["BK"] * cfg["BV"], cfg["num_warps"]) <= (128 if cfg["BK"] > 128 else 64)


# sm_90: one warpgroup with state tiles up to 128 × 64, or two with 128 × 128 (a quarter of the programs
# at r = 256, d = 512, each re-reading c and v half as often), or with 256 × 128 at r > 128: all of r in
# one program, c read once per value tile: at RetNet-1.3B's layer (r = 256, d = 512) the fastest, most of all
# where the pass runs in pieces; 256-wide value tiles and 2 stages were slower there.  A fourth stage (192 KB
# of tiles) pays a little for the 256 × 128 tile; deeper pipelines of the smaller tiles do not.  The tiles tie
# timed alone, so the tuner also times them in the whole call (Method.whole_call; docs/design.md §3.5, §5.5).
_SM90 = [dict(BT=[64, 128], BK=[64, 128], BV=[32, 64], num_warps=[4], num_stages=[2, 3]),
         dict(BT=[64], BK=[128], BV=[128], num_warps=[8], num_stages=[2, 3]),
         dict(BT=[64], BK=[256], BV=[128], num_warps=[8], num_stages=[3, 4])]

WAVE_TILE = 128
"""State tile side (in r and in d) at which :func:`pass_wave` counts a segment-state pass's programs."""


def pass_wave(sums: int, r: int, d: int, family: Family) -> int:
    """The size class of a segment-state pass of ``sums`` local states (batch·heads × segments or pieces) at widths
    ``r`` and ``d``: ⌊log2⌋ of its programs at 128 × 128 tiles per multiprocessor, from −3 (an eighth of a wave or
    less) to 1 (two waves or more).  A key of the pass's autotuner beside r, d and the flags, so that a tile chosen
    for a pass of a few programs (1 × 32 heads × 2048 at r = d = 128: 32 sums, a quarter of a wave) is not the one
    a pass of several waves runs (× 100 000: 256 sums in pieces), and at most five choices are made per key
    whatever the sequence lengths.  Without it a small tile tuned first at a short n was kept for every longer
    one, where a large tile is much faster (docs/design.md §5.3)."""
    programs = max(1, sums * cdiv(r, WAVE_TILE) * cdiv(d, WAVE_TILE))
    return max(-3, min(1, math.floor(math.log2(programs / family.num_sms))))


STATE = KernelSpace(
    name="segments.state",
    axes={
        "default": dict(BT=[64], BK=[64, 128], BV=[32, 64], num_warps=[4], num_stages=[2, 3]),
        "a6000": dict(BT=[32, 64], BK=[64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "ada": dict(BT=[32, 64], BK=[64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "h100": _SM90,
        "h200": _SM90,
    },
    cpu=dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=1),
    smem=_state_smem,
    fits=_state_fits,
)


def _scan_fits(cfg, args) -> bool:
    return cfg["BK"] <= pow2(args["R"]) and cfg["BV"] <= pow2(args["D"])


SCAN = KernelSpace(
    name="segments.scan",
    axes={
        "default": dict(BK=[32, 64], BV=[64], num_warps=[4], num_stages=[1]),
        "h100": dict(BK=[16, 32, 64], BV=[64, 128], num_warps=[4], num_stages=[1]),
        "h200": dict(BK=[16, 32, 64], BV=[64, 128], num_warps=[4], num_stages=[1]),
    },
    cpu=dict(BK=64, BV=64, num_warps=4, num_stages=1),
    smem=lambda cfg, args: 0,
    fits=_scan_fits,
)


def segment_length(n: int, programs_per_segment: int, family: Family, *, programs_per_sm: int,
                   min_segment: int, align: int) -> int:
    """Rows per segment for a method that cuts each sequence of ``n`` rows into segments (docs/design.md §3).

    The rule shared by every such method: a launch runs ``programs_per_segment``
    programs (batch·heads × value tiles) per segment, and the segment count is
    the largest that keeps them within one wave of ``programs_per_sm`` programs
    on each of the family's multiprocessors (rounding down: a partial second
    wave leaves multiprocessors idle at the end), each segment at least
    ``min_segment`` rows.  Segment lengths are multiples of ``align`` (the
    method's largest chunk), so that only a segment's last chunk is cut short.
    Returns ``n`` (one segment) when the programs already fill the GPU or the
    sequence is too short to split.
    """
    segments = min(programs_per_sm * family.num_sms // max(1, programs_per_segment), n // min_segment)
    if segments <= 1:
        return n
    return min(cdiv(cdiv(n, segments), align) * align, n)
