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

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from ..autotune import autotune, is_interpreting
from ..autotune.configs import CompiledLaunches
from . import decode_space as spaces
from ..autotune.sizing import cdiv
from .abi import batch_head, head_log2_gamma, head_ptr, head_ptrs, step_decay, strides

_KEY = ["R", "D", "BH_BUCKET", "HAS_DECAY"]


@autotune(spaces.STEP, key=_KEY, restore_value=["st_ptr"])
@triton.jit(do_not_specialize=["BH_BUCKET"])
def _decode_step_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, st_ptr,
    b_strides, c_strides, v_strides, o_strides, st_strides, H, R, D, BH_BUCKET,
    HAS_DECAY: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # value tiles of one head are neighbours in launch order (they read the same b_t, c_t)
    i_v, i_bh = tl.program_id(0) % tl.cdiv(D, BV), tl.program_id(0) // tl.cdiv(D, BV)
    # b_t, c_t, v_t, o_t: (batch, head, column) strides; the state (batch, head, key, value)
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    p_st = head_ptr(st_ptr, st_strides, i_b, i_h)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    # γ in two parts: decoding many tokens multiplies by γ as often as a recurrence does
    g_hi, g_lo = step_decay(lam)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    b_v = tl.load(p_v + o_v * v_strides[2], mask=m_v, other=0.0).to(tl.float32)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for k0 in range(0, R, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < R
        b_b = tl.load(p_b + o_k * b_strides[2], mask=m_k, other=0.0).to(tl.float32)
        b_c = tl.load(p_c + o_k * c_strides[2], mask=m_k, other=0.0).to(tl.float32)
        p_s = p_st + o_k[:, None] * st_strides[2] + o_v[None, :] * st_strides[3]
        m_s = m_k[:, None] & m_v[None, :]
        b_s = tl.load(p_s, mask=m_s, other=0.0)  # [BK, BV]
        if HAS_DECAY:
            b_s = tl.fma(b_s, g_hi, tl.fma(b_s, g_lo, b_c[:, None] * b_v[None, :]))
        else:
            b_s += b_c[:, None] * b_v[None, :]
        tl.store(p_s, b_s, mask=m_s)
        acc += b_b[:, None] * b_s
    b_o = tl.sum(acc, axis=0)  # [BV] = b_t S over the keys
    tl.store(p_o + o_v * o_strides[2], b_o.to(o_ptr.dtype.element_ty), mask=m_v)


_LAUNCHES = CompiledLaunches(_decode_step_kernel)
"""decode_step's compiled kernels by shape, strides and alignment: one token is launched straight
through the compiled kernel (its host time is the hot loop of generation)."""


def _decode_step_torch(b_t, c_t, v_t, state, gamma, out) -> None:
    """The same step in PyTorch, for CPU tensors outside the interpreter (float64 inside, one rounding)."""
    new = c_t.double().unsqueeze(-1) * v_t.double().unsqueeze(-2)
    if gamma is not None:
        new += gamma.double().view(1, -1, 1, 1) * state
    else:
        new += state
    state.copy_(new)
    out.copy_((b_t.double().unsqueeze(-2) @ new).squeeze(-2))


def decode_args(b_t, c_t, v_t, state, gamma, out) -> dict:
    """The decode kernel's keyword arguments (everything but the config)."""
    B, H, r = b_t.shape
    return dict(
        b_ptr=b_t, c_ptr=c_t, v_ptr=v_t, o_ptr=out, gamma_ptr=out if gamma is None else gamma,
        st_ptr=state, b_strides=strides(b_t), c_strides=strides(c_t), v_strides=strides(v_t), o_strides=strides(out),
        st_strides=strides(state),
        H=H, R=r, D=v_t.shape[-1], BH_BUCKET=(B * H).bit_length(),
        HAS_DECAY=gamma is not None,
    )


def decode_step_impl(b_t: torch.Tensor, c_t: torch.Tensor, v_t: torch.Tensor, state: torch.Tensor,
                     gamma: Optional[torch.Tensor], out: torch.Tensor,
                     config: Optional[Mapping] = None) -> None:
    """Launch the decode step (inputs validated by :func:`leettriton.decode_step`).

    b_t, c_t: ``(B, H, r)``; v_t: ``(B, H, d)``; state: float32 ``(B, H, r, d)``,
    updated in place; gamma: ``(H,)`` contiguous, any float dtype, or None; out: ``(B, H, d)``.
    ``config`` maps the kernel's space name to a config dict (None: autotune).
    """
    if state.device.type == "cpu" and not is_interpreting():
        _decode_step_torch(b_t, c_t, v_t, state, gamma, out)
        return
    args = decode_args(b_t, c_t, v_t, state, gamma, out)
    d, bh = v_t.shape[-1], v_t.shape[0] * v_t.shape[1]
    grid = lambda meta: (cdiv(d, meta["BV"]) * bh,)  # noqa: E731
    pinned = (config or {}).get(spaces.STEP.name)
    # everything the compiled kernel and its config depend on: sizes, strides, dtypes, 16-byte alignment
    tensors = (b_t, c_t, v_t, out, args["gamma_ptr"], state)
    key = (bh, args["H"], args["R"], d, args["b_strides"], args["c_strides"], args["v_strides"], args["o_strides"],
           args["st_strides"], v_t.dtype, None if gamma is None else gamma.dtype,
           tuple(x.data_ptr() % 16 == 0 for x in tensors), None if pinned is None else tuple(sorted(pinned.items())))
    _LAUNCHES.launch(key, grid, pinned, args, state.device)
