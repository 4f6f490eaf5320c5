"""fleet_attention: FleetAttention, O = Σ_k diag(b_k) · γ-cumsum(diag(c_k) V), by blocks on tensor cores.

For every rank column k the decayed cumulative sum of c[:, k] v runs down the
sequence,

    h_k[t, :] = γ h_k[t−1, :] + c[t, k] v[t, :],        o[t, :] = Σ_k b[t, k] h_k[t, :],

which is the state recursion of docs/design.md §1.2 read column by column: h_k[t] is row
k of the state S_t.  Row by row this is a chain of n dependent steps per rank
and value column (latency bound on CUDA cores, many times slower than the
chunked lightning_attention).  Here it
runs a block of BT rows at a time, with the relative decays of docs/design.md §3.7
(local row indices i, j of the block):

    h_k[block] = L @ (c[:, k] ⊙ v) + γ^(i+1) · carry_k,    L[i, j] = γ^(i−j) for i ≥ j, else 0
    o[block]  += b[:, k] ⊙ h_k[block]                      for k = 0 .. r−1

so the chain becomes one [BT, BT] @ [BT, BV] tensor-core product per rank and
block (two for 16-bit inputs, see Numerics); carry_k, row k of the state before the block, is the only thing that
crosses blocks.  After the block's output tile is stored, the carries of all
ranks are brought to the block's end with one more product per BK ranks,

    S[k0:k0+BK] ← γ^BT S[k0:k0+BK] + c[:, k0:k0+BK]ᵀ @ (w ⊙ v),   w_j = γ^(BT−1−j)    # [BK, BT] @ [BT, BV]

(r in slices of BK, so a [BK, BV] float32 slice of the state is in registers at
a time, never all r rows).  The last block of a segment, the only one that may
be cut short, has no next block and skips it.

Cost per batch·head: n·r·d·BT multiply-adds on tensor cores for the rank loop
(BT times the algorithm's n·r·d: the price of turning the chain into products;
2 n·r·d·BT for 16-bit inputs) and n·r·d for the carries, plus 3 n·r·d elementwise
operations on CUDA cores (c ⊙ v, the carry term, the b-weighted sum; 3 more for
16-bit inputs, splitting c ⊙ v); memory traffic: b, c, v read once per
value tile (the columns of b and c come from L1/L2 for each rank), o written
once, the [r, BV] carry slice read once per block and written once.  The BT
factor is why it does not beat the chunked methods on the GPUs measured; it is
kept as the library's fast form of FleetAttention (docs/design.md §3.7).

One program owns the [BT, BV] output tiles of one batch·head, one BV slice of
the value columns and one segment of the sequence; it walks the segment in
blocks of BT rows and, per block, loops over k itself, so every output element
is written once by one program (no atomics, bitwise deterministic).  Its [R, BV]
float32 carries are too large for registers and live in the program's own slice
of a float32 workspace, read by the rank loop and rewritten after it by other
threads of the same program; ``tl.debug_barrier()`` orders the two (every thread
has read the old carries before any is overwritten, and the next block reads
them only once all are written).

Segments: the workspace is that of ``segment_start_states`` (kernels/segments.py).
When batch·heads and the value tiles cannot fill the GPU, the sequence is cut
into segments (rule: ``segment_length`` in methods/fleet_attention/space.py)
whose start states come from the tensor-core segment-state pass, and each
program starts its carries there; with one segment it is the initial state (or
zero).  The final state comes from the same pass.

Numerics (docs/design.md §2: 16-bit inputs on tensor cores with float32
accumulation; float32 exact by default): every product accumulates in float32
and the carries, the state and the output sum stay float32.  The output sums
r terms b[t, k] h_k[t], which may cancel to far below their size, so no rank's
term may carry its own rounding: c ⊙ v is exact (:func:`_decayed_sum`).  16-bit
inputs give the products operands of their own dtype: L, decays ≤ 1 rounded to
it, and c ⊙ v as two operands, hi (rounded) and lo (the remainder, exact), each
multiplied by L; the carry product takes c as it is and w ⊙ v rounded.  Each
rounding of L or w ⊙ v is the same for every rank, so it errs in proportion to
the scores b·c themselves, as the chunked kernels' rounded decayed scores do.
(Rounded once per rank instead, c ⊙ v gave 9e-3 at r = 212 for a float16 output
0.28 made of terms of size 1, and bfloat16 through float32 operands rounded to
TF32 9e-3 to 2e-2 on such cases under the interpreter; a product |c·v| beyond
float16's 65504 would overflow.)  float32 inputs give the products float32
operands at the caller's precision, true float32 (``"ieee"``, the default:
within 1e-5 of the oracle) or TF32 (``"tf32"``, opt in).

Offsets across batch·heads and segments are 64-bit; inside one segment they are
32-bit (its rows times the row stride below 2^31 elements).  Every decay is
exp2(λ · distance) with distance ≥ 0, every factor in (0, 1]; nothing is
divided by a decay.

With a per-token decay (``PER_TOKEN_DECAY``, docs/design.md §1.6, §3.7) the combine takes each row's own
factor: per block L[i, j] = exp2(G_i − G_j), the carry into row i exp2(G_i), G the block's prefix sums
of a · log2 e (kernels/token_decay.py), and the segments' states come from the per-token segment kernels.
Without the flag none of this is compiled.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...problem import Problem
from ..spec import Plan
from ...autotune import autotune, launch
from . import space as spaces
from ...autotune.sizing import cdiv
from ...kernels.abi import (any_nonfinite, batch_head, causal_decay, decay, float16_tile_scale, head_log2_gamma,
                            head_ptr, head_ptrs, mma, nonfinite, problem_args, round_to)
from ...kernels.segments import segment_start_states
from ...kernels.token_decay import decay_args, log2_decays, pair_exponents, prefix_sums, tile_tail, token_start_states

_KEY = ["R", "D", "HAS_DECAY", "DOT_PRECISION", "PER_TOKEN_DECAY"]


@triton.jit
def _operand(x, IN_DTYPE: tl.constexpr):
    """``x`` as a tensor-core operand for inputs of ``IN_DTYPE``: in the inputs' own dtype, rounded to nearest."""
    return round_to(x, IN_DTYPE)


