"""Rows scaled by one factor each: v[b, t, h, :] = x[b, t, h, :] · dt[b, t, h], and its backward, one pass each.

Mamba-2's values are v = dt·x (docs/design.md §12.6): x ``(batch, n, heads, P)`` in the layer's dtype (a view
of the convolution's output: a split, then heads unflattened, so its rows are not contiguous), dt
``(batch, n, heads)`` float32.  The PyTorch form ``(x.float() * dt[..., None]).to(x.dtype)`` writes a float32
copy of x and a float32 product before the rounded one, and its backward more float32 tensors of x's size;
here the forward reads x and dt once and writes v once, and the backward reads dv, x and dt once and writes
dx and ddt once (one launch each).

A program takes BN rows (tokens) of one (batch, head), P columns BP at a time with masks (any P), and reads
every tensor through its strides.  The grid's one axis is batch × row blocks × heads, heads fastest: the
programs that run together read neighbouring heads of the same tokens, which lie side by side in memory.
Each product is float32 and rounded once to x's dtype (the PyTorch form's values, bit for bit):

    v = round(x · dt),   dx = round(dv · dt),   ddt = Σ_p dv[·, p] · x[·, p]  (float32, the kernel's order).
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from .. import problem
from ..autotune import KernelSpace, autotune
from ..autotune.configs import CompiledLaunches
from ..autotune.sizing import cdiv, next_power_of_2
from .abi import round_to

__all__ = ["scale_rows", "scale_rows_backward", "FWD", "BWD", "MAX_BP", "column_tile"]

MAX_BP = 128
"""The widest column tile: a wider P is read in slices of this many columns."""


def column_tile(p: int) -> int:
    """BP for rows of ``p`` columns: ``p`` padded to a power of two (at least 16), at most :data:`MAX_BP`."""
    return min(MAX_BP, max(16, next_power_of_2(int(p))))


def _keep(cfg) -> bool:
    # each thread holds 16 to 64 entries of a full [BN, MAX_BP] tile of each tensor it reads: enough loads in
    # flight for a pass bound by memory, few enough registers
    per_thread = cfg["BN"] * MAX_BP // (32 * cfg["num_warps"])
    return 16 <= per_thread <= 64


_AXES = dict(BN=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1])   # a stream: the same list everywhere
_CPU = dict(BN=16, num_warps=4, num_stages=1)   # several row blocks, a partial last one, on small tests

FWD = KernelSpace(name="scale_rows.fwd", axes={"default": _AXES}, cpu=_CPU, smem=lambda cfg, args: 0, keep=_keep)
"""The forward's configs: how many rows a program owns and how many threads share them (registers only)."""

BWD = KernelSpace(name="scale_rows.bwd", axes={"default": _AXES}, cpu=_CPU, smem=lambda cfg, args: 0, keep=_keep)
"""The backward's configs, as the forward's."""


