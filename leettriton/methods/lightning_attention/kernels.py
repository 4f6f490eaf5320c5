"""lightning_attention: Lightning Attention-2, one fused kernel walking the chunks in order.

One program per batch·head and value tile walks the whole sequence, chunk by chunk, its state in registers:
the chunk walk of kernels/walk.py (its body, modes and launcher), here as this method's own kernel instance,
with its own config space (``space.FWD``) and tuned choices.  r > 256 runs in pieces of r (kernels/pieces.py).
"""
from __future__ import annotations

from ...kernels.pieces import in_r_pieces
from ...kernels.walk import WALK_MAX_R, chunk_walk_kernel, launch_chunk_walk
from ...problem import Problem
from ..spec import Plan
from . import space as spaces

_lightning_attention_fwd_kernel = chunk_walk_kernel(spaces.FWD)


def lightning_attention_fwd(p: Problem, plan: Plan) -> None:
    """Launch the fused chunk walk for ``p`` with the plan's configs (r > 256: in pieces of r)."""
    in_r_pieces(p, WALK_MAX_R, lambda piece, partial: launch_chunk_walk(_lightning_attention_fwd_kernel, spaces.FWD,
                                                                        piece, plan.configs, partial=partial))