@triton.jit
def _decayed_sum(acc, b_l, b_c, b_v, o_r, IN_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr):
    """``acc`` + L @ (c ⊙ v) for one rank column ``b_c`` [BT] and the block's values ``b_v`` [BT, BV].

    c ⊙ v is exact in float32 (a product of two 16-bit values has at most 22 significant bits).
    For 16-bit inputs it enters the product as two operands of the inputs' dtype, hi = c ⊙ v
    rounded and lo = what the rounding dropped (exact in that dtype: the 11 low bits of a float16
    product, the 8 of a bfloat16 one), and L multiplies both: rounded once, each rank's term would
    carry its own relative error (up to 2^-12 in float16), and the sum over r ranks, which may
    cancel to far below its terms, would add those errors up (r = 212 gave 9e-3 of an output 0.28
    made of terms of size 1).  L's rounding, the same for every rank, errs in proportion to the
    scores themselves, as the chunked kernels' rounded decayed scores do.

    ``CAUSAL`` (the slow form, taken by a block whose output is not finite, docs/nonfinite.md): L's zeros
    above the diagonal times a non-finite c_j v_j would be NaN in rows i < j, so c ⊙ v enters with its
    non-finite entries set to zero, and each value column's rows from its first non-finite entry on are
    NaN (the definition gives them ±inf or NaN); for float16 a tile of c ⊙ v past float16's range goes in
    scaled, its product scaled back.  The rows before a non-finite value are the fast form's bit for bit: the
    compiler fuses ``acc``'s product (the carry term γ^(i+1) carry, made by the caller) with the sum into one
    rounding, so the NaN rows are selected after the sum, not in ``acc``, and float16's scaled product is added
    to ``acc`` (not ``acc`` to it), which keeps that fusion; a scale of 1 is exact (docs/nonfinite.md).
    """
    b_x = b_c.to(tl.float32)[:, None] * b_v.to(tl.float32)
    if CAUSAL:
        if IN_DTYPE == tl.float16:
            # float16's hi part of c ⊙ v overflows past 65 504 (c, v ≈ 300): in the slow form a tile past
            # float16's range goes in scaled by a power of two, undone on the float32 product
            up, down = float16_tile_scale(b_x)
            b_x = b_x * up
        bad = nonfinite(b_x)
        first = tl.min(tl.where(bad, o_r[:, None], 2147483647), axis=0)  # [BV]: each column's first non-finite row
        b_x = tl.where(bad, 0.0, b_x)
        if IN_DTYPE == tl.float16:
            # acc first: its product (the carry term) fuses with the sum as in the fast form
            b_h = acc + _split_product(b_l, b_x, IN_DTYPE, DOT_PRECISION) * down
        else:
            b_h = _split_product(b_l, b_x, IN_DTYPE, DOT_PRECISION) + acc
        return tl.where(o_r[:, None] >= first[None, :], float("nan"), b_h)
    return _split_product(b_l, b_x, IN_DTYPE, DOT_PRECISION) + acc


