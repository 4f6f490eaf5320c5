"""block_based: segment-parallel chunk walk, for when batch·heads alone cannot fill the GPU.

The sequence is cut into segments of L rows (L from the family's rule in
methods/block_based/space.py, so that programs ≈ a small multiple of the
multiprocessors).  Then:

1. ``segment_local_states`` (kernels/segments.py): the local state
   Σ_j γ^(e−1−j) c_jᵀ v_j of every segment but the last, in parallel;
2. the lightning_attention chunk walk (methods/lightning_attention/kernels.py), one
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

Memory traffic: b once, c and v twice (the state pass reads all segments but the last), o once,
plus the float32 workspace of NS · r · d per batch·head.  When one segment
suffices (many batch·heads, or a short sequence) it is the lightning walk alone.
"""
from __future__ import annotations

from ...problem import Problem
from ..spec import Plan
from . import space as spaces
from ...kernels.segments import segment_local_states, segment_start_states
from ...kernels.pieces import in_r_pieces
from ..lightning_attention.kernels import WALK_MAX_R, chunk_walk_kernel, launch_chunk_walk

_block_based_fwd_kernel = chunk_walk_kernel(spaces.FWD)


def block_based_fwd(p: Problem, plan: Plan) -> None:
    """Launch the segment states and the segment-parallel chunk walk for ``p`` with the plan's
    configs and schedule (``seg_len``, ``prefix``: :func:`space.schedule`); r > 256 in pieces of r
    (kernels/pieces.py)."""
    in_r_pieces(p, WALK_MAX_R, lambda piece: _block_based_fwd(piece, plan))


def _block_based_fwd(p: Problem, plan: Plan) -> None:
    n = p.shape[2]
    config = plan.configs
    seg_len = plan.schedule["seg_len"]
    if seg_len >= n:
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, config)
        return
    if plan.schedule["prefix"]:
        # few segments: the walk sums each start state from the local states itself (no scan launch)
        ws = segment_local_states(p, seg_len, config, last=False)
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, config, ws=ws, seg_len=seg_len, prefix=True)
    else:
        ws = segment_start_states(p, seg_len, config)
        launch_chunk_walk(_block_based_fwd_kernel, spaces.FWD, p, config, ws=ws, seg_len=seg_len)
