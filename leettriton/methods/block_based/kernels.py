"""block_based: segment-parallel chunk walk, for when batch·heads alone cannot fill the GPU.

The sequence is cut into segments of L rows (L from the family's rule in
methods/block_based/space.py, so that programs ≈ a small multiple of the
multiprocessors).  Then:

1. ``segment_local_states`` (kernels/segments.py): the local state
   Σ_j γ^(e−1−j) c_jᵀ v_j of every segment but the last, in parallel;
2. the chunk walk (kernels/walk.py), one
   program per (value tile, segment, batch·head), each starting from its
   segment's start state γ^(s·L) S₀ + Σ_{j<s} γ^((s−1−j)·L) S_loc[j], which it
   sums itself (the last segment's programs end with the final state):
   intra-chunk masked decayed products on tensor cores, inter-chunk through
   the float32 state in registers.

With many segments (a few batch·heads and a very long sequence: see
``walk_sums_prefix`` in methods/block_based/space.py) those sums would read
the local states quadratically often; a short scan kernel then turns them into
start states first (``segment_start_states``).  Folding the scan into the walk
saves a launch, which counts where a call takes a fraction of a millisecond.
Where the segments are few and long (batch 1: two segments of 16 384 rows at 32
heads), the state pass alone would run too few programs for the GPU; it then cuts
each segment into ``split`` pieces (``state_split`` in space.py), and the scan
joins the pieces' states (the walk reads every ``split``-th).

Memory traffic: b once, c and v twice (the state pass reads all segments but the last), o once,
plus the float32 workspace of NS · split · r · d per batch·head.  When one segment
suffices (many batch·heads, or a short sequence) it is the lightning walk alone.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...problem import Problem
from ..spec import Plan
from . import space as spaces
from ...kernels.segments import scan_segment_states, segment_local_states
from ...kernels.pieces import in_r_pieces
from ...kernels.walk import WALK_MAX_R, chunk_walk_kernel, launch_chunk_walk

_block_based_fwd_kernel = chunk_walk_kernel(spaces.FWD)


def block_based_fwd(p: Problem, plan: Plan) -> None:
    """Launch the segment states and the segment-parallel chunk walk for ``p`` with the plan's
    configs and schedule (``seg_len``, ``split``, ``prefix``: :func:`space.schedule`); r > 256 in pieces of r
    (kernels/pieces.py)."""
    in_r_pieces(p, WALK_MAX_R, lambda piece, partial: _block_based_fwd(piece, plan, partial))


def _block_based_fwd(p: Problem, plan: Plan, partial: Optional[torch.Tensor]) -> None:
    if plan.schedule["seg_len"] >= p.shape[2]:
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, plan.configs, partial=partial)
        return
    walk_segments(p, plan, local_states(p, plan), partial=partial)


def local_states(p: Problem, plan: Plan) -> torch.Tensor:
    """The segment-state pass of ``p`` (a plan with ``seg_len < n``): the local states, from a zero start,
    that :func:`walk_segments` takes, as few as the plan's walk reads."""
    if plan.schedule["prefix"]:
        # with the prefix sums the walk never reads the last segment's local state
        return segment_local_states(p, plan.schedule["seg_len"], plan.configs, last=False)
    # the state pass in pieces; without a final state, none of the last segment's pieces (the scan
    # then reads every piece's state but theirs)
    piece, before_last = spaces.state_pieces(plan.schedule, p.shape[2])
    return segment_local_states(p, piece, plan.configs, count=None if p.state is not None else before_last)


def walk_segments(p: Problem, plan: Plan, ws: torch.Tensor, partial: Optional[torch.Tensor] = None) -> None:
    """The segment-parallel walk of ``p`` (r ≤ ``WALK_MAX_R``, a plan with ``seg_len < n``) from the
    local states ``ws`` (``segment_local_states`` of ``p``'s rows from a zero start, in the plan's
    pieces (``space.state_pieces``); without ``p.state``, those of the last segment's pieces may be
    missing): the start states from ``p.initial_state`` and ``ws`` (summed by each walk program, or by
    the scan kernel, which rewrites ``ws`` in place: a workspace walks once), then the walk.  Split
    from the local states so that a caller that needs them anyway (the sequence-parallel state pass,
    leettriton/distributed.py) computes them once.  ``partial``: as :func:`launch_chunk_walk`'s (a piece of r)."""
    seg_len, config = plan.schedule["seg_len"], plan.configs
    if plan.schedule["prefix"]:
        # few segments: the walk sums each start state from the local states itself (no scan launch)
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, config, ws=ws, seg_len=seg_len, prefix=True,
                          partial=partial)
    else:
        # the start state of every piece up to the last segment's first (all of them for the final state)
        piece, before_last = spaces.state_pieces(plan.schedule, p.shape[2])
        scan_segment_states(p, ws, piece, config, count=None if p.state is not None else before_last + 1)
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, config, ws=ws, seg_len=seg_len,
                          sub=plan.schedule.get("split", 1), partial=partial)
