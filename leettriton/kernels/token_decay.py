"""Tile code for the per-token decay (docs/design.md §1.6) shared by vanilla, recursion and fleet_attention.

With a per-token decay a_t ≤ 0 the decay between key j and row i ≥ j is exp(a_{j+1} + … + a_i).  The
kernels here and the methods that use them form every factor as exp2 of a non-positive sum of nearby
terms, in log2 units (a · log2 e, :func:`log2_decays`), never as a difference of two long prefix sums
(at n = 10^5 with strong decay those reach 10^6 and keep no digit of a nearby difference):

* inside one tile of rows, G_i = the tile's own prefix sum up to row i, and the decay from j to i is
  G_i − G_j, both sums of at most a tile of terms, each kept in two floats (:func:`prefix_sums`) so that
  their difference keeps float32's accuracy (a rounding that makes it positive is taken as 0);
* key j of an earlier tile reaches row i through ``tail_j`` (the sum over the rows after j in its
  tile, :func:`tile_tail`), the tile sums of the tiles between (each a sum of one tile), and G_i;
* states carry from tile to tile (or segment to segment) multiplied by exp2 of the tile's (segment's) sum.

A value a > 0 or NaN is read as NaN (:func:`log2_decays`): every sum that holds it is NaN, and so is every
row it decays (rows ≥ k, through G_k − G_k in its own tile or the sums of the tiles before a later
row), in its batch element and head only; rows before it never see it.

Two kernels give the states of segments of the sequence with a per-token decay, as kernels/segments.py
does for a constant one: ``_token_state_kernel`` every segment's local end state from zero (and the
segment's decay sum), or with one segment the final state itself; ``_token_scan_kernel`` the segments'
start states, start[s+1] = exp2(sum_s) start[s] + local[s], and the final state.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from ..autotune import autotune, launch
from ..autotune.configs import KernelSpace
from ..autotune.sizing import cdiv
from ..problem import Problem
from . import segments_space
from .abi import (batch_head, float16_tile_scale, group_ptr, head_ptr, load_tile, low_part, lower_values_product,
                  mma, problem_args, round_to, store_tile, two_part)

LOG2E = tl.constexpr(1.4426950408889634)

STATE = KernelSpace(name="token_decay.state", axes=segments_space.STATE.axes, cpu=segments_space.STATE.cpu,
                    smem=segments_space.STATE.smem, fits=segments_space.STATE.fits)
"""The per-token segment-state kernel's configs: those of the constant-decay one (kernels/segments_space.py),
whose tiles and loads it shares (plus a tile of decays)."""

SCAN = KernelSpace(name="token_decay.scan", axes=segments_space.SCAN.axes, cpu=segments_space.SCAN.cpu,
                   smem=segments_space.SCAN.smem, fits=segments_space.SCAN.fits)
"""The per-token segment scan's configs: those of the constant-decay scan."""


# --------------------------------------------------------------------------- jit helpers

@triton.jit
def log2_decays(p_a, stride, rows, n_rows):
    """a_t · log2 e of ``rows`` as float32 (0 at rows ≥ ``n_rows``: no decay), NaN where a > 0 or NaN."""
    a = tl.load(p_a + rows * stride, mask=rows < n_rows, other=0.0).to(tl.float32)
    return tl.where(a <= 0.0, a * LOG2E, float("nan"))


@triton.jit
def tile_tail(p_a, stride, rows, n_rows, BT: tl.constexpr):
    """tail_j = Σ_{k > j in the tile} a_k · log2 e for the tile of ``BT`` consecutive ``rows``: a sum of the
    rows after j (read one row on, the tile's last row taking none), never a difference of sums."""
    o_r = tl.arange(0, BT)
    a_next = tl.where(o_r == BT - 1, 0.0, log2_decays(p_a, stride, rows + 1, n_rows))
    return tl.cumsum(a_next, axis=0, reverse=True)


@triton.jit
def _two_sum(h1, l1, h2, l2):
    """(h1 + l1) + (h2 + l2) as an unevaluated sum hi + lo: hi the float32 sum of h1 and h2, lo what its
    rounding dropped (exact: Knuth's two-sum) plus the two low parts."""
    s = h1 + h2
    bp = s - h1
    return s, ((h1 - (s - bp)) + (h2 - bp)) + (l1 + l2)


