"""causal_dot_product: the row-by-row recurrence S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t.

The algorithm of fast-transformers' ``causal_product`` CUDA kernel, extended to a
decay.  Each program owns the whole key dimension of one [R, BV] slice of the
state, in float32 registers, and walks the sequence one row at a time: an
outer-product update of the state, then o_t as a reduction over the key
dimension.  No quadratic term, no tensor-core work.  Programs are independent
(batch · heads × value tiles): no cross-program reduction, so results do not
change run to run.

What makes the sequential loop fast:

* Layout.  A block of BT rows of b (or c) is read as one [words, BT·BV] tile
  that repeats each row over the BV value columns.  Words being its only
  contiguous axis, coalescing gives each thread one 16-byte vector of words,
  spreads the words over lanes, the columns over the remaining lanes and the
  warps, and leaves the BT rows in registers.  The state takes the same
  layout, so the update needs no data movement and the reduction over keys is
  a few in-thread adds and a shuffle tree inside one warp: no shared memory,
  no barrier per row.  (A [BT, BK, BV] pointer grid would say the same, but
  Triton 3.6 and 3.9 break the tie between its two non-contiguous axes in
  opposite ways; a 2-D tile has no tie.)
* 32-bit words.  16-bit rows are read as int32 words holding two keys (the
  state is kept as its even and odd keys), and unpacked only after a row is
  picked: 16-bit values carried across the loop make ptxas spill.
* Blocks of rows.  BT rows of b, c and v come in with one load each; the tile
  is reshaped to [words, BT, BV] (no data movement) and row i picked out with
  a select that the compiler folds away (the unrolled loop knows i).
* Software pipelining, by hand.  The loads of block j+1 are issued before
  block j is processed, so their latency hides behind BT steps of work (left
  to itself, ptxas sinks each row's loads next to their first use: one memory
  latency per row).  The BT outputs of a block are gathered in registers and
  written with one store.

Rows past the end read as zero and do not decay the state, so the last block
needs no special case.  The per-step decay is γ split in two floats
(:func:`step_decay`), so thousands of multiplications by γ do not drift.  All
products are float32 FMAs on CUDA cores, so ``precision`` has no effect (every
dtype gets "ieee" accuracy).  Cost O(n r d) with n sequential steps: the
method for tiny n and for very large batch · heads.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from ...problem import Problem
from ..spec import Plan
from ...autotune import autotune, launch
from . import space as spaces
from ...autotune.sizing import cdiv
from ...kernels.abi import batch_head, head_log2_gamma, head_ptr, head_ptrs, problem_args, step_decay, store_tile

_KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "STORE_STATE", "KW", "PER_TOKEN_DECAY"]
_MAX_OFFSET = 2**31 - 1


@triton.jit
def _pick_row(block, m_i):
    """Row i (``m_i`` true) of a [W, BT, BV] block whose rows lie in registers.

    Exact, and free once unrolled: a select and a sum of bit patterns, which the
    compiler folds to a register move (x + 0 adds nothing).  A float sum would
    need -0.0 as its neutral element, and Triton 3.6 turns -0.0 into +0.0.
    """
    if block.dtype == tl.float32:
        return tl.sum(tl.where(m_i, block.to(tl.int32, bitcast=True), 0), axis=1).to(tl.float32, bitcast=True)
    else:
        return tl.sum(tl.where(m_i, block, 0), axis=1)


@triton.jit
def _unpack(words, BF16: tl.constexpr):
    """The two 16-bit keys in each 32-bit word, as float32: (low half, high half)."""
    if BF16:
        return (words << 16).to(tl.float32, bitcast=True), (words & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (words & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (words >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo, hi


@triton.jit
def _step(b_s, b_c, b_v, g_hi, g_lo, HAS_DECAY: tl.constexpr):
    """S ← γ S + c_tᵀ v_t on a [W, BV] part of the state, with γ = g_hi + g_lo."""
    if HAS_DECAY:
        return tl.fma(b_s, g_hi, tl.fma(b_s, g_lo, b_c * b_v))
    else:
        return b_s + b_c * b_v


@autotune(spaces.FWD, key=_KEY)
@triton.jit(do_not_specialize=["N"])
def _causal_dot_product_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    RW, stride_bnw, stride_cnw, a_ptr, a_strides, PER_TOKEN_DECAY: tl.constexpr,
    BK: tl.constexpr, KW: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr,
):
    # value tiles of one head are neighbours in launch order: they share the b and c rows in L2
    NV = tl.cdiv(D, BV)
    i_v = tl.program_id(0) % NV
    i_bh = tl.program_id(0) // NV
    # 64-bit head offsets: batch · heads · n · r elements may pass 2^31
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    g_hi, g_lo = step_decay(lam)  # the decay of one step, exp2(λ · 1), in two parts
    if PER_TOKEN_DECAY:  # the per-token decay a_t of this batch element and head (docs/design.md §1.6)
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h)

    # Rows of b and c are read as 32-bit words (RW per row, stride_bnw apart): pairs of
    # 16-bit keys (KW = 2; keys 2w and 2w + 1 live in the state halves b_se and b_so), or
    # single keys.  Loop-carried 16-bit values make ptxas spill (sm_80-90, Triton 3.6 and
    # 3.9), so nothing 16-bit crosses the loop.
    BF16: tl.constexpr = b_ptr.dtype.element_ty == tl.bfloat16
    IS_32: tl.constexpr = b_ptr.dtype.element_ty == tl.float32
    BKW: tl.constexpr = BK // KW
    o_i = tl.arange(0, BT)
    o_w = tl.arange(0, BKW)
    o_v = i_v * BV + tl.arange(0, BV)
    if KW == 2:  # the launcher checked: keys contiguous, rows and heads 4-byte aligned
        p_b = p_b.to(tl.pointer_type(tl.int32))
        p_c = p_c.to(tl.pointer_type(tl.int32))
        o_bw = o_w[:, None]  # [BKW, 1]
        o_cw = o_w[:, None]
    else:
        o_bw = o_w[:, None] * b_strides[3]
        o_cw = o_w[:, None] * c_strides[3]
    # A block is loaded as one [BKW, BT·BV] tile whose column j holds row j // BV of b (or c)
    # for value column j % BV: each row repeated over the value columns.  Words being its
    # only contiguous axis, coalescing puts a 16-byte vector of words in each thread, words
    # across lanes, the columns across the remaining lanes and the warps, and -- once those
    # are used up -- the rows in registers.  Reshaped to [BKW, BT, BV] (no data movement),
    # row i is a register select, and the state, [BKW, BV], takes the same layout.
    o_j = tl.arange(0, BT * BV)
    o_jt = o_j // BV
    o_jv = i_v * BV + o_j % BV
    o_vv = o_jv[None, :] * v_strides[3]  # [1, BT * BV]
    m_w = o_w[:, None] < RW
    m_v = o_jv[None, :] < D

    # the state: keys KW·w (b_se) and, for pairs, KW·w + 1 (b_so)
    m_se = (o_w * KW < R)[:, None] & (o_v < D)[None, :]
    m_so = (o_w * KW + 1 < R)[:, None] & (o_v < D)[None, :]
    if HAS_INITIAL:
        p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h) + (o_w * KW)[:, None] * s0_strides[2] + o_v[None, :] * s0_strides[3]
        b_se = tl.load(p_s0, mask=m_se, other=0.0)
        if KW == 2:
            b_so = tl.load(p_s0 + s0_strides[2], mask=m_so, other=0.0)
        else:
            b_so = tl.zeros([1, 1], dtype=tl.float32)
    else:
        b_se = tl.zeros([BKW, BV], dtype=tl.float32)
        if KW == 2:
            b_so = tl.zeros([BKW, BV], dtype=tl.float32)
        else:
            b_so = tl.zeros([1, 1], dtype=tl.float32)

    # float32 values carried across the loop are scaled by a 1.0 the compiler cannot see
    # through: otherwise LLVM narrows them back to 16 bits
    one = tl.minimum(N, 1).to(tl.float32)
    o_t = o_jt[None, :]  # [1, BT * BV]: the row of each column
    n_b = tl.load(p_b + (o_bw + o_t * stride_bnw), mask=(o_t < N) & m_w, other=0)  # [BKW, BT * BV]
    n_c = tl.load(p_c + (o_cw + o_t * stride_cnw), mask=(o_t < N) & m_w, other=0)
    n_v = tl.load(p_v + (o_vv + o_t * v_strides[2]), mask=(o_t < N) & m_v, other=0.0).to(tl.float32) * one
    if PER_TOKEN_DECAY:  # the decays come in with their block, one block ahead as b, c and v do
        n_a = tl.load(p_a + o_i * a_strides[2], mask=o_i < N, other=0.0).to(tl.float32) * one
    else:
        n_a = tl.zeros([BT], dtype=tl.float32)
    if KW == 1 and not IS_32:
        n_b = n_b.to(tl.float32) * one
        n_c = n_c.to(tl.float32) * one
    for t0 in range(0, N, BT):
        b_bb = tl.reshape(n_b, [BKW, BT, BV])
        b_cb = tl.reshape(n_c, [BKW, BT, BV])
        b_vb = tl.reshape(n_v, [1, BT, BV])
        # next block first: its loads are in flight while this block is processed (offsets
        # are recomputed from t0: kept as loop invariants they cost ~40 registers)
        o_tn = t0 + BT + o_jt[None, :]
        n_b = tl.load(p_b + (o_bw + o_tn * stride_bnw), mask=(o_tn < N) & m_w, other=0)
        n_c = tl.load(p_c + (o_cw + o_tn * stride_cnw), mask=(o_tn < N) & m_w, other=0)
        b_a = n_a
        n_v = tl.load(p_v + (o_vv + o_tn * v_strides[2]), mask=(o_tn < N) & m_v, other=0.0).to(tl.float32) * one
        if PER_TOKEN_DECAY:
            n_a = tl.load(p_a + (t0 + BT + o_i) * a_strides[2], mask=t0 + BT + o_i < N, other=0.0).to(tl.float32) * one
        if KW == 1 and not IS_32:
            n_b = n_b.to(tl.float32) * one
            n_c = n_c.to(tl.float32) * one

        b_o = tl.zeros([BT, BV], dtype=tl.float32)
        if PER_TOKEN_DECAY:  # the block's decays: exp(a) = exp2(a · log2 e) ≤ 1; a > 0 or NaN gives NaN
            b_g = tl.where(b_a <= 0.0, tl.exp2(b_a * 1.4426950408889634), float("nan"))
        for i in tl.static_range(BT):
            m_i = o_i[None, :, None] == i
            w_b = _pick_row(b_bb, m_i)  # [BKW, BV]
            w_c = _pick_row(b_cb, m_i)
            b_v = _pick_row(b_vb, m_i)  # [1, BV]
            # a row past the end adds zero and must not decay the state either
            m_row = t0 + i < N
            if PER_TOKEN_DECAY:  # the row's factor (a row past the end read a = 0: factor 1)
                g_h = tl.sum(tl.where(o_i == i, b_g, 0.0), axis=0)
                g_l = 0.0
            else:
                g_h = tl.where(m_row, g_hi, 1.0)
                g_l = tl.where(m_row, g_lo, 0.0)
            if KW == 2:
                b_be, b_bo = _unpack(w_b, BF16)
                b_ce, b_co = _unpack(w_c, BF16)
                b_se = _step(b_se, b_ce, b_v, g_h, g_l, HAS_DECAY or PER_TOKEN_DECAY)
                b_so = _step(b_so, b_co, b_v, g_h, g_l, HAS_DECAY or PER_TOKEN_DECAY)
                b_ot = tl.sum(b_se * b_be + b_so * b_bo, axis=0, keep_dims=True)  # [1, BV] = b_t S_t
            else:
                b_se = _step(b_se, w_c, b_v, g_h, g_l, HAS_DECAY or PER_TOKEN_DECAY)
                b_ot = tl.sum(b_se * w_b, axis=0, keep_dims=True)  # [1, BV] = b_t S_t
            b_o = tl.where(o_i[:, None] == i, b_ot, b_o)
        store_tile(p_o, b_o, t0 + o_i, o_v, o_strides[2], o_strides[3], N, D)

    if STORE_STATE:
        p_st = head_ptr(st_ptr, st_strides, i_b, i_h) + (o_w * KW)[:, None] * st_strides[2] + o_v[None, :] * st_strides[3]
        tl.store(p_st, b_se, mask=m_se)
        if KW == 2:
            tl.store(p_st + st_strides[2], b_so, mask=m_so)


def _keys_per_word(p: Problem) -> int:
    """2 when rows of b and c can be read as 32-bit words holding two 16-bit keys, else 1.

    The same for a reversed problem (docs/design.md §10.3): its last row, where the kernel's pointer
    starts, is as aligned as the first when the row stride is even."""
    if p.b.dtype == torch.float32 or p.b.shape[-1] % 2:
        return 1
    for x in (p.b, p.c):
        if x.stride(3) != 1 or any(s % 2 for s in x.stride()[:3]) or x.data_ptr() % 4:
            return 1
    return 2


def _launch(p: Problem, config: Optional[Mapping]) -> None:
    B, H, n, r, d = p.shape
    args = problem_args(p)
    args["BK"] = spaces.key_tile(r)
    kw = _keys_per_word(p)
    # the row strides the kernel is given (negated for a reversed problem), in words
    args.update(RW=-(-r // kw), stride_bnw=args["b_strides"][2] // kw, stride_cnw=args["c_strides"][2] // kw,
                KW=kw)
    if p.log_decay is not None:
        if p.reverse:
            raise ValueError("causal_dot_product: a reversed problem with a per-token decay is not run (the "
                             "backward reverses the decays itself)")
        args.update(a_ptr=p.log_decay, a_strides=tuple(p.log_decay.stride()), PER_TOKEN_DECAY=True)
    else:
        args.update(a_ptr=p.out, a_strides=(0, 0, 0), PER_TOKEN_DECAY=False)
    grid = lambda meta: (cdiv(d, meta["BV"]) * B * H,)  # noqa: E731
    launch(_causal_dot_product_fwd_kernel, grid, (config or {}).get(spaces.FWD.name), **args)


def causal_dot_product_fwd(p: Problem, plan: Plan) -> None:
    """Launch the recurrence kernel for ``p`` with the plan's configs.

    Row offsets inside the kernel are 32-bit (64-bit ones cost registers and make
    ptxas spill).  A sequence whose offsets would pass 2^31 elements (e.g. half a
    million tokens in the bnhd layout with 32 heads of 128) runs as consecutive
    pieces chained through the state, which the definition makes exact; a piece
    reads its initial state and writes its final state in place (each program
    reads and writes only its own tile).
    """
    B, H, n, r, d = p.shape
    config = plan.configs
    row_stride = max(abs(x.stride(2)) for x in (p.b, p.c, p.v, p.out))
    rows = max(1, _MAX_OFFSET // max(row_stride, 1) - 2 * spaces.MAX_BT)
    if n <= rows:
        _launch(p, config)
        return
    state = p.state if p.state is not None else torch.empty((B, H, r, d), dtype=torch.float32, device=p.v.device)
    initial = p.initial_state
    for a in range(0, n, rows):
        z = min(n, a + rows)
        piece = dataclasses.replace(p.rows(a, z), initial_state=initial, state=state)
        _launch(piece, config)
        initial = state
