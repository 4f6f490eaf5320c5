"""Configs of the block_based chunk walk, and the rule that cuts the sequence into segments.

block_based launches the chunk walk (kernels/walk.py) once per (segment,
value tile, batch·head), so its config space is the same walk space under its
own name (its choices are tuned apart: its programs are shorter and more
numerous).  The segment rule lives here, not in the launcher: it is a
GPU-specific choice (the number of multiprocessors to fill).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional


from ...autotune.families import Family
from ...autotune.sizing import cdiv, elem_bytes, pow2
from ...kernels.abi import problem_args
from ...kernels.segments_space import segment_length as shared_segment_length
from ...problem import Problem
from ...kernels.walk import CHUNK_ROWS_MAX, WALK_MAX_R
from ...kernels.walk_space import walk_space


def _trial(config: Mapping[str, int], args: Mapping[str, Any], family: Family) -> bool:
    """The autotuner times a segmented walk, cut without a config (:func:`reference_walk`), only with the
    configs that get the same segments, and where the cut names a class (:func:`one_per_sm_reference`), only
    with that class's (value-tile width and programs per multiprocessor).  Its choice is kept for every n of
    its key, and a config of the same class gets the same segments at every n, so there the choice never runs
    under segments cut for another occupancy (a one-program config under segments for two leaves half its
    programs to a second wave).  The others run only when pinned; the tuner times them so
    (:func:`alternatives`)."""
    if not args.get("SEGMENTED") or family.name == "cpu":   # the interpreter's segments take no config
        return True
    ws = args["ws_ptr"]   # (B, H, NS, r, d): the segments' states
    r, d, itemsize = args["R"], args["D"], elem_bytes(args)
    segments = segment_length(ws.shape[0] * ws.shape[1], args["N"], r, d, itemsize, family, config)
    if segments != args["SEG"]:
        return False
    return one_per_sm_reference(r, d, itemsize, family) is None or \
        walk_class(config, r, d, itemsize, family) == reference_walk(r, d, itemsize, family)


FWD = dataclasses.replace(walk_space("block_based.fwd"), trial=_trial)

PROGRAMS_PER_SM = 2
"""Walk programs to aim for per multiprocessor: exactly one wave.  The 16-bit
configs run 4 warps with 240-255 registers per thread and 25-82 KB of shared
memory on sm_90, so two programs share an SM (the loads of one hide behind the
products of the other); a second, partial wave would leave SMs idle at the end.
A config that leaves room for only one (:func:`programs_per_sm`) gets one."""

REGISTERS_PER_SM = 65536
"""32-bit registers of one multiprocessor (every family so far)."""

WALK_REGISTERS = 255
"""Registers per thread to assume for a walk program: the 16-bit walks compile to 240-255 on sm_90."""

MIN_SEGMENT = 1024
"""Fewest rows per segment: below this the extra traffic of a segment (its
float32 start state, written and read back, r·d·4 B = 64 KB at r = d = 128)
is a sizeable share of its own inputs (L·(2r + d)·2 B = 768 KB at L = 1024)."""

SMALL_STATE = 64 * 64
"""States of at most this many entries (r·d) may take segments down to ``SHORT_MIN_SEGMENT`` rows."""

LARGE_STATE = 256 * 256
"""States of at least this many entries (r·d) may also take segments down to ``SHORT_MIN_SEGMENT`` rows, as long as
their walks still get at most one program a multiprocessor (:func:`segmenting`).  Their walk's time per row is that
of its products (r·d multiply-adds a row), not of its reads, and a segment's start state (r·d floats) grows with it,
so its share of a segment's time stays that of a narrow walk's start state at 512 rows; but a second program on a
multiprocessor adds no speed to products that already keep it busy, while more segments add state-pass work.  So
shorter segments pay for the one-program walk and not beyond it, as measured at RetNet-1.3B's layer (heads 8,
r = 256, d = 512; docs/design.md §3.6)."""

SHORT_MIN_SEGMENT = 512
"""Fewest rows per segment for a small state (and, up to one program a multiprocessor, a large one), while the
walk still sums its own start states (at most ``PREFIX_SEGMENTS`` segments: a scan launch costs more than the
shorter segments save).  At r = d = 64 the state is 16 KB, the same share of 512 rows' inputs as at r = d = 128
of 1024.  Short segments pay while the walk sums its own start states; once they would need the scan, its launch
costs more than they save (docs/design.md §3.6)."""


def short_min_segment(n: int) -> int:
    """``SHORT_MIN_SEGMENT``, or longer where ``PREFIX_SEGMENTS`` segments of it would not cover ``n`` (at most
    ``MIN_SEGMENT``)."""
    return max(SHORT_MIN_SEGMENT, min(MIN_SEGMENT, cdiv(n, PREFIX_SEGMENTS)))


def min_segment(n: int, r: int, d: int) -> int:
    """The fewest rows per segment of a sequence of ``n`` rows at widths ``r`` and ``d`` in the segment rule's
    wave: ``MIN_SEGMENT``, or for a small state :func:`short_min_segment` (a large state's shorter segments come
    in :func:`segmenting`, up to one program a multiprocessor)."""
    if r * d > SMALL_STATE:
        return MIN_SEGMENT
    return short_min_segment(n)


SEGMENT_ALIGN = CHUNK_ROWS_MAX
"""Segment lengths are multiples of the largest chunk, so no chunk is cut short."""

INTERPRETER_SEGMENT = 40
"""Segment length under the interpreter (the ``cpu`` family), whatever the size:
short, so that the CPU test suite's sequences of a few hundred rows run the
multi-segment path, and not a multiple of the interpreter's 16-row chunk, so
that segment ends cut chunks short."""

REFERENCE_BV = 64
"""Value-tile width the segment count assumes when no config is pinned (while the walk is autotuned),
where :func:`reference_walk` names no other: the width the tuner picks at r = d = 128 on sm_90.
A reference narrower than the width that runs would halve the segments the tuned
walk then runs with (one program per SM instead of two), which is slower: the
reference must be the width the tuner picks (docs/design.md §3.6)."""

ONE_PER_SM_FAMILIES = ("h100", "h200")
"""Families (sm_90) whose 16-bit walks at r > 64 are cut, while autotuned, for one program a multiprocessor
(:func:`reference_walk`)."""


def reference_walk(r: int, d: int, itemsize: int, family: Family) -> tuple[int, int]:
    """(value-tile width, walk programs per multiprocessor) that a segmented walk is cut for when its config
    is not pinned: :func:`one_per_sm_reference`'s class, or else ``REFERENCE_BV`` and ``PROGRAMS_PER_SM``."""
    bv = one_per_sm_reference(r, d, itemsize, family)
    return (bv, 1) if bv is not None else (min(REFERENCE_BV, pow2(d)), PROGRAMS_PER_SM)


