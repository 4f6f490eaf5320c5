"""causal_dot_product: the row-by-row recurrence S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t.

The algorithm of fast-transformers' ``causal_product`` CUDA kernel, extended to a
decay.  Each program owns the whole key dimension of one [R, BV] slice of the
state, in float32 registers, and walks the sequence one row at a time: an
outer-product update of the state, then o_t as a reduction over the key
dimension.  No quadratic term, no tensor-core work.  Programs are independent
(batch · heads × value tiles): no cross-program reduction, so results do not
change run to run.

What makes the sequential loop fast:

* Layout.  The rows are read through pointer grids of shape [BT, BK, BV] that
  repeat each row over the value columns.  Coalescing gives such a load one
  16-byte vector of keys per thread, the keys across lanes, the value columns
  across the remaining lanes and the warps, and the BT rows in registers.  The
  state takes the same layout, so the update needs no data movement and the
  reduction over keys is a few in-thread adds and a shuffle tree inside one
  warp: no shared memory, no barrier per row.
* Blocks of rows.  BT rows of b, c and v come in with one load each; picking
  row i out of the block is a select on registers that the compiler folds
  away (the unrolled loop knows i).
* Software pipelining.  The loads of block j+1 are issued before block j is
  processed, so their latency hides behind BT steps of work.  The BT outputs
  of a block are gathered in registers and written with one store.

Rows past the end read as zero and do not decay the state, so the last block
needs no special case.  Cost O(n r d) on CUDA cores with n sequential steps:
the method for tiny n and for very large batch · heads.
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
    # value tiles of one head are neighbours in launch order: they share the b and c rows in L2
    NV = tl.cdiv(D, BV)
    i_v = tl.program_id(0) % NV
    i_bh = tl.program_id(0) // NV
    i_b = i_bh // H
    i_h = i_bh % H
    b_ptr += i_b * stride_bb + i_h * stride_bh
    c_ptr += i_b * stride_cb + i_h * stride_ch
    v_ptr += i_b * stride_vb + i_h * stride_vh
    o_ptr += i_b * stride_ob + i_h * stride_oh
    lam = head_log2_gamma(lam_ptr, i_h, HAS_DECAY)
    gamma = tl.exp2(lam)  # the decay of one step, exp2(λ · 1)

    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    # [BT, BK, BV] pointer grids that repeat each row of b and c over the value columns: they
    # give the loaded blocks, and the state built from them, the layout described above
    o_rep = tl.zeros([BT, BK, BV], dtype=tl.int32)
    p_b = b_ptr + o_k[None, :, None] * stride_bk + o_rep
    p_c = c_ptr + o_k[None, :, None] * stride_ck + o_rep
    p_v = v_ptr + o_v[None, None, :] * stride_vd
    m_k = o_k[None, :, None] < R
    m_v = o_v[None, None, :] < D

    if HAS_INITIAL:
        s0_ptr += i_b * stride_s0b + i_h * stride_s0h
        b_s = load_tile(s0_ptr, o_k, o_v, stride_s0k, stride_s0d, R, D)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)

    o_t = o_i[:, None, None]
    n_b = tl.load(p_b + o_t * stride_bn, mask=(o_t < N) & m_k, other=0.0)  # [BT, BK, BV], rows repeated
    n_c = tl.load(p_c + o_t * stride_cn, mask=(o_t < N) & m_k, other=0.0)  # [BT, BK, BV]
    n_v = tl.load(p_v + o_t * stride_vn, mask=(o_t < N) & m_v, other=0.0)  # [BT, 1, BV]
    for t0 in range(0, N, BT):
        b_bb = n_b
        b_cb = n_c
        b_vb = n_v
        # next block first: its loads are in flight while this block is processed
        o_t = t0 + BT + o_i[:, None, None]
        n_b = tl.load(p_b + o_t * stride_bn, mask=(o_t < N) & m_k, other=0.0)
        n_c = tl.load(p_c + o_t * stride_cn, mask=(o_t < N) & m_k, other=0.0)
        n_v = tl.load(p_v + o_t * stride_vn, mask=(o_t < N) & m_v, other=0.0)

        b_o = tl.zeros([BT, BV], dtype=tl.float32)
        for i in tl.static_range(BT):
            # row i of the block; the other rows become -0.0, which the sum over the
            # register axis folds away (x + -0.0 == x)
            m_i = o_i[:, None, None] == i
            b_b = tl.sum(tl.where(m_i, b_bb.to(tl.float32), -0.0), axis=0)  # [BK, BV]
            b_c = tl.sum(tl.where(m_i, b_cb.to(tl.float32), -0.0), axis=0)  # [BK, BV]
            b_v = tl.sum(tl.where(m_i, b_vb.to(tl.float32), -0.0), axis=0)  # [1, BV]
            if HAS_DECAY:
                # a row past the end adds zero and must not decay the state either
                b_s = b_s * tl.where(t0 + i < N, gamma, 1.0) + b_c * b_v
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
    grid = lambda meta: (triton.cdiv(d, meta["BV"]) * B * H,)  # noqa: E731
    launch(_causal_dot_product_fwd_kernel, grid, (config or {}).get(spaces.FWD.name), **args)