@triton.jit
def prefix_sums(a):
    """(hi, lo): G_i = Σ_{k ≤ i} a_k over a tile's decays ``a``, as hi + lo (about twice float32's digits).

    A difference G_i − G_j of two float32 prefix sums keeps only ε · |G| of absolute accuracy, which is
    poor where a strong decay came before a weak one inside the tile; with (hi_i − hi_j) + (lo_i − lo_j)
    (:func:`pair_exponents`) the error is about ε · |G_i − G_j| (hi_i − hi_j is exact where the two are
    within a factor 2 of each other, and relatively accurate where they are not).  Row i combines rows
    ≤ i only, so a bad a_k never reaches rows before k."""
    return tl.associative_scan((a, tl.zeros_like(a)), 0, _two_sum)


@triton.jit
def pair_exponents(hi_i, lo_i, hi_j, lo_j):
    """[len(i), len(j)] exponents G_i − G_j of :func:`prefix_sums`' (hi, lo) pairs."""
    return (hi_i[:, None] - hi_j[None, :]) + (lo_i[:, None] - lo_j[None, :])


@triton.jit
def poison(a):
    """0 where the tile's decays ``a`` (from :func:`log2_decays`) hold no NaN, else NaN: added to the
    exponents of keys in that tile that reach later tiles, so that a bad a_k makes every later row NaN
    (its keys j ≥ k do not contain a_k in their sums)."""
    return tl.sum(tl.where(a == a, 0.0, a), axis=0)


@triton.jit
def scalar_zero():
    """A float32 zero scalar (a loop-carried sum's start)."""
    return tl.sum(tl.zeros([2], dtype=tl.float32), axis=0)


@triton.jit
def token_masked_product(acc, b_ptr, c_ptr, v_ptr, b_strides, c_strides, v_strides, o_i, o_j, o_v, e, N, R, D,
                         DOT_PRECISION: tl.constexpr, BK: tl.constexpr, CAUSAL: tl.constexpr):
    """acc + ((b_i c_jᵀ) ⊙ M_ij) v_j with M[i, j] = exp2(e[i, j]) for i ≥ j and 0 above the diagonal
    (selected out, never multiplied by zero): :func:`kernels.abi.masked_product` with the exponents ``e``
    ([len(o_i), len(o_j)], log2 units, ≤ 0 but for a rounding, taken as 0) in place of γ^(i−j).

    ``CAUSAL``: the slow form (docs/nonfinite.md), the product with v by :func:`lower_values_product`."""
    o_k = tl.arange(0, BK)
    scores = tl.zeros([o_i.shape[0], o_j.shape[0]], dtype=tl.float32)
    for k0 in range(0, R, BK):
        b_bi = load_tile(b_ptr, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R)
        b_cj = load_tile(c_ptr, o_j, k0 + o_k, c_strides[2], c_strides[3], N, R)
        scores += mma(b_bi, tl.trans(b_cj), DOT_PRECISION)  # [BT, BK] @ [BK, BJ]
    m = tl.exp2(tl.where(e > 0.0, 0.0, e))  # a NaN exponent stays NaN
    scores = tl.where(o_i[:, None] >= o_j[None, :], scores * m, 0.0)
    b_vj = load_tile(v_ptr, o_j, o_v, v_strides[2], v_strides[3], N, D)
    if b_vj.dtype == tl.float16:
        up, down = float16_tile_scale(scores)  # float16's range (docs/nonfinite.md)
        scores *= up
    else:
        down = 1.0
    if CAUSAL:
        return lower_values_product(acc, round_to(scores, b_vj.dtype), b_vj, o_i, o_j, down, DOT_PRECISION)
    return acc + mma(round_to(scores, b_vj.dtype), b_vj, DOT_PRECISION) * down  # [BT, BJ] @ [BJ, BV]


# --------------------------------------------------------------------------- segment states

