"""decode_step: one generated token, S ← γ S + c_tᵀ v_t, then o_t = b_t S, in place on the state.

The step is memory-bound: the float32 state (r × d per batch element and head)
is read once and written once; b_t, c_t, v_t and o_t are small next to it.
Each program owns a [R, BV] column slice of one head's state and walks it in
[BK, BV] tiles (16-byte accesses along d, where the state is contiguous):
load the tile, update it, store it, and accumulate b_t ⊙ S for o_t, which is
reduced over the keys once at the end.  The decay is γ split in two floats
(``step_decay``): a long generation multiplies the state by γ once per token,
and a rounded γ would drift.  Programs never share state, so the
update is in place with no hazard; one launch, no allocation, no host sync,
so the step can be captured in a CUDA graph.

The autotuner benchmarks configs by running the kernel several times;
``restore_value`` saves the state before each trial and puts it back after,
so tuning applies the update exactly once.  The key holds the batch · heads
bucket (log2), because small batches want narrow tiles (more programs) and
large ones wide tiles.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import torch
import triton
import triton.language as tl

from ..autotune import autotune, is_interpreting, launch
from ..autotune.configs import CompiledLaunches
from . import decode_space as spaces
from ..autotune.sizing import cdiv
from ..problem import expand_heads
from .abi import and_scalar, batch_head, group_strides, head_log2_gamma, head_ptr, head_ptrs, step_decay, strides

@triton.jit
def _token_pass(p_b, p_c, p_v, p_st, b_stride, c_stride, v_stride, st_stride_k, st_stride_v, p_keep, keep_stride_t,
                keep_stride_k, keep_stride_v, first, o_v, R, D, g_hi, g_lo, HAS_DECAY: tl.constexpr,
                KEEP: tl.constexpr, GUARDED: tl.constexpr, live, BK: tl.constexpr, BV: tl.constexpr):
    """One token over a [R, BV] column slice of one state: S ← γ S + c_tᵀ v_t in place, tile by tile;
    returns the [BV] slice of b_t S.  ``GUARDED``: the state is read and written only where ``live``
    (a padding row computes its output from a zero state and touches no memory).  ``KEEP``: the new
    slice is also written at ``p_keep + keep_stride_t`` and, where ``first`` (a [BV] flag: the
    first token), the slice before it at ``p_keep`` (a padding row's kept states are zeros)."""
    m_v = o_v < D
    if GUARDED:
        m_v = and_scalar(m_v, live)
    b_v = tl.load(p_v + o_v * v_stride, mask=o_v < D, other=0.0).to(tl.float32)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for k0 in range(0, R, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < R
        b_b = tl.load(p_b + o_k * b_stride, mask=m_k, other=0.0).to(tl.float32)
        b_c = tl.load(p_c + o_k * c_stride, mask=m_k, other=0.0).to(tl.float32)
        p_s = p_st + o_k[:, None] * st_stride_k + o_v[None, :] * st_stride_v
        m_s = m_k[:, None] & m_v[None, :]
        b_s = tl.load(p_s, mask=m_s, other=0.0)  # [BK, BV]
        if KEEP:
            p_k = p_keep + o_k[:, None] * keep_stride_k + o_v[None, :] * keep_stride_v
            m_keep = m_k[:, None] & (o_v < D)[None, :]
            tl.store(p_k, b_s, mask=m_keep & first[None, :])
        if HAS_DECAY:
            b_s = tl.fma(b_s, g_hi, tl.fma(b_s, g_lo, b_c[:, None] * b_v[None, :]))
        else:
            b_s += b_c[:, None] * b_v[None, :]
        tl.store(p_s, b_s, mask=m_s)
        if KEEP:
            if GUARDED:
                tl.store(p_k + keep_stride_t, tl.where(live, b_s, 0.0), mask=m_keep)
            else:
                tl.store(p_k + keep_stride_t, b_s, mask=m_keep)
        acc += b_b[:, None] * b_s
    return tl.sum(acc, axis=0)  # [BV] = b_t S over the keys


@triton.jit
def _state_row(st_ptr, st_strides, slot_ptr, i_b, i_h, SLOTS, SLOTTED: tl.constexpr):
    """The pointer to batch element ``i_b``'s state of head ``i_h``: row ``i_b`` of the state, or with
    ``SLOTTED`` row ``slot_ptr[i_b]`` of a pool.  Returns (pointer, live, fill): the slot id is read here,
    on the device; a negative id is padding (zero output, no state touched), one past the pool (possible
    only when the host checks were skipped) gives NaN outputs (``fill``) and touches no state either."""
    if SLOTTED:
        slot = tl.load(slot_ptr + i_b).to(tl.int64)
        live = (slot >= 0) & (slot < SLOTS)
        row = tl.where(live, slot, 0)
        fill = tl.where(slot < 0, 0.0, float("nan"))
    else:
        live = True
        row = i_b
        fill = 0.0
    return head_ptr(st_ptr, st_strides, row, i_h), live, fill


_KEY = ["R", "D", "BH_BUCKET", "HAS_DECAY", "SLOTTED"]


@autotune(spaces.STEP, key=_KEY, restore_value=["st_ptr"])
@triton.jit(do_not_specialize=["BH_BUCKET", "SLOTS"])
def _decode_step_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, st_ptr, slot_ptr,
    b_strides, c_strides, v_strides, o_strides, st_strides, H, R, D, SLOTS, BH_BUCKET,
    HAS_DECAY: tl.constexpr, SLOTTED: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # value tiles of one head are neighbours in launch order (they read the same b_t, c_t)
    i_v, i_bh = tl.program_id(0) % tl.cdiv(D, BV), tl.program_id(0) // tl.cdiv(D, BV)
    # b_t, c_t, v_t, o_t: (batch, head, column) strides; the state (row, head, key, value), its row the
    # batch element's slot (SLOTTED) or the batch element itself
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    p_st, live, fill = _state_row(st_ptr, st_strides, slot_ptr, i_b, i_h, SLOTS, SLOTTED)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    # γ in two parts: decoding many tokens multiplies by γ as often as a recurrence does
    g_hi, g_lo = step_decay(lam)

    o_v = i_v * BV + tl.arange(0, BV)
    b_o = _token_pass(p_b, p_c, p_v, p_st, b_strides[2], c_strides[2], v_strides[2], st_strides[2], st_strides[3],
                      p_st, 0, 0, 0, False, o_v, R, D, g_hi, g_lo, HAS_DECAY, False, SLOTTED, live, BK, BV)
    if SLOTTED:
        b_o = tl.where(live, b_o, fill)
    tl.store(p_o + o_v * o_strides[2], b_o.to(o_ptr.dtype.element_ty), mask=o_v < D)


_TOKENS_KEY = ["R", "D", "BH_BUCKET", "HAS_DECAY", "SLOTTED", "KEEP", "PER_TOKEN_DECAY"]


@autotune(spaces.TOKENS, key=_TOKENS_KEY, restore_value=["st_ptr"])
@triton.jit(do_not_specialize=["BH_BUCKET", "K", "SLOTS"])
def _decode_tokens_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, st_ptr, slot_ptr, keep_ptr,
    b_strides, c_strides, v_strides, o_strides, st_strides, keep_strides, H, R, D, K, SLOTS, BH_BUCKET,
    HAS_DECAY: tl.constexpr, SLOTTED: tl.constexpr, KEEP: tl.constexpr,
    a_ptr, a_strides, PER_TOKEN_DECAY: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # b, c, v, o: (batch, head, token, column) strides; the state (row, head, key, value), its row the
    # batch element's slot (SLOTTED) or the batch element itself; kept states (batch, head, token + 1, key, value)
    i_v, i_bh = tl.program_id(0) % tl.cdiv(D, BV), tl.program_id(0) // tl.cdiv(D, BV)
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    p_st, live, fill = _state_row(st_ptr, st_strides, slot_ptr, i_b, i_h, SLOTS, SLOTTED)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    g_hi, g_lo = step_decay(lam)
    o_v = i_v * BV + tl.arange(0, BV)
    p_keep = keep_ptr + i_b * keep_strides[0] + i_h * keep_strides[1]
    if PER_TOKEN_DECAY:  # token t's decay a_t of this row and head (docs/design.md §1.6)
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h)
    for t in range(0, K):
        if PER_TOKEN_DECAY:  # exp(a_t) = exp2(a_t · log2 e) ≤ 1; a_t > 0 or NaN gives NaN
            a_t = tl.load(p_a + t * a_strides[2]).to(tl.float32)
            g_hi = tl.where(a_t <= 0.0, tl.exp2(a_t * 1.4426950408889634), float("nan"))
            g_lo = 0.0
        b_o = _token_pass(p_b + t * b_strides[2], p_c + t * c_strides[2], p_v + t * v_strides[2], p_st,
                          b_strides[3], c_strides[3], v_strides[3], st_strides[2], st_strides[3],
                          p_keep + t * keep_strides[2], keep_strides[2], keep_strides[3], keep_strides[4], (o_v * 0 + t) == 0,
                          o_v, R, D, g_hi, g_lo,
                          HAS_DECAY or PER_TOKEN_DECAY, KEEP, SLOTTED, live, BK, BV)
        if SLOTTED:
            b_o = tl.where(live, b_o, fill)
        tl.store(p_o + t * o_strides[2] + o_v * o_strides[3], b_o.to(o_ptr.dtype.element_ty), mask=o_v < D)
        # the next token reads the state slice this one wrote: every thread of the program must see
        # every other thread's stores (the state stays in global memory between tokens)
        tl.debug_barrier()


_POINTERS = ("b_ptr", "c_ptr", "v_ptr", "o_ptr", "gamma_ptr", "st_ptr")
_LAUNCHES = CompiledLaunches(_decode_step_kernel, _POINTERS + ("slot_ptr",))
"""decode_step's launches by shape, strides and dtypes, slotted or not: one token is launched straight
through the compiled kernel (its host time is the hot loop of generation)."""


def _decode_step_torch(b_t, c_t, v_t, state, gamma, out) -> None:
    """The same step in PyTorch, for CPU tensors outside the interpreter (float64 inside, one rounding); grouped
    heads expanded to the state's (docs/design.md §1.7)."""
    H = state.shape[1]
    b_t, c_t, v_t = (expand_heads(x, H) for x in (b_t, c_t, v_t))
    new = c_t.double().unsqueeze(-1) * v_t.double().unsqueeze(-2)
    if gamma is not None:
        new += gamma.double().view(1, -1, 1, 1) * state
    else:
        new += state
    state.copy_(new)
    out.copy_((b_t.double().unsqueeze(-2) @ new).squeeze(-2))


class _TorchStep:
    """The repeatable step of CPU tensors outside the interpreter: the PyTorch step, called as a Launch is."""

    def __init__(self, has_decay: bool, slotted: bool) -> None:
        self.has_decay, self.slotted = has_decay, slotted

    def __call__(self, tensors) -> bool:
        b_t, c_t, v_t, out, gamma, state, slot_ids = tensors
        _torch_step(b_t, c_t, v_t, state, gamma if self.has_decay else None, out, slot_ids if self.slotted else None)
        return True


def _torch_step(b_t, c_t, v_t, state, gamma, out, slot_ids) -> None:
    if slot_ids is None:
        _decode_step_torch(b_t, c_t, v_t, state, gamma, out)
    else:  # the k-token step's PyTorch form on a token axis of one (the same addresses)
        _decode_tokens_torch(b_t.unsqueeze(2), c_t.unsqueeze(2), v_t.unsqueeze(2), state, gamma, out.unsqueeze(2),
                             slot_ids, None)


def decode_args(b_t, c_t, v_t, state, gamma, out, slot_ids=None) -> dict:
    """The decode kernel's keyword arguments (everything but the config).  The heads are the state's (b_t, c_t,
    v_t may be grouped: docs/design.md §1.7)."""
    B, r = b_t.shape[0], b_t.shape[-1]
    H = state.shape[1]
    return dict(
        b_ptr=b_t, c_ptr=c_t, v_ptr=v_t, o_ptr=out, gamma_ptr=out if gamma is None else gamma,
        st_ptr=state, slot_ptr=state if slot_ids is None else slot_ids,
        b_strides=group_strides(b_t, H), c_strides=group_strides(c_t, H), v_strides=group_strides(v_t, H),
        o_strides=strides(out),
        st_strides=strides(state),
        H=H, R=r, D=v_t.shape[-1], SLOTS=state.shape[0], BH_BUCKET=(B * H).bit_length(),
        HAS_DECAY=gamma is not None, SLOTTED=slot_ids is not None,
    )


def decode_step_impl(b_t: torch.Tensor, c_t: torch.Tensor, v_t: torch.Tensor, state: torch.Tensor,
                     gamma: Optional[torch.Tensor], out: torch.Tensor, slot_ids: Optional[torch.Tensor] = None,
                     config: Optional[Mapping] = None) -> Optional[Callable[[tuple], bool]]:
    """Launch the decode step (inputs validated by :func:`leettriton.decode_step`).

    b_t, c_t: ``(B, H, r)``; v_t: ``(B, H, d)``; state: float32 ``(B, H, r, d)``, or with ``slot_ids``
    (``(B,)`` int32/int64) a pool ``(slots, H, r, d)``, updated in place; gamma: ``(H,)`` contiguous, any
    float dtype, or None; out: ``(B, H, d)``.  ``config`` maps the kernel's space name to a config dict
    (None: autotune).  The slotted step is this kernel with a flag: one kernel, one config space.

    Returns what repeats this launch for tensors of the same shapes, strides, dtypes and device (and
    a γ of the same kind): called with ``(b_t, c_t, v_t, out, gamma or out, state, slot_ids or state)`` it
    launches and returns True, or returns False and launches nothing, when this call must go through
    ``decode_step_impl`` again (docs/design.md §4.5).  None when there is nothing to repeat.
    """
    if state.device.type == "cpu" and not is_interpreting():
        _torch_step(b_t, c_t, v_t, state, gamma, out, slot_ids)
        return _TorchStep(gamma is not None, slot_ids is not None)
    args = decode_args(b_t, c_t, v_t, state, gamma, out, slot_ids)
    d, bh = v_t.shape[-1], v_t.shape[0] * state.shape[1]
    grid = lambda meta: (cdiv(d, meta["BV"]) * bh,)  # noqa: E731
    pinned = (config or {}).get(spaces.STEP.name)
    # every argument but the tensors by value, the tensors by dtype, the config, and the grid's batch·heads
    return _LAUNCHES.launch(_LAUNCHES.key(pinned, args, bh), grid, pinned, args, state.device)


_TOKEN_LAUNCHES = CompiledLaunches(_decode_tokens_kernel, _POINTERS + ("slot_ptr", "keep_ptr", "a_ptr"))
"""The multi-token step's compiled kernels, launched directly as the one-token step's are."""


def _decode_tokens_torch(b, c, v, state, gamma, out, slot_ids, kept, log_decay=None) -> None:
    """The k-token step in PyTorch, for CPU tensors outside the interpreter (float64 inside); ``log_decay``
    ``(B, H, k)``: token t's factor exp(a_t) (NaN for a_t > 0 or NaN), instead of γ."""
    B, _, K, r = b.shape
    H = state.shape[1]
    b, c, v = (expand_heads(x, H) for x in (b, c, v))   # grouped heads (docs/design.md §1.7)
    if slot_ids is None:
        rows, live = torch.arange(B), torch.ones(B, dtype=torch.bool)
    else:
        ids = slot_ids.long()
        live = ids >= 0
        rows = ids.clamp(min=0)
    s = state[rows].double() * live.view(B, 1, 1, 1)  # (B, H, r, d); zero for padding rows
    if kept is not None:
        kept[:, :, 0] = s * live.view(B, 1, 1, 1)
    for t in range(K):
        new = c[:, :, t].double().unsqueeze(-1) * v[:, :, t].double().unsqueeze(-2)
        if log_decay is not None:
            a = log_decay[:, :, t].double()
            f = torch.where(a <= 0, torch.exp(a.clamp(max=0)), torch.full((), float("nan"), dtype=torch.float64))
            s = new + f.view(B, H, 1, 1) * s
        else:
            s = new + (s if gamma is None else gamma.double().view(1, -1, 1, 1) * s)
        out[:, :, t] = torch.where(live.view(B, 1, 1), (b[:, :, t].double().unsqueeze(-2) @ s).squeeze(-2), 0.0)
        if kept is not None:
            kept[:, :, t + 1] = s * live.view(B, 1, 1, 1)
    if bool(live.any()):
        state[rows[live]] = s[live].to(state.dtype)


def decode_tokens_impl(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                       gamma: Optional[torch.Tensor], out: torch.Tensor, slot_ids: Optional[torch.Tensor] = None,
                       kept: Optional[torch.Tensor] = None,
                       config: Optional[Mapping] = None,
                       log_decay: Optional[torch.Tensor] = None) -> Optional[Callable[[tuple], bool]]:
    """Launch the k-token step (inputs validated by the public functions; docs/design.md §13.1).

    b, c: ``(B, H, k, r)``; v: ``(B, H, k, d)``; out: ``(B, H, k, d)``; state: float32, ``(B, H, r, d)``, or
    with ``slot_ids`` (``(B,)`` int32/int64) a pool ``(slots, H, r, d)``; updated in place.  ``kept``:
    float32 ``(B, H, k, r, d)`` that receives the state after each token, or None.
    ``log_decay``: the per-token decay ``(B, H, k)`` (any strides; γ is then None), or None; the kernel's
    ``PER_TOKEN_DECAY`` flag, off for a constant γ, which compiles as without it.
    Returns what repeats the launch, as :func:`decode_step_impl` does; it takes
    ``(b, c, v, out, gamma or out, state, slot_ids or state, kept or state, log_decay or out)``.
    """
    if state.device.type == "cpu" and not is_interpreting():
        _decode_tokens_torch(b, c, v, state, gamma, out, slot_ids, kept, log_decay)
        return _TorchTokens(gamma is not None, slot_ids is not None, kept is not None, log_decay is not None)
    B, _, K, r = b.shape
    H = state.shape[1]   # the output's heads: b, c, v may be grouped (docs/design.md §1.7)
    d = v.shape[-1]
    keep = kept if kept is not None else state  # unused stand-in
    args = dict(
        b_ptr=b, c_ptr=c, v_ptr=v, o_ptr=out, gamma_ptr=out if gamma is None else gamma, st_ptr=state,
        slot_ptr=state if slot_ids is None else slot_ids, keep_ptr=keep,
        b_strides=group_strides(b, H), c_strides=group_strides(c, H), v_strides=group_strides(v, H),
        o_strides=strides(out), st_strides=strides(state), keep_strides=strides(keep) if kept is not None else (0, 0, 0, 0, 0),
        H=H, R=r, D=d, K=K, SLOTS=state.shape[0], BH_BUCKET=(B * H).bit_length(),
        HAS_DECAY=gamma is not None, SLOTTED=slot_ids is not None, KEEP=kept is not None,
        a_ptr=out if log_decay is None else log_decay,
        a_strides=(0, 0, 0) if log_decay is None else tuple(log_decay.stride()), PER_TOKEN_DECAY=log_decay is not None,
    )
    grid = lambda meta: (cdiv(d, meta["BV"]) * B * H,)  # noqa: E731
    pinned = (config or {}).get(spaces.TOKENS.name)
    # every argument but the tensors by value, the tensors by dtype, the config, and the grid's batch·heads
    return _TOKEN_LAUNCHES.launch(_TOKEN_LAUNCHES.key(pinned, args, B * H), grid, pinned, args, state.device)


class _TorchTokens:
    """The repeatable k-token step of CPU tensors outside the interpreter, called as a Launch is."""

    def __init__(self, has_decay: bool, slotted: bool, keep: bool, per_token: bool = False) -> None:
        self.has_decay, self.slotted, self.keep, self.per_token = has_decay, slotted, keep, per_token

    def __call__(self, tensors) -> bool:
        b, c, v, out, gamma, state, slot_ids, kept, log_decay = tensors
        _decode_tokens_torch(b, c, v, state, gamma if self.has_decay else None, out,
                             slot_ids if self.slotted else None, kept if self.keep else None,
                             log_decay if self.per_token else None)
        return True
