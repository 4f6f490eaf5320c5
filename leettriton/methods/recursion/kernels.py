"""recursion: HyperAttention-style divide and conquer, level by level over a tree of left states.

Cut the sequence into leaves of L0 rows (leaf q holds rows [q·L0, (q+1)·L0)).
At level l the sequence is cut into segments of 2h rows, h = L0·2^l; the right
half of every segment receives, at offset i inside the half,

    o_i += γ^(i+1) b_i S_left,       S_left = Σ_{j in left half} γ^(h−1−j) c_jᵀ v_j,

and the leaves themselves are dense: o_i = Σ_{j ≤ i in the leaf} γ^(i−j) (b_i·c_j) v_j.
Every earlier row reaches row i at exactly one level (the binary digits of its
leaf index), so the sum over levels and the leaf is the operator of docs/design.md §1.
The initial state adds γ^(i+1) b_i S₀ to every row.

Three steps (tensor cores, except the elementwise combine of step 2):

1. leaf states: the local state Σ_j γ^(L0−1−j) c_jᵀ v_j of every leaf, by the
   shared segment-state kernel (kernels/segments.py, SEG = L0, no scan), into a
   float32 tree of cdiv(n, L0) states per batch·head;
2. one ``recursion.level`` launch per level l, bottom up, in place: the state of
   a block of 2^(l+1) leaves is γ^h · (its left half's state) + (its right
   half's), written over the right half's slot (the slot of its last leaf).  Slot
   m·2^l − 1 with m odd is written last at level l − 1 (for l = 0 it is a leaf
   state) and never again, and then holds the state of the 2^l leaves before leaf
   m·2^l: the left state that level l sends to the right half starting there;
3. ``recursion.fwd``: each [BT, BV] output tile (inside leaf q, first row q0 =
   q·L0) is finalised by one program: its dense product inside the leaf, then
   the levels.  The levels whose bit is set in q reach the tile; by linearity
   their terms γ^(i − first·L0 + 1) b_i S_left = γ^(i − q0 + 1) b_i ·
   γ^((q − first)·L0) S_left share the row factor, so the program sums the
   left states (each times its scalar decay, and the initial state times
   γ^q0), a BK slice of r at a time, and multiplies b once: one [BT, r] @
   [r, BV] product per tile instead of one per level.  Accumulated in float32
   registers and stored once.

Applying the levels inside the tile's program, rather than one pass over the
output per level, keeps the float32 accumulation in registers: a pass per level
would read and write a float32 copy of half the output at each of the
log2(n/L0) levels, 3-4× the memory traffic of this whole method at r = d = 128,
and would need that (B, H, n, d) float32 copy.  The sum of left states is the
same divide and conquer (each level's left state is still built by the tree and
sent to every right half); only the multiplication by b is distributed over it.

Cost: the leaf products O(n L0 (r + d)); the levels O(n r d) products plus
O((n / BT) log(n/L0) r d) float32 state reads and additions -- each tile meets
about half of the log2(n/L0) levels; the tree O(n r d / L0) of float32 traffic.  Memory: the tree, cdiv(n, L0) · r · d · 4 bytes
per batch·head (r = d = 128, L0 = 256: 256 B per row, as much as the 16-bit
output row), built for a block of batch elements and heads at a time when larger
than ``TREE_BYTES`` (methods/recursion/space.py).  The final state comes from
the shared segment-state kernel over each block.

Offsets across batch·heads are 64-bit; inside one (batch, head) sequence they
are 32-bit, like the other kernels' (n times the row stride below 2^31 elements).
Every decay is exp2(λ · distance) with distance ≥ 0; a state is only ever
multiplied by γ^h, never divided.

With a per-token decay (``PER_TOKEN_DECAY``, docs/design.md §1.6, §3.8) every decay is taken relative to a
segment boundary: the leaf states and each leaf's decay sum come from the per-token segment-state kernel
(kernels/token_decay.py), a tree of sums (one row per level) lies beside the state tree, and the leaf
is vanilla's per-token tile.  Without the flag none of this is compiled.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import triton
import triton.language as tl

from ...problem import Problem
from ..spec import Plan
from ...autotune import autotune, launch
from . import space as spaces
from ...autotune.sizing import cdiv
from ...kernels.abi import (any_nonfinite, batch_head, decay, head_log2_gamma, head_ptr, head_ptrs, load_tile,
                            masked_product, mma, problem_args, store_tile)
from ...kernels.segments import final_state, segment_local_states
from ...kernels.token_decay import (decay_args, log2_decays, pair_exponents, poison, prefix_sums, scalar_zero,
                                    tile_tail, token_final_state, token_local_states, token_masked_product)


# the level kernel rewrites the tree in place: the autotuner must restore it between its trial runs
@autotune(spaces.LEVEL, key=["R", "D", "HAS_DECAY", "PER_TOKEN_DECAY"], restore_value=["tree_ptr"])
@triton.jit(do_not_specialize=["N", "NS", "SPAN", "LEAF", "SUMS_BH", "LEV"])
def _recursion_level_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    tree_ptr, NS, SPAN, LEAF, sums_ptr, SUMS_BH, LEV, PER_TOKEN_DECAY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # one pair of sibling blocks of SPAN leaves each: right ← γ^(SPAN·LEAF) · left + right
    i_p = tl.program_id(0)
    i_e = tl.program_id(1)
    i_bh = tl.program_id(2)
    lam = head_log2_gamma(gamma_ptr, i_bh % H, HAS_DECAY)
    o_e = i_e * BLOCK + tl.arange(0, BLOCK)
    m_e = o_e < R * D
    p_left = tree_ptr + (i_bh.to(tl.int64) * NS + (2 * i_p + 1) * SPAN - 1) * R * D + o_e
    p_right = p_left + SPAN.to(tl.int64) * R * D
    b_left = tl.load(p_left, mask=m_e, other=0.0)
    b_right = tl.load(p_right, mask=m_e, other=0.0)
    if HAS_DECAY:
        b_left *= tl.exp2(lam * (SPAN * LEAF).to(tl.float32))
    if PER_TOKEN_DECAY:
        # the left state decays by the right block's sum of a · log2 e (row LEV of the sums tree: each
        # block's sum); the pair's sum goes to row LEV + 1, written once per pair
        p_sums = sums_ptr + i_bh.to(tl.int64) * SUMS_BH + LEV * NS
        s_left = tl.load(p_sums + (2 * i_p + 1) * SPAN - 1)
        s_right = tl.load(p_sums + (2 * i_p + 2) * SPAN - 1)
        b_left *= tl.exp2(s_right)
        if i_e == 0:
            tl.store(p_sums + NS + (2 * i_p + 2) * SPAN - 1, s_left + s_right)
    tl.store(p_right, b_left + b_right, mask=m_e)


@triton.jit
def _leaf_tile(p_b, p_c, p_v, b_strides, c_strides, v_strides, leaf, i_t, o_i, o_v, lam, N, R, D, LEAF,
               HAS_DECAY: tl.constexpr, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
               BJ: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The leaf's dense share of the [BT, BV] output tile of rows ``o_i`` (``CAUSAL``: as
    :func:`masked_product`'s)."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for j0 in range(leaf * LEAF, (i_t + 1) * BT, BJ):
        o_j = j0 + tl.arange(0, BJ)
        acc = masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_j, o_v, lam, N, R, D,
                             HAS_DECAY, DOT_PRECISION, BK, CAUSAL)
    return acc


@triton.jit
def _leaf_token_tile(p_b, p_c, p_v, p_a, a_stride, b_g, b_gl, b_strides, c_strides, v_strides, leaf, i_t, o_i, o_v,
                     N, R, D, LEAF, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
                     BJ: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """:func:`_leaf_tile` with a per-token decay (docs/design.md §1.6), as vanilla's tile: ``b_g`` + ``b_gl``
    hold G_i, the tile's prefix sums of a · log2 e in two parts (kernels/token_decay.py, ``prefix_sums``).
    Key tiles inside the output tile (BJ divides BT) decay key j by G_i − G_j (G_j picked out of the tile's
    sums); the leaf's earlier key tiles, walked backwards, by G_i + the sums of the key tiles between +
    tail_j.  Returns the tile and Σ a · log2 e over the leaf's rows before the tile."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    i0 = i_t * BT
    o_r = tl.arange(0, BT)
    o_rj = tl.arange(0, BJ)
    for j0 in range(i0, i0 + BT, BJ):
        o_j = j0 + o_rj
        pick = o_r[:, None] == (o_j - i0)[None, :]
        g_j = tl.sum(tl.where(pick, b_g[:, None], 0.0), axis=0)  # [BJ]: G_j, both parts
        g_jl = tl.sum(tl.where(pick, b_gl[:, None], 0.0), axis=0)
        acc = token_masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_j, o_v,
                                   pair_exponents(b_g, b_gl, g_j, g_jl), N, R, D, DOT_PRECISION, BK, CAUSAL)
    between = scalar_zero()  # Σ a · log2 e over the key tiles between key tile J and the output tile
    for m in range(0, (i0 - leaf * LEAF) // BJ):
        o_j = i0 - (m + 1) * BJ + o_rj
        b_a = log2_decays(p_a, a_stride, o_j, N)
        b_tail = tile_tail(p_a, a_stride, o_j, N, BJ) + poison(b_a)
        acc = token_masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_j, o_v,
                                   (b_g + between)[:, None] + b_tail[None, :], N, R, D, DOT_PRECISION, BK, CAUSAL)
        between += tl.sum(b_a, axis=0)
    return acc, between


