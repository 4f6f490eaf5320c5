"""fleet_attention: FleetAttention, O = Σ_k diag(b_k) · γ-cumsum(diag(c_k) V), one scan per rank column.

For every rank column k the decayed cumulative sum of c[:, k] v runs down the
sequence in float32,

    h_k[t, :] = γ h_k[t−1, :] + c[t, k] v[t, :],        o[t, :] = Σ_k b[t, k] h_k[t, :],

which is the state recursion of DESIGN §1 read column by column: h_k[t] is row
k of the state S_t.  The work is elementwise (CUDA cores, not tensor cores):
per (row t, rank k, value column j) one multiply c·v, one fused step γh + c·v
and one fused o + b·h -- 3 n r d float32 instructions per batch·head with
decay, 2 without (the c·v product folds into the cumulative sum).  With the
broadcast of b and c and the carries, the rank loop issues 4.1-4.5
instructions per element on sm_90 (autotune/spaces/fleet_attention.py).

One program owns the [BT, BV] output tiles of one batch·head, one BV slice of
the value columns and one segment of the sequence; it walks the segment in
blocks of BT rows and, per block, loops over k itself, so every output element
is written once by one program (no atomics, bitwise deterministic):

* the block's v tile is loaded once and stays in registers (float32);
* for each k: x = c[:, k] ⊙ v (a [BT, BV] tile), the carry h_k[t0 − 1] enters
  row 0 as γ·carry, ``tl.associative_scan`` with the linear-recurrence combine
  ((a1, x1), (a2, x2)) → (a1·a2, a2·x1 + x2) gives h_k on the block, and
  o += b[:, k] ⊙ h_k; the carry for the next block is h_k's last row.

The value offsets are multiplied by a stride the compiler does not specialise
(``stride_vd``, ``stride_od``), so the loads of v are not vectorised along d and
Triton lays the tile out with one value column per lane and all BT rows inside
the thread: the scan is then a sequential chain of FMAs in registers (no
shuffles, no shared memory), the γ·carry and last-row selections fold away, and
only the b and c columns are broadcast to the lanes.  Those come from [KU, BT]
blocks loaded once per KU rank columns, k-major so each lane extracts its column
without crossing lanes.  (The layout is a matter of speed only: any layout
computes the same values.)

Carries: the [R, BV] float32 carry of a program (= its slice of the state S) is
too large for registers, so it lives in the program's own slice of a float32
workspace (one [BV] row per k, read and written once per block, from L1/L2).
The workspace is that of ``segment_start_states`` (kernels/_segments.py): when
batch·heads and the value tiles cannot fill the GPU, the sequence is cut into
segments whose start states come from the tensor-core segment-state pass, and
each program starts its carries there; with one segment it is the initial
state (or zero).  The final state comes from the same pass.

Offsets across batch·heads and segments are 64-bit; inside one segment they are
32-bit (its rows times the row stride below 2^31 elements).  Every decay is
exp2(λ·1) = γ (the per-step factor) or a product of such steps; nothing is
divided by a decay.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from ..api import Problem
from ..autotune import autotune, current_family, launch
from ..autotune.families import is_interpreting
from ..autotune.spaces import fleet_attention as spaces
from ..autotune.spaces._util import cdiv, next_power_of_2
from ._common import causal_decay, head_log2_gamma, problem_args
from ._segments import segment_start_states

_KEY = ["R", "D", "HAS_DECAY", "KU"]
_KU = 32 if is_interpreting() else 8
"""Rank columns of b and c loaded per block load: one 16-byte vector per row for 16-bit inputs
on the GPU; 32 under the interpreter, where fewer and larger numpy calls are faster (3× at r = 130)."""

# The interpreter runs ``tl.associative_scan`` with a user combine element by element in
# Python, and every tile operation of the KU-fold rank loop as one numpy call: minutes per
# test case.  Under it the KU columns of a block are taken at once instead, as a
# [BT, KU, BV] tile, with the decayed sum as the product of the [BT, BT] relative-decay
# matrix γ^(i−j) with it: the same sums, a few numpy calls.  That body would spill on
# the GPU (KU tiles where the scan holds one), so compiled code never takes it; the
# scan body is checked under the interpreter by forcing this flag off.
_INTERPRETED = tl.constexpr(is_interpreting())


@triton.jit
def _linear_recurrence(a1, x1, a2, x2):
    """Combine of h_t = a_t h_{t−1} + x_t: the step (a1, x1) followed by the step (a2, x2)."""
    return a1 * a2, tl.fma(a2, x1, x2)


@triton.jit
def _rank_columns_scan(acc, b_ct, b_bt, b_v, p_carry, k0, step, m_v, o_j, R, D,
                       HAS_DECAY: tl.constexpr, KU: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """acc + Σ_{j<KU} b[:, k0+j] ⊙ h_{k0+j} on one block, one rank column at a time (compiled path).

    b_ct, b_bt: [KU, BT] float32 blocks of c and b (k-major); b_v: [BT, BV] float32.
    Reads and rewrites the carries of columns k0 .. k0+KU−1.
    """
    o_r = tl.arange(0, BT)
    # constant per register once the rows sit inside each thread: the selections fold away
    m_first = (o_r == 0)[:, None]
    m_last = (o_r == BT - 1)[:, None]
    if HAS_DECAY:
        b_step = tl.full([BT, BV], 1.0, tl.float32) * step
    for j in tl.static_range(KU):
        # column k0 + j of c and b (indexing a tile with a scalar does not compile)
        b_c = tl.sum(tl.where(o_j[:, None] == j, b_ct, 0.0), axis=0)
        b_b = tl.sum(tl.where(o_j[:, None] == j, b_bt, 0.0), axis=0)
        m_carry = m_v & (tl.full([BV], k0 + j, tl.int32) < R)
        b_carry = tl.load(p_carry + (k0 + j) * D, mask=m_carry, other=0.0)
        b_x = b_c[:, None] * b_v
        if HAS_DECAY:
            b_x = tl.where(m_first, b_x + b_carry[None, :] * step, b_x)
            _, b_h = tl.associative_scan((b_step, b_x), 0, _linear_recurrence)
        else:
            b_h = tl.cumsum(tl.where(m_first, b_x + b_carry[None, :], b_x), 0)
        acc += b_b[:, None] * b_h
        # h on the block's last row: a block cut short by the sequence end is the last
        # one, whose carry nobody reads
        tl.store(p_carry + (k0 + j) * D, tl.sum(tl.where(m_last, b_h, 0.0), 0), mask=m_carry)
    return acc


@triton.jit
def _rank_columns_product(acc, b_ct, b_bt, b_v, p_carry, k0, lam, m_v, o_j, R, D,
                          HAS_DECAY: tl.constexpr, KU: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """The same as :func:`_rank_columns_scan`, all KU columns at once (interpreter path)."""
    o_r = tl.arange(0, BT)
    m_kv = (k0 + o_j < R)[None, :, None] & m_v[None, None, :]
    p_rows = p_carry[None, None, :] + (k0 + o_j)[None, :, None] * D
    b_carry = tl.load(p_rows, mask=m_kv, other=0.0)                          # [1, KU, BV]
    b_x = tl.trans(b_ct)[:, :, None] * b_v[:, None, :]                      # [BT, KU, BV]
    m_first = (o_r == 0)[:, None, None]
    if HAS_DECAY:
        b_x = tl.where(m_first, b_x + b_carry * tl.exp2(lam), b_x)
        # rows x (columns, values) as one 2-D operand keeps numpy on its fast matmul
        b_h = tl.dot(causal_decay(lam, o_r, o_r, HAS_DECAY), tl.reshape(b_x, (BT, KU * BV)),
                     input_precision="ieee")                                 # [BT, BT] @ [BT, KU·BV]
        b_h = tl.reshape(b_h, (BT, KU, BV))
    else:
        b_h = tl.cumsum(tl.where(m_first, b_x + b_carry, b_x), 0)
    acc += tl.sum(tl.trans(b_bt)[:, :, None] * b_h, axis=1)
    tl.store(p_rows, tl.sum(tl.where((o_r == BT - 1)[:, None, None], b_h, 0.0), 0, keep_dims=True), mask=m_kv)
    return acc


@autotune(spaces.FWD, key=_KEY, restore_value=["ws_ptr"])
@triton.jit(do_not_specialize=["N", "SEG", "NS", "stride_vd", "stride_od"])
def _fleet_attention_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, lam_ptr, s0_ptr, st_ptr,
    stride_bb, stride_bh, stride_bn, stride_bk, stride_cb, stride_ch, stride_cn, stride_ck,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_s0b, stride_s0h, stride_s0k, stride_s0d, stride_stb, stride_sth, stride_stk, stride_std,
    H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS,
    KU: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = (i_bh // H).to(tl.int64)  # 64-bit: batch·heads·n·d may exceed 2^31 elements
    i_h = (i_bh % H).to(tl.int64)
    b_ptr += i_b * stride_bb + i_h * stride_bh
    c_ptr += i_b * stride_cb + i_h * stride_ch
    v_ptr += i_b * stride_vb + i_h * stride_vh
    o_ptr += i_b * stride_ob + i_h * stride_oh
    lam = head_log2_gamma(lam_ptr, i_h, HAS_DECAY)
    step = tl.exp2(lam)  # γ: the decay of one row

    o_r = tl.arange(0, BT)
    o_j = tl.arange(0, KU)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    # row k of this program's carry (its [R, BV] slice of the state) is p_carry + k * D
    p_carry = ws_ptr + (i_bh * NS + i_s).to(tl.int64) * R * D + o_v

    # addresses from the segment's first row on (64-bit base, 32-bit offsets inside the segment)
    t_start = i_s * SEG
    seg_rows = tl.minimum(SEG, N - t_start)
    b_ptr += t_start.to(tl.int64) * stride_bn
    c_ptr += t_start.to(tl.int64) * stride_cn
    v_ptr += t_start.to(tl.int64) * stride_vn
    o_ptr += t_start.to(tl.int64) * stride_on
    for t0 in range(0, seg_rows, BT):
        o_t = t0 + o_r
        m_t = o_t < seg_rows
        m_tv = m_t[:, None] & m_v[None, :]
        b_v = tl.load(v_ptr + o_t[:, None] * stride_vn + o_v[None, :] * stride_vd, mask=m_tv, other=0.0)
        b_v = b_v.to(tl.float32)
        acc = tl.zeros([BT, BV], dtype=tl.float32)
        for k0 in range(0, R, KU):
            o_k = k0 + o_j
            m_kt = (o_k < R)[:, None] & m_t[None, :]
            # [KU, BT] blocks, k-major: one lane holds all KU values of its row
            b_ct = tl.load(c_ptr + o_k[:, None] * stride_ck + o_t[None, :] * stride_cn, mask=m_kt, other=0.0)
            b_bt = tl.load(b_ptr + o_k[:, None] * stride_bk + o_t[None, :] * stride_bn, mask=m_kt, other=0.0)
            b_ct = b_ct.to(tl.float32)
            b_bt = b_bt.to(tl.float32)
            if _INTERPRETED:
                acc = _rank_columns_product(acc, b_ct, b_bt, b_v, p_carry, k0, lam, m_v, o_j, R, D,
                                            HAS_DECAY, KU, BT, BV)
            else:
                acc = _rank_columns_scan(acc, b_ct, b_bt, b_v, p_carry, k0, step, m_v, o_j, R, D,
                                         HAS_DECAY, KU, BT, BV)
        tl.store(o_ptr + o_t[:, None] * stride_on + o_v[None, :] * stride_od, acc.to(o_ptr.dtype.element_ty),
                 mask=m_tv)
        # the next block reads carries other threads may have written
        tl.debug_barrier()


def fleet_attention_fwd(p: Problem, config: Optional[Mapping] = None) -> None:
    """Launch the fleet_attention kernels for ``p`` (``config``: per-kernel configs, or None to autotune)."""
    B, H, n, r, d = p.shape
    config = config or {}
    fwd_config = config.get(spaces.FWD.name)
    seg_len = spaces.segment_length(B * H, n, d, current_family(p.v.device), fwd_config)
    ns = cdiv(n, seg_len)
    if ns > 1 or p.state is not None:
        # start state of every segment (the carries to begin from), and the final state
        ws = segment_start_states(p, seg_len, config)
    elif p.initial_state is not None:
        ws = p.initial_state.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    else:
        ws = torch.zeros((B, H, r, d), dtype=torch.float32, device=p.v.device)
    args = problem_args(p)
    grid = lambda meta: (cdiv(d, meta["BV"]), ns, B * H)  # noqa: E731
    launch(_fleet_attention_fwd_kernel, grid, fwd_config, **args, ws_ptr=ws, SEG=seg_len, NS=ns,
           KU=min(_KU, next_power_of_2(r)))
