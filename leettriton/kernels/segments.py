"""Sequence-segment states, shared by every method that splits the sequence.

A sequence cut into segments of L rows can be processed segment-parallel once
each segment's *start* state is known.  Two kernels give those states:

1. ``_segment_state_kernel`` — every segment's local end state, from a zero
   start, in parallel over (batch·head, segment, r-tile, d-tile):
       S_loc[s] = Σ_{j in s} γ^(e_s − 1 − j) c_jᵀ v_j        (e_s = the segment's end)
   The last segment's is needed only for the final state: without one it is
   not computed, and c and v of the last segment are not read.
2. ``_segment_scan_kernel`` — a short sequential scan over the segments per
   (batch·head, tile), in place:
       start[0] = S₀,   start[s+1] = γ^(len_s) start[s] + S_loc[s]
   and the final state start[NS] when the caller wants it.

With one segment the first kernel writes the final state directly
(γ^n S₀ + S_loc), which is how methods without a state of their own (vanilla)
produce it.

With a per-token decay a (``PER_TOKEN_DECAY``, docs/design.md §1.6) γ^(e_s − 1 − j) is exp(a_{j+1} + … +
a_{e_s − 1}): the state pass walks its segment's chunks in order, S ← exp(G_last) S + Σ_j exp(G_last − G_j)
c_jᵀ v_j with G the cumulative sum of a within the chunk (float32, relative to the chunk's start), and writes
beside each local state its segment's decay A_s = Σ_{j in s} a_j · log2 e (the sum of its chunks' sums, in
log2 units: :func:`segment_sums`).  The scan is then start[s+1] = exp2(A_s) start[s] + S_loc[s]: each factor
the decay of one segment, never a difference of long prefix sums.  Every exponent is ≤ 0; a > 0 or NaN is NaN.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from ..problem import Problem
from ..autotune import autotune
from ..autotune.configs import CompiledLaunches
from ..autotune.families import current_family
from . import segments_space as spaces
from ..autotune.sizing import cdiv
from .abi import (batch_head, decay, group_ptr, head_log2_gamma, head_ptr, load_tile, low_part, mma, problem_args, round_to,
                  store_tile, two_part)

_KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "DOT_PRECISION", "DIRECT", "TWO_PART", "WAVE", "PER_TOKEN_DECAY"]

LOG2E = tl.constexpr(1.4426950408889634)
"""log2 e: a natural-log decay a becomes the base-2 exponent a · log2 e."""


@triton.jit
def _chunk_key_decays(a, BT: tl.constexpr):
    """One chunk's decays to its end from its per-token decays ``a`` ([BT] float32, a = 0 past the end):
    exp2(G_last − G_j) per row j, and G_last, with G_j = (a_0 + … + a_j) · log2 e the cumulative sum within the
    chunk (float32).  Exponents ≤ 0 (a rounded difference above zero taken as zero); a > 0 or NaN is NaN from
    its row on."""
    g = tl.cumsum(tl.where(a <= 0.0, a * LOG2E, float("nan")), axis=0)  # [BT]
    g_last = tl.sum(tl.where(tl.arange(0, BT) == BT - 1, g, 0.0), axis=0)
    tail = g_last - g
    return tl.exp2(tl.where(tail > 0.0, 0.0, tail)), g_last


@autotune(spaces.STATE, key=_KEY)
@triton.jit(do_not_specialize=["N", "SEG", "NL", "WAVE"])
def _segment_state_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS, NL, WAVE, a_ptr, a_strides, sum_ptr,
    DIRECT: tl.constexpr, TWO_PART: tl.constexpr, PER_TOKEN_DECAY: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):
    # WAVE: the pass's size class, read by its autotuner only (segments_space.pass_wave)
    # batch·heads × the NL ≤ NS segments computed on the grid's first axis (the others are limited to
    # 65535); 64-bit batch and head offsets (16 × 32 × 100 000 × 128 elements overflow 32 bits)
    i_bhl = tl.program_id(0)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_bh = i_bhl // NL
    i_s = i_bhl % NL
    i_bhs = i_bh * NS + i_s  # the segment's entry in the workspace
    i_b, i_h = batch_head(i_bh, H)
    p_c = group_ptr(c_ptr, c_strides, i_b, i_h)
    p_v = group_ptr(v_ptr, v_strides, i_b, i_h)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)

    t_start = i_s * SEG
    t_end = tl.minimum(t_start + SEG, N)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    if PER_TOKEN_DECAY:
        # the decays come in one chunk ahead (a [BT] load is not one Triton's pipeliner takes)
        p_ld = head_ptr(a_ptr, a_strides, i_b, i_h)
        a_next = tl.load(p_ld + (t_start + tl.arange(0, BT)) * a_strides[2],
                         mask=t_start + tl.arange(0, BT) < t_end, other=0.0).to(tl.float32)
        a_sum = tl.zeros([1], dtype=tl.float32)  # the segment's decay so far, log2 units
    for t0 in range(t_start, t_end, BT):
        o_t = t0 + tl.arange(0, BT)
        b_c = load_tile(p_c, o_t, o_k, c_strides[2], c_strides[3], t_end, R)
        b_v = load_tile(p_v, o_t, o_v, v_strides[2], v_strides[3], t_end, D)
        # γ^(e−1−j) ≤ 1 for rows inside the segment; rows past its end load as zero.  The decay
        # goes on v: rounded to a 16-bit operand, its error is then the same for every rank (row
        # of the state), so a product b·S that cancels over the ranks does not add up r of them.
        # (with TWO_PART, bfloat16: the decayed v in two parts, two products)
        if PER_TOKEN_DECAY:  # the chunks in order: S ← exp(G_last) S + Σ_j exp(G_last − G_j) c_jᵀ v_j
            a_chunk = a_next
            a_next = tl.load(p_ld + (o_t + BT) * a_strides[2], mask=o_t + BT < t_end, other=0.0).to(tl.float32)
            row_decay, g_last = _chunk_key_decays(a_chunk, BT)
            acc = acc * tl.exp2(g_last)
            a_sum += g_last
        else:
            row_decay = decay(lam, tl.maximum(t_end - 1 - o_t, 0), HAS_DECAY)
        b_vd = b_v * row_decay[:, None]
        b_vdh = round_to(b_vd, b_v.dtype)
        acc += mma(tl.trans(b_c), b_vdh, DOT_PRECISION)  # [BK, BT] @ [BT, BV]
        if TWO_PART:
            acc += mma(tl.trans(b_c), low_part(b_vd, b_vdh, b_v.dtype), DOT_PRECISION)  # [BK, BT] @ [BT, BV]

    if DIRECT:
        # one segment: the final state itself
        if HAS_INITIAL:
            p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
            if PER_TOKEN_DECAY:
                g_n = tl.exp2(tl.sum(a_sum, axis=0))
            else:
                g_n = decay(lam, N, HAS_DECAY)
            acc += load_tile(p_s0, o_k, o_v, s0_strides[2], s0_strides[3], R, D) * g_n
        p_st = head_ptr(st_ptr, st_strides, i_b, i_h)
        store_tile(p_st, acc, o_k, o_v, st_strides[2], st_strides[3], R, D)
    else:
        ws_ptr += i_bhs.to(tl.int64) * R * D
        store_tile(ws_ptr, acc, o_k, o_v, D, 1, R, D)
        if PER_TOKEN_DECAY:  # the segment's decay, once per segment (by its first state tile's program)
            if (i_k == 0) & (i_v == 0):
                tl.store(sum_ptr + i_bhs.to(tl.int64), tl.sum(a_sum, axis=0))


# the scan rewrites the workspace in place: the autotuner must restore it between its trial runs
@autotune(spaces.SCAN, key=["R", "D", "HAS_DECAY", "HAS_INITIAL", "STORE_STATE", "PER_TOKEN_DECAY"],
          restore_value=["ws_ptr"])
@triton.jit(do_not_specialize=["N", "SEG", "NS", "NW"])
def _segment_scan_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS, NW, sum_ptr,
    PER_TOKEN_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # the first NS of the NW entries per batch·head (NS = NW when the final state is wanted)
    i_bh = tl.program_id(0)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b, i_h = batch_head(i_bh, H)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < R) & (o_v[None, :] < D)
    p_ws = ws_ptr + i_bh.to(tl.int64) * NW * R * D + o_k[:, None] * D + o_v[None, :]

    if HAS_INITIAL:
        p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
        b_s = load_tile(p_s0, o_k, o_v, s0_strides[2], s0_strides[3], R, D)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    # every segment but the last is SEG rows long; each start state replaces the local state in place.
    # PER_TOKEN_DECAY: each segment's own decay exp2(A_s), from the state pass (NW per batch·head)
    if PER_TOKEN_DECAY:
        p_sum = sum_ptr + i_bh.to(tl.int64) * NW
    else:
        seg_decay = decay(lam, SEG, HAS_DECAY)
    for i_s in range(0, NS - 1):
        b_local = tl.load(p_ws, mask=m_kv, other=0.0)
        tl.store(p_ws, b_s, mask=m_kv)
        if PER_TOKEN_DECAY:
            b_s = b_s * tl.exp2(tl.load(p_sum + i_s)) + b_local
        else:
            b_s = b_s * seg_decay + b_local
        p_ws += R * D
    # the last segment's local state exists (and is read) only when the final state is wanted
    if STORE_STATE:
        b_local = tl.load(p_ws, mask=m_kv, other=0.0)
    tl.store(p_ws, b_s, mask=m_kv)
    if STORE_STATE:
        if PER_TOKEN_DECAY:
            b_s = b_s * tl.exp2(tl.load(p_sum + NS - 1)) + b_local
        else:
            b_s = b_s * decay(lam, N - (NS - 1) * SEG, HAS_DECAY) + b_local
        p_st = head_ptr(st_ptr, st_strides, i_b, i_h)
        store_tile(p_st, b_s, o_k, o_v, st_strides[2], st_strides[3], R, D)


_POINTERS = ("b_ptr", "c_ptr", "v_ptr", "o_ptr", "gamma_ptr", "s0_ptr", "st_ptr", "ws_ptr")
# both kernels launch through their compiled launches (docs/design.md §4.5): a launch seen before (sizes,
# strides, segments, flags, config; the batch size, which the grids read) goes straight to the compiled kernel
_STATE_LAUNCHES = CompiledLaunches(_segment_state_kernel, _POINTERS + ("a_ptr", "sum_ptr"))
_SCAN_LAUNCHES = CompiledLaunches(_segment_scan_kernel, _POINTERS + ("sum_ptr",))


def token_decay_args(p: Problem) -> dict:
    """``a_ptr`` and ``a_strides``, the per-token decay (``p.log_decay``, a (B, H, n) view) as the walk and the
    state pass read it, or an unread stand-in without one.  A reversed problem with a per-token decay is never
    run (its decays are shifted by a row: the backward reverses them itself, docs/design.md §10.6)."""
    if p.log_decay is None:
        return dict(a_ptr=p.out, a_strides=(0, 0, 0))
    if p.reverse:
        raise ValueError("a reversed problem with a per-token decay is not run (the backward reverses the decays "
                         "itself, on reversed copies)")
    return dict(a_ptr=p.log_decay, a_strides=tuple(p.log_decay.stride()))


def _workspace(p: Problem, ns: int) -> torch.Tensor:
    """A float32 ``(B, H, ns, r, d)`` workspace (contiguous); with a per-token decay, followed in the same
    allocation by the ``(B, H, ns)`` segments' decays (:func:`segment_sums`)."""
    B, H, n, r, d = p.shape
    if p.log_decay is None:
        return torch.empty((B, H, ns, r, d), dtype=torch.float32, device=p.v.device)
    states = B * H * ns * r * d
    return torch.empty(states + B * H * ns, dtype=torch.float32, device=p.v.device)[:states].view(B, H, ns, r, d)