def one_per_sm_reference(r: int, d: int, itemsize: int, family: Family) -> Optional[int]:
    """The value-tile width of the one-program-a-multiprocessor class that an autotuned walk of these widths
    is cut for and autotunes within (:func:`_trial`), or None where it is cut for ``PROGRAMS_PER_SM`` and times
    every config that gets those segments.

    The class the tuner chose where it timed every config under its own segments: on sm_90, 16-bit inputs,
    64-wide tiles, one program a multiprocessor (64-row chunks with 3 or 4 stages) at 64 < r ≤ 128, and
    128-wide tiles on 8 warps at r > 128 (d ≥ 128).  Of the segmented block_based points at r = d = 128,
    h200.json chose 64-wide tiles, one program a multiprocessor, at 62 of 62 and h100.json at 57 of 62; at
    r = 256, d = 512 the 8-warp 128-wide walk at 29 of 31 and 10 of 12.  Cut for two programs a
    multiprocessor, an autotuned walk that then picks a one-program config runs half its programs in a second
    wave, slower than the file's one-program walk (docs/design.md §3.6, §5.5)."""
    rp = pow2(min(r, WALK_MAX_R))
    if family.name not in ONE_PER_SM_FAMILIES or itemsize != 2 or rp <= 64:
        return None
    if rp <= 128:
        return min(REFERENCE_BV, pow2(d))
    return 128 if d >= 128 else None


