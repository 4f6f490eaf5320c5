"""causal_dot_product: the row-by-row recurrence S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t.

The algorithm of fast-transformers' ``causal_product`` CUDA kernel, extended to a
decay: each program owns the whole key dimension of one [R, BV] slice of the
state, in float32 registers, and walks the sequence one row at a time.  There
is no quadratic term and no tensor-core work: per row it is an outer-product
update of the state and a reduction over the key dimension.  Programs are
independent (batch · heads × value tiles), so there is no cross-program
reduction at all and the result is the same run to run.

Making the sequential loop fast:

* The rows b_t and c_t are read through a [BK, BV] pointer grid that repeats
  the row across the value columns.  Triton then gives the loaded tile -- and
  the state, which is built from it -- a layout with 16 bytes of consecutive
  keys inside each thread (one vector load per row) and the rest of the key
  dimension across the lanes of one warp, warps splitting the value columns.
  The reduction o_t = Σ_k b_t[k] S_t[k, :] is then a few in-thread adds and a
  short shuffle tree, with no shared memory and no barrier per row.
* The loop body covers BT rows, unrolled: the 3·BT row loads do not depend on
  the state, so they are all issued at the top of the body and one memory
  latency is paid per BT rows instead of per row.
* The BT outputs are gathered in a [BT, BV] register tile and written with one
  store per block (one layout change per block instead of one per row).

Rows past the end are masked to zero and do not decay the state, so the last
block needs no special case.  Cost O(n r d) on CUDA cores with n sequential
steps: it wins for tiny n and for very large batch · heads.
"""
from __future__ import annotations

from typing import Mapping, Optional

import triton
import triton.language as tl

from ..api import Problem
from ..autotune import autotune, launch
from ..autotune.spaces import causal_dot_product as spaces
from ._common import head_log2_gamma, load_tile, problem_args, store_tile

_KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "STORE_STATE"]


@autotune(spaces.FWD, key=_KEY)
@triton.jit(do_not_specialize=["N"])
def _causal_dot_product_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, lam_ptr, s0_ptr, st_ptr,
    stride_bb, stride_bh, stride_bn, stride_bk, stride_cb, stride_ch, stride_cn, stride_ck,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_s0b, stride_s0h, stride_s0k, stride_s0d, stride_stb, stride_sth, stride_stk, stride_std,
    H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    b_ptr += i_b * stride_bb + i_h * stride_bh
    c_ptr += i_b * stride_cb + i_h * stride_ch
    v_ptr += i_b * stride_vb + i_h * stride_vh
    o_ptr += i_b * stride_ob + i_h * stride_oh
    lam = head_log2_gamma(lam_ptr, i_h, HAS_DECAY)
    gamma = tl.exp2(lam)  # γ^1: the decay of one step (1 without decay)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_i = tl.arange(0, BT)
    # b_t and c_t through a [BK, BV] grid of pointers that repeats the row over the value
    # columns: it gives the state a layout with the key dimension in-thread and across lanes
    o_kv = o_k[:, None] * 0 + o_v[None, :] * 0
    p_b = b_ptr + o_k[:, None] * stride_bk + o_kv
    p_c = c_ptr + o_k[:, None] * stride_ck + o_kv
    p_v = v_ptr + o_v[None, :] * stride_vd

    if HAS_INITIAL:
        s0_ptr += i_b * stride_s0b + i_h * stride_s0h
        b_s = load_tile(s0_ptr, o_k, o_v, stride_s0k, stride_s0d, R, D)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)

    for t0 in range(0, N, BT):
        b_o = tl.zeros([BT, BV], dtype=tl.float32)
        for i in tl.static_range(BT):
            t = t0 + i
            m_t = t < N
            # a row past the end reads as zero: its key and value limits drop to 0
            m_k = o_k[:, None] < tl.where(m_t, R, 0)
            m_v = o_v[None, :] < tl.where(m_t, D, 0)
            b_b = tl.load(p_b + t * stride_bn, mask=m_k, other=0.0).to(tl.float32)  # [BK, BV], b_t repeated
            b_c = tl.load(p_c + t * stride_cn, mask=m_k, other=0.0).to(tl.float32)  # [BK, BV], c_t repeated
            b_v = tl.load(p_v + t * stride_vn, mask=m_v, other=0.0).to(tl.float32)  # [1, BV]
            if HAS_DECAY:
                # a row past the end adds zero and must not decay the state either
                b_s = b_s * tl.where(m_t, gamma, 1.0) + b_c * b_v
            else:
                b_s += b_c * b_v
            b_ot = tl.sum(b_s * b_b, axis=0, keep_dims=True)  # [1, BV] = b_t S_t
            b_o = tl.where(o_i[:, None] == i, b_ot, b_o)
        store_tile(o_ptr, b_o, t0 + o_i, o_v, stride_on, stride_od, N, D)

    if STORE_STATE:
        st_ptr += i_b * stride_stb + i_h * stride_sth
        store_tile(st_ptr, b_s, o_k, o_v, stride_stk, stride_std, R, D)


def causal_dot_product_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    """Launch the recurrence kernel for ``p`` (``config``: per-kernel configs, or None to autotune)."""
    B, H, n, r, d = p.shape
    args = problem_args(p)
    args["BK"] = spaces.key_tile(r)
    grid = lambda meta: (triton.cdiv(d, meta["BV"]), B * H)  # noqa: E731
    launch(_causal_dot_product_fwd_kernel, grid, (config or {}).get(spaces.FWD.name), **args)