def segment_sums(ws: torch.Tensor) -> torch.Tensor:
    """The ``(B, H, ns)`` float32 segments' decays A_s = Σ_{j in s} a_j · log2 e (log2 units) that follow the
    states of a per-token problem's workspace ``ws`` (from :func:`segment_local_states`), a view."""
    B, H, ns = ws.shape[:3]
    return ws.as_strided((B, H, ns), (H * ns, ns, 1), ws.storage_offset() + ws.numel())


def _sums_arg(p: Problem, ws: torch.Tensor) -> torch.Tensor:
    """The kernels' ``sum_ptr``: :func:`segment_sums` of ``ws`` with a per-token decay, else an unread stand-in."""
    return ws if p.log_decay is None else segment_sums(ws)


def _wave(p: Problem, sums: int) -> int:
    """:func:`segments_space.pass_wave` of a state pass of ``sums`` local states of ``p``, on its device's family."""
    B, H, n, r, d = p.shape
    return spaces.pass_wave(sums, r, d, current_family(p.v.device))


def final_state(p: Problem, config: Optional[Mapping] = None) -> None:
    """Write the final state γ^n S₀ + Σ_j γ^(n−1−j) c_jᵀ v_j into ``p.state``."""
    B, H, n, r, d = p.shape
    grid = lambda meta: (B * H, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
    _STATE_LAUNCHES.launch_args(grid, (config or {}).get(spaces.STATE.name),
                                dict(problem_args(p), ws_ptr=p.out, SEG=n, NS=1, NL=1, DIRECT=True,
                                     TWO_PART=two_part(p), WAVE=_wave(p, B * H), sum_ptr=p.out,
                                     PER_TOKEN_DECAY=p.log_decay is not None, **token_decay_args(p)), B)


def segment_local_states(p: Problem, seg_len: int, config: Optional[Mapping] = None, *,
                         last: bool = True, count: Optional[int] = None) -> torch.Tensor:
    """Local end state (from a zero start) of every segment of ``seg_len`` rows.

    Returns a float32 tensor of shape ``(B, H, NS, r, d)`` (contiguous), NS = ceil(n / seg_len).
    With ``last=False`` the last segment's entry is left unwritten (and its rows are not read); with
    ``count``, every entry from ``count`` on (a caller that cut the last of its own, longer segments
    into several of these needs none of them).  With a per-token decay the segments' decays follow the
    states in the same allocation (:func:`segment_sums`), written for the same entries.
    """
    B, H, n, r, d = p.shape
    ns = cdiv(n, seg_len)
    nl = count if count is not None else ns if last else ns - 1
    ws = _workspace(p, ns)
    if nl > 0:
        mark = (_STATE_LAUNCHES, seg_len, nl, two_part(p))
        decays = token_decay_args(p)
        sums = _sums_arg(p, ws)
        if not p.repeat_launch(mark, (ws, decays["a_ptr"], sums)):
            grid = lambda meta: (B * H * nl, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
            p.keep_launch(mark, _STATE_LAUNCHES.launch_args(
                grid, (config or {}).get(spaces.STATE.name),
                dict(problem_args(p), ws_ptr=ws, SEG=seg_len, NS=ns, NL=nl, DIRECT=False, TWO_PART=two_part(p),
                     WAVE=_wave(p, B * H * nl), sum_ptr=sums, PER_TOKEN_DECAY=p.log_decay is not None, **decays), B))
    return ws


def segment_start_states(p: Problem, seg_len: int, config: Optional[Mapping] = None) -> torch.Tensor:
    """Start state of every segment of ``seg_len`` rows, and the final state into ``p.state``.

    Returns a float32 workspace of shape ``(B, H, NS, r, d)`` (contiguous) with
    NS = ceil(n / seg_len); entry s is the state before row s·seg_len
    (entry 0 is the initial state, or zero).
    """
    ws = segment_local_states(p, seg_len, config, last=p.state is not None)
    scan_segment_states(p, ws, seg_len, config)
    return ws


def scan_segment_states(p: Problem, ws: torch.Tensor, seg_len: int, config: Optional[Mapping] = None, *,
                        count: Optional[int] = None) -> None:
    """Turn the segments' local states in ``ws`` (from :func:`segment_local_states` with the same
    ``seg_len``; the last entry is read only when ``p.state`` is wanted) into their start states, in
    place, from ``p.initial_state`` (or zero), and write the final state into ``p.state`` when asked.

    With ``count`` only the first ``count`` entries: the start states of segments 0 … count − 1, from
    the local states of the first count − 1 (every entry is needed for the final state)."""
    B, H, n, r, d = p.shape
    count = ws.shape[2] if count is None else count
    if p.state is not None and count != ws.shape[2]:
        raise ValueError("the final state needs the scan of every segment")
    mark = (_SCAN_LAUNCHES, seg_len, count, ws.shape[2])
    sums = _sums_arg(p, ws)
    if not p.repeat_launch(mark, (ws, sums)):
        scan_grid = lambda meta: (B * H, cdiv(r, meta["BK"]), cdiv(d, meta["BV"]))  # noqa: E731
        p.keep_launch(mark, _SCAN_LAUNCHES.launch_args(
            scan_grid, (config or {}).get(spaces.SCAN.name),
            dict(problem_args(p), ws_ptr=ws, SEG=seg_len, NS=count, NW=ws.shape[2], sum_ptr=sums,
                 PER_TOKEN_DECAY=p.log_decay is not None), B))
