"""The chunk walk: one fused kernel walking the chunks of a sequence in order (Lightning Attention-2).

Each program owns one batch·head, one [BV]-wide slice of the value columns and
one segment of the sequence (the whole sequence for lightning_attention), and keeps the
[BV, r] slice of the *transposed* state Sᵀ in float32 registers, as r/BK ≤ 4
tiles of [BV, BK] (so r up to 256 fits).  Per chunk of T ≤ BT rows (local
indices i, j), everything transposed so that the value columns are the rows
of every product:

    scoresᵀ = (c bᵀ) ⊙ Mᵀ,   M[i, j] = γ^(i−j) for i ≥ j          (intra-chunk)
    oᵀ      = vᵀ scoresᵀ + (Sᵀ bᵀ) ⊙ γ^(i+1)                       (inter-chunk, through the state)
    Sᵀ      = γ^T Sᵀ + (vᵀ ⊙ γ^(T−1−j)) c

Why transposed: the state is the accumulator of its own update, and with the
value columns as rows it is also the *first* operand of the product with b, which
Hopper's warpgroup MMA (and mma.sync) take from registers for 16-bit types.  The
state then never goes through shared memory (as the second operand it was
written and read back there, 64 KB per 32-row chunk at r = 128, BV = 64, the
largest share of the walk's shared-memory traffic), and with 64-row chunks
every product is a warpgroup MMA.  The loads of the next chunk do not depend on
the state, so Triton prefetches them under the products of the current one.
Every decay is exp2(λ · distance) with distance ≥ 0, every factor in (0, 1];
the mask depends only on i − j, so it is built once per program.  The grid is
flat (value tiles fastest, then segments, then batch·heads): programs that read
the same b and c tiles run side by side and share them through L2.

Precision: 16-bit inputs feed the score and value products directly (the
decayed scores and the decayed v are rounded to the input dtype, as in every
flash-style kernel).  The state stays float32; for its product with b it is
rounded to the input dtype (see :func:`_state_hi`): bfloat16 as it is (8 bits,
as b itself); float16 for r > 64 as it is too, each row's copy checked on the
side, and the programs whose copy left float16's normal range walked again by
a second launch of the grid with every row scaled by a power of two (never past
float16's limit, 11 significant bits, as TF32 keeps); for r ≤ 64 scaled so
throughout (docs/design.md §2.3, :func:`_walk_chunks`'s modes).  The row decay
γ^(i+1) is applied to the product's rows, after it.  With ``TWO_PART`` (the
backward's calls, bfloat16: docs/design.md §10.4) the state before that product
and the decayed v before each state update go in as two bfloat16 parts, hi + lo,
one product each.  float32 inputs run every product at ``DOT_PRECISION``
("ieee" by default, or TF32).

With a per-token decay a (``PER_TOKEN_DECAY``, docs/design.md §1.6) γ's decays become each chunk's own: its
a loaded with its rows (a = 0 past the end), G the cumulative sum of a · log2 e within the chunk (float32,
relative to the chunk's start), the mask exp2(G_i − G_j) for i ≥ j (selected, the one [BT, BT] exp2 per chunk),
the row decay exp2(G_i) and the update Sᵀ = exp2(G_last) Sᵀ + (vᵀ ⊙ exp2(G_last − G_j)) c: O(BT) more work and
one more load per chunk, every exponent ≤ 0.  An a > 0 or NaN makes G NaN from its row on, so that row, the
rows after it and the state are NaN, and the non-finite state sends the program through the causal form, which
keeps the rows before it (docs/nonfinite.md).  Segments start from states whose decays are each segment's sum
of a (kernels/segments.py).

The same jit body serves ``block_based`` (methods/block_based/kernels.py): there the
sequence is cut into segments whose start states come from the shared
segment-state kernels, and one program walks one segment (``SEGMENTED``);
with few segments each program sums its start state from the segments' local
states itself (``PREFIX``), which saves the scan's launch.
Cost O(n T (r + d) + n r d); memory traffic b, c, v read once, o written once.

The walk reads its rows only through the pointers and strides of ``problem_args``, so it runs a reversed
problem (the backward's calls in reversed time: last row first, negated row strides, docs/design.md §10.3)
unchanged, segments and all.

Who walks: lightning_attention (whole sequences, its own instance and space), block_based and the
sequence-parallel path (segments, through block_based's instance), the packed prefill (``launch_varlen_walk``,
packed sequences), and the backward (reversed problems through the methods' launchers).  Every instance is
compiled from the one body by :func:`chunk_walk_kernel`, each with its own config space (kernels/walk_space.py).

The modes (the kernel's constexprs other than its config BT, BK, BV).  The launchers never set them by hand:
:func:`walk_spec` derives all of them from the problem and the launch (one :class:`WalkSpec`), except ``REDO``,
which :func:`redo_args` sets for the second launch.

===============  ====================================================  =============================================
mode             what it does                                          set from (allowed with)
===============  ====================================================  =============================================
HAS_DECAY        decays by γ (λ = log2 γ per head); off: γ = 1          a γ given
HAS_INITIAL      reads a start state (else zero)                       an initial state given (varlen: the pool);
                                                                       always for segments from the workspace
STORE_STATE      writes the final state (the last segment's            a state asked for; never for segments from
                 programs; varlen: each sequence's row or slot)        the workspace (the state pass wrote it)
DOT_PRECISION    the products' input precision ("ieee" or "tf32")      float32: the caller's; 16-bit: "tf32"
SEGMENTED        one program per segment of SEG rows, its start        launch_chunk_walk with a workspace
                 state from the workspace (entry i_s·SUB)              (block_based, sequence parallelism)
PREFIX           each segment's program sums its start state from      the plan's ``prefix`` (SEGMENTED, SUB = 1)
                 the segments' local states (no scan launch)
VARLEN           a packed batch: rows from cu_seqlens, one program     launch_varlen_walk (not with SEGMENTED,
                 per sequence, its state row its own or its slot       PREFIX, TWO_PART, TMA, CUT)
SLOTS            varlen state rows are pool slots (negative: none),    slot ids given (VARLEN only)
                 start state where has_initial_state says so
RP               r rounded up to a power of two ≥ 16: NK = RP / BK     r (NK ≤ 4: r ≤ WALK_MAX_R)
                 register tiles of the state
TWO_PART         bfloat16: the state operand and the decayed v in      the problem's ``two_part`` (the backward's
                 two bfloat16 parts, hi + lo                           bfloat16 calls; not VARLEN)
PIECE            the masked scores' product with v in two parts        a piece of a wider r, 16-bit inputs
ACC              adds the float32 sum of the pieces before this one    a piece of r after the first
                 to each output tile
TMA              reads b, c, v through tensor descriptors              :func:`reads_by_descriptor` (not VARLEN,
                                                                       not a reversed problem)
CUT              zeroes c and v past a segment's end inside a chunk    TMA, and a segment (or the sequence) whose
                                                                       length is no multiple of CHUNK_ROWS_MAX
PER_TOKEN_DECAY  decays by the per-token a (``a_ptr``): each           a log_decay given (γ is then absent); not a
                 chunk's mask, row and key decays from the             reversed problem (the backward reverses the
                 cumulative sum of a within it (_token_decays);        decays on copies).  Allowed with every other
                 PREFIX: the segments' decays (``sum_ptr``)            mode: none is switched off for it
CHECKPOINT       VARLEN: each sequence's state after every CK_EVERY    checkpoint slots given (VARLEN with SLOTS;
                 of its rows to its slot in the (N, NCK) table at      docs/design.md §13.9); allowed with every
                 ``ck_ptr`` (negative: none)                           other mode of VARLEN
PDL              the redo is a programmatic dependent launch           a CUDA device of compute capability 9 or
                                                                       more (:func:`redo_by_pdl`)
REDO             the second launch: walks again the programs the       :func:`redo_args` (every walk's second
                 first flagged (:func:`walk_flags`): float16's         launch)
                 scaled form (1), the causal form (2)
===============  ====================================================  =============================================

Derived in the kernel from these and the dtypes: ``NK``; ``MODE`` of :func:`_walk_chunks` (0: the state
operand rounded as it is, bfloat16 and float32; 1: float16 checked, RP ≥ CHECKED_MIN_R; 2: float16 scaled,
narrower r or ``REDO``); ``CAUSAL`` (the redo's walk of a program whose final state is non-finite or whose
float16 scores left float16's range, docs/nonfinite.md).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

try:  # the context variable in which Triton keeps its allocator (Triton 3.6 to 3.9)
    from triton.runtime._allocation import NullAllocator as _NullAllocator, _allocator as _ALLOCATOR
except ImportError:  # a release that keeps it elsewhere: ours is then set before every walk on CUDA
    _NullAllocator = _ALLOCATOR = None

DESCRIPTORS = hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")
"""Whether this Triton builds tensor descriptors in a kernel (``tl.make_tensor_descriptor``, with the scratch
memory of ``triton.set_allocator``): without them the walk reads through pointers only."""

from ..problem import Problem, VarlenProblem
from ..autotune import KernelSpace, autotune, launch
from ..autotune.configs import CompiledLaunches, chosen_config
from ..autotune.families import current_family, is_interpreting
from . import walk_space as spaces
from ..autotune.sizing import cdiv
from .pieces import in_r_pieces
from .segments import segment_sums, token_decay_args
from .abi import (FP16_MAX, FP16_MIN_NORMAL, any_nonfinite, batch_head, causal_decay, decay, float16_tile_scale,
                  head_log2_gamma, head_ptr, head_ptrs, load_tile, low_part, mma, nonfinite, pow2_at_least_16,
                  problem_args, reversed_rows, round_to, store_tile, strides, two_part)

KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "STORE_STATE", "DOT_PRECISION", "SEGMENTED", "PREFIX", "VARLEN", "SLOTS",
       "TWO_PART", "PIECE", "ACC", "TMA", "CUT", "PER_TOKEN_DECAY", "CHECKPOINT"]

LOG2E = tl.constexpr(1.4426950408889634)
"""log2 e: a natural-log decay a becomes the base-2 exponent a · log2 e."""


@triton.jit
def _start_state(p_s, stride_k, stride_d, o_k, o_v, R, D, LOAD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """One [BV, BK] tile of the transposed state Sᵀ before the walk (zero when there is none to load)."""
    if LOAD:
        return load_tile(p_s, o_v, o_k, stride_d, stride_k, D, R)
    else:
        return tl.zeros([BV, BK], dtype=tl.float32)


@triton.jit
def _store_state(p_s, s, stride_k, stride_d, o_k, o_v, R, D):
    """Write one [BV, BK] tile of Sᵀ back as rows ``o_k``, columns ``o_v`` of the (r, d) state."""
    store_tile(p_s, s, o_v, o_k, stride_d, stride_k, D, R)


@triton.jit
def _load_bc(p_b, p_c, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R):
    """The [BT, BK] tiles of b and c at rows ``o_t`` (< rows) and columns ``o_k`` of r."""
    b_b = load_tile(p_b, o_t, o_k, stride_bn, stride_bk, rows, R)
    b_c = load_tile(p_c, o_t, o_k, stride_cn, stride_ck, rows, R)
    return b_b, b_c


@triton.jit
def _rows_by_descriptor(d, t0, k0, o_t, rows, CUT: tl.constexpr):
    """The tile of descriptor ``d`` at row ``t0`` and column ``k0``; with ``CUT``, its rows from ``rows`` on
    zeroed (the next segment's: see :func:`_chunk_bc`)."""
    x = d.load([t0, k0])
    if CUT:
        x = tl.where(o_t[:, None] < rows, x, 0.0)
    return x


@triton.jit
def _chunk_bc(p_b, p_c, d_b, d_c, t0, k0, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R,
              CUT: tl.constexpr, TMA: tl.constexpr):
    """The [BT, BK] tiles of b and c at the chunk's rows (``rows`` of them present) and columns k0 + ``o_k`` of r:
    through the descriptors ``d_b``, ``d_c`` (row ``t0`` of the head) with ``TMA``, else through the pointers
    (at the chunk's first row).  A descriptor reads the rows past n as zero, but the rows past a segment's end
    are the next segment's: with ``CUT`` (segments that may end inside a chunk) c is zeroed there, as the
    pointer loads zero it.  The masked scores multiply those rows by zero, and zero times a non-finite value
    is NaN: zeroed, an infinity in the next segment cannot reach this one's outputs (v is zeroed alike; b's
    rows past the end reach only outputs that are not stored)."""
    if TMA:
        b_b = d_b.load([t0, k0])
        b_c = _rows_by_descriptor(d_c, t0, k0, o_t, rows, CUT)
    else:
        b_b, b_c = _load_bc(p_b, p_c, o_t, k0 + o_k, stride_bn, stride_bk, stride_cn, stride_ck, rows, R)
    return b_b, b_c


@triton.jit
def _varlen_rows(cu_ptr, i_seq, N):
    """Rows [start, end) of packed sequence ``i_seq``, from cu_seqlens, clamped to [0, N] (offsets the host
    did not check can then cost a wrong answer but never an access outside b, c, v or the output)."""
    t_start = tl.minimum(tl.maximum(tl.load(cu_ptr + i_seq).to(tl.int32), 0), N)
    t_end = tl.minimum(tl.maximum(tl.load(cu_ptr + i_seq + 1).to(tl.int32), t_start), N)
    return t_start, t_end


@triton.jit
def _varlen_state_row(slot_ptr, init_ptr, i_seq, NSLOTS, D, HAS_INITIAL: tl.constexpr, SLOTS: tl.constexpr):
    """Packed sequence ``i_seq``'s state row, and how many value columns of it to read before the walk
    and to write after it (D or 0: a masked load of none reads zero, a masked store of none writes nothing).

    SLOTS: the row is the sequence's slot in the pool; a negative slot (or one past the pool, possible
    only when the host checks were skipped) reads and writes nothing; the start state is read where
    has_initial_state says so.  Otherwise the row is the sequence itself (a returned state per sequence).
    """
    if SLOTS:
        slot = tl.load(slot_ptr + i_seq).to(tl.int64)
        live = (slot >= 0) & (slot < NSLOTS)
        row = tl.where(live, slot, 0)
        d_final = tl.where(live, D, 0)
        if HAS_INITIAL:
            d_start = tl.where(live & (tl.load(init_ptr + i_seq) != 0), D, 0)
        else:
            d_start = 0
    else:
        row = i_seq.to(tl.int64)
        d_start = D
        d_final = D
    return row, d_start, d_final


@triton.jit
def _row_absmax(s):
    return tl.max(tl.abs(s), axis=1)


@triton.jit
def _pow2_scales(m):
    """Powers of two (up, 1/up) that bring a row whose largest |entry| is ``m`` into [2^14, 2^15).

    Read off the exponent bits of ``m``, so no division and no log; clamped to the normal range
    (a zero or tiny row gets the largest factor, which keeps it far below float16's limit).
    """
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of the row maximum
    k = tl.minimum(tl.maximum(268 - e, 1), 253)  # biased exponent of 2^(14 − (e − 127))
    up = (k << 23).to(tl.float32, bitcast=True)
    down = ((254 - k) << 23).to(tl.float32, bitcast=True)
    return up, down


@triton.jit
def _state_hi(s, up, dtype: tl.constexpr, SCALE: tl.constexpr):
    """The 16-bit register operand of one [BV, BK] state tile: Sᵀ rounded to ``dtype`` (b's).

    With ``SCALE`` (float16's scaled mode) each row is first multiplied by its power of two ``up`` from
    :func:`_pow2_scales` (no overflow past 65 504; 11 significant bits for every entry down to 2^-28 of its
    row's largest), undone on the product's rows by the caller.  Without it the state goes in as it is:
    bfloat16 has float32's range (8 significant bits, as in b itself), and float16's checked mode
    (:func:`_float16_row_check`) walks again scaled when a row does not fit.  float32 b: unchanged.
    """
    if SCALE:
        s = s * up[:, None]
    return round_to(s, dtype)


@triton.jit
def _state_times_b(acc, s, s_hi, b, PRECISION: tl.constexpr, TWO_PART: tl.constexpr):
    """acc + Sᵀ bᵀ for one [BV, BK] state tile (``s_hi`` its operand, :func:`_state_hi`) and one [BT, BK] tile
    of b: [BV, BK] @ [BK, BT].  16-bit b: the operand is the register operand of a 16-bit product
    (products exact, sums in float32), so the state is never staged through shared memory; bfloat16 with
    ``TWO_PART`` adds what the rounding dropped as a second product (about 16 bits).  float32 b: one product
    at ``PRECISION``.
    """
    acc += mma(s_hi, tl.trans(b), PRECISION)  # [BV, BK] @ [BK, BT]
    if TWO_PART:
        acc += mma(low_part(s, s_hi, b.dtype), tl.trans(b), PRECISION)  # [BV, BK] @ [BK, BT]
    return acc


_CHECKED_MIN_R = 128
CHECKED_MIN_R = tl.constexpr(_CHECKED_MIN_R)
"""float16 walks with r (rounded up to a power of two) at least this wide are checked, with a redo launch; narrower
ones scale every chunk's operand (one launch): at r = 64 the scaling is cheap and the redo's launch is not
(docs/design.md §2.3)."""

FP16_ROW_FLOOR = tl.constexpr(2.0 ** -8)
"""float16's checked mode rounds a state row as it is only when its largest rounded magnitude is zero or in
[FP16_ROW_FLOOR, 65 504] (docs/design.md §2.3); every other row sends the program's walk round again, scaled."""


@triton.jit
def _float16_row_check(bad, s, s_hi, FROM_COPY: tl.constexpr):
    """``bad`` (one int32 per row of Sᵀ) set where the float16 copy ``s_hi`` of the state tile ``s`` does not
    keep the row to float16's precision: an infinity (past 65 504), or a nonzero largest magnitude below
    FP16_ROW_FLOOR (subnormals, whose spacing is absolute).  ``FROM_COPY``: the maxima of the 16-bit copy
    itself (half as many registers to reduce); otherwise of the float32 state (a row the copy rounds to zero
    counts as nonzero there: stricter).  Either is off the product's path: the product has its operand."""
    if FROM_COPY:
        m = tl.max(tl.abs(s_hi), axis=1).to(tl.float32)
    else:
        m = _row_absmax(s)
    return tl.maximum(bad, ((m > 65504.0) | ((m > 0.0) & (m < FP16_ROW_FLOOR))).to(tl.int32))


@triton.jit
def _add_update(s, g_chunk, b_vd, b_vdt, c, PRECISION: tl.constexpr, TWO_PART: tl.constexpr):
    """γ^T Sᵀ + (vᵀ ⊙ γ^(T−1−j)) c for one [BV, BK] state tile: ``b_vdt`` is the decayed vᵀ rounded to the
    input dtype, ``b_vd`` the same in float32 (with ``TWO_PART`` its low part is a second product)."""
    s = s * g_chunk + mma(b_vdt, c, PRECISION)  # [BV, BT] @ [BT, BK]
    if TWO_PART:
        s += mma(low_part(b_vd, b_vdt, b_vdt.dtype), c, PRECISION)  # [BV, BT] @ [BT, BK]
    return s


@triton.jit
def _values_times_scores(acc, b_vt, b_at, b_att, o_t, CAUSAL: tl.constexpr, PIECE: tl.constexpr,
                         PRECISION: tl.constexpr):
    """``acc`` + vᵀ scoresᵀ for one chunk: [BV, BT] @ [BT, BT], ``b_at`` the masked decayed scoresᵀ (float32,
    entry [j, i]) and ``b_att`` the same rounded to v's dtype; with ``PIECE`` what the rounding dropped as a
    second product.

    ``CAUSAL`` (the walk's slow form, docs/nonfinite.md): zero scores (masked or decayed away) times a
    non-finite v_j would be NaN in rows i < j, so v enters with its non-finite entries set to zero, and each
    value column's rows from its first non-finite entry on are NaN in ``acc`` (the definition gives them ±inf
    or NaN).  Otherwise the same expression as the fast form, operand for operand, so the compiler lowers both
    alike and the rows before a non-finite value are the fast form's bit for bit."""
    if PIECE:
        b_lo = low_part(b_at, b_att, b_vt.dtype)
    if CAUSAL:
        bad = nonfinite(b_vt)
        first = tl.min(tl.where(bad, o_t[None, :], 2147483647), axis=1)  # [BV]: each column's first non-finite row
        acc = tl.where(o_t[None, :] >= first[:, None], float("nan"), acc)
        b_vt = tl.where(bad, 0.0, b_vt).to(b_vt.dtype)
    out = acc + mma(b_vt, b_att, PRECISION)  # [BV, BT] @ [BT, BT]
    if PIECE:
        # a piece of a wider r: its scores are partial sums over its keys, which may cancel between
        # pieces, so what their rounding dropped goes in as a second product (kernels/pieces.py)
        out += mma(b_vt, b_lo, PRECISION)  # [BV, BT] @ [BT, BT]
    return out


@triton.jit
def _state_nonfinite(s0, s1, s2, s3, NK: tl.constexpr):
    """Whether the state tiles s0..s3 (those past NK unused) hold a non-finite entry, as a scalar.

    Every non-finite entry of c or v in a walked row reaches the state (a product with ±inf or NaN is never
    finite, and a non-finite state stays so: its decay is positive or zero), so a walk whose final state is
    finite met none, and its outputs are those of the causal form (docs/nonfinite.md)."""
    bad = any_nonfinite(s0)
    if NK >= 2:
        bad = bad | any_nonfinite(s1)
    if NK >= 4:
        bad = bad | any_nonfinite(s2) | any_nonfinite(s3)
    return bad


@triton.jit
def _walk_start(p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, lam, SEG, o_k, o_v, R, D, d_start, HAS_DECAY: tl.constexpr,
                HAS_INITIAL: tl.constexpr, PREFIX: tl.constexpr, PER_TOKEN_DECAY: tl.constexpr, NK: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr):
    """The state before the walk's first row, as the r tiles s0..s3 of Sᵀ (those past NK unused).

    SEGMENTED: the segments' start states are in the workspace (the launcher sets HAS_INITIAL for them), NW
    entries per batch·head, one per SEG / SUB rows (the state pass cut each segment into SUB pieces), segment
    i_s's at entry i_s·SUB (``p_s``); PREFIX (SUB = 1): their local states are (``p_ws``), and the start state
    is γ^(i_s·SEG) S₀ + Σ_{j < i_s} γ^((i_s−1−j)·SEG) S_loc[j], summed here; otherwise the initial state at
    ``p_s``, or zero.  With ``PER_TOKEN_DECAY`` the PREFIX sum is Horner's, S ← exp(A_j) S + S_loc[j] for
    j < i_s, A_j the sum of a over segment j (``p_sum``, in log2 units, written by the state pass): each factor
    the decay of one segment, never of a difference of long prefix sums.
    """
    s0 = _start_state(p_s, stride_sk, stride_sd, o_k, o_v, R, d_start, HAS_INITIAL, BK, BV)
    s1 = s0
    s2 = s0
    s3 = s0
    if NK >= 2:
        s1 = _start_state(p_s, stride_sk, stride_sd, BK + o_k, o_v, R, d_start, HAS_INITIAL, BK, BV)
    if NK >= 4:
        s2 = _start_state(p_s, stride_sk, stride_sd, 2 * BK + o_k, o_v, R, d_start, HAS_INITIAL, BK, BV)
        s3 = _start_state(p_s, stride_sk, stride_sd, 3 * BK + o_k, o_v, R, d_start, HAS_INITIAL, BK, BV)
    if PREFIX and PER_TOKEN_DECAY:
        for j in range(0, i_s):
            g_j = tl.exp2(tl.load(p_sum + j))  # exp(A_j): A_j ≤ 0 (NaN where a decay was > 0 or NaN)
            s0 = s0 * g_j + _start_state(p_ws, D, 1, o_k, o_v, R, D, True, BK, BV)
            if NK >= 2:
                s1 = s1 * g_j + _start_state(p_ws, D, 1, BK + o_k, o_v, R, D, True, BK, BV)
            if NK >= 4:
                s2 = s2 * g_j + _start_state(p_ws, D, 1, 2 * BK + o_k, o_v, R, D, True, BK, BV)
                s3 = s3 * g_j + _start_state(p_ws, D, 1, 3 * BK + o_k, o_v, R, D, True, BK, BV)
            p_ws += R * D
    if PREFIX and not PER_TOKEN_DECAY:
        g_s = decay(lam, i_s.to(tl.int64) * SEG, HAS_DECAY)
        s0 = s0 * g_s
        if NK >= 2:
            s1 = s1 * g_s
        if NK >= 4:
            s2 = s2 * g_s
            s3 = s3 * g_s
        for j in range(0, i_s):
            g_j = decay(lam, (i_s - 1 - j).to(tl.int64) * SEG, HAS_DECAY)
            s0 += g_j * _start_state(p_ws, D, 1, o_k, o_v, R, D, True, BK, BV)
            if NK >= 2:
                s1 += g_j * _start_state(p_ws, D, 1, BK + o_k, o_v, R, D, True, BK, BV)
            if NK >= 4:
                s2 += g_j * _start_state(p_ws, D, 1, 2 * BK + o_k, o_v, R, D, True, BK, BV)
                s3 += g_j * _start_state(p_ws, D, 1, 3 * BK + o_k, o_v, R, D, True, BK, BV)
            p_ws += R * D
    return s0, s1, s2, s3


@triton.jit
def _load_decays(p_ld, stride_ldn, o_t, rows):
    """The [BT] per-token decays a of a chunk (``p_ld`` at its first row) as float32, a = 0 from row ``rows`` on
    (none present where ``rows`` ≤ 0: nothing is read)."""
    return tl.load(p_ld + o_t * stride_ldn, mask=o_t < rows, other=0.0).to(tl.float32)


@triton.jit
def _token_decays(a, o_t, BT: tl.constexpr):
    """A chunk's decays from its per-token decays ``a`` (:func:`_load_decays`, a = 0 past the end): with
    G_i = (a_0 + … + a_i) · log2 e, the cumulative sum within the chunk (float32, relative to its start),

        m_intra_t[j, i] = exp2(G_i − G_j) for i ≥ j, else 0     (M transposed, as the walk's scores are)
        row_decay[i]    = exp2(G_i)                             (the state before the chunk, seen by row i)
        key_decay[j]    = exp2(G_last − G_j)                    (key j at the chunk's end)
        g_chunk         = exp2(G_last)                          (the state across the chunk)

    Every exponent is a sum of decays, ≤ 0 (a difference that rounding leaves above zero is taken as zero,
    and a masked one is −inf: a factor of exactly 0, never a positive exponent); a > 0 or NaN is NaN, so
    every factor from its row on is NaN and the rows before it keep theirs (docs/design.md §1.6).  O(BT)
    work and one [BT, BT] exp2 per chunk."""
    g = tl.cumsum(tl.where(a <= 0.0, a * LOG2E, float("nan")), axis=0)  # [BT]
    g_last = tl.sum(tl.where(o_t == BT - 1, g, 0.0), axis=0)  # G at the chunk's last row (a = 0 past the end)
    diff = g[None, :] - g[:, None]  # [j, i]: G_i − G_j
    m_intra_t = tl.exp2(tl.where(o_t[None, :] >= o_t[:, None], tl.where(diff > 0.0, 0.0, diff), float("-inf")))
    tail = g_last - g
    key_decay = tl.exp2(tl.where(tail > 0.0, 0.0, tail))
    return m_intra_t, tl.exp2(g), key_decay, tl.exp2(g_last)


@triton.jit
def _store_checkpoint(s0, s1, s2, s3, p_ck, slot_ptr, stride_cks, stride_ckk, stride_ckd, NSLOTS, o_k, o_v, R, D,
                      NK: tl.constexpr, BK: tl.constexpr):
    """The state tiles s0..s3 as a checkpoint, to the pool slot at ``slot_ptr`` (``p_ck``: the pool at this head,
    slots ``stride_cks`` apart) if it lies in [0, NSLOTS): −1 writes nothing, nor does a slot the host did not
    check outside the pool."""
    slot = tl.load(slot_ptr).to(tl.int64)
    if (slot >= 0) & (slot < NSLOTS):
        p = p_ck + slot * stride_cks
        _store_state(p, s0, stride_ckk, stride_ckd, o_k, o_v, R, D)
        if NK >= 2:
            _store_state(p, s1, stride_ckk, stride_ckd, BK + o_k, o_v, R, D)
        if NK >= 4:
            _store_state(p, s2, stride_ckk, stride_ckd, 2 * BK + o_k, o_v, R, D)
            _store_state(p, s3, stride_ckk, stride_ckd, 3 * BK + o_k, o_v, R, D)


@triton.jit
def _walk_chunks(s0, s1, s2, s3, p_b, p_c, p_v, p_o, p_a, p_ld, d_b, d_c, d_v, t_start, t_end, R, D, lam, i_v, o_t,
                 o_k, o_v, stride_bn, stride_bk, stride_cn, stride_ck, stride_vn, stride_vd, stride_on, stride_od,
                 stride_an, stride_ad, stride_ldn, p_ck, ck_row, stride_cks, stride_ckk, stride_ckd, NCK, CK_EVERY,
                 NSLOTS, HAS_DECAY: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 TWO_PART: tl.constexpr, PIECE: tl.constexpr, ACC: tl.constexpr, TMA: tl.constexpr, CUT: tl.constexpr,
                 PER_TOKEN_DECAY: tl.constexpr, CHECKPOINT: tl.constexpr, NK: tl.constexpr, MODE: tl.constexpr,
                 CAUSAL: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Walk rows t_start … t_end − 1 from the state tiles s0..s3, writing their outputs; returns the state
    after them and whether float16's check failed (``bad``, a scalar; always 0 unless MODE is 1).

    ``CAUSAL``: the slow form, causal for any values (docs/nonfinite.md), walked again by a program whose
    first walk ended with a non-finite state (:func:`_state_nonfinite`) or, for float16, met scores out of
    float16's range (``out_of_range``, returned last: the slow form scales such chunks' score tiles); the
    state it carries is the same.

    ``MODE``: 0, the state operand rounded as it is (bfloat16, float32); 1, float16 checked: rounded as it
    is, each row's copy checked (:func:`_float16_row_check`); 2, float16 scaled: each row of the operand
    scaled by its power of two (:func:`_pow2_scales`), undone on the product's rows.  The pointers are at
    the walk's first row (descriptors: row t_start of the head).

    ``PER_TOKEN_DECAY``: the decays are each chunk's own, from its per-token decays (``p_ld``, the row stride
    ``stride_ldn``; :func:`_token_decays`), in place of γ's, which depend on local positions only.

    ``CHECKPOINT`` (a packed sequence's state checkpoints, docs/design.md §13.9): after a chunk's state update,
    where the rows walked so far reach (j + 1)·``CK_EVERY``, the state is stored as checkpoint j to pool slot
    ``ck_row[j]`` (``p_ck``: the pool at this head, slots ``stride_cks`` apart) when j < ``NCK`` and the slot
    is in [0, ``NSLOTS``).  CK_EVERY is a multiple of every BT, so checkpoints fall at chunk ends; one scalar
    counter (the row of the next) finds them, and the slot's load, j's division and the stores sit in a branch
    taken once per CK_EVERY rows (masked stores in every chunk kept their addresses live through the loop,
    whose state tiles then spilled).
    """
    if not PER_TOKEN_DECAY:
        # both depend on local positions only: the same for every chunk.  m_intra_t[j, i] = γ^(i−j), i ≥ j
        m_intra_t = tl.trans(causal_decay(lam, o_t, o_t, HAS_DECAY))
        row_decay = decay(lam, o_t + 1, HAS_DECAY)
    else:
        # each chunk's decays come in one chunk ahead, as the pipelined tiles of b, c and v do (a [BT] load is
        # not one Triton's pipeliner takes): their latency hides behind the chunk before
        a_next = _load_decays(p_ld, stride_ldn, o_t, t_end - t_start)
    # the check's maxima from the 16-bit copy where one tile holds all of r (r = 256 at 8 warps: the cheaper
    # reduction), else from the float32 tiles, which cost less to reduce than two copies (docs/design.md §2.3)
    FROM_COPY: tl.constexpr = NK == 1
    bad = tl.zeros([BV], dtype=tl.int32)
    # float16's score range (docs/nonfinite.md): each key's largest decayed score in each chunk, kept as the
    # largest over chunks and whether it was nonzero and below float16's normal range in some chunk (a tile
    # all below it, or past 65 504, sends the program round again, its tiles scaled where they need it)
    F16: tl.constexpr = p_b.dtype.element_ty == tl.float16
    key_max = tl.zeros([BT], dtype=tl.float32)
    key_low = tl.zeros([BT], dtype=tl.int32)
    if CHECKPOINT:
        ck_at = t_start + CK_EVERY   # the row before which the next checkpoint falls
    for t0 in range(t_start, t_end, BT):
        rows = t_end - t0  # rows of this chunk present (the last may be short; its tail loads as zero)
        if PER_TOKEN_DECAY:
            a_chunk = a_next
            p_ld += BT * stride_ldn
            a_next = _load_decays(p_ld, stride_ldn, o_t, rows - BT)  # the next chunk's
            m_intra_t, row_decay, key_decay, g_chunk = _token_decays(a_chunk, o_t, BT)
        if MODE == 2:
            # one power-of-two scale per state row (value column), from its largest entry
            m = _row_absmax(s0)
            if NK >= 2:
                m = tl.maximum(m, _row_absmax(s1))
            if NK >= 4:
                m = tl.maximum(m, tl.maximum(_row_absmax(s2), _row_absmax(s3)))
            up, down = _pow2_scales(m)
        else:
            up = tl.full([BV], 1.0, tl.float32)
            down = up
        # transposed scores c bᵀ and the state term Sᵀ bᵀ, accumulated over the r tiles
        b0, c0 = _chunk_bc(p_b, p_c, d_b, d_c, t0, 0, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck,
                           rows, R, CUT, TMA)
        b_at = mma(c0, tl.trans(b0), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
        h0 = _state_hi(s0, up, b0.dtype, MODE == 2)
        b_ot = _state_times_b(tl.zeros([BV, BT], dtype=tl.float32), s0, h0, b0, DOT_PRECISION, TWO_PART)
        if MODE == 1:
            bad = _float16_row_check(bad, s0, h0, FROM_COPY)
        if NK >= 2:
            b1, c1 = _chunk_bc(p_b, p_c, d_b, d_c, t0, BK, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck,
                               rows, R, CUT, TMA)
            b_at += mma(c1, tl.trans(b1), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            h1 = _state_hi(s1, up, b1.dtype, MODE == 2)
            b_ot = _state_times_b(b_ot, s1, h1, b1, DOT_PRECISION, TWO_PART)
            if MODE == 1:
                bad = _float16_row_check(bad, s1, h1, FROM_COPY)
        if NK >= 4:
            b2, c2 = _chunk_bc(p_b, p_c, d_b, d_c, t0, 2 * BK, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck,
                               rows, R, CUT, TMA)
            b_at += mma(c2, tl.trans(b2), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            h2 = _state_hi(s2, up, b2.dtype, MODE == 2)
            b_ot = _state_times_b(b_ot, s2, h2, b2, DOT_PRECISION, TWO_PART)
            b3, c3 = _chunk_bc(p_b, p_c, d_b, d_c, t0, 3 * BK, o_t, o_k, stride_bn, stride_bk, stride_cn, stride_ck,
                               rows, R, CUT, TMA)
            b_at += mma(c3, tl.trans(b3), DOT_PRECISION)  # [BT, BK] @ [BK, BT]
            h3 = _state_hi(s3, up, b3.dtype, MODE == 2)
            b_ot = _state_times_b(b_ot, s3, h3, b3, DOT_PRECISION, TWO_PART)
            if MODE == 1:
                bad = _float16_row_check(_float16_row_check(bad, s2, h2, FROM_COPY), s3, h3, FROM_COPY)
        if TMA:
            b_vt = tl.trans(_rows_by_descriptor(d_v, t0, i_v * BV, o_t, rows, CUT))  # [BV, BT]
        else:
            b_vt = tl.trans(load_tile(p_v, o_t, o_v, stride_vn, stride_vd, rows, D))  # [BV, BT]
        if ACC:
            b_acc = load_tile(p_a, o_v, o_t, stride_ad, stride_an, D, rows)  # [BV, BT], float32

        # earlier chunks reach row i through the state, decayed by γ^(i+1) (applied to the product, with
        # the rows' float16 scales undone); this chunk through the masked scores
        if MODE == 2:
            b_ot = b_ot * down[:, None] * row_decay[None, :]
        else:
            b_ot = b_ot * row_decay[None, :]
        if CAUSAL:
            # masked and decayed-away scores selected out: a non-finite c_j reaches rows i ≥ j only
            b_at = tl.where(m_intra_t == 0.0, 0.0, b_at * m_intra_t)   # a NaN decay stays NaN
        else:
            b_at = b_at * m_intra_t
        if F16 and CAUSAL:
            # a tile past float16's range (or all below its normal range) scaled by a power of two, undone
            # on the float32 product; a tile within it as it is.  (A branch on the scale, to take an unscaled
            # tile by the fast form's expression, fails Triton 3.6's software pipelining of the walk's loop.)
            up, down = float16_tile_scale(b_at)
            b_at = b_at * up
            b_ot += _values_times_scores(tl.zeros([BV, BT], dtype=tl.float32), b_vt, b_at, round_to(b_at, b_vt.dtype),
                                         o_t, CAUSAL, PIECE, DOT_PRECISION) * down
        else:
            if F16:
                m_key = tl.max(tl.abs(b_at), axis=1)  # [BT]: each key's largest score in this chunk
                key_max = tl.maximum(key_max, m_key)
                # a key's row of zeros (padding, or no row) is neither low nor seen
                key_low = tl.maximum(key_low, ((m_key > 0.0) & (m_key < FP16_MIN_NORMAL)).to(tl.int32))
            b_att = round_to(b_at, b_vt.dtype)
            b_ot = _values_times_scores(b_ot, b_vt, b_at, b_att, o_t, CAUSAL, PIECE, DOT_PRECISION)
        if ACC:
            b_ot += b_acc
        store_tile(p_o, b_ot, o_v, o_t, stride_od, stride_on, D, rows)

        # Sᵀ ← γ^T Sᵀ + Σ_j γ^(T−1−j) v_jᵀ c_j over the T present rows
        if PER_TOKEN_DECAY:  # Sᵀ ← exp(G_last) Sᵀ + Σ_j exp(G_last − G_j) v_jᵀ c_j
            b_vd = b_vt * key_decay[None, :]
            b_vdt = round_to(b_vd, b_vt.dtype)
        else:
            n_rows = tl.minimum(rows, BT)
            b_vd = b_vt * decay(lam, tl.maximum(n_rows - 1 - o_t, 0), HAS_DECAY)[None, :]
            b_vdt = round_to(b_vd, b_vt.dtype)
            g_chunk = decay(lam, n_rows, HAS_DECAY)
        s0 = _add_update(s0, g_chunk, b_vd, b_vdt, c0, DOT_PRECISION, TWO_PART)
        if NK >= 2:
            s1 = _add_update(s1, g_chunk, b_vd, b_vdt, c1, DOT_PRECISION, TWO_PART)
        if NK >= 4:
            s2 = _add_update(s2, g_chunk, b_vd, b_vdt, c2, DOT_PRECISION, TWO_PART)
            s3 = _add_update(s3, g_chunk, b_vd, b_vdt, c3, DOT_PRECISION, TWO_PART)
        if CHECKPOINT:
            # a whole chunk that ends where the next checkpoint falls: one counter, no division by K but in the branch
            hit = (t0 + BT == ck_at) & (ck_at <= t_end)
            if hit:
                j = (ck_at - t_start) // CK_EVERY - 1
                if j < NCK:
                    _store_checkpoint(s0, s1, s2, s3, p_ck, ck_row + j, stride_cks, stride_ckk, stride_ckd, NSLOTS,
                                      o_k, o_v, R, D, NK, BK)
            ck_at = tl.where(hit, ck_at + CK_EVERY, ck_at)

        p_b += BT * stride_bn
        p_c += BT * stride_cn
        p_v += BT * stride_vn
        p_o += BT * stride_on
        p_a += BT * stride_an
    # out of float16's range: a score past 65 504, or (a necessary condition for a tile all below 2^-14, rows of
    # zeros aside) every key with a nonzero score in some chunk below 2^-14 in some chunk
    if F16:
        top = tl.max(key_max, axis=0)
        low = tl.min(tl.where(key_max > 0.0, key_low, 1), axis=0)
        out_of_range = (top > FP16_MAX) | ((low > 0) & (top > 0.0))
    else:
        out_of_range = False
    return s0, s1, s2, s3, tl.max(bad, axis=0), out_of_range


# The chunk walk's body; ``chunk_walk_kernel`` compiles it, one instance per method.
def _chunk_walk_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS, NW, SUB, cu_ptr, slot_ptr, init_ptr, NSLOTS, acc_ptr, acc_strides, flag_ptr, a_ptr, a_strides,
    sum_ptr, ck_ptr, NCK, CK_EVERY,
    SEGMENTED: tl.constexpr, PREFIX: tl.constexpr, VARLEN: tl.constexpr, SLOTS: tl.constexpr, RP: tl.constexpr,
    TWO_PART: tl.constexpr, PIECE: tl.constexpr, ACC: tl.constexpr, TMA: tl.constexpr, CUT: tl.constexpr,
    PER_TOKEN_DECAY: tl.constexpr, CHECKPOINT: tl.constexpr, REDO: tl.constexpr,
    PDL: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # r is cut into NK tiles of BK (RP = r rounded up to a power of two): the transposed state Sᵀ
    # lives in NK [BV, BK] float32 register tiles s0..s3
    NK: tl.constexpr = (RP + BK - 1) // BK
    tl.static_assert(NK <= 4)
    SCALED: tl.constexpr = b_ptr.dtype.element_ty == tl.float16

    # one flat grid, value tiles fastest: the programs that share b and c run side by side (L2 reuse),
    # and batch·heads·segments may exceed the 65535 limit of the grid's other axes
    pid = tl.program_id(0)
    # float16 (docs/design.md §2.3): the walk rounds the state as it is, as bfloat16's does, checks each row's
    # float16 copy on the side and writes one flag per program; the same grid launched again with REDO walks
    # the flagged programs' rows once more with every row scaled (their outputs written over) and leaves the
    # others at once.  The final state is stored by the walk that holds.  PDL (sm_90): the redo is a
    # programmatic dependent launch, let in as soon as every program of the first walk has started; it waits
    # for that walk to finish, its writes visible, before it reads or writes anything
    if PDL and not REDO:
        tl.extra.cuda.gdc_launch_dependents()
    if REDO:
        if PDL:
            tl.extra.cuda.gdc_wait()
        flag = tl.load(flag_ptr + pid)
        if flag == 0:
            return
    MODE: tl.constexpr = 2 if REDO else ((1 if RP >= CHECKED_MIN_R else 2) if SCALED else 0)
    nv = (D + BV - 1) // BV
    i_v = pid % nv
    i_bhs = pid // nv
    i_s = i_bhs % NS
    i_bh = i_bhs // NS
    i_b, i_h = batch_head(i_bh, H)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    stride_bn, stride_bk = b_strides[2], b_strides[3]
    stride_cn, stride_ck = c_strides[2], c_strides[3]
    stride_vn, stride_vd = v_strides[2], v_strides[3]
    stride_on, stride_od = o_strides[2], o_strides[3]

    if VARLEN:
        # a packed batch (B = 1, N = T tokens): segment i_s is packed sequence i_s, its rows from cu_seqlens,
        # its start and final state in row i_row of the initial and final states (its pool slot, or itself)
        t_start, t_end = _varlen_rows(cu_ptr, i_s, N)
        i_row, d_start, d_final = _varlen_state_row(slot_ptr, init_ptr, i_s, NSLOTS, D, HAS_INITIAL, SLOTS)
    else:
        t_start = i_s * SEG
        t_end = tl.minimum(t_start + SEG, N)
        i_row = i_b
        d_start = D
        d_final = D
    t_start64 = t_start.to(tl.int64)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    if TMA:
        # b, c and v read through tensor descriptors of this head's rows (the copy engine: no address or mask
        # per element; rows past n read as zero).  The launcher gives TMA only for 16-bit rows of unit column
        # stride at 16-byte aligned addresses (:func:`reads_by_descriptor`)
        d_b = tl.make_tensor_descriptor(p_b, shape=[N, R], strides=[stride_bn, 1], block_shape=[BT, BK])
        d_c = tl.make_tensor_descriptor(p_c, shape=[N, R], strides=[stride_cn, 1], block_shape=[BT, BK])
        d_v = tl.make_tensor_descriptor(p_v, shape=[N, D], strides=[stride_vn, 1], block_shape=[BT, BV])
    else:
        d_b, d_c, d_v = p_b, p_c, p_v  # unread
    p_b += t_start64 * stride_bn
    p_c += t_start64 * stride_cn
    p_v += t_start64 * stride_vn
    p_o += t_start64 * stride_on
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    if SEGMENTED and not PREFIX:
        p_s = ws_ptr + (i_bh * NW + i_s * SUB).to(tl.int64) * R * D
        stride_sk = D
        stride_sd = 1
    else:
        p_s = head_ptr(s0_ptr, s0_strides, i_row, i_h)
        stride_sk = s0_strides[2]
        stride_sd = s0_strides[3]
    p_ws = ws_ptr + (i_bh * NW).to(tl.int64) * R * D
    # ACC (a piece of r after the first, kernels/pieces.py): the float32 sum of the pieces before this one,
    # addressed as the output is, is added to each output tile before it is stored
    p_a = head_ptr(acc_ptr, acc_strides, i_b, i_h) + t_start64 * acc_strides[2]
    # PER_TOKEN_DECAY: this head's per-token decays a (a (B, H, N) view: the walk's rows, as b's), and with PREFIX
    # the segments' summed decays (NW per batch·head, from the state pass)
    if PER_TOKEN_DECAY:
        p_ld = head_ptr(a_ptr, a_strides, i_b, i_h) + t_start64 * a_strides[2]
        p_sum = sum_ptr + (i_bh * NW).to(tl.int64)
    else:
        p_ld = a_ptr  # unread
        p_sum = sum_ptr
    # CHECKPOINT (VARLEN with a pool): the pool at this head, and sequence i_s's row of the (N, NCK) slot table
    if CHECKPOINT:
        p_ck = head_ptr(st_ptr, st_strides, 0, i_h)
        ck_row = ck_ptr + i_s.to(tl.int64) * NCK
    else:
        p_ck = st_ptr  # unread
        ck_row = ck_ptr

    p_st = head_ptr(st_ptr, st_strides, i_row, i_h)
    if REDO:
        # a program the first walk flagged (docs/numerics.md, docs/nonfinite.md).  2: its walk met a non-finite
        # value (its final state is non-finite: the value may have reached earlier rows of its chunk through a
        # zero score, 0 · inf) or float16 scores out of float16's range: it walks its rows again in the slow,
        # causal form.  1 (float16's check of its state copy failed): the fast form scaled, then the causal form
        # where that meets a non-finite value or scores out of range.  The slow form lives in this second launch
        # alone: in the first, even as a function of its own, it made ptxas allocate the fast walk's registers
        # around a call and slowed every walk (docs/numerics.md, "Why the redo is a second launch")
        causal = flag == 2
        if SCALED:
            if flag == 1:
                s0, s1, s2, s3, bad, out_of_range = _fast_walk(
                    p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, SEG, d_start, p_b, p_c, p_v, p_o, p_a, p_ld, d_b,
                    d_c, d_v, t_start, t_end, R, D, lam, i_v, o_t, o_k, o_v, stride_bn, stride_bk, stride_cn,
                    stride_ck, stride_vn, stride_vd, stride_on, stride_od, acc_strides[2], acc_strides[3],
                    a_strides[2], p_ck, ck_row, st_strides[0], st_strides[2], st_strides[3], NCK, CK_EVERY, NSLOTS,
                    HAS_DECAY, HAS_INITIAL, PREFIX, DOT_PRECISION, TWO_PART, PIECE, ACC, TMA, CUT, PER_TOKEN_DECAY,
                    CHECKPOINT, NK, MODE, BT, BK, BV)
                causal = _state_nonfinite(s0, s1, s2, s3, NK) | out_of_range
                if not causal:
                    _walk_end(s0, s1, s2, s3, bad, flag_ptr, pid, p_st, st_strides[2], st_strides[3], i_s, NS, o_k,
                              o_v, R, D, d_final, STORE_STATE, VARLEN, False, NK, BK)
        if causal:
            _causal_walk(
                p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, SEG, d_start, p_b, p_c, p_v, p_o, p_a, p_ld, p_b -
                t_start64 * stride_bn, p_c - t_start64 * stride_cn, p_v - t_start64 * stride_vn, t_start, t_end, N,
                R, D, lam, i_v, stride_bn, stride_bk, stride_cn, stride_ck, stride_vn, stride_vd, stride_on,
                stride_od, acc_strides[2], acc_strides[3], a_strides[2], flag_ptr, pid, p_st, st_strides[2],
                st_strides[3], NS, d_final, p_ck, ck_row, st_strides[0], NCK, CK_EVERY, NSLOTS, HAS_DECAY,
                HAS_INITIAL, PREFIX, STORE_STATE, VARLEN, DOT_PRECISION, TWO_PART, PIECE, ACC, TMA, CUT,
                PER_TOKEN_DECAY, CHECKPOINT, NK, MODE, BT, BK, BV)
    else:
        s0, s1, s2, s3, bad, out_of_range = _fast_walk(
            p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, SEG, d_start, p_b, p_c, p_v, p_o, p_a, p_ld, d_b, d_c, d_v,
            t_start, t_end, R, D, lam, i_v, o_t, o_k, o_v, stride_bn, stride_bk, stride_cn, stride_ck, stride_vn,
            stride_vd, stride_on, stride_od, acc_strides[2], acc_strides[3], a_strides[2], p_ck, ck_row,
            st_strides[0], st_strides[2], st_strides[3], NCK, CK_EVERY, NSLOTS, HAS_DECAY, HAS_INITIAL, PREFIX,
            DOT_PRECISION, TWO_PART, PIECE, ACC, TMA, CUT, PER_TOKEN_DECAY, CHECKPOINT, NK, MODE, BT, BK, BV)
        # every program writes its flag: 2 where its final state is non-finite or its float16 scores left
        # float16's range, else float16's check (1: a state copy out of range; bfloat16 and float32: 0)
        flag = tl.where(_state_nonfinite(s0, s1, s2, s3, NK) | out_of_range, 2, bad)
        _walk_end(s0, s1, s2, s3, flag, flag_ptr, pid, p_st, st_strides[2], st_strides[3], i_s, NS, o_k, o_v, R, D,
                  d_final, STORE_STATE, VARLEN, True, NK, BK)


@triton.jit
def _fast_walk(p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, SEG, d_start, p_b, p_c, p_v, p_o, p_a, p_ld, d_b, d_c, d_v,
               t_start, t_end, R, D, lam, i_v, o_t, o_k, o_v, stride_bn, stride_bk, stride_cn, stride_ck, stride_vn,
               stride_vd, stride_on, stride_od, stride_an, stride_ad, stride_ldn, p_ck, ck_row, stride_cks, stride_stk,
               stride_std, NCK, CK_EVERY, NSLOTS, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr,
               PREFIX: tl.constexpr, DOT_PRECISION: tl.constexpr, TWO_PART: tl.constexpr, PIECE: tl.constexpr,
               ACC: tl.constexpr, TMA: tl.constexpr, CUT: tl.constexpr, PER_TOKEN_DECAY: tl.constexpr,
               CHECKPOINT: tl.constexpr, NK: tl.constexpr, MODE: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr):
    """The walk's fast form over the program's rows from its start state: the state after them, float16's
    check and whether float16's scores left its range (:func:`_walk_chunks` with ``CAUSAL`` off)."""
    s0, s1, s2, s3 = _walk_start(p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, lam, SEG, o_k, o_v, R, D, d_start,
                                 HAS_DECAY, HAS_INITIAL, PREFIX, PER_TOKEN_DECAY, NK, BK, BV)
    return _walk_chunks(
        s0, s1, s2, s3, p_b, p_c, p_v, p_o, p_a, p_ld, d_b, d_c, d_v, t_start, t_end, R, D, lam, i_v, o_t, o_k, o_v,
        stride_bn, stride_bk, stride_cn, stride_ck, stride_vn, stride_vd, stride_on, stride_od, stride_an, stride_ad,
        stride_ldn, p_ck, ck_row, stride_cks, stride_stk, stride_std, NCK, CK_EVERY, NSLOTS, HAS_DECAY, DOT_PRECISION,
        TWO_PART, PIECE, ACC, TMA, CUT, PER_TOKEN_DECAY, CHECKPOINT, NK, MODE, False, BT, BK, BV)


@triton.jit
def _walk_end(s0, s1, s2, s3, flag, flag_ptr, pid, p_st, stride_stk, stride_std, i_s, NS, o_k, o_v, R, D, d_final,
              STORE_STATE: tl.constexpr, VARLEN: tl.constexpr, FIRST: tl.constexpr, NK: tl.constexpr,
              BK: tl.constexpr):
    """After a program's walk: the first launch's (``FIRST``) writes the program's flag, and a flagged program
    leaves its final state to the redo; otherwise the final state, from the walk of the last segment (of a
    packed sequence: its only walk, its row and columns up to ``d_final`` given by its slot)."""
    keep = 1
    if FIRST:
        tl.store(flag_ptr + pid, flag)
        keep = (flag == 0).to(tl.int32)
    if STORE_STATE:
        if VARLEN:
            last = 1
            cols = d_final
        else:
            last = (i_s == NS - 1).to(tl.int32)
            cols = D
        if (keep != 0) & (last != 0):
            _store_state(p_st, s0, stride_stk, stride_std, o_k, o_v, R, cols)
            if NK >= 2:
                _store_state(p_st, s1, stride_stk, stride_std, BK + o_k, o_v, R, cols)
            if NK >= 4:
                _store_state(p_st, s2, stride_stk, stride_std, 2 * BK + o_k, o_v, R, cols)
                _store_state(p_st, s3, stride_stk, stride_std, 3 * BK + o_k, o_v, R, cols)


@triton.jit(noinline=True)
def _causal_walk(p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, SEG, d_start, p_b, p_c, p_v, p_o, p_a, p_ld, h_b, h_c, h_v,
                 t_start, t_end, N, R, D, lam, i_v, stride_bn, stride_bk, stride_cn, stride_ck, stride_vn, stride_vd,
                 stride_on, stride_od, stride_an, stride_ad, stride_ldn, flag_ptr, pid, p_st, stride_stk, stride_std,
                 NS, d_final, p_ck, ck_row, stride_cks, NCK, CK_EVERY, NSLOTS, HAS_DECAY: tl.constexpr,
                 HAS_INITIAL: tl.constexpr, PREFIX: tl.constexpr,
                 STORE_STATE: tl.constexpr, VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 TWO_PART: tl.constexpr, PIECE: tl.constexpr, ACC: tl.constexpr, TMA: tl.constexpr, CUT: tl.constexpr,
                 PER_TOKEN_DECAY: tl.constexpr, CHECKPOINT: tl.constexpr, NK: tl.constexpr, MODE: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The walk's slow, causal form (docs/nonfinite.md) over the program's rows again, from its start state,
    its outputs written over, then :func:`_walk_end`: the redo launch's, for a program whose first walk met a
    non-finite value or float16 scores out of range.  Its own function, called (not inlined), so that float16's
    redo, which also holds the scaled fast walk, allocates their registers apart.  Scalars and pointers in,
    nothing out (Triton passes no tensor across a call); ``h_b``, ``h_c``, ``h_v`` the head's rows from 0 (the
    tensor descriptors').  ``CHECKPOINT``: the checkpoints are written again, from the slow form's states."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    if TMA:
        d_b = tl.make_tensor_descriptor(h_b, shape=[N, R], strides=[stride_bn, 1], block_shape=[BT, BK])
        d_c = tl.make_tensor_descriptor(h_c, shape=[N, R], strides=[stride_cn, 1], block_shape=[BT, BK])
        d_v = tl.make_tensor_descriptor(h_v, shape=[N, D], strides=[stride_vn, 1], block_shape=[BT, BV])
    else:
        d_b, d_c, d_v = h_b, h_c, h_v  # unread
    s0, s1, s2, s3 = _walk_start(p_s, stride_sk, stride_sd, p_ws, p_sum, i_s, lam, SEG, o_k, o_v, R, D, d_start,
                                 HAS_DECAY, HAS_INITIAL, PREFIX, PER_TOKEN_DECAY, NK, BK, BV)
    s0, s1, s2, s3, bad, _ = _walk_chunks(
        s0, s1, s2, s3, p_b, p_c, p_v, p_o, p_a, p_ld, d_b, d_c, d_v, t_start, t_end, R, D, lam, i_v, o_t, o_k, o_v,
        stride_bn, stride_bk, stride_cn, stride_ck, stride_vn, stride_vd, stride_on, stride_od, stride_an, stride_ad,
        stride_ldn, p_ck, ck_row, stride_cks, stride_stk, stride_std, NCK, CK_EVERY, NSLOTS, HAS_DECAY, DOT_PRECISION,
        TWO_PART, PIECE, ACC, TMA, CUT, PER_TOKEN_DECAY, CHECKPOINT, NK, MODE, True, BT, BK, BV)
    _walk_end(s0, s1, s2, s3, bad, flag_ptr, pid, p_st, stride_stk, stride_std, i_s, NS, o_k, o_v, R, D, d_final,
              STORE_STATE, VARLEN, False, NK, BK)


def chunk_walk_kernel(space: KernelSpace, compiled: bool = True, **autotune_options):
    """The chunk walk compiled as its own kernel, autotuned over ``space``.

    Each method that launches the walk gets its own instance (its own config
    space, its own tuned choices), from the one body above; with ``compiled`` it launches through its
    ``launches`` (:func:`launch_chunk_walk`).  ``autotune_options``
    go to the autotuner (the packed walk, which updates a state pool in place,
    restores it between trials).
    """
    kernel = autotune(space, key=KEY, **autotune_options)(
        triton.jit(do_not_specialize=["N", "SEG", "NS", "NW", "SUB", "NSLOTS", "NCK", "CK_EVERY"])(_chunk_walk_fwd_kernel))
    if compiled:
        kernel.launches = CompiledLaunches(kernel, WALK_POINTERS)
    return kernel


WALK_POINTERS = ("b_ptr", "c_ptr", "v_ptr", "o_ptr", "gamma_ptr", "s0_ptr", "st_ptr", "ws_ptr", "cu_ptr", "slot_ptr",
                 "init_ptr", "acc_ptr", "flag_ptr", "a_ptr", "sum_ptr", "ck_ptr")
"""The chunk walk's tensor arguments.  Each walk kernel launches through its ``launches``
(:class:`~leettriton.autotune.configs.CompiledLaunches`): a shape, strides, dtypes, flags and config
seen before goes straight to the compiled kernel (docs/design.md §4.5)."""


def launch_with_redo(kernel, grid, config: Optional[Mapping], batch: int, args: dict):
    """Launch ``kernel`` through its compiled launches (``kernel.launches``), then its redo; returns the Launch
    that repeats both (or None).  Its key is every argument but the tensors by value (sizes, strides, segment
    counts, flags), the tensors by dtype, the config, and the batch size the grid reads besides the arguments.

    The redo (``args["flag_ptr"]``, each program's flag written by the first launch): the same grid again with
    ``REDO`` and the config the first launch ran (docs/numerics.md, "The redo"), a programmatic dependent
    launch where ``args["PDL"]`` (:func:`redo_by_pdl`).  Every chunk walk launches so, and vanilla's kernel."""
    first = kernel.launches.launch_args(grid, config, args, batch)
    ran = config if config is not None else chosen_config(kernel)
    again = kernel.launches.launch_args(grid, ran, redo_args(args), batch)
    if first is None or again is None:
        return None
    return lambda tensors: first(tensors) and again(tensors)


def redo_by_pdl(p) -> bool:
    """Whether the redo launch of the walk of ``p`` is a programmatic dependent launch: compiled for a CUDA device of compute capability 9 or more (sm_90's
    ``griddepcontrol``; the interpreter has none).

    The first walk then lets the redo's grid in once each of its programs has started, and each redo
    program waits for the whole walk, its writes visible, before it reads its flag: the redo's launch and the
    scheduling of its programs overlap the walk's last programs instead of following them, which hides most
    of the redo's cost where nothing is flagged (docs/numerics.md)."""
    capability = current_family(p.v.device).capability  # None under the interpreter (the cpu family)
    return capability is not None and capability[0] >= 9


def redo_args(args: dict) -> dict:
    """The redo launch's arguments from the first walk's: ``REDO``, and ``launch_pdl`` (Triton's launch
    option for a programmatic dependent launch) where the walk's ``PDL``."""
    return {**args, "REDO": True, **({"launch_pdl": True} if args["PDL"] else {})}


MIN_BV = 16
"""The narrowest value tile of any walk config: a walk has at most cdiv(d, MIN_BV) programs per segment and
batch·head, so many flags (:func:`walk_flags`)."""


def walk_flags(p, programs_per_row: int) -> torch.Tensor:
    """The walk's per-program flags (int32, one per walk program, each written by the first launch before the
    redo reads it: no fill), for a walk of ``programs_per_row`` programs per batch·head and value tile.  Every
    walk has them and its redo launch: 0, the program is done; 1, float16's check of its state copy failed;
    2, it met a non-finite value or float16 scores out of range (the redo walks it in the causal form)."""
    B, H, n, r, d = p.shape
    return torch.empty(max(1, cdiv(d, MIN_BV) * programs_per_row * B * H), dtype=torch.int32, device=p.v.device)


# the packed walk reads its start states from a pool and writes the final states over them: every
# autotuning trial must start from the same pool
_varlen_walk_kernel = chunk_walk_kernel(spaces.VARLEN, compiled=False, restore_value=["st_ptr"])


@dataclasses.dataclass(frozen=True)
class WalkSpec:
    """The modes of one walk launch: every constexpr of the kernel but its config (BT, BK, BV), as the
    module docstring's table gives them.  Each is a function of the problem and of what the launcher was
    asked for (whole sequence, segments, packed batch; a piece's partial sum): :func:`walk_spec` builds them,
    the one place they are derived.  ``REDO`` is the redo launch's alone (:func:`redo_args`)."""
    HAS_DECAY: bool
    HAS_INITIAL: bool
    STORE_STATE: bool
    DOT_PRECISION: str
    SEGMENTED: bool
    PREFIX: bool
    VARLEN: bool
    SLOTS: bool
    RP: int
    TWO_PART: bool
    PIECE: bool
    ACC: bool
    TMA: bool
    CUT: bool
    PDL: bool
    PER_TOKEN_DECAY: bool = False
    CHECKPOINT: bool = False
    REDO: bool = False

    def constexprs(self) -> dict:
        """The modes as the kernel's keyword arguments."""
        return dict(vars(self))


def walk_spec(p: Problem, *, seg_len: Optional[int] = None, prefix: bool = False,
              partial: Optional[torch.Tensor] = None) -> WalkSpec:
    """The modes of the walk of ``p`` (the module docstring's table): a packed batch where ``p`` is a
    :class:`~leettriton.problem.VarlenProblem`; else the whole sequence (``seg_len`` None), or segments of
    ``seg_len`` rows whose start states are in a workspace or, with ``prefix``, summed by each program from
    the segments' local states.  ``partial``: the sum of the pieces of r before this one (None: none)."""
    shared = problem_args(p)  # the flags every kernel takes: decay, initial and final state, precision
    n, r = p.shape[2], p.shape[3]
    if p.log_decay is not None and p.reverse:
        raise ValueError("the chunk walk takes no reversed problem with a per-token decay (the backward reverses "
                         "the decays itself, on reversed copies: docs/design.md §10.6)")
    varlen = isinstance(p, VarlenProblem)
    segmented = seg_len is not None
    # segments that start from their states in the workspace: the segment-state kernels folded the initial
    # state in there, and wrote the final state
    from_workspace = segmented and not prefix
    tma = not varlen and reads_by_descriptor(p, cdiv(n, seg_len) if segmented else 1)
    return WalkSpec(
        HAS_DECAY=shared["HAS_DECAY"],
        HAS_INITIAL=True if from_workspace else shared["HAS_INITIAL"],
        STORE_STATE=False if from_workspace else shared["STORE_STATE"],
        DOT_PRECISION=shared["DOT_PRECISION"],
        SEGMENTED=segmented,
        PREFIX=prefix,
        VARLEN=varlen,
        SLOTS=varlen and p.slot_ids is not None,
        RP=pow2_at_least_16(r),
        TWO_PART=not varlen and two_part(p),
        PIECE=scores_in_two_parts(p),
        ACC=partial is not None,
        TMA=tma,
        CUT=tma and (seg_len if segmented else n) % CHUNK_ROWS_MAX != 0,
        PDL=redo_by_pdl(p),
        PER_TOKEN_DECAY=p.log_decay is not None,
        CHECKPOINT=varlen and p.checkpoint_slots is not None,
    )


def launch_chunk_walk(kernel, space: KernelSpace, p: Problem, config: Optional[Mapping], *, ws=None,
                      seg_len: Optional[int] = None, prefix: bool = False, sub: int = 1,
                      partial: Optional[torch.Tensor] = None) -> None:
    """Walk the chunks of ``p`` with ``kernel``: the whole sequence, or segments of ``seg_len`` rows.

    ``ws`` (``(B, H, NW, r, d)`` float32) holds the start states of pieces of ``seg_len / sub`` rows
    (from ``segment_start_states`` or the scan), segment s's at entry s·``sub``; or with ``prefix``
    (``sub`` = 1) the segments' local states (from ``segment_local_states``; the last segment's entry
    is not read): each program then sums its own start state and the last segment's programs write
    the final state.  ``partial`` (a piece of r after the first, kernels/pieces.py): the float32
    ``(B, H, n, d)`` sum of the pieces before, added to the output before it is stored.
    """
    if prefix and sub != 1:
        raise ValueError("the walk sums its start states from whole segments' local states only (sub = 1)")
    # a call of a signature walked before: every argument but the tensors is what it was then (the memo's
    # signature fixes the shapes, strides, dtypes and flags, and the key adds the sub-problem's shape, output and
    # states, Problem._variant; ``mark`` what this launcher adds: the segments, and whether a partial sum is added)
    mark = (kernel, seg_len, prefix, sub, ws is None, partial is None)
    flags = walk_flags(p, 1 if ws is None else cdiv(p.shape[2], seg_len))
    if DESCRIPTORS and p.v.is_cuda:
        _scratch_allocator()  # before any launch: a repeat of a launch with tensor descriptors needs one too
    out = p.out
    stand_in = out if ws is None else ws
    decays = token_decay_args(p)
    sums = segment_sums(ws) if prefix and p.log_decay is not None else out  # (else an unread stand-in)
    if p.repeat_launch(mark, (stand_in, stand_in, stand_in, stand_in, out if partial is None else partial,
                              flags, decays["a_ptr"], sums, stand_in)):
        return
    B, H, n, r, d = p.shape
    args = problem_args(p)
    spec = walk_spec(p, seg_len=None if ws is None else seg_len, prefix=prefix, partial=partial)
    if ws is None:
        seg_len, ns = n, 1
        ws = p.out  # unused stand-in
    else:
        ns = cdiv(n, seg_len)
    grid = lambda meta: (cdiv(d, meta["BV"]) * ns * B * H,)  # noqa: E731
    args.update(ws_ptr=ws, SEG=seg_len, NS=ns, NW=ws.shape[2] if spec.SEGMENTED else 1, SUB=sub, cu_ptr=ws,
                slot_ptr=ws, init_ptr=ws, NSLOTS=0, flag_ptr=flags, sum_ptr=sums,
                ck_ptr=ws, NCK=0, CK_EVERY=1,
                **decays, **partial_args(p, args, partial), **spec.constexprs())
    p.keep_launch(mark, launch_with_redo(kernel, grid, (config or {}).get(space.name), B, args))


TMA_MIN_R = 129
"""Narrowest r at which the walk reads b, c and v through tensor descriptors (:func:`reads_by_descriptor`)."""

CHUNK_ROWS_MAX = 128
"""No walk config's chunk (BT) is longer: segments whose length is a multiple of this never end inside a chunk
(block_based's segment rule aligns them so, ``SEGMENT_ALIGN``)."""


TMA_PROGRAM_BV = 128
"""The widest value tile of the walk's configs: :func:`reads_by_descriptor` counts a launch's programs with it
(the fewest that launch can have, whatever the config)."""


def reads_by_descriptor(p: Problem, segments: int = 1) -> bool:
    """Whether the walk of ``p`` in ``segments`` segments reads b, c and v through tensor descriptors (TMA on
    sm_90) instead of pointers.

    Where r > 128, where the copy engine's loads save the walk the registers and instructions that addresses
    and masks per element take; at r ≤ 128 they measured no faster, at r = 64 slower (docs/design.md §3.4).
    And where more than half the multiprocessors get a program (counted with ``TMA_PROGRAM_BV``-wide value
    tiles): a launch of fewer, long walks measured slower with descriptors.
    The rows must allow a descriptor: 16-bit elements, a unit column stride, every other
    stride a multiple of 16 bytes and every head's first row 16-byte aligned, rows forward in memory (not a
    reversed problem's).  On CUDA devices of compute capability 9 or more, and under the interpreter (which
    emulates descriptors, so the CPU suite runs this path); with a Triton that builds them (:data:`DESCRIPTORS`).
    """
    B, H, _, r, d = p.shape
    if not DESCRIPTORS or r < TMA_MIN_R or p.reverse or p.b.dtype not in (torch.float16, torch.bfloat16):
        return False
    family = current_family(p.v.device)
    if not is_interpreting() and (family.capability is None or family.capability[0] < 9):
        return False
    if 2 * B * H * segments * cdiv(d, TMA_PROGRAM_BV) <= family.num_sms:
        return False
    for x in (p.b, p.c, p.v):
        st = x.stride()
        if st[-1] != 1 or st[-2] <= 0 or any(s % 8 for s in st[:-1]) or x.data_ptr() % 16:
            return False
    return True


def _scratch_allocator() -> None:
    """Give Triton a global-memory allocator if none is set: a kernel that builds tensor descriptors on the
    device writes them to scratch memory, which Triton allocates at launch through it.  A caller's own
    allocator is kept.  (Set in the calling thread's context: Triton keeps the allocator in a context
    variable, which a new thread starts without.)"""
    if _ALLOCATOR is not None and not isinstance(_ALLOCATOR.get(), _NullAllocator):
        return
    triton.set_allocator(_torch_scratch)


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Scratch memory for a launch, from PyTorch's caching allocator on the current device and stream
    (its blocks are aligned to 512 bytes, more than a descriptor's 128)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def scores_in_two_parts(p: Problem) -> bool:
    """Whether the walk of ``p`` makes its masked scores' product with v in two parts (``PIECE``): ``p`` is a piece
    of a wider r (:attr:`Problem.r_piece`) with 16-bit inputs.  A piece's scores are partial sums over its keys;
    where the pieces' sums cancel, one rounding of each to the input dtype would err by that dtype's precision
    of the pieces' magnitudes, not of the whole score's.  float32 products take the scores as they are."""
    return p.r_piece and p.v.dtype != torch.float32


def partial_args(p: Problem, args: Mapping, partial: Optional[torch.Tensor]) -> dict:
    """The walk's ``acc_ptr`` and ``acc_strides`` for ``partial`` (or None: the output as an unread stand-in;
    ``ACC``, which says which, is :func:`walk_spec`'s), addressed as the output is: a reversed problem's from
    its last row (docs/design.md §10.3)."""
    if partial is None:
        return dict(acc_ptr=args["o_ptr"], acc_strides=args["o_strides"])
    ptr, st = reversed_rows(partial) if p.reverse else (partial, strides(partial))
    return dict(acc_ptr=ptr, acc_strides=st)


WALK_MAX_R = 256
"""Widest r one walk program holds: its transposed state is at most four [BV, 64] register tiles.
A wider r runs as pieces of r whose outputs are summed (kernels/pieces.py)."""


def launch_varlen_walk(p: VarlenProblem, config: Optional[Mapping] = None) -> None:
    """Walk every packed sequence of ``p`` in one launch: one program per (value tile, sequence, head),
    each reading its rows from cu_seqlens and its start state from its pool slot (docs/design.md §13.2).

    ``config`` maps the space name to a config (None: autotune).  r > 256 runs in pieces of r.
    """
    in_r_pieces(p, WALK_MAX_R, lambda piece, partial: _launch_varlen_walk(piece, config, partial))


def checkpoint_args(p: VarlenProblem) -> dict:
    """The packed walk's checkpoint arguments (docs/design.md §13.9): the ``(N, M)`` slot table (contiguous: the
    problem holds it as the kernel reads it), M and K; without checkpoints cu_seqlens as an unread stand-in."""
    if p.checkpoint_slots is None:
        return dict(ck_ptr=p.cu_seqlens, NCK=0, CK_EVERY=1)
    return dict(ck_ptr=p.checkpoint_slots, NCK=p.checkpoint_slots.shape[1], CK_EVERY=p.checkpoint_every)


def _launch_varlen_walk(p: VarlenProblem, config: Optional[Mapping], partial: Optional[torch.Tensor]) -> None:
    B, H, n, r, d = p.shape
    seqs = p.num_seqs
    args = problem_args(p)
    stand_in = p.cu_seqlens
    grid = lambda meta: (cdiv(d, meta["BV"]) * seqs * H,)  # noqa: E731
    flags = walk_flags(p, seqs)
    args.update(ws_ptr=p.out, SEG=n, NS=seqs, NW=1, SUB=1, cu_ptr=p.cu_seqlens,
                slot_ptr=stand_in if p.slot_ids is None else p.slot_ids,
                init_ptr=stand_in if p.has_initial is None else p.has_initial, NSLOTS=p.pool_slots,
                flag_ptr=flags, sum_ptr=p.out, **token_decay_args(p),
                **checkpoint_args(p),
                **partial_args(p, args, partial), **walk_spec(p, partial=partial).constexprs())
    # through launch() itself: a packed batch's T and sequence count, which the direct launches would key
    # on by value, change from call to call.  Then the redo, with the config the first walk ran
    config = (config or {}).get(spaces.VARLEN.name)
    launch(_varlen_walk_kernel, grid, config, **args)
    launch(_varlen_walk_kernel, grid, config if config is not None else chosen_config(_varlen_walk_kernel),
           **redo_args(args))
