"""PyTorch versions of the six methods: the CPU path, and the "PyTorch" column of the benchmarks.

Each ``<method>_torch(p, config=None)`` fills ``p.out`` (and ``p.state``) for a
:class:`~leettriton.api.Problem` with the algorithm of the method of that
name (docs/design.md §3), written with device-agnostic batched tensor operations: every
operation is vectorised over batch and heads, Python loops only walk blocks of
the sequence (never batch, heads or single rows), and nothing synchronises with
the host, so the same code runs on CPU and CUDA tensors.

Numerics: everything is computed in float32 (16-bit inputs are upcast, the
output is cast back on the final copy).  Autograd records every operation, so
the methods are differentiable as they stand (docs/design.md §10.2).  Every decay factor is
exp2(λ · distance) with distance ≥ 0, so it lies in (0, 1]; a decay is never
divided by and γ^(−j) is never formed.  Per batch element and head, with rows
b_t, c_t of B, C and v_t of V, the building blocks are (docs/design.md §3)

    masked product:  O_i  = Σ_{j ≤ i} γ^(i−j) (b_i · c_j) v_j      inside a block of rows
    from a state:    O_i += γ^(i+1) b_i S                          S: the state before the block
    state advance:   S'   = γ^T S + Σ_j γ^(T−1−j) c_jᵀ v_j          T: rows of the block

Causal for any values (docs/nonfinite.md): masked and decayed-away scores are selected out, never
multiplied by zero, and a product of a lower-triangular matrix with values (:func:`_lower_product`)
lets a non-finite value at row k reach rows ≥ k only.

With a per-token decay (``p.log_decay``, docs/design.md §1.6) every twin runs :func:`_per_token_chunks`
with its own block length: the chunked form with the cumulative log-decay G within each block, in float32,
every factor exp(G_i − G_j) or exp(G_last − G_j) of a non-positive exponent (never a division).

``config`` is accepted for the common method signature; the block sizes below
are fixed (they bound memory, and need no tuning for a reference path).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import torch
import torch.nn.functional as F

from .problem import Problem, expand_heads

__all__ = [
    "vanilla_torch", "causal_dot_product_torch", "block_based_torch", "recursion_torch",
    "lightning_attention_torch", "fleet_attention_torch",
]

_BUDGET = 1 << 24
"""float32 elements (64 MiB) in the largest temporary of one step, over all batch elements and heads."""
_VANILLA_ROWS = 1024    # vanilla: output rows per step (fewer when batch · heads is large)
_SCAN_ROWS = 16         # causal_dot_product: time rows per block of prefix sums
_FLEET_ROWS = 32        # fleet_attention: rows per block of the relative-decay matrix
_CHUNK = 128            # lightning_attention: chunk length
_PARALLEL_CHUNK = 64    # block_based: chunk length (all chunks' T×T scores are live at once)
_LEAF = 64              # recursion: leaf length


# --------------------------------------------------------------------------- shared helpers

def _inputs(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """b, c, v in float32 (16-bit inputs upcast; float32 views pass through uncopied), each with a head per
    output head: grouped heads are repeated here (docs/design.md §1.7; autograd sums each group's gradient).

    float64 tensors stay float64: the package's gradient checks hand the methods float64 problems
    (``torch.autograd.gradcheck``; the public functions take 16- and 32-bit inputs only).
    """
    dtype = torch.promote_types(p.v.dtype, torch.float32)
    H = p.shape[1]
    return tuple(expand_heads(x.to(dtype), H) for x in (p.b, p.c, p.v))


def _lam(lam: torch.Tensor, ndim: int) -> torch.Tensor:
    """λ (H,) shaped (1, H, 1, …, 1) to broadcast against an ndim-dim (B, H, …) tensor."""
    return lam.view(1, -1, *([1] * (ndim - 2)))


def _scale(x: torch.Tensor, lam: Optional[torch.Tensor], dist: torch.Tensor) -> torch.Tensor:
    """Rows of x (its second-to-last dim) times exp2(λ · dist), dist ≥ 0 one per row; x without decay."""
    if lam is None:
        return x
    return x * torch.exp2(_lam(lam, x.ndim) * dist.view(-1, 1))


def _causal_decay(lam: Optional[torch.Tensor], rows: torch.Tensor, cols: torch.Tensor, ndim: int) -> torch.Tensor:
    """M[i, j] = γ^(rows_i − cols_j) where rows_i ≥ cols_j, else 0 (rows, cols: absolute positions).

    Shaped (1, H, 1, …, R, K) for an ndim-dim score tensor, or (R, K) without decay.
    """
    dist = rows[:, None] - cols[None, :]
    causal = dist >= 0
    if lam is None:
        return causal.float()
    return torch.where(causal, torch.exp2(_lam(lam, ndim) * dist.clamp(min=0)), 0.0)


def _masked_product(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """((b cᵀ) ⊙ mask) v over the last two dims (any leading batch dims); ``mask`` lower-triangular.

    Entries where the mask is zero (above the diagonal, or decayed away) are selected out of the
    scores, so a non-finite c_j reaches rows ≥ j only; the product with v likewise (:func:`_lower_product`).
    """
    scores = b @ c.transpose(-1, -2)                    # [.., R, r] @ [.., r, K]
    scores = scores.mul_(mask).masked_fill_(mask == 0, 0.0)
    return _lower_product(scores, v)                    # [.., R, K] @ [.., K, d]


def _lower_product(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``a @ x`` over the last two dims for a square lower-triangular ``a`` (zero above the diagonal), such
    that a non-finite entry of ``x`` at row k reaches rows ≥ k only, and (backward) a non-finite gradient
    at row k reaches the gradients of rows ≤ k only.

    A plain product multiplies the zeros above the diagonal by every row of ``x``, and 0 · ±inf is NaN.
    Here ``x`` enters with its non-finite entries set to zero, and each column's rows from its first
    non-finite entry on are NaN: elementwise work and no host synchronisation, the product made once.
    The backward's product with aᵀ is the same in reversed time (:class:`_LowerProduct`).
    """
    return _LowerProduct.apply(a, x)


def _lower_product_values(a: torch.Tensor, x: torch.Tensor):
    """(a @ x as :func:`_lower_product` gives it, x with its non-finite entries zeroed, where they were, and the
    entries set to NaN)."""
    bad = ~torch.isfinite(x)
    clean = x.masked_fill(bad, 0.0)
    reached = torch.cummax(bad, dim=-2).values
    return (a @ clean).masked_fill(reached, float("nan")), clean, bad, reached


class _LowerProduct(torch.autograd.Function):
    """:func:`_lower_product` with a backward that keeps the mirror rule (docs/nonfinite.md): d(a @ x)/dx is
    aᵀ g, an upper-triangular product, made as the lower product of a and g both reversed in time."""

    @staticmethod
    def forward(ctx, a, x):
        out, _, _, _ = _lower_product_values(a, x)
        ctx.save_for_backward(a, x)
        return out

    @staticmethod
    def backward(ctx, g):
        # from the saved inputs, so that a backward with create_graph is differentiable in turn
        a, x = ctx.saved_tensors
        bad = ~torch.isfinite(x)
        clean = x.masked_fill(bad, 0.0)
        g = g.masked_fill(torch.cummax(bad, dim=-2).values, 0.0)   # the entries set to NaN are constants
        da = dx = None
        if ctx.needs_input_grad[0]:
            da = (g @ clean.transpose(-1, -2)).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            rev = a.transpose(-1, -2).flip(-1, -2)                       # aᵀ reversed in both dims: lower
            dx = _lower_product_values(rev, g.flip(-2))[0].flip(-2).masked_fill(bad, 0.0)
        return da, dx


def _from_state(b: torch.Tensor, S: torch.Tensor, lam: Optional[torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
    """γ^(pos_i + 1) b_i S: what the state before a block adds to its row at offset pos_i."""
    return _scale(b, lam, pos + 1) @ S                  # [.., R, r] @ [.., r, d]


def _combine(first: Optional[torch.Tensor], second: torch.Tensor, lam: Optional[torch.Tensor],
             length: int) -> torch.Tensor:
    """State after two consecutive pieces: γ^length · first + second (length: rows of the second)."""
    if first is None:
        return second
    if lam is None:
        return first + second
    return torch.exp2(_lam(lam, first.ndim) * length) * first + second


def _advance(S: Optional[torch.Tensor], c: torch.Tensor, v: torch.Tensor,
             lam: Optional[torch.Tensor]) -> torch.Tensor:
    """State after the rows of c, v (second-to-last dim, T rows): γ^T S + Σ_j γ^(T−1−j) c_jᵀ v_j."""
    T = c.shape[-2]
    j = torch.arange(T, device=c.device)
    local = _scale(c, lam, T - 1 - j).transpose(-1, -2) @ v     # [.., r, T] @ [.., T, d]
    return _combine(S, local, lam, T)


def _decayed_cumsum(x: torch.Tensor, lam: Optional[torch.Tensor], step: int = 1,
                    carry: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y_t = Σ_{s ≤ t} γ^(step·(t−s)) x_s + γ^(step·(t+1)) carry, along dim 2 of x (B, H, T, …).

    A Hillis–Steele scan: after the pass with shift s, y_t holds the decayed sum
    of the 2s rows ending at t, so log2 T passes, each adding γ^(step·s) ≤ 1
    times the rows s earlier (a plain add without decay; on CPU this is also
    faster than torch.cumsum along a middle dim).
    """
    T = x.shape[2]
    y, shift = x, 1
    while shift < T:
        if lam is None:
            shifted = y[:, :, shift:] + y[:, :, :-shift]
        else:
            shifted = torch.addcmul(y[:, :, shift:], torch.exp2(_lam(lam, x.ndim) * (step * shift)), y[:, :, :-shift])
        y = torch.cat((y[:, :, :shift], shifted), 2)
        shift *= 2
    if carry is not None:
        carry = carry.unsqueeze(2)
        if lam is not None:
            t = torch.arange(1, T + 1, device=x.device).view(-1, *([1] * (x.ndim - 3)))
            carry = torch.exp2(_lam(lam, x.ndim) * (step * t)) * carry
        y = y + carry
    return y


def _pad_chunks(x: torch.Tensor, T: int, front: int, back: int) -> torch.Tensor:
    """(B, H, n, f) zero-padded with front/back rows and viewed as (B, H, N, T, f) chunks."""
    B, H, n, f = x.shape
    x = F.pad(x, (0, 0, front, back)) if front or back else x
    return x.reshape(B, H, (n + front + back) // T, T, f)


def _per_token_chunks(p: Problem, T: int) -> None:
    """Fill ``p.out`` (and ``p.state``) for a problem with a per-token decay a (``p.log_decay``), in blocks
    of T rows carried through the state (docs/design.md §1.6).  Within a block, with G_i = a_0 + … + a_i
    (the block's own rows, float32):

        O_i  = Σ_{j ≤ i} exp(G_i − G_j) (b_i · c_j) v_j + exp(G_i) b_i S
        S'   = exp(G_last) S + Σ_j exp(G_last − G_j) c_jᵀ v_j

    Each exponent is a sum of decays, ≤ 0; the causal mask selects (above the diagonal is never formed).
    A value > 0 or NaN makes every row it decays NaN.  Differentiable in a too (autograd records it)."""
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    a = p.log_decay.to(b.dtype)
    a = torch.where(a <= 0, a, torch.full((), float("nan"), dtype=a.dtype, device=a.device))
    S = p.initial_state
    T = max(1, min(T, n))
    for t0 in range(0, n, T):
        sl = slice(t0, min(n, t0 + T))
        bb, cc, vv = b[:, :, sl], c[:, :, sl], v[:, :, sl]
        G = torch.cumsum(a[:, :, sl], dim=-1)                              # [B, H, T]
        m = G.shape[-1]
        t = torch.arange(m, device=b.device)
        causal = t[:, None] >= t[None, :]
        diff = torch.where(causal, G[..., :, None] - G[..., None, :], 0.0)
        mask = torch.where(causal, torch.exp(diff), 0.0)
        scores = torch.where(causal, (bb @ cc.transpose(-1, -2)) * mask, 0.0)
        o = _lower_product(scores, vv)
        tail = torch.exp(G[..., -1:] - G).unsqueeze(-1)                   # exp(a_{j+1} + … + a_last)
        local = (cc * tail).transpose(-1, -2) @ vv
        if S is not None:
            o = o + (bb * torch.exp(G).unsqueeze(-1)) @ S.to(b.dtype)
            S = torch.exp(G[..., -1]).view(B, H, 1, 1) * S + local
        else:
            S = local
        p.out[:, :, sl].copy_(o)
    if p.state is not None:
        if S is None:
            p.state.zero_()
        else:
            p.state.copy_(S)


# --------------------------------------------------------------------------- the six methods

def vanilla_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """Tiled quadratic form O = (B Cᵀ ⊙ M) V + γ^(t+1) B S₀.

    For each block of output rows starting at t0: the diagonal tile is a masked
    product with the block's causal decay matrix (the same for every block); the
    keys before t0 follow in key blocks, where M is rank one,
    γ^(i−j) = γ^(i−t0) · γ^(t0−j) with both exponents ≥ 0, so the decay scales
    the rows of b and c and the (rows × keys) score tile needs no mask.  Tiles
    hold at most ``_BUDGET`` elements over all batch elements and heads, so
    memory never grows like n².  The final state is one advance over the whole
    sequence.  Cost O(n² (r + d)).
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _VANILLA_ROWS)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    rows = _VANILLA_ROWS
    while rows > 16 and B * H * rows * rows > _BUDGET:
        rows //= 2
    keys = max(rows, _BUDGET // (B * H * rows))
    pos = torch.arange(n, device=v.device)
    diag = _causal_decay(lam, pos[:rows], pos[:rows], 4)
    for t0 in range(0, n, rows):
        m = min(n, t0 + rows) - t0
        bb = b[:, :, t0:t0 + m]
        o = _masked_product(bb, c[:, :, t0:t0 + m], v[:, :, t0:t0 + m], diag[..., :m, :m])
        b_past = _scale(bb, lam, pos[:m])                                   # γ^(i − t0) b_i
        for k0 in range(0, t0, keys):
            k1 = min(t0, k0 + keys)
            c_past = _scale(c[:, :, k0:k1], lam, t0 - pos[k0:k1])          # γ^(t0 − j) c_j
            o = o + (b_past @ c_past.transpose(-1, -2)) @ v[:, :, k0:k1]  # [m, r] @ [r, K] @ [K, d]
        if p.initial_state is not None:
            o = o + _from_state(bb, p.initial_state, lam, pos[t0:t0 + m])
        p.out[:, :, t0:t0 + m].copy_(o)
    if p.state is not None:
        p.state.copy_(_advance(p.initial_state, c, v, lam))


def causal_dot_product_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """The recurrence S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t, vectorised over time in blocks.

    Performer-style: the outer products c_tᵀ v_t of a block of T rows, their
    decayed prefix sums (a log-step scan) on top of the carried state give
    every S_t of the block at once; o_t = b_t S_t; the last S_t is carried into
    the next block.  Cost O(n r d log T); memory T·r·d per batch element and
    head (T shrinks when batch · heads · r · d is large).
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _SCAN_ROWS)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    T = max(1, min(_SCAN_ROWS, _BUDGET // (B * H * r * d)))
    S = p.initial_state
    for t0 in range(0, n, T):
        sl = slice(t0, min(n, t0 + T))
        kv = c[:, :, sl, :, None] * v[:, :, sl, None, :]             # [B, H, T, r, d]
        states = _decayed_cumsum(kv, lam, carry=S)                    # S_t for every row of the block
        p.out[:, :, sl].copy_((b[:, :, sl, None, :] @ states).squeeze(-2))   # [.., 1, r] @ [.., r, d]
        S = states[:, :, -1]
    if p.state is not None:
        p.state.copy_(S)


def lightning_attention_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """Lightning Attention-2: walk the chunks in order, the state carried in float32.

    Chunk of T rows: intra-chunk masked decayed product ((B Cᵀ) ⊙ M) V, plus the
    inter-chunk term γ^(i+1) b_i S; then S ← γ^T S + Σ_j γ^(T−1−j) c_jᵀ v_j.
    Cost O(n T (r + d) + n r d); memory O(T² + r d) per batch element and head.
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _CHUNK)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    T = _CHUNK
    pos = torch.arange(T, device=v.device)
    mask = _causal_decay(lam, pos, pos, 4)
    S = p.initial_state
    for t0 in range(0, n, T):
        m = min(n, t0 + T) - t0
        bb, cc, vv = (x[:, :, t0:t0 + m] for x in (b, c, v))
        o = _masked_product(bb, cc, vv, mask[..., :m, :m])
        if S is not None:
            o = o + _from_state(bb, S, lam, pos[:m])
        p.out[:, :, t0:t0 + m].copy_(o)
        S = _advance(S, cc, vv, lam)
    if p.state is not None:
        p.state.copy_(S)


def block_based_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """Chunk-parallel: all chunk states at once, a scan across chunks, all chunk outputs at once.

    The sequence is zero-padded at the end to N chunks of T rows.  (1) Every
    chunk's local state L_k = Σ_j γ^(T−1−j) c_jᵀ v_j in one batched matmul;
    (2) a decayed scan across chunks (step γ^T) gives every chunk's start state
    S_k = γ^T S_{k−1} + L_{k−1}, S_0 = S₀; (3) every chunk's output in one
    batched product: intra-chunk masked product + γ^(i+1) b_i S_k.  The final
    state advances the last start state over the true rows of the last chunk
    (so padding never enters it).  Cost O(n T (r + d) + n r d); memory
    O(n T + n r d / T) per batch element and head.
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _PARALLEL_CHUNK)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    T = _PARALLEL_CHUNK
    N = -(-n // T)
    b5, c5, v5 = (_pad_chunks(x, T, 0, N * T - n) for x in (b, c, v))
    local = _advance(None, c5, v5, lam)                                        # [B, H, N, r, d]
    ends = _decayed_cumsum(local, lam, step=T, carry=p.initial_state)          # state after chunk k
    first = p.initial_state if p.initial_state is not None else torch.zeros_like(ends[:, :, 0])
    starts = torch.cat((first.unsqueeze(2), ends[:, :, :-1]), 2)
    pos = torch.arange(T, device=v.device)
    out = _masked_product(b5, c5, v5, _causal_decay(lam, pos, pos, 5))                 # [B, H, N, T, d]
    out += _from_state(b5, starts, lam, pos)
    p.out.copy_(out.view(B, H, N * T, d)[:, :, :n])
    if p.state is not None:
        t0 = (N - 1) * T
        p.state.copy_(_advance(starts[:, :, -1], c[:, :, t0:], v[:, :, t0:], lam))


def recursion_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """HyperAttention-style divide and conquer, level by level from the leaves up.

    The sequence is zero-padded at the front to P = L0 · 2^K rows, so the top
    segment ends at the last true row.  Leaves of L0 rows are computed densely
    (masked products), with each leaf's state Σ_j γ^(L0−1−j) c_jᵀ v_j.  At each
    level, segments of L rows (L doubling up to P): the right half of every
    segment receives, at offset i, γ^(i+1) b_i S_left, with S_left = Σ_{j in
    left} γ^(L/2−1−j) c_jᵀ v_j the left half's state (the level below's segment
    state); the segment's state is γ^(L/2) S_left + S_right.  Everything before
    a segment reaches it at a higher level; the top segment's state is the final
    state.  The initial state adds γ^(t+1) b_t S₀ to the output and γ^n S₀ to
    the final state.  Cost O(n log n · r d + n L0 (r + d)).
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _LEAF)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    L0 = _LEAF
    P = L0 << max(0, math.ceil(math.log2(-(-n // L0))))
    b5, c5, v5 = (_pad_chunks(x, L0, P - n, 0) for x in (b, c, v))
    pos = torch.arange(P, device=v.device)
    out = _masked_product(b5, c5, v5, _causal_decay(lam, pos[:L0], pos[:L0], 5))   # [B, H, P/L0, L0, d]
    states = _advance(None, c5, v5, lam)                                            # [B, H, P/L0, r, d]
    half = L0
    while half < P:
        N = P // (2 * half)
        b_right = b5.view(B, H, N, 2, half, r)[:, :, :, 1]
        out.view(B, H, N, 2, half, d)[:, :, :, 1] += _from_state(b_right, states[:, :, 0::2], lam, pos[:half])
        states = _combine(states[:, :, 0::2], states[:, :, 1::2], lam, half)
        half *= 2
    out = out.view(B, H, P, d)[:, :, P - n:]
    if p.initial_state is not None:
        out = out + _from_state(b, p.initial_state, lam, pos[:n])
    p.out.copy_(out)
    if p.state is not None:
        p.state.copy_(_combine(p.initial_state, states[:, :, 0], lam, n))


def fleet_attention_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    """FleetAttention: O = Σ_k diag(b_k) · M · diag(c_k) V, one decayed cumsum per rank column.

    For each rank column k, the decayed cumulative sum over the sequence of
    c[:, k] v (an n × d scan), weighted row-wise by b[:, k] and summed over k.
    Blockwise with relative decays: within a block of T rows the decayed cumsum
    is a product with the T × T lower-triangular matrix γ^(i−j), and the carry
    (for column k, row k of the state: a d-vector) enters row i as γ^(i+1)·carry.
    Columns are processed in groups of G, so a step holds T·G·d elements per
    batch element and head.  Cost O(n T r d) in matmuls; the carries, O(r d),
    after the last block are the final state.
    """
    if p.log_decay is not None:
        return _per_token_chunks(p, _FLEET_ROWS)
    B, H, n, r, d = p.shape
    b, c, v = _inputs(p)
    lam = p.log2_gamma
    T = _FLEET_ROWS
    G = max(1, min(r, _BUDGET // (B * H * T * d)))
    pos = torch.arange(T, device=v.device)
    mask = _causal_decay(lam, pos, pos, 4).to(v.dtype)
    S = (p.initial_state.to(v.dtype, copy=True) if p.initial_state is not None
         else torch.zeros(B, H, r, d, dtype=v.dtype, device=v.device))
    for t0 in range(0, n, T):
        m = min(n, t0 + T) - t0
        o = torch.zeros(B, H, m, d, dtype=v.dtype, device=v.device)
        for k0 in range(0, r, G):
            g = min(r, k0 + G) - k0
            cv = c[:, :, t0:t0 + m, k0:k0 + g, None] * v[:, :, t0:t0 + m, None, :]   # [B, H, m, g, d]
            carry = S[:, :, k0:k0 + g].reshape(B, H, 1, g * d)
            y = _lower_product(mask[..., :m, :m], cv.view(B, H, m, g * d))    # [m, m] @ [m, g·d]
            y = y + _scale(carry, lam, pos[:m] + 1)
            y = y.view(B, H, m, g, d)
            o += (b[:, :, t0:t0 + m, None, k0:k0 + g] @ y).squeeze(-2)   # [.., 1, g] @ [.., g, d]
            S[:, :, k0:k0 + g] = y[:, :, -1]
        p.out[:, :, t0:t0 + m].copy_(o)
    if p.state is not None:
        p.state.copy_(S)