def walk_class(config: Mapping[str, int], r: int, d: int, itemsize: int, family: Family) -> tuple[int, int]:
    """(value-tile width, walk programs per multiprocessor) of a walk ``config``: what its segments depend on."""
    return min(config["BV"], pow2(d)), programs_per_sm(config, r, itemsize, family)


def programs_per_sm(config: Mapping[str, int], r: int, itemsize: int, family: Family) -> int:
    """Walk programs of ``config`` that one multiprocessor holds at once, at most ``PROGRAMS_PER_SM``
    (an autotuned walk's segments assume :func:`reference_walk`'s).

    Registers: ``WALK_REGISTERS`` per thread, so 8 warps leave room for one program.  Shared memory:
    the pipelined tiles, ``num_stages`` copies of the BT-row tiles of b, c (r wide, or the width of
    one piece of r: ``WALK_MAX_R``) and v, against the family's shared memory.  An estimate: on sm_90
    in float16 (Triton 3.6) the compiler allocates 120 KB where it counts 120 KB (BT 64, 3 stages,
    r = d = 128, BV 64: one program per SM), 76 KB where it counts 108 KB (BT 32, 3 stages, r = 256:
    two), and 112 KB where it counts 144 KB (BT 32, 4 stages, r = 256: counted as one, though two
    would fit).  Whatever it counts, the tuner times each config under the segments it gets here.
    """
    by_registers = REGISTERS_PER_SM // (WALK_REGISTERS * 32 * config["num_warps"])
    tiles = config["num_stages"] * config["BT"] * (2 * pow2(min(r, WALK_MAX_R)) + config["BV"]) * itemsize
    return max(1, min(PROGRAMS_PER_SM, by_registers, family.smem_per_block // tiles))


def segment_length(batch_heads: int, n: int, r: int, d: int, itemsize: int, family: Family,
                   config: Optional[Mapping[str, int]] = None) -> int:
    """Rows per segment for a launch of ``batch_heads`` sequences of ``n`` rows, widths ``r`` and
    ``d``, ``itemsize``-byte inputs: the first of :func:`segmenting`."""
    return segmenting(batch_heads, n, r, d, itemsize, family, config)[0]


def segmenting(batch_heads: int, n: int, r: int, d: int, itemsize: int, family: Family,
               config: Optional[Mapping[str, int]] = None) -> tuple[int, int]:
    """(rows per segment, pieces per segment of the state pass) for a launch of ``batch_heads``
    sequences of ``n`` rows, widths ``r`` and ``d``, ``itemsize``-byte inputs.

    Segments: the shared rule (kernels/segments_space.py) with one program per (segment, value tile,
    batch·head), :func:`programs_per_sm` of the walk ``config`` per multiprocessor, segments of at
    least :func:`min_segment` rows; for a state of ``LARGE_STATE`` entries or more, as many as that rule with
    one program a multiprocessor and :func:`short_min_segment` rows gives, if more; under the interpreter,
    ``INTERPRETER_SEGMENT`` rows.  Pieces:
    :func:`state_split`; the segment length is then rounded up to a multiple of the pieces' alignment,
    so that every piece but the sequence's last is as long."""
    if family.name == "cpu":
        seg_len = min(n, INTERPRETER_SEGMENT)
        return seg_len, state_split(batch_heads, n, r, d, seg_len, family)
    bv, per_sm = walk_class(config, r, d, itemsize, family) if config else reference_walk(r, d, itemsize, family)
    programs = batch_heads * cdiv(d, bv)
    seg_len = shared_segment_length(n, programs, family, programs_per_sm=per_sm,
                                    min_segment=min_segment(n, r, d), align=SEGMENT_ALIGN)
    if r * d >= LARGE_STATE:   # shorter segments, as far as one walk program a multiprocessor (LARGE_STATE)
        seg_len = min(seg_len, shared_segment_length(n, programs, family, programs_per_sm=1,
                                                     min_segment=short_min_segment(n), align=SEGMENT_ALIGN))
    split = state_split(batch_heads, n, r, d, seg_len, family)
    if split > 1:
        seg_len = cdiv(cdiv(n, cdiv(n, seg_len)), SEGMENT_ALIGN * split) * SEGMENT_ALIGN * split
    return (seg_len, split) if seg_len < n else (n, 1)


STATE_PROGRAMS_PER_SM = 2
"""Segment-state programs to aim for per multiprocessor.  The state pass runs one program per
(segment but the last, r tile, d tile, batch·head), each summing its segment's rows in order: at
batch 1 with two segments (1 × 32 heads × 32 768, r = d = 128, tiles of 128 × 64) that is 64 programs
for 132 multiprocessors, each reading 16 384 rows.  Cutting each segment into pieces for the state
pass gives it more programs and shorter loops; the scan kernel then joins the pieces' states."""

STATE_TILE = (128, 64)
"""The (r, d) state tile the piece count assumes (the segment-state kernel's is autotuned later)."""

MIN_STATE_PIECE = 1024
"""Fewest rows per piece of the state pass."""

MAX_STATE_SPLIT = 16
"""Most pieces per segment (a power of two)."""


def state_split(batch_heads: int, n: int, r: int, d: int, seg_len: int, family: Family) -> int:
    """Pieces per segment for the state pass of a walk over segments of ``seg_len`` rows: the fewest
    (a power of two) that give the pass ``STATE_PROGRAMS_PER_SM`` programs per multiprocessor, with
    pieces of at least ``MIN_STATE_PIECE`` rows; 1 for one segment.  Under the interpreter: 2 where
    the walk would otherwise sum its start states itself (more segments than
    ``INTERPRETER_PREFIX_SEGMENTS``), so that the CPU suite runs both."""
    segments = cdiv(n, seg_len)
    if segments <= 1:
        return 1
    if family.name == "cpu":
        return 1 if walk_sums_prefix(segments, family) else 2
    programs = (segments - 1) * batch_heads * cdiv(r, STATE_TILE[0]) * cdiv(d, STATE_TILE[1])
    split = 1
    while (split < MAX_STATE_SPLIT and programs * split < STATE_PROGRAMS_PER_SM * family.num_sms
           and seg_len // (2 * split) >= MIN_STATE_PIECE):
        split *= 2
    return split


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
    walk), ``split`` (pieces per segment of the state pass, :func:`state_split`) and ``prefix``
    (whether the walk sums its start states itself, with no scan kernel: whole segments only)."""
    B, H, n, r, d = p.shape
    seg_len, split = segmenting(B * H, n, r, d, p.v.element_size(), family, (configs or {}).get(FWD.name))
    return dict(seg_len=seg_len, split=split,
                prefix=seg_len < n and split == 1 and walk_sums_prefix(cdiv(n, seg_len), family))


def state_pieces(schedule: Mapping[str, Any], n: int) -> tuple[int, int]:
    """(rows per piece of the state pass, pieces before the last segment's first) of a segmented
    schedule over ``n`` rows: the walk of segment s reads the start state of piece s · split."""
    split = schedule.get("split", 1)
    return schedule["seg_len"] // split, (cdiv(n, schedule["seg_len"]) - 1) * split


def alternatives(p: Problem, family: Family) -> list[dict]:
    """The walk configs the tuner times pinned, with their own segments (``Method.alternatives``): every
    config that fits ``p`` and that the autotuner does not time under the segments cut for
    :func:`reference_walk` (:func:`_trial`): every config that gets other segments, and where those are more
    than one and the cut names a class (:func:`one_per_sm_reference`), every config of another class."""
    if family.name == "cpu":   # the interpreter's segments take no config
        return []
    B, H, n, r, d = p.shape
    itemsize = p.v.element_size()
    reference = segment_length(B * H, n, r, d, itemsize, family)
    cut, fixed = reference_walk(r, d, itemsize, family), one_per_sm_reference(r, d, itemsize, family) is not None
    args = {**problem_args(p), "SEGMENTED": True}
    others = []
    for cfg in FWD.usable(family, args):
        own = segment_length(B * H, n, r, d, itemsize, family, cfg)
        if own != reference or (reference < n and fixed and walk_class(cfg, r, d, itemsize, family) != cut):
            others.append({FWD.name: cfg})
    return others
