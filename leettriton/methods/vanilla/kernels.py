"""vanilla: the tiled quadratic form O = (B Cᵀ ⊙ M) V, never materialised in memory.

Each program owns one [BT, BV] output tile and walks the key tiles j ≤ i up to
the diagonal: scores = B_i C_jᵀ (over r in BK slices), times the decay mask
built from relative positions, then O += scores V_j, all accumulated in fp32.
The initial state adds γ^(i+1) B_i S₀; the final state comes from the shared
segment-state kernel over the whole sequence (the quadratic form has no state).
Cost O(n² (r + d)): it wins only for very short sequences.

With a per-token decay (``PER_TOKEN_DECAY``, docs/design.md §1.6, §3.1) the tile's keys decay by sums of
nearby decays (kernels/token_decay.py): the diagonal tile by its own prefix sums, the earlier key tiles,
walked from the diagonal backwards, by the sums of the tiles between; the final state comes from the
per-token segment-state kernel.  Without the flag none of this is compiled.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from ...problem import Problem
from ..spec import Plan
from ...autotune import autotune
from ...autotune.configs import CompiledLaunches
from . import space as spaces
from ...autotune.sizing import cdiv
from ...kernels.abi import (any_nonfinite, batch_head, decay, head_log2_gamma, head_ptr, head_ptrs, load_tile,
                            masked_product, mma, problem_args, store_tile)
from ...kernels.segments import final_state
from ...kernels.walk import launch_with_redo, redo_by_pdl
from ...kernels.token_decay import (decay_args, log2_decays, pair_exponents, poison, prefix_sums, scalar_zero,
                                    tile_tail, token_final_state, token_masked_product)

_KEY = ["R", "D", "HAS_DECAY", "HAS_INITIAL", "DOT_PRECISION", "PER_TOKEN_DECAY"]


@triton.jit
def _vanilla_tile(p_b, p_c, p_v, s0_ptr, s0_strides, b_strides, c_strides, v_strides, i_b, i_h, i_t, o_i, o_v, lam,
                  N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  CAUSAL: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The float32 [BT, BV] output tile of rows ``o_i``, value columns ``o_v`` (``CAUSAL``: as
    :func:`masked_product`'s)."""
    o_k = tl.arange(0, BK)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    # key tiles strictly below the diagonal tile and the diagonal tile itself
    for j0 in range(0, (i_t + 1) * BT, BT):
        o_j = j0 + tl.arange(0, BT)
        acc = masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_j, o_v, lam, N, R, D,
                             HAS_DECAY, DOT_PRECISION, BK, CAUSAL)

    if HAS_INITIAL:
        # γ^(i+1) b_i S₀: the initial state as seen by row i
        p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
        row_decay = decay(lam, o_i + 1, HAS_DECAY)
        for k0 in range(0, R, BK):
            b_bi = load_tile(p_b, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R).to(tl.float32)
            b_s = load_tile(p_s0, k0 + o_k, o_v, s0_strides[2], s0_strides[3], R, D)
            acc += mma(b_bi * row_decay[:, None], b_s, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
    return acc


@triton.jit
def _vanilla_token_tile(p_b, p_c, p_v, p_a, a_stride, b_g, b_gl, s0_ptr, s0_strides, b_strides, c_strides, v_strides,
                        i_b, i_h, i_t, o_i, o_v, N, R, D, HAS_INITIAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        CAUSAL: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """:func:`_vanilla_tile` with a per-token decay (docs/design.md §1.6); ``b_g`` + ``b_gl``: G_i, the tile's
    prefix sums of a · log2 e up to each row, in two parts (kernels/token_decay.py, ``prefix_sums``).

    The diagonal tile decays key j by G_i − G_j; then the key tiles from the diagonal backwards, key j of
    tile J by G_i + (the sums of the tiles between J and this one) + tail_j: every exponent a sum of nearby
    terms, ≤ 0.  The initial state reaches row i decayed by G_i + the sums of every earlier tile."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    acc = token_masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_i, o_v,
                               pair_exponents(b_g, b_gl, b_g, b_gl), N, R, D, DOT_PRECISION, BK, CAUSAL)
    between = scalar_zero()  # Σ a · log2 e over the tiles between key tile J and this one
    o_r = tl.arange(0, BT)
    for m in range(0, i_t):
        o_j = (i_t - 1 - m) * BT + o_r
        b_a = log2_decays(p_a, a_stride, o_j, N)
        b_tail = tile_tail(p_a, a_stride, o_j, N, BT) + poison(b_a)
        acc = token_masked_product(acc, p_b, p_c, p_v, b_strides, c_strides, v_strides, o_i, o_j, o_v,
                                   (b_g + between)[:, None] + b_tail[None, :], N, R, D, DOT_PRECISION, BK, CAUSAL)
        between += tl.sum(b_a, axis=0)

    if HAS_INITIAL:
        # exp(a_0 + … + a_i) b_i S₀
        o_k = tl.arange(0, BK)
        p_s0 = head_ptr(s0_ptr, s0_strides, i_b, i_h)
        row_decay = tl.exp2(b_g + between)
        for k0 in range(0, R, BK):
            b_bi = load_tile(p_b, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R).to(tl.float32)
            b_s = load_tile(p_s0, k0 + o_k, o_v, s0_strides[2], s0_strides[3], R, D)
            acc += mma(b_bi * row_decay[:, None], b_s, DOT_PRECISION)  # [BT, BK] @ [BK, BV]
    return acc


@triton.jit
def _output_tile(p_b, p_c, p_v, a_ptr, a_strides, s0_ptr, s0_strides, b_strides, c_strides, v_strides, i_b, i_h, i_t,
                 o_i, o_v, lam, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr,
                 PER_TOKEN_DECAY: tl.constexpr, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr):
    """The float32 output tile of rows ``o_i``, value columns ``o_v``: :func:`_vanilla_token_tile` with a per-token
    decay (docs/design.md §1.6; its prefix sums from this head's decays), else :func:`_vanilla_tile`."""
    if PER_TOKEN_DECAY:
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h)
        b_g, b_gl = prefix_sums(log2_decays(p_a, a_strides[2], o_i, N))
        return _vanilla_token_tile(p_b, p_c, p_v, p_a, a_strides[2], b_g, b_gl, s0_ptr, s0_strides, b_strides,
                                   c_strides, v_strides, i_b, i_h, i_t, o_i, o_v, N, R, D, HAS_INITIAL, DOT_PRECISION,
                                   CAUSAL, BT, BK, BV)
    else:
        return _vanilla_tile(p_b, p_c, p_v, s0_ptr, s0_strides, b_strides, c_strides, v_strides, i_b, i_h, i_t, o_i,
                             o_v, lam, N, R, D, HAS_DECAY, HAS_INITIAL, DOT_PRECISION, CAUSAL, BT, BK, BV)


@autotune(spaces.FWD, key=_KEY)
@triton.jit(do_not_specialize=["N"])
def _vanilla_fwd_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr, b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides,
    H, N, R, D, HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    a_ptr, a_strides, flag_ptr, PER_TOKEN_DECAY: tl.constexpr, REDO: tl.constexpr, PDL: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # batch·heads·row tiles on the grid's first axis (the others are limited to 65535);
    # 64-bit batch and head offsets
    nt = tl.cdiv(N, BT)
    i_bh = tl.program_id(0) // nt
    i_t = tl.program_id(0) % nt
    i_v = tl.program_id(1)
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    p_flag = flag_ptr + tl.program_id(0) * tl.num_programs(1) + i_v

    o_i = i_t * BT + tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    # the first launch stores the tile and whether it holds a non-finite entry; the redo (REDO, the same grid
    # and config) computes a flagged tile again in the causal form, so that a non-finite value reaches later
    # rows only (docs/nonfinite.md).  The causal form is a launch of its own, not a branch or a call of the
    # first: either kept its registers live in the fast form's (docs/numerics.md, "Why the redo is a second
    # launch")
    if REDO:
        if PDL:
            tl.extra.cuda.gdc_wait()
        if tl.load(p_flag) != 0:
            acc = _output_tile(p_b, p_c, p_v, a_ptr, a_strides, s0_ptr, s0_strides, b_strides, c_strides, v_strides,
                               i_b, i_h, i_t, o_i, o_v, lam, N, R, D, HAS_DECAY, HAS_INITIAL, PER_TOKEN_DECAY,
                               DOT_PRECISION, True, BT, BK, BV)
            store_tile(p_o, acc, o_i, o_v, o_strides[2], o_strides[3], N, D)
    else:
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        acc = _output_tile(p_b, p_c, p_v, a_ptr, a_strides, s0_ptr, s0_strides, b_strides, c_strides, v_strides,
                           i_b, i_h, i_t, o_i, o_v, lam, N, R, D, HAS_DECAY, HAS_INITIAL, PER_TOKEN_DECAY,
                           DOT_PRECISION, False, BT, BK, BV)
        tl.store(p_flag, any_nonfinite(acc).to(tl.int32))
        store_tile(p_o, acc, o_i, o_v, o_strides[2], o_strides[3], N, D)


_vanilla_fwd_kernel.launches = CompiledLaunches(_vanilla_fwd_kernel, ("b_ptr", "c_ptr", "v_ptr", "o_ptr", "gamma_ptr",
                                                                      "s0_ptr", "st_ptr", "flag_ptr", "a_ptr"))
# The kernel's launches, by everything but its tensors (docs/design.md §4.5): a shape, strides, dtypes, flags and
# config seen before goes straight to the compiled kernel, for both launches (walk.launch_with_redo, as the chunk
# walk's); a call of a signature seen before repeats them from the problem's memo.  vanilla is the method of short
# sequences, where the host's time is the call's.


def vanilla_fwd(p: Problem, plan: Plan) -> None:
    """Launch the vanilla kernels for ``p`` with the plan's configs: the output tiles, their redo (the same
    grid and config, a programmatic dependent launch where :func:`redo_by_pdl`), then the final state."""
    B, H, n, r, d = p.shape
    # one flag per program of the first launch, each written before the redo reads it (no fill)
    flags = torch.empty(B * H * cdiv(n, spaces.MIN_BT) * cdiv(d, spaces.MIN_BV), dtype=torch.int32, device=p.v.device)
    decays = decay_args(p)
    mark = (_vanilla_fwd_kernel,)
    if not p.repeat_launch(mark, (flags, decays["a_ptr"])):
        args = problem_args(p)
        args.update(decays, flag_ptr=flags, PDL=redo_by_pdl(p), REDO=False)
        fwd_grid = lambda meta: (B * H * cdiv(n, meta["BT"]), cdiv(d, meta["BV"]))  # noqa: E731
        p.keep_launch(mark, launch_with_redo(_vanilla_fwd_kernel, fwd_grid, plan.config(spaces.FWD), B, args))
    if p.state is not None:
        if p.log_decay is not None:
            token_final_state(p, plan.configs)
        else:
            final_state(p, plan.configs)
