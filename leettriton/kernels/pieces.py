"""Keys wider than a kernel holds: the problem cut into pieces of r whose outputs add up.

The operator is linear in the key dimension: with b and c cut into column blocks
b = [b₁ … b_k], c = [c₁ … c_k] (and the state into the matching row blocks),

    o = Σ_p (b_p c_pᵀ ⊙ M) v + γ^(i+1) b_p S₀[p]        and     S_n[p] = γ^n S₀[p] + Σ_j γ^(n−1−j) c_p,jᵀ v_j,

so each piece is a problem of its own over the same v, and its state rows are exactly
rows p of the full state.  A kernel that holds all of r in registers (the chunk walk:
at most 256) runs a wider r as consecutive pieces chained through float32 partial
outputs: each piece adds the sum of the pieces before it (read from a float32 buffer)
to its own output in float32, and the last one rounds the total once into the output
(docs/design.md §1.5).  No separate sum or copy runs; each launch reads one buffer
and writes another, so running it again (an autotuning trial) gives the same result.

A piece's masked scores are partial sums over its keys, which may cancel between pieces: one
rounding of each to 16 bits would err by the pieces' magnitudes, not the score's.  With 16-bit
inputs the walk of a piece (``Problem.r_piece``) therefore makes their product with v in two parts,
hi + lo, each a product of its own (about 22 significant bits for float16): one more product per
chunk, for r > 256 only.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from ..problem import Problem

__all__ = ["in_r_pieces"]


def in_r_pieces(p: Problem, max_r: int, run: Callable[[Problem, Optional[torch.Tensor]], None]) -> None:
    """Run ``run(p, None)`` when r ≤ ``max_r``; else ``run(piece, partial)`` on pieces of r of at most
    ``max_r`` keys (all ``max_r`` wide but the last), in order.

    ``partial`` is None for the first piece and otherwise the float32 ``(B, H, n, d)`` sum of the pieces
    before it, which the launch must add to its own output before writing ``piece.out``: a float32
    buffer for every piece but the last, whose ``out`` is ``p.out``.  Two buffers alternate (one for
    two pieces), so no launch reads what it writes.  Each piece reads column views of b and c and row
    views of the initial state and writes row views of the final state: no input is copied.  Extra
    traffic: one float32 (n, d) buffer written and read back per piece after the first.
    """
    r = p.b.shape[-1]
    if r <= max_r:
        run(p, None)
        return
    starts = range(0, r, max_r)
    buffers = [torch.empty(p.out.shape, dtype=torch.float32, device=p.out.device)
               for _ in range(min(2, len(starts) - 1))]
    partial = None
    for i, start in enumerate(starts):
        keys = slice(start, min(start + max_r, r))
        out = p.out if i == len(starts) - 1 else buffers[i % 2]
        piece = dataclasses.replace(
            p, b=p.b[..., keys], c=p.c[..., keys], out=out,
            initial_state=None if p.initial_state is None else p.initial_state[:, :, keys],
            state=None if p.state is None else p.state[:, :, keys], r_piece=True)
        run(piece, partial)
        partial = out
