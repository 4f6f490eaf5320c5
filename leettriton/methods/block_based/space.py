"""Configs of the block_based chunk walk, and the rule that cuts the sequence into segments.

block_based launches the lightning_attention chunk walk once per (segment,
value tile, batch·head), so its config space is the same walk space under its
own name (its choices are tuned apart: its programs are shorter and more
numerous).  The segment rule lives here, not in the launcher: it is a
GPU-specific choice (the number of multiprocessors to fill).
"""
from __future__ import annotations

from typing import Mapping, Optional


from ...autotune.families import Family
from ...autotune.sizing import cdiv, pow2
from ...kernels.segments_space import segment_length as shared_segment_length
from ...problem import Problem
from ..lightning_attention.space import walk_space

FWD = walk_space("block_based.fwd")

PROGRAMS_PER_SM = 2
"""Walk programs to aim for per multiprocessor: exactly one wave.  The 16-bit
configs run 4 warps with 240-255 registers per thread and 25-82 KB of shared
memory on sm_90, so two programs share an SM (the loads of one hide behind the
products of the other); a second, partial wave would leave SMs idle at the end."""

MIN_SEGMENT = 1024
"""Fewest rows per segment: below this the extra traffic of a segment (its
float32 start state, written and read back, r·d·4 B = 64 KB at r = d = 128)
is a sizeable share of its own inputs (L·(2r + d)·2 B = 768 KB at L = 1024)."""

SEGMENT_ALIGN = 128
"""Segment lengths are multiples of the largest chunk, so no chunk is cut short."""

INTERPRETER_SEGMENT = 40
"""Segment length under the interpreter (the ``cpu`` family), whatever the size:
short, so that the CPU test suite's sequences of a few hundred rows run the
multi-segment path, and not a multiple of the interpreter's 16-row chunk, so
that segment ends cut chunks short."""

REFERENCE_BV = 64
"""Value-tile width the segment count assumes when no config is pinned (while
the walk is autotuned): the width the tuner picks at r = d = 128 on sm_90.
Assuming 32 there halved the segments the tuned 64-wide walk then ran with (one
program per SM instead of two): 2.77 ms at 1 × 32 heads × 100 000 in float16
with decay, against 2.48 ms with the segment count of its own width
(perf/results/h100/walk_configs.log, where 32-wide tiles took 4.68 ms)."""


def segment_length(batch_heads: int, n: int, d: int, family: Family,
                   config: Optional[Mapping[str, int]] = None) -> int:
    """Rows per segment for a launch of ``batch_heads`` sequences of ``n`` rows, value width ``d``:
    the shared rule (kernels/segments_space.py) with one program per (segment, value tile,
    batch·head), ``PROGRAMS_PER_SM`` per multiprocessor, segments of at least ``MIN_SEGMENT`` rows.
    Under the interpreter, ``INTERPRETER_SEGMENT`` rows."""
    if family.name == "cpu":
        return min(n, INTERPRETER_SEGMENT)
    bv = min((config or {}).get("BV", REFERENCE_BV), pow2(d))
    return shared_segment_length(n, batch_heads * cdiv(d, bv), family, programs_per_sm=PROGRAMS_PER_SM,
                                 min_segment=MIN_SEGMENT, align=SEGMENT_ALIGN)


PREFIX_SEGMENTS = 8
"""Most segments for which each walk program sums its own start state from the segments' local
states (it reads up to NS − 1 of them, r·d·4 B each: at most 7 · 64 KB at r = d = 128, against a
scan launch saved); with more, a scan kernel computes the start states once."""

INTERPRETER_PREFIX_SEGMENTS = 3
"""The same bound under the interpreter, low so that the CPU suite's sequences of a few hundred
rows run both paths."""


def walk_sums_prefix(segments: int, family: Family) -> bool:
    """Whether a walk over ``segments`` segments sums its start states itself (no scan kernel)."""
    return segments <= (INTERPRETER_PREFIX_SEGMENTS if family.name == "cpu" else PREFIX_SEGMENTS)


def schedule(p: Problem, family: Family, configs: Optional[Mapping]) -> dict:
    """block_based's launch parameters: ``seg_len`` (rows per segment; n: one segment, the plain
    walk) and ``prefix`` (whether the walk sums its start states itself, with no scan kernel)."""
    B, H, n, r, d = p.shape
    seg_len = segment_length(B * H, n, d, family, (configs or {}).get(FWD.name))
    return dict(seg_len=seg_len, prefix=seg_len < n and walk_sums_prefix(cdiv(n, seg_len), family))