@autotune(STATE, key=["R", "D", "HAS_INITIAL", "DOT_PRECISION", "DIRECT", "TWO_PART"])
@triton.jit(do_not_specialize=["N", "SEG", "NS", "NL", "SUMS_BH"])
def _token_state_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    a_ptr, a_strides, ws_ptr, sums_ptr, SUMS_BH, SEG, NS, NL,
    DIRECT: tl.constexpr, TWO_PART: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # batch·heads × the NL ≤ NS segments computed on the grid's first axis; 64-bit batch and head offsets
    i_bhl = tl.program_id(0)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_bh = i_bhl // NL
    i_s = i_bhl % NL
    i_b, i_h = batch_head(i_bh, H)
    p_c = group_ptr(c_ptr, c_strides, i_b, i_h)
    p_v = group_ptr(v_ptr, v_strides, i_b, i_h)
    p_a = head_ptr(a_ptr, a_strides, i_b, i_h)

    t_start = i_s * SEG
    t_end = tl.minimum(t_start + SEG, N)
    o_r = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    total = scalar_zero()
    for t0 in range(t_start, t_end, BT):
        o_t = t0 + o_r
        b_a = log2_decays(p_a, a_strides[2], o_t, t_end)
        tile_sum = tl.sum(b_a, axis=0)
        b_c = load_tile(p_c, o_t, o_k, c_strides[2], c_strides[3], t_end, R)
        b_v = load_tile(p_v, o_t, o_v, v_strides[2], v_strides[3], t_end, D)
        # key j reaches the tile's end decayed by its tail; the decay goes on v, as in the constant-decay
        # kernel (kernels/segments.py), so its rounding is the same for every rank
        b_vd = b_v * tl.exp2(tile_tail(p_a, a_strides[2], o_t, t_end, BT))[:, None]
        b_vdh = round_to(b_vd, b_v.dtype)
        # the state so far decays by the tile's sum (a NaN sum makes it NaN, a zero state too)
        acc = acc * tl.exp2(tile_sum) + mma(tl.trans(b_c), b_vdh, DOT_PRECISION)  # [BK, BT] @ [BT, BV]
        if TWO_PART:
            acc += mma(tl.trans(b_c), low_part(b_vd, b_vdh, b_v.dtype), DOT_PRECISION)
        total += tile_sum

    if DIRECT:
        # one segment: the final state exp(a_0 + … + a_{n−1}) S₀ + the local state
        if HAS_INITIAL:
            p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
            acc += load_tile(p_s0, o_k, o_v, s0_strides[2], s0_strides[3], R, D) * tl.exp2(total)
        p_st = head_ptr(st_ptr, st_strides, i_b, i_h)
        store_tile(p_st, acc, o_k, o_v, st_strides[2], st_strides[3], R, D)
    else:
        p_ws = ws_ptr + (i_bh * NS + i_s).to(tl.int64) * R * D
        store_tile(p_ws, acc, o_k, o_v, D, 1, R, D)
        if (i_k == 0) & (i_v == 0):
            tl.store(sums_ptr + i_bh.to(tl.int64) * SUMS_BH + i_s, total)


# the scan rewrites the workspace in place: the autotuner must restore it between its trial runs
@autotune(SCAN, key=["R", "D", "HAS_INITIAL", "STORE_STATE"], restore_value=["ws_ptr"])
@triton.jit(do_not_specialize=["NS", "NW", "SUMS_BH"])
def _token_scan_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, sums_ptr, SUMS_BH, NS, NW,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # the first NS of the NW entries per batch·head (NS = NW when the final state is wanted)
    i_bh = tl.program_id(0)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b, i_h = batch_head(i_bh, H)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < R) & (o_v[None, :] < D)
    p_ws = ws_ptr + i_bh.to(tl.int64) * NW * R * D + o_k[:, None] * D + o_v[None, :]
    p_sum = sums_ptr + i_bh.to(tl.int64) * SUMS_BH

    if HAS_INITIAL:
        p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
        b_s = load_tile(p_s0, o_k, o_v, s0_strides[2], s0_strides[3], R, D)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    # each start state replaces the local state in place: start[s+1] = exp2(sum_s) start[s] + local[s]
    for i_s in range(0, NS - 1):
        b_local = tl.load(p_ws, mask=m_kv, other=0.0)
        tl.store(p_ws, b_s, mask=m_kv)
        b_s = b_s * tl.exp2(tl.load(p_sum + i_s)) + b_local
        p_ws += R * D
    # the last segment's local state exists (and is read) only when the final state is wanted
    if STORE_STATE:
        b_local = tl.load(p_ws, mask=m_kv, other=0.0)
    tl.store(p_ws, b_s, mask=m_kv)
    if STORE_STATE:
        b_s = b_s * tl.exp2(tl.load(p_sum + NS - 1)) + b_local
        p_st = head_ptr(st_ptr, st_strides, i_b, i_h)
        store_tile(p_st, b_s, o_k, o_v, st_strides[2], st_strides[3], R, D)