@triton.jit
def _program_rows(H, N, BN: tl.constexpr):
    """(batch, head, the rows o_n, which of them exist) of this program: the grid's axis is batch × row blocks ×
    heads, heads fastest; 64-bit, as offsets of long views pass 2^31."""
    n_blocks = tl.cdiv(N, BN)
    i_p = tl.program_id(0)
    i_h = (i_p % H).to(tl.int64)
    i_r = i_p // H
    i_b = (i_r // n_blocks).to(tl.int64)
    o_n = ((i_r % n_blocks) * BN + tl.arange(0, BN)).to(tl.int64)
    return i_b, i_h, o_n, o_n < N


@autotune(FWD, key=["P"])
@triton.jit(do_not_specialize=["N"])
def _scale_rows_kernel(x_ptr, dt_ptr, v_ptr, x_strides, dt_strides, v_strides, H, N, P, BN: tl.constexpr,
                       BP: tl.constexpr):
    i_b, i_h, o_n, m_n = _program_rows(H, N, BN)
    b_dt = tl.load(dt_ptr + i_b * dt_strides[0] + i_h * dt_strides[2] + o_n * dt_strides[1], mask=m_n,
                   other=0.0).to(tl.float32)                                                         # [BN]
    p_x = x_ptr + i_b * x_strides[0] + i_h * x_strides[2] + o_n[:, None] * x_strides[1]
    p_v = v_ptr + i_b * v_strides[0] + i_h * v_strides[2] + o_n[:, None] * v_strides[1]
    for p0 in range(0, P, BP):
        o_p = p0 + tl.arange(0, BP)
        m = m_n[:, None] & (o_p < P)[None, :]
        b_x = tl.load(p_x + o_p[None, :] * x_strides[3], mask=m, other=0.0)                       # [BN, BP]
        b_v = b_x.to(tl.float32) * b_dt[:, None]
        tl.store(p_v + o_p[None, :] * v_strides[3], round_to(b_v, v_ptr.dtype.element_ty), mask=m)


@autotune(BWD, key=["P", "NEED_DX", "NEED_DDT"])
@triton.jit(do_not_specialize=["N"])
def _scale_rows_backward_kernel(dv_ptr, x_ptr, dt_ptr, dx_ptr, ddt_ptr, dv_strides, x_strides, dt_strides,
                                dx_strides, H, N, P, NEED_DX: tl.constexpr, NEED_DDT: tl.constexpr,
                                BN: tl.constexpr, BP: tl.constexpr):
    i_b, i_h, o_n, m_n = _program_rows(H, N, BN)
    b_dt = tl.zeros([BN], dtype=tl.float32)
    if NEED_DX:
        b_dt = tl.load(dt_ptr + i_b * dt_strides[0] + i_h * dt_strides[2] + o_n * dt_strides[1], mask=m_n,
                       other=0.0).to(tl.float32)
    p_dv = dv_ptr + i_b * dv_strides[0] + i_h * dv_strides[2] + o_n[:, None] * dv_strides[1]
    p_x = x_ptr + i_b * x_strides[0] + i_h * x_strides[2] + o_n[:, None] * x_strides[1]
    p_dx = dx_ptr + i_b * dx_strides[0] + i_h * dx_strides[2] + o_n[:, None] * dx_strides[1]
    acc = tl.zeros([BN], dtype=tl.float32)
    for p0 in range(0, P, BP):
        o_p = p0 + tl.arange(0, BP)
        m = m_n[:, None] & (o_p < P)[None, :]
        b_dv = tl.load(p_dv + o_p[None, :] * dv_strides[3], mask=m, other=0.0).to(tl.float32)       # [BN, BP]
        if NEED_DX:
            tl.store(p_dx + o_p[None, :] * dx_strides[3], round_to(b_dv * b_dt[:, None], dx_ptr.dtype.element_ty),
                     mask=m)
        if NEED_DDT:
            b_x = tl.load(p_x + o_p[None, :] * x_strides[3], mask=m, other=0.0).to(tl.float32)
            acc += tl.sum(b_dv * b_x, axis=1)
    if NEED_DDT:   # ddt is a new contiguous (batch, n, heads) tensor
        tl.store(ddt_ptr + (i_b * N + o_n) * H + i_h, acc, mask=m_n)


_FWD_LAUNCHES = CompiledLaunches(_scale_rows_kernel, ("x_ptr", "dt_ptr", "v_ptr"))
_BWD_LAUNCHES = CompiledLaunches(_scale_rows_backward_kernel, ("dv_ptr", "x_ptr", "dt_ptr", "dx_ptr", "ddt_ptr"))
"""The compiled kernels by sizes, strides and dtypes: a layer's call goes straight through the compiled kernel
(host time on short sequences); the keys hold n, so a run of many lengths forgets old ones."""


def _grid(B: int, n: int, H: int):
    return lambda meta: (B * cdiv(n, meta["BN"]) * H,)


def _key(sizes, tensors, pinned) -> tuple:
    """Everything the compiled kernel, its config and the grid depend on: sizes, strides, dtypes, alignment."""
    return (sizes, tuple(x.dtype for x in tensors), tuple(x.stride() for x in tensors),
            tuple(x.data_ptr() % 16 == 0 for x in tensors), None if pinned is None else tuple(sorted(pinned.items())))


def scale_rows(x: torch.Tensor, dt: torch.Tensor, config: Optional[Mapping] = None) -> torch.Tensor:
    """v = x · dt[..., None] in float32, rounded once to x's dtype, by one launch (no checks: the caller's).

    Args:
        x: ``(batch, n, heads, P)``, float16, bfloat16, float32 or float64, any strides.
        dt: ``(batch, n, heads)`` float32, any strides, on x's device.
        config: maps ``"scale_rows.fwd"`` to a config of the kernel (tests); None: autotuned.

    Returns:
        A new contiguous tensor of x's shape and dtype: ``(x.float() * dt[..., None]).to(x.dtype)``'s values.
        Runs the Triton kernel: CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    """
    B, n, H, P = x.shape
    v = problem.new_empty((B, n, H, P), x.dtype, x.device)
    if v.numel() == 0:
        return v
    args = dict(x_ptr=x, dt_ptr=dt, v_ptr=v, x_strides=tuple(x.stride()), dt_strides=tuple(dt.stride()),
                v_strides=tuple(v.stride()), H=H, N=n, P=P, BP=column_tile(P))
    pinned = (config or {}).get(FWD.name)
    _FWD_LAUNCHES.launch(_key((B, n, H, P), (x, dt, v), pinned), _grid(B, n, H), pinned, args, x.device)
    return v


def scale_rows_backward(dv: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, need_dx: bool = True,
                        need_ddt: bool = True, config: Optional[Mapping] = None
                        ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The gradients of :func:`scale_rows` by one launch (no checks: the caller's).

    Args:
        dv: v's gradient, x's shape, any strides (stride 0 too) and dtype of the four.
        x, dt: the forward's inputs.
        need_dx, need_ddt: which gradients to form (at least one).
        config: maps ``"scale_rows.bwd"`` to a config of the kernel (tests); None: autotuned.

    Returns:
        ``(dx, ddt)``: dx = dv · dt in float32 rounded once to x's dtype, a new contiguous tensor of x's shape;
        ddt = Σ_p dv · x in float32, a new contiguous float32 ``(batch, n, heads)`` tensor (products and sum in
        float32); None where not asked for.
    """
    B, n, H, P = x.shape
    dx = problem.new_empty((B, n, H, P), x.dtype, x.device) if need_dx else None
    ddt = problem.new_empty((B, n, H), torch.float32, x.device) if need_ddt else None
    if B * n * H * P == 0 or not (need_dx or need_ddt):
        return dx, None if ddt is None else ddt.zero_()   # P = 0: a sum over no columns
    # an output not asked for gets a stand-in, never written (NEED_DX / NEED_DDT prune its code)
    dx_ = dx if dx is not None else dv
    ddt_ = ddt if ddt is not None else dt
    args = dict(dv_ptr=dv, x_ptr=x, dt_ptr=dt, dx_ptr=dx_, ddt_ptr=ddt_, dv_strides=tuple(dv.stride()),
                x_strides=tuple(x.stride()), dt_strides=tuple(dt.stride()), dx_strides=tuple(dx_.stride()), H=H, N=n,
                P=P, NEED_DX=bool(need_dx), NEED_DDT=bool(need_ddt), BP=column_tile(P))
    pinned = (config or {}).get(BWD.name)
    key = _key((B, n, H, P, bool(need_dx), bool(need_ddt)), (dv, x, dt, dx_, ddt_), pinned)
    _BWD_LAUNCHES.launch(key, _grid(B, n, H), pinned, args, x.device)
    return dx, ddt