@autotune(spaces.FWD, key=["R", "D", "HAS_DECAY", "HAS_INITIAL", "DOT_PRECISION", "PER_TOKEN_DECAY"])
@triton.jit(do_not_specialize=["N", "NS", "LEAF", "LEVELS", "SUMS_BH"])
def _recursion_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    tree_ptr, NS, LEAF, LEVELS, sums_ptr, SUMS_BH, a_ptr, a_strides, PER_TOKEN_DECAY: tl.constexpr,
    BT: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_t, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = batch_head(i_bh, H)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)

    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    o_i = i_t * BT + tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    leaf = (i_t * BT) // LEAF
    if PER_TOKEN_DECAY:  # the per-token decay a_t of this batch element and head (docs/design.md §1.6)
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h)
        b_g, b_gl = prefix_sums(log2_decays(p_a, a_strides[2], o_i, N))   # G_i: a · log2 e over the tile's rows ≤ i
        acc, lead = _leaf_token_tile(p_b, p_c, p_v, p_a, a_strides[2], b_g, b_gl, b_strides, c_strides, v_strides, leaf,
                                     i_t, o_i, o_v, N, R, D, LEAF, DOT_PRECISION, False, BT, BJ, BK, BV)
        if any_nonfinite(acc):  # the causal form, as below
            acc, lead = _leaf_token_tile(p_b, p_c, p_v, p_a, a_strides[2], b_g, b_gl, b_strides, c_strides, v_strides,
                                         leaf, i_t, o_i, o_v, N, R, D, LEAF, DOT_PRECISION, True, BT, BJ, BK, BV)
        # the levels as below, each left state decayed by the sums of the blocks between it and the leaf
        # (rows [first·LEAF, q0): the blocks of the lower set bits, from the sums tree), and row i by its
        # sum over [q0, i] (lead + G_i); the initial state by the sums of all of [0, q0)
        if (leaf > 0) | HAS_INITIAL:
            row_decay = tl.exp2(b_g + lead)
            p_tree = tree_ptr + i_bh.to(tl.int64) * NS * R * D
            p_sums = sums_ptr + i_bh.to(tl.int64) * SUMS_BH
            if HAS_INITIAL:
                p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
            for k0 in range(0, R, BK):
                b_s = tl.zeros([BK, BV], dtype=tl.float32)
                gap = scalar_zero()
                for lev in range(0, LEVELS):
                    if (leaf >> lev) & 1:
                        first = (leaf >> lev) << lev
                        b_left = load_tile(p_tree + (first - 1).to(tl.int64) * R * D, k0 + o_k, o_v, D, 1, R, D)
                        b_s += b_left * tl.exp2(gap)
                        gap += tl.load(p_sums + lev * NS + first - 1)
                if HAS_INITIAL:
                    b_s0 = load_tile(p_s0, k0 + o_k, o_v, s0_strides[2], s0_strides[3], R, D)
                    b_s += b_s0 * tl.exp2(gap)
                b_bi = load_tile(p_b, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R).to(tl.float32)
                acc += mma(b_bi * row_decay[:, None], b_s, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
    else:
        # the leaf: dense decayed product over its key blocks up to the tile's last row; where it holds a
        # non-finite entry, again in the causal form, so that a non-finite value reaches later rows only
        # (docs/nonfinite.md): one check per tile on other inputs
        acc = _leaf_tile(p_b, p_c, p_v, b_strides, c_strides, v_strides, leaf, i_t, o_i, o_v, lam, N, R, D, LEAF,
                         HAS_DECAY, DOT_PRECISION, False, BT, BJ, BK, BV)
        if any_nonfinite(acc):
            acc = _leaf_tile(p_b, p_c, p_v, b_strides, c_strides, v_strides, leaf, i_t, o_i, o_v, lam, N, R, D, LEAF,
                             HAS_DECAY, DOT_PRECISION, True, BT, BJ, BK, BV)

        # the levels: bit l of the leaf index set means the tile lies in the right half of a
        # segment at level l, whose left state sits in slot (first leaf of that half) − 1; row i
        # (its offset from the half's start first·LEAF) receives γ^(i − first·LEAF + 1) b_i S_left.
        # With q0 = leaf·LEAF that is γ^(i − q0 + 1) b_i · γ^((leaf − first)·LEAF) S_left, so the
        # levels' left states, each scaled by its factor, are summed per BK slice of r first and
        # meet b in one product (likewise the initial state, term γ^(i+1) b_i S₀ = γ^(i − q0 + 1)
        # b_i · γ^q0 S₀)
        if (leaf > 0) | HAS_INITIAL:
            q0 = leaf * LEAF
            row_decay = decay(lam, o_i - q0 + 1, HAS_DECAY)
            p_tree = tree_ptr + i_bh.to(tl.int64) * NS * R * D
            if HAS_INITIAL:
                p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
            for k0 in range(0, R, BK):
                b_s = tl.zeros([BK, BV], dtype=tl.float32)
                for lev in range(0, LEVELS):
                    if (leaf >> lev) & 1:
                        first = (leaf >> lev) << lev
                        p_left = p_tree + (first - 1).to(tl.int64) * R * D
                        b_left = load_tile(p_left, k0 + o_k, o_v, D, 1, R, D)
                        if HAS_DECAY:
                            b_left *= tl.exp2(lam * ((leaf - first) * LEAF).to(tl.float32))
                        b_s += b_left
                if HAS_INITIAL:
                    b_s0 = load_tile(p_s0, k0 + o_k, o_v, s0_strides[2], s0_strides[3], R, D)
                    if HAS_DECAY:
                        b_s0 *= tl.exp2(lam * q0.to(tl.float32))
                    b_s += b_s0
                b_bi = load_tile(p_b, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R).to(tl.float32) * row_decay[:, None]
                acc += mma(b_bi, b_s, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
    store_tile(p_o, acc, o_i, o_v, o_strides[2], o_strides[3], N, D)


def _leaf_states(p: Problem, leaf: int, config: Mapping) -> torch.Tensor:
    """The float32 local state of every leaf, shape (B, H, cdiv(n, leaf), r, d), contiguous."""
    return segment_local_states(p, leaf, config)


_MAX_OFFSET = 2**31 - 1   # 32-bit element offsets of the shared segment-state kernels
_MAX_GRID_Z = 65535       # their grid's third axis holds batch · heads · segments


def _slices(p: Problem, ns: int) -> list[tuple[int, int, int, int]]:
    """(b0, b1, h0, h1) blocks of batch elements and heads, each computed on its own.

    Each block's state tree stays within ``TREE_BYTES``, and the shared segment-state
    kernel that computes its leaf states stays within its limits (32-bit offsets into
    the block's tensors, batch · heads · leaves on one grid axis).  One block when
    everything fits, which is the common case.
    """
    B, H, n, r, d = p.shape

    def fits(nb: int, nh: int) -> bool:
        if nb * nh * ns * r * d * 4 > spaces.TREE_BYTES or nb * nh * ns > _MAX_GRID_Z:
            return False
        return all((nb - 1) * x.stride(0) + (nh - 1) * x.stride(1) + (n - 1) * x.stride(2)
                   + (x.shape[3] - 1) * x.stride(3) <= _MAX_OFFSET for x in (p.b, p.c, p.v))

    if ns == 1 or fits(B, H):
        return [(0, B, 0, H)]
    group = max(p.groups)   # blocks of whole groups of heads (docs/design.md §1.7)
    nh = H
    while nh > group and not fits(1, nh):
        nh = cdiv(nh, 2)
    nh = cdiv(nh, group) * group
    nb = 1
    if nh == H:
        while nb * 2 <= B and fits(nb * 2, H):
            nb *= 2
    return [(b0, min(B, b0 + nb), h0, min(H, h0 + nh)) for b0 in range(0, B, nb) for h0 in range(0, H, nh)]


def _block(p: Problem, b0: int, b1: int, h0: int, h1: int) -> Problem:
    """The sub-problem of batch elements b0:b1 and heads h0:h1 (views, no copies)."""
    H = p.shape[1]

    def cut(x):   # a grouped tensor's heads read by heads h0:h1, whole groups (_slices)
        g = 1 if x is None else H // x.shape[1]
        return None if x is None else x[b0:b1, h0 // g:-(-h1 // g)]

    gamma = None if p.gamma is None else p.gamma[h0:h1]
    return dataclasses.replace(p, b=cut(p.b), c=cut(p.c), v=cut(p.v), out=cut(p.out), gamma=gamma,
                               initial_state=cut(p.initial_state), state=cut(p.state), log_decay=cut(p.log_decay))


def recursion_fwd(p: Problem, plan: Plan) -> None:
    """Launch the recursion kernels for ``p`` with the plan's configs and schedule (``leaf``)."""
    B, H, n, r, d = p.shape
    config = plan.configs or {}
    leaf = plan.schedule["leaf"]
    ns = cdiv(n, leaf)
    levels = (ns - 1).bit_length()     # the bits of every leaf index: levels l with 2^l < ns
    per_token = p.log_decay is not None
    for b0, b1, h0, h1 in _slices(p, ns):
        sub = p if (b0, b1, h0, h1) == (0, B, 0, H) else _block(p, b0, b1, h0, h1)
        args = problem_args(sub)
        args.update(decay_args(sub))
        # the level kernel reads the decays' sums tree, never a itself: its flag only
        level_args = {k: x for k, x in args.items() if k not in ("a_ptr", "a_strides")}
        BH = (b1 - b0) * (h1 - h0)
        # with a per-token decay, row l of the sums tree holds at each slot the sum of a · log2 e over the
        # block of 2^l leaves ending there (row 0: the leaves'), written level by level beside the states
        sums_bh = (levels + 1) * ns
        if ns > 1:
            if per_token:
                sums = torch.empty((BH, levels + 1, ns), dtype=torch.float32, device=p.v.device)
                tree, _ = token_local_states(sub, leaf, config, sums=sums, sums_bh=sums_bh)
            else:
                tree = _leaf_states(sub, leaf, config)
                sums = tree
            for lev in range(levels):
                span = 1 << lev
                pairs = ns // (2 * span)   # sibling pairs whose right block ends inside the tree
                if pairs == 0:
                    break
                grid = lambda meta: (pairs, cdiv(r * d, meta["BLOCK"]), BH)  # noqa: E731
                launch(_recursion_level_kernel, grid, config.get(spaces.LEVEL.name), **level_args,
                       tree_ptr=tree, NS=ns, SPAN=span, LEAF=leaf, sums_ptr=sums, SUMS_BH=sums_bh, LEV=lev)
        else:
            # no level reaches any tile: never read, but typed float32 like a tree, as the kernel's
            # (compiled, never run) level loop expects
            tree = sums = torch.empty(1, dtype=torch.float32, device=p.v.device)
        grid = lambda meta: (cdiv(n, meta["BT"]), cdiv(d, meta["BV"]), BH)  # noqa: E731
        launch(_recursion_fwd_kernel, grid, config.get(spaces.FWD.name), **args,
               tree_ptr=tree, NS=ns, LEAF=leaf, LEVELS=levels, sums_ptr=sums, SUMS_BH=sums_bh)
        del tree, sums
        if sub.state is not None:
            if per_token:
                token_final_state(sub, config)
            else:
                final_state(sub, config)
