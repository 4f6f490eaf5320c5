"""Tile code shared by the kernels, and the launch arguments every kernel takes.

Every kernel receives the same leading arguments (see :func:`problem_args`):
pointers to b, c, v, the output, λ = log2 γ per head, the initial and the final
state; the four strides of each; the sizes H, N, R, D; and the flags
HAS_DECAY, HAS_INITIAL, STORE_STATE and DOT_PRECISION.  Kernels read strides,
so any layout and any non-contiguous view runs without a copy.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..api import Problem
from ..autotune.families import is_interpreting
from ..autotune.spaces._util import next_power_of_2

# Triton's interpreter multiplies the raw bit patterns of bfloat16 dot operands;
# upcasting them to float32 first gives the product the GPU's tensor cores give
# (bf16 × bf16 is exact in fp32).  A compile-time no-op on the GPU (as is round_to's shim).
_INTERPRETER_BF16_DOT = tl.constexpr(is_interpreting())


def problem_args(p: Problem) -> dict:
    """The keyword arguments shared by every kernel for problem ``p`` (a new dict each call,
    built once per problem: a method launching several kernels reads the strides once)."""
    cached = p.__dict__.get("_kernel_args")
    if cached is None:
        cached = p.__dict__["_kernel_args"] = _problem_args(p)
    return dict(cached)


def _problem_args(p: Problem) -> dict:
    B, H, n, r, d = p.shape
    # Unused pointers get a harmless stand-in; the flags keep the kernel from reading them.
    lam = p.log2_gamma if p.log2_gamma is not None else p.out
    s0 = p.initial_state if p.initial_state is not None else p.out
    st = p.state if p.state is not None else p.out
    sb, sc, sv, so, ss0, sst = (x.stride() for x in (p.b, p.c, p.v, p.out, s0, st))
    return dict(
        b_ptr=p.b, c_ptr=p.c, v_ptr=p.v, o_ptr=p.out, lam_ptr=lam, s0_ptr=s0, st_ptr=st,
        stride_bb=sb[0], stride_bh=sb[1], stride_bn=sb[2], stride_bk=sb[3],
        stride_cb=sc[0], stride_ch=sc[1], stride_cn=sc[2], stride_ck=sc[3],
        stride_vb=sv[0], stride_vh=sv[1], stride_vn=sv[2], stride_vd=sv[3],
        stride_ob=so[0], stride_oh=so[1], stride_on=so[2], stride_od=so[3],
        stride_s0b=ss0[0], stride_s0h=ss0[1], stride_s0k=ss0[-2], stride_s0d=ss0[-1],
        stride_stb=sst[0], stride_sth=sst[1], stride_stk=sst[-2], stride_std=sst[-1],
        H=H, N=n, R=r, D=d,
        HAS_DECAY=p.log2_gamma is not None,
        HAS_INITIAL=p.initial_state is not None,
        STORE_STATE=p.state is not None,
        DOT_PRECISION=dot_precision(p),
    )


def dot_precision(p: Problem) -> str:
    """``tl.dot`` input precision: the caller's choice for float32 inputs; for 16-bit inputs TF32
    (it applies only to products whose operands a kernel upcast to float32, and holds 16-bit
    values exactly)."""
    import torch

    if p.v.dtype == torch.float32:
        return p.precision
    return "tf32"


def pow2_at_least_16(x: int) -> int:
    """Smallest power of two ≥ max(x, 16): the least tile a ``tl.dot`` operand may have."""
    return max(16, next_power_of_2(x))


# --------------------------------------------------------------------------- jit helpers

@triton.jit
def mma(a, b, PRECISION: tl.constexpr):
    """``a @ b`` with float32 accumulation; ``PRECISION`` applies to float32 operands."""
    if _INTERPRETER_BF16_DOT:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
        if b.dtype == tl.bfloat16:
            b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 ``x`` rounded to ``dtype`` to nearest (ties to even), as the GPU converts.

    Triton's interpreter truncates float32 → bfloat16 (towards zero, a bias of half a unit in
    the last place); under it the rounding is done on the bit pattern first, so that the CPU
    suite sees the GPU's arithmetic.  A plain conversion on the GPU.
    """
    if _INTERPRETER_BF16_DOT:
        if dtype == tl.bfloat16 and x.dtype == tl.float32:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def load_tile(ptr, rows, cols, stride_row, stride_col, n_rows, n_cols):
    """A [len(rows), len(cols)] tile, zero outside ``rows < n_rows`` and ``cols < n_cols``."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(ptr + rows[:, None] * stride_row + cols[None, :] * stride_col, mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, value, rows, cols, stride_row, stride_col, n_rows, n_cols):
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(ptr + rows[:, None] * stride_row + cols[None, :] * stride_col, round_to(value, ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def decay(lam, dist, HAS_DECAY: tl.constexpr):
    """γ^dist = exp2(λ · dist) for dist ≥ 0, so every factor lies in (0, 1] (never γ^-j)."""
    if HAS_DECAY:
        return tl.exp2(lam * dist.to(tl.float32))
    else:
        return tl.full(dist.shape, 1.0, tl.float32)


@triton.jit
def causal_decay(lam, rows, cols, HAS_DECAY: tl.constexpr):
    """M[i, j] = γ^(i−j) for i ≥ j, else 0, for absolute positions ``rows`` × ``cols``."""
    dist = rows[:, None] - cols[None, :]
    causal = dist >= 0
    return tl.where(causal, decay(lam, tl.where(causal, dist, 0), HAS_DECAY), 0.0)


@triton.jit
def head_log2_gamma(lam_ptr, i_h, HAS_DECAY: tl.constexpr):
    if HAS_DECAY:
        return tl.load(lam_ptr + i_h).to(tl.float32)
    else:
        return 0.0
