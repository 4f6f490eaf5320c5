"""lightning_attention: Lightning Attention-2, one fused kernel walking the chunks in order.

Each program owns one batch·head, one [BV]-wide slice of the value columns and
one segment of the sequence (the whole sequence for this method), and keeps the
[r, BV] slice of the state in float32 registers, as r/BK ≤ 4 tiles of [BK, BV]
(so that b is upcast for the state product one [BT, BK] tile at a time, and r
up to 256 fits).  Per chunk of T ≤ BT rows (local indices i, j):

    scores = (b cᵀ) ⊙ M,     M[i, j] = γ^(i−j) for i ≥ j        (intra-chunk)
    o      = scores v + γ^(i+1) ⊙ (b S)                           (inter-chunk, through the state)
    S      = γ^T S + cᵀ (γ^(T−1−j) ⊙ v)

Four tile products per chunk, all on tensor cores; the loads of the next chunk
do not depend on the state, so Triton prefetches them under the products of
the current one (from ``num_stages`` = 3 on).  Every decay is
exp2(λ · distance) with distance ≥ 0, every factor in (0, 1]; the mask M
depends only on i − j, so it is built once per program.  The grid is flat
(value tiles fastest, then segments, then batch·heads): programs that read the
same b and c tiles run side by side and share them through L2.

Precision: 16-bit inputs feed the score and value products directly (the
decayed scores and the decayed v are rounded to the input dtype, as in every
flash-style kernel); the product with the float32 state uses ``DOT_PRECISION``
(TF32 for 16-bit inputs, exact for their values) with b upcast to float32, so
the state is never rounded to 16 bits (fp16 would overflow for long sequences
with γ = 1).  The row decay γ^(i+1) is applied to the product's rows, after it,
so the only rounding on that path is the state's to TF32.

The same jit body serves ``block_based`` (kernels/block_based.py): there the
sequence is cut into segments whose start states come from the shared
segment-state kernels, and one program walks one segment (``SEGMENTED``).
Cost O(n T (r + d) + n r d); memory traffic b, c, v read once, o written once.
"""
from __future__ import annotations

from typing import Mapping, Optional

import triton
import triton.language as tl

from ..api import Problem
from ..autotune import KernelSpace, autotune, launch
from ..autotune.spaces import lightning_attention as spaces
from ..autotune.spaces._util import cdiv
from ._common import causal_decay, decay, head_log2_gamma, load_tile, mma, pow2_at_least_16, problem_args, store_tile

KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "STORE_STATE", "DOT_PRECISION", "SEGMENTED"]


