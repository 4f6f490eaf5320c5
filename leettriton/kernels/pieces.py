"""Keys wider than a kernel holds: the problem cut into pieces of r whose outputs add up.

The operator is linear in the key dimension: with b and c cut into column blocks
b = [b₁ … b_k], c = [c₁ … c_k] (and the state into the matching row blocks),

    o = Σ_p (b_p c_pᵀ ⊙ M) v + γ^(i+1) b_p S₀[p]        and     S_n[p] = γ^n S₀[p] + Σ_j γ^(n−1−j) c_p,jᵀ v_j,

so each piece is a problem of its own over the same v, and its state rows are exactly
rows p of the full state.  A kernel that holds all of r in registers (the chunk walk:
at most 256) runs a wider r as consecutive pieces, each writing a float32 partial
output; the partial outputs are summed in float32 and rounded once (docs/design.md §2).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..problem import Problem

__all__ = ["in_r_pieces"]


def in_r_pieces(p: Problem, max_r: int, run: Callable[[Problem], None]) -> None:
    """Run ``run(piece)`` on ``p`` itself when r ≤ ``max_r``; else on pieces of r of at most ``max_r``
    keys (all ``max_r`` wide but the last), summing their float32 outputs into ``p.out``.

    Each piece reads column views of b and c and row views of the initial state and writes row
    views of the final state: no input is copied.  Extra traffic: two float32 (n, d) buffers per
    piece after the first.
    """
    r = p.b.shape[-1]
    if r <= max_r:
        run(p)
        return
    total = torch.empty(p.out.shape, dtype=torch.float32, device=p.out.device)
    part = torch.empty_like(total)
    for start in range(0, r, max_r):
        keys = slice(start, min(start + max_r, r))
        piece = dataclasses.replace(
            p, b=p.b[..., keys], c=p.c[..., keys], out=total if start == 0 else part,
            initial_state=None if p.initial_state is None else p.initial_state[:, :, keys],
            state=None if p.state is None else p.state[:, :, keys])
        run(piece)
        if start > 0:
            total += part
    p.out.copy_(total)