# --------------------------------------------------------------------------- launchers

def decay_args(p: Problem) -> dict:
    """The launch arguments of a kernel's per-token decay: ``a_ptr``, ``a_strides`` and the flag
    ``PER_TOKEN_DECAY`` (without one, the output stands in for the pointer: never read, the flag off).

    A reversed problem with a per-token decay is refused: its decays are a row off (the backward reverses
    them itself, docs/design.md §10.6)."""
    a = p.log_decay
    if a is None:
        return dict(a_ptr=p.out, a_strides=(0, 0, 0), PER_TOKEN_DECAY=False)
    if p.reverse:
        raise ValueError("a reversed problem with a per-token decay is not run (the backward reverses the "
                         "decays itself)")
    return dict(a_ptr=a, a_strides=tuple(a.stride()), PER_TOKEN_DECAY=True)


def _state_args(p: Problem) -> dict:
    args = problem_args(p)
    args.update(a_ptr=p.log_decay, a_strides=tuple(p.log_decay.stride()), TWO_PART=two_part(p))
    return args


def token_final_state(p: Problem, configs: Optional[Mapping] = None) -> None:
    """Write the final state exp(a_0 + … + a_{n−1}) S₀ + Σ_j exp(a_{j+1} + … + a_{n−1}) c_jᵀ v_j into
    ``p.state`` (``p`` has a per-token decay)."""
    B, H, n, r, d = p.shape
    grid = lambda meta: (B * H, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
    launch(_token_state_kernel, grid, (configs or {}).get(STATE.name), **_state_args(p),
           ws_ptr=p.state, sums_ptr=p.state, SUMS_BH=0, SEG=n, NS=1, NL=1, DIRECT=True)


def token_local_states(p: Problem, seg_len: int, configs: Optional[Mapping] = None, *, last: bool = True,
                       sums: Optional[torch.Tensor] = None, sums_bh: Optional[int] = None):
    """Local end state (from a zero start) of every segment of ``seg_len`` rows, and each segment's decay sum.

    Returns ``(ws, sums)``: float32 ``(B, H, NS, r, d)`` (contiguous), NS = ceil(n / seg_len), and the sums
    Σ a · log2 e over each segment, entry s of batch·head i at ``sums.view(-1)[i · sums_bh + s]`` (default: a
    new contiguous ``(B, H, NS)``).  With ``last=False`` the last segment's entries are left unwritten (and
    its rows are not read)."""
    B, H, n, r, d = p.shape
    ns = cdiv(n, seg_len)
    nl = ns if last else ns - 1
    ws = torch.empty((B, H, ns, r, d), dtype=torch.float32, device=p.v.device)
    if sums is None:
        sums, sums_bh = torch.empty((B, H, ns), dtype=torch.float32, device=p.v.device), ns
    if nl > 0:
        grid = lambda meta: (B * H * nl, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
        launch(_token_state_kernel, grid, (configs or {}).get(STATE.name), **_state_args(p),
               ws_ptr=ws, sums_ptr=sums, SUMS_BH=sums_bh, SEG=seg_len, NS=ns, NL=nl, DIRECT=False)
    return ws, sums


def token_start_states(p: Problem, seg_len: int, configs: Optional[Mapping] = None) -> torch.Tensor:
    """Start state of every segment of ``seg_len`` rows (entry 0: the initial state, or zero), float32
    ``(B, H, NS, r, d)``, and the final state into ``p.state`` when it is wanted."""
    B, H, n, r, d = p.shape
    ws, sums = token_local_states(p, seg_len, configs, last=p.state is not None)
    ns = ws.shape[2]
    grid = lambda meta: (B * H, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
    launch(_token_scan_kernel, grid, (configs or {}).get(SCAN.name), **problem_args(p),
           ws_ptr=ws, sums_ptr=sums, SUMS_BH=ns, NS=ns, NW=ns)
    return ws