@triton.jit
def _start_state(p_s, stride_k, stride_d, o_k, o_v, R, D, LOAD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """One [BK, BV] tile of the state before the walk (zero when there is none to load)."""
    if LOAD:
        return load_tile(p_s, o_k, o_v, stride_k, stride_d, R, D)
    else:
        return tl.zeros([BK, BV], dtype=tl.float32)


@triton.jit
def _load_bc(p_b, p_c, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R):
    """The [BT, BK] tiles of b and c at rows ``o_t`` (< rows) and columns ``o_k`` of r."""
    b_b = load_tile(p_b, o_t, o_k, stride_bn, stride_bk, rows, R)
    b_c = load_tile(p_c, o_t, o_k, stride_cn, stride_ck, rows, R)
    return b_b, b_c


# The chunk walk's body; ``chunk_walk_kernel`` compiles it, one instance per method.
def _chunk_walk_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, lam_ptr, s0_ptr, st_ptr,
    stride_bb, stride_bh, stride_bn, stride_bk, stride_cb, stride_ch, stride_cn, stride_ck,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_s0b, stride_s0h, stride_s0k, stride_s0d, stride_stb, stride_sth, stride_stk, stride_std,
    H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS,
    SEGMENTED: tl.constexpr, RP: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # r is cut into NK tiles of BK (RP = r rounded up to a power of two): the state lives in NK
    # [BK, BV] register tiles s0..s3, so b is upcast for the state product one [BT, BK] tile at a time
    NK: tl.constexpr = (RP + BK - 1) // BK
    tl.static_assert(NK <= 4)

    # one flat grid, value tiles fastest: the programs that share b and c run side by side (L2 reuse),
    # and batch·heads·segments may exceed the 65535 limit of the grid's other axes
    pid = tl.program_id(0)
    nv = (D + BV - 1) // BV
    i_v = pid % nv
    i_bhs = pid // nv
    i_s = i_bhs % NS
    i_bh = i_bhs // NS
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    lam = head_log2_gamma(lam_ptr, i_h, HAS_DECAY)

    t_start = i_s * SEG
    t_end = tl.minimum(t_start + SEG, N)
    t_start64 = t_start.to(tl.int64)
    p_b = b_ptr + i_b * stride_bb + i_h * stride_bh + t_start64 * stride_bn
    p_c = c_ptr + i_b * stride_cb + i_h * stride_ch + t_start64 * stride_cn
    p_v = v_ptr + i_b * stride_vb + i_h * stride_vh + t_start64 * stride_vn
    p_o = o_ptr + i_b * stride_ob + i_h * stride_oh + t_start64 * stride_on

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)

    # the state before the segment's first row: the segment-state workspace, the initial state, or zero
    # (segments always start from the workspace: the launcher sets HAS_INITIAL for them)
    if SEGMENTED:
        p_s = ws_ptr + i_bhs.to(tl.int64) * R * D
        stride_sk = D
        stride_sd = 1
    else:
        p_s = s0_ptr + i_b * stride_s0b + i_h * stride_s0h
        stride_sk = stride_s0k
        stride_sd = stride_s0d
    s0 = _start_state(p_s, stride_sk, stride_sd, o_k, o_v, R, D, HAS_INITIAL, BK, BV)
    if NK >= 2:
        s1 = _start_state(p_s, stride_sk, stride_sd, BK + o_k, o_v, R, D, HAS_INITIAL, BK, BV)
    if NK >= 4:
        s2 = _start_state(p_s, stride_sk, stride_sd, 2 * BK + o_k, o_v, R, D, HAS_INITIAL, BK, BV)
        s3 = _start_state(p_s, stride_sk, stride_sd, 3 * BK + o_k, o_v, R, D, HAS_INITIAL, BK, BV)

    # both depend on local positions only: the same for every chunk
    m_intra = causal_decay(lam, o_t, o_t, HAS_DECAY)
    row_decay = decay(lam, o_t + 1, HAS_DECAY)

    for t0 in range(t_start, t_end, BT):
        rows = t_end - t0  # rows of this chunk present (the last may be short; its tail loads as zero)
        # scores b cᵀ and the state term b S, accumulated over the r tiles
        b0, c0 = _load_bc(p_b, p_c, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R)
        b_a = mma(b0, tl.trans(c0), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
        b_o = mma(b0.to(tl.float32), s0, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
        if NK >= 2:
            b1, c1 = _load_bc(p_b, p_c, o_t, BK + o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R)
            b_a += mma(b1, tl.trans(c1), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            b_o += mma(b1.to(tl.float32), s1, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
        if NK >= 4:
            b2, c2 = _load_bc(p_b, p_c, o_t, 2 * BK + o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R)
            b_a += mma(b2, tl.trans(c2), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            b_o += mma(b2.to(tl.float32), s2, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
            b3, c3 = _load_bc(p_b, p_c, o_t, 3 * BK + o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R)
            b_a += mma(b3, tl.trans(c3), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            b_o += mma(b3.to(tl.float32), s3, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
        b_v = load_tile(p_v, o_t, o_v, stride_vn, stride_vd, rows, D)

        # earlier chunks reach row i through the state, decayed by γ^(i+1) (applied to the product's
        # rows, so b enters the TF32 product exactly); this chunk through the masked scores
        b_o = b_o * row_decay[:, None]
        b_a = b_a * m_intra
        b_o += mma(b_a.to(b_v.dtype), b_v, DOT_PRECISION)  # [BT, BT] @ [BT, BV]
        store_tile(p_o, b_o, o_t, o_v, stride_on, stride_od, rows, D)

        # S ← γ^T S + Σ_j γ^(T−1−j) c_jᵀ v_j over the T present rows
        n_rows = tl.minimum(rows, BT)
        b_vd = (b_v * decay(lam, tl.maximum(n_rows - 1 - o_t, 0), HAS_DECAY)[:, None]).to(b_v.dtype)
        g_chunk = decay(lam, n_rows, HAS_DECAY)
        s0 = s0 * g_chunk + mma(tl.trans(c0), b_vd, DOT_PRECISION)  # [BK, BT] @ [BT, BV]
        if NK >= 2:
            s1 = s1 * g_chunk + mma(tl.trans(c1), b_vd, DOT_PRECISION)  # [BK, BT] @ [BT, BV]
        if NK >= 4:
            s2 = s2 * g_chunk + mma(tl.trans(c2), b_vd, DOT_PRECISION)  # [BK, BT] @ [BT, BV]
            s3 = s3 * g_chunk + mma(tl.trans(c3), b_vd, DOT_PRECISION)  # [BK, BT] @ [BT, BV]

        p_b += BT * stride_bn
        p_c += BT * stride_cn
        p_v += BT * stride_vn
        p_o += BT * stride_on

    if STORE_STATE:
        p_st = st_ptr + i_b * stride_stb + i_h * stride_sth
        store_tile(p_st, s0, o_k, o_v, stride_stk, stride_std, R, D)
        if NK >= 2:
            store_tile(p_st, s1, BK + o_k, o_v, stride_stk, stride_std, R, D)
        if NK >= 4:
            store_tile(p_st, s2, 2 * BK + o_k, o_v, stride_stk, stride_std, R, D)
            store_tile(p_st, s3, 3 * BK + o_k, o_v, stride_stk, stride_std, R, D)


def chunk_walk_kernel(space: KernelSpace):
    """The chunk walk compiled as its own kernel, autotuned over ``space``.

    Each method that launches the walk gets its own instance (its own config
    space, its own tuned choices), from the one body above.
    """
    return autotune(space, key=KEY)(triton.jit(do_not_specialize=["N", "SEG", "NS"])(_chunk_walk_fwd_kernel))


_lightning_attention_fwd_kernel = chunk_walk_kernel(spaces.FWD)


def launch_chunk_walk(kernel, space: KernelSpace, p: Problem, config: Optional[Mapping], *, ws=None,
                      seg_len: Optional[int] = None) -> None:
    """Walk the chunks of ``p`` with ``kernel``: the whole sequence, or segments of ``seg_len`` rows
    whose start states are in ``ws`` (``(B, H, NS, r, d)`` float32, from ``segment_start_states``)."""
    B, H, n, r, d = p.shape
    args = problem_args(p)
    if ws is None:
        seg_len, ns, segmented = n, 1, False
        ws = p.out  # unused stand-in
    else:
        ns, segmented = cdiv(n, seg_len), True
        # every segment starts from its state in the workspace (the segment-state kernels folded in
        # the initial state there, and wrote the final state)
        args.update(HAS_INITIAL=True, STORE_STATE=False)
    grid = lambda meta: (cdiv(d, meta["BV"]) * ns * B * H,)  # noqa: E731
    launch(kernel, grid, (config or {}).get(space.name), **args, ws_ptr=ws, SEG=seg_len, NS=ns,
           SEGMENTED=segmented, RP=pow2_at_least_16(r))


def lightning_attention_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    """Launch the fused chunk walk for ``p`` (``config``: per-kernel configs, or None to autotune)."""
    launch_chunk_walk(_lightning_attention_fwd_kernel, spaces.FWD, p, config)