@triton.jit
def _split_product(b_l, b_x, IN_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """L @ x for float32 x: 16-bit inputs as two operands of their dtype, hi and lo (:func:`_decayed_sum`)."""
    if IN_DTYPE != tl.float32:
        b_hi = round_to(b_x, IN_DTYPE)
        b_lo = round_to(b_x - b_hi.to(tl.float32), IN_DTYPE)
        return mma(b_l, b_hi, DOT_PRECISION) + mma(b_l, b_lo, DOT_PRECISION)   # [BT, BT] @ [BT, BV], twice
    else:
        return mma(b_l, b_x, DOT_PRECISION)                                     # [BT, BT] @ [BT, BV]


@triton.jit
def _block_out(b_l, b_first, b_v, p_b, p_c, p_ws, o_t, m_t, o_r, o_v, m_v, stride_bn, stride_bk, stride_cn, stride_ck,
               D, R, IN_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
               BV: tl.constexpr):
    """The block's float32 [BT, BV] output: Σ_k b[:, k] ⊙ (L @ (c[:, k] ⊙ v) + γ^(i+1) carry_k)."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for k in range(0, R):
        b_c = tl.load(p_c + o_t * stride_cn + k * stride_ck, mask=m_t, other=0.0)
        b_b = tl.load(p_b + o_t * stride_bn + k * stride_bk, mask=m_t, other=0.0).to(tl.float32)
        b_carry = tl.load(p_ws + k * D + o_v, mask=m_v, other=0.0)
        b_h = _decayed_sum(b_first[:, None] * b_carry[None, :], b_l, b_c, b_v, o_r, IN_DTYPE, DOT_PRECISION, CAUSAL)
        acc += b_b[:, None] * b_h
    return acc


@autotune(spaces.FWD, key=_KEY, restore_value=["ws_ptr"])
@triton.jit(do_not_specialize=["N", "SEG", "NS"])
def _fleet_attention_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS, a_ptr, a_strides, PER_TOKEN_DECAY: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    IN_DTYPE: tl.constexpr = v_ptr.dtype.element_ty
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b, i_h = batch_head(i_bh, H)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    stride_bn, stride_bk, stride_cn, stride_ck = b_strides[2], b_strides[3], c_strides[2], c_strides[3]
    stride_vn, stride_vd, stride_on, stride_od = v_strides[2], v_strides[3], o_strides[2], o_strides[3]

    # addresses from the segment's first row on (64-bit base, 32-bit offsets inside the segment)
    t_start = i_s * SEG
    seg_rows = tl.minimum(SEG, N - t_start)
    t_start64 = t_start.to(tl.int64)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    p_b, p_c = p_b + t_start64 * stride_bn, p_c + t_start64 * stride_cn
    p_v, p_o = p_v + t_start64 * stride_vn, p_o + t_start64 * stride_on

    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    # this program's [R, BV] slice of the state (row k = the carry of h_k): the segment's start
    # state, then the end state of each block
    p_ws = ws_ptr + (i_bh * NS + i_s).to(tl.int64) * R * D
    if PER_TOKEN_DECAY:
        # the per-token decay a_t (docs/design.md §1.6): the block's decays are built per block below
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h) + t_start64 * a_strides[2]
    else:
        # the block's decays, all exp2(λ·distance) with distance ≥ 0, built once per program
        b_l = _operand(causal_decay(lam, o_r, o_r, HAS_DECAY), IN_DTYPE)   # [BT, BT]: γ^(i−j), i ≥ j
        b_first = decay(lam, o_r + 1, HAS_DECAY)                            # γ^(i+1): the carry into row i
        b_w = decay(lam, BT - 1 - o_r, HAS_DECAY)                           # γ^(BT−1−j): row j into the end state
        block_decay = tl.exp2(lam * BT)                                     # γ^BT (1 without decay: λ = 0)
    for t0 in range(0, seg_rows, BT):
        o_t = t0 + o_r
        m_t = o_t < seg_rows
        m_tv = m_t[:, None] & m_v[None, :]
        if PER_TOKEN_DECAY:
            # G_i: the block's prefix sums of a · log2 e; L[i, j] = exp2(G_i − G_j) for i ≥ j (selected; a
            # rounding above 0 taken as 0), the carry into row i exp2(G_i); a bad a_k is NaN from row k on
            b_a = log2_decays(p_a, a_strides[2], o_t, seg_rows)
            b_g, b_gl = prefix_sums(b_a)   # in two parts (kernels/token_decay.py)
            b_e = pair_exponents(b_g, b_gl, b_g, b_gl)
            b_l = _operand(tl.where(o_r[:, None] >= o_r[None, :], tl.exp2(tl.where(b_e > 0.0, 0.0, b_e)), 0.0),
                           IN_DTYPE)
            b_first = tl.exp2(b_g)
        b_v = _operand(tl.load(p_v + o_t[:, None] * stride_vn + o_v[None, :] * stride_vd, mask=m_tv, other=0.0),
                       IN_DTYPE)
        acc = _block_out(b_l, b_first, b_v, p_b, p_c, p_ws, o_t, m_t, o_r, o_v, m_v, stride_bn, stride_bk, stride_cn,
                         stride_ck, D, R, IN_DTYPE, DOT_PRECISION, False, BT, BV)
        # a non-finite entry: the block again in the causal form, so that a non-finite c or v reaches later
        # rows only (docs/nonfinite.md); one check per block on other inputs
        if any_nonfinite(acc):
            acc = _block_out(b_l, b_first, b_v, p_b, p_c, p_ws, o_t, m_t, o_r, o_v, m_v, stride_bn, stride_bk,
                             stride_cn, stride_ck, D, R, IN_DTYPE, DOT_PRECISION, True, BT, BV)
        tl.store(p_o + o_t[:, None] * stride_on + o_v[None, :] * stride_od, round_to(acc, o_ptr.dtype.element_ty),
                 mask=m_tv)
        # the carries for the next block, BK ranks at a time: S ← γ^BT S + cᵀ (w ⊙ v).  The decay
        # goes on v, so its rounding (float16 inputs) is the same for every rank, and c stays
        # exact.  The last block of the segment (the only one that may be cut short) has no next block.
        if t0 + BT < seg_rows:
            if PER_TOKEN_DECAY:  # row j into the end state by its tail, the carries by the block's sum
                b_w = tl.exp2(tile_tail(p_a, a_strides[2], o_t, seg_rows, BT))
                block_decay = tl.exp2(tl.sum(b_a, axis=0))
            b_vw = _operand(b_v.to(tl.float32) * b_w[:, None], IN_DTYPE)      # [BT, BV]
            for k0 in range(0, R, BK):
                o_kk = k0 + o_k
                m_kv = (o_kk < R)[:, None] & m_v[None, :]
                b_ct = tl.load(p_c + o_t[:, None] * stride_cn + o_kk[None, :] * stride_ck,
                               mask=(o_kk < R)[None, :], other=0.0)             # [BT, BK]
                p_s = p_ws + o_kk[:, None] * D + o_v[None, :]
                b_s = tl.load(p_s, mask=m_kv, other=0.0) * block_decay
                b_s += mma(tl.trans(_operand(b_ct, IN_DTYPE)), b_vw, DOT_PRECISION)   # [BK, BT] @ [BT, BV]
                # every thread has read the old carries (in the rank loop and just above)
                tl.debug_barrier()
                tl.store(p_s, b_s, mask=m_kv)
            # the next block reads carries other threads wrote
            tl.debug_barrier()


def fleet_attention_fwd(p: Problem, plan: Plan) -> None:
    """Launch the fleet_attention kernels for ``p`` with the plan's configs and schedule (``seg_len``)."""
    B, H, n, r, d = p.shape
    config = plan.configs
    fwd_config = plan.config(spaces.FWD)
    seg_len = plan.schedule["seg_len"]
    ns = cdiv(n, seg_len)
    if ns > 1 or p.state is not None:
        # start state of every segment (the carries to begin from), and the final state
        if p.log_decay is not None:
            ws = token_start_states(p, seg_len, config)
        else:
            ws = segment_start_states(p, seg_len, config)
    elif p.initial_state is not None:
        ws = p.initial_state.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    else:
        ws = torch.zeros((B, H, r, d), dtype=torch.float32, device=p.v.device)
    args = problem_args(p)
    args.update(decay_args(p))
    grid = lambda meta: (cdiv(d, meta["BV"]), ns, B * H)  # noqa: E731
    launch(_fleet_attention_fwd_kernel, grid, fwd_config, **args, ws_ptr=ws, SEG=seg_len, NS=ns)
