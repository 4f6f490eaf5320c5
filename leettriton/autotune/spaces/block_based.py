"""Configs of the block_based chunk walk, and the rule that cuts the sequence into segments.

block_based launches the lightning_attention chunk walk once per (segment,
value tile, batch·head), so its config space is the same walk space under its
own name (its choices are tuned apart: its programs are shorter and more
numerous).  The segment rule lives here, not in the launcher: it is a
GPU-specific choice (the number of multiprocessors to fill).
"""
from __future__ import annotations

from typing import Mapping, Optional

import triton

from ..families import Family
from ._util import pow2
from .lightning_attention import walk_space

FWD = walk_space("block_based.fwd")

PROGRAMS_PER_SM = 2
"""Programs of the segment walk to aim for per multiprocessor: one wave of two
co-resident programs (the fp16 r = d = 128 configs use 8 warps and ~100-230 KB of
shared memory, so one or two fit per SM), enough for the loads of one to hide
behind the products of the other."""

MIN_SEGMENT = 1024
"""Fewest rows per segment: below this the extra traffic of a segment (its
float32 start state, written and read back, r·d·4 B ≈ 64 KB at r = d = 128)
is a sizeable share of its own inputs (L·(2r + d)·2 B ≈ 768 KB at L = 1024)."""

SEGMENT_ALIGN = 128
"""Segment lengths are multiples of the largest chunk, so no chunk is cut short."""

REFERENCE_BV = 128
"""Value-tile width the segment count assumes when no config is pinned (the
widest of the h100/h200 lists: the rule then errs towards more segments)."""


def segment_length(batch_heads: int, n: int, d: int, family: Family,
                   config: Optional[Mapping[str, int]] = None) -> int:
    """Rows per segment for a launch of ``batch_heads`` sequences of ``n`` rows, value width ``d``.

    Aims at ``PROGRAMS_PER_SM × family.num_sms`` programs of the walk, each
    segment at least ``MIN_SEGMENT`` rows; returns ``n`` (one segment, no
    segment states at all) when batch·heads and the value tiles already fill
    the GPU or the sequence is too short to split.
    """
    bv = min((config or {}).get("BV", REFERENCE_BV), pow2(d))
    programs = batch_heads * triton.cdiv(d, bv)
    target = PROGRAMS_PER_SM * family.num_sms
    segments = min(triton.cdiv(target, programs), n // MIN_SEGMENT)
    if segments <= 1:
        return n
    seg = triton.cdiv(triton.cdiv(n, segments), SEGMENT_ALIGN) * SEGMENT_ALIGN
    return min(seg, n)
