"""vanilla: the tiled quadratic form O = (B Cᵀ ⊙ M) V, never materialised in memory.

Each program owns one [BT, BV] output tile and walks the key tiles j ≤ i up to
the diagonal: scores = B_i C_jᵀ (over r in BK slices), times the decay mask
built from relative positions, then O += scores V_j, all accumulated in fp32.
The initial state adds γ^(i+1) B_i S₀; the final state comes from the shared
segment-state kernel over the whole sequence (the quadratic form has no state).
Cost O(n² (r + d)): it wins only for very short sequences.
"""
from __future__ import annotations


import triton
import triton.language as tl

from ...problem import Problem
from ..spec import Plan
from ...autotune import autotune, launch
from . import space as spaces
from ...autotune.sizing import cdiv
from ...kernels.abi import causal_decay, decay, head_log2_gamma, load_tile, mma, problem_args, store_tile
from ...kernels.segments import final_state

_KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "DOT_PRECISION"]


@autotune(spaces.FWD, key=_KEY)
@triton.jit(do_not_specialize=["N"])
def _vanilla_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr,
    stride_bb, stride_bh, stride_bn, stride_bk, stride_cb, stride_ch, stride_cn, stride_ck,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_s0b, stride_s0h, stride_s0k, stride_s0d, stride_stb, stride_sth, stride_stk, stride_std,
    H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # batch·heads·row tiles on the grid's first axis (the others are limited to 65535);
    # 64-bit batch and head offsets
    nt = tl.cdiv(N, BT)
    i_bh = tl.program_id(0) // nt
    i_t = tl.program_id(0) % nt
    i_v = tl.program_id(1)
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    b_ptr += i_b * stride_bb + i_h * stride_bh
    c_ptr += i_b * stride_cb + i_h * stride_ch
    v_ptr += i_b * stride_vb + i_h * stride_vh
    o_ptr += i_b * stride_ob + i_h * stride_oh
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)

    o_i = i_t * BT + tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    # key tiles strictly below the diagonal tile and the diagonal tile itself
    for j0 in range(0, (i_t + 1) * BT, BT):
        o_j = j0 + tl.arange(0, BT)
        scores = tl.zeros([BT, BT], dtype=tl.float32)
        for k0 in range(0, R, BK):
            b_b = load_tile(b_ptr, o_i, k0 + o_k, stride_bn, stride_bk, N, R)
            b_c = load_tile(c_ptr, o_j, k0 + o_k, stride_cn, stride_ck, N, R)
            scores += mma(b_b, tl.trans(b_c), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
        scores *= causal_decay(lam, o_i, o_j, HAS_DECAY)
        b_v = load_tile(v_ptr, o_j, o_v, stride_vn, stride_vd, N, D)
        acc += mma(scores.to(b_v.dtype), b_v, DOT_PRECISION)  # [BT, BT] @ [BT, BV]

    if HAS_INITIAL:
        # γ^(i+1) b_i S₀: the initial state as seen by row i
        s0_ptr += i_b * stride_s0b + i_h * stride_s0h
        row_decay = decay(lam, o_i + 1, HAS_DECAY)
        for k0 in range(0, R, BK):
            b_b = load_tile(b_ptr, o_i, k0 + o_k, stride_bn, stride_bk, N, R).to(tl.float32)
            b_s = load_tile(s0_ptr, k0 + o_k, o_v, stride_s0k, stride_s0d, R, D)
            acc += mma(b_b * row_decay[:, None], b_s, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
    store_tile(o_ptr, acc, o_i, o_v, stride_on, stride_od, N, D)


def vanilla_fwd(p: Problem, plan: Plan) -> None:
    """Launch the vanilla kernels for ``p`` with the plan's configs."""
    B, H, n, r, d = p.shape
    args = problem_args(p)
    fwd_grid = lambda meta: (B * H * cdiv(n, meta["BT"]), cdiv(d, meta["BV"]))  # noqa: E731
    launch(_vanilla_fwd_kernel, fwd_grid, plan.config(spaces.FWD), **args)
    if p.state is not None:
        final_state(p, plan.configs)
