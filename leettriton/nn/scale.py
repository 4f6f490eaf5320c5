"""Mamba-2's values v = dt·x in one pass each way, and as a registered operator for ``torch.compile``.

:func:`scale_values` is the layer's ``(x.float() * dt[..., None]).to(x.dtype)`` (docs/design.md §12.6) without
its float32 temporaries: where the package runs its kernels (CUDA tensors, or CPU tensors under the
interpreter) the forward and the backward are one launch each of :mod:`leettriton.kernels.scale_rows`; other
CPU tensors take the PyTorch form itself.

While ``torch.compile`` traces, the call is the operator ``torch.ops.leettriton.scale_values`` (its backward
the operator ``scale_values_backward``, registered as its autograd formula), traced as one opaque node each
(docs/design.md §4.6); eager calls keep their own path and host time, as the package's entry points do.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..autotune.families import is_interpreting
from ..kernels.scale_rows import scale_rows, scale_rows_backward
from ..ops import custom_op, is_compiling
from ..problem import type_name

__all__ = ["scale_values", "scale_values_torch", "SCALE_DTYPES", "OPS"]

SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""x's dtypes (dt is float32)."""

OPS = ("scale_values", "scale_values_backward")
"""The operators' names in ``torch.ops.leettriton``."""


def scale_values_torch(x: Tensor, dt: Tensor) -> Tensor:
    """The PyTorch form of :func:`scale_values`: the product in float32, rounded once to x's dtype."""
    return (x.float() * dt[..., None]).to(x.dtype)


def _uses_kernel(x: Tensor) -> bool:
    """Whether the kernels run on x's device: CUDA, or the CPU under the interpreter."""
    return x.device.type == "cuda" or (x.device.type == "cpu" and is_interpreting())


def _check(x, dt) -> None:
    """Errors before any work: the arguments :func:`scale_values` documents."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor (batch, n, heads, P), got {type_name(x)}")
    if not isinstance(dt, Tensor):
        raise TypeError(f"dt must be a float32 tensor (batch, n, heads), got {type_name(dt)}")
    if x.dtype not in SCALE_DTYPES:
        raise TypeError(f"x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if dt.dtype != torch.float32:
        raise TypeError(f"dt must be float32 (the softplus's output), got {dt.dtype}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (batch, n, heads, P), got shape {tuple(x.shape)}")
    if tuple(dt.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"dt must have shape {tuple(x.shape[:-1])} (x's (batch, n, heads)), got shape "
                         f"{tuple(dt.shape)}")
    if dt.device != x.device:
        raise ValueError(f"dt must be on x's device {x.device}, got a tensor on {dt.device}")


class _ScaleValues(torch.autograd.Function):
    """The eager kernels' autograd: the forward's inputs saved (no float32 copy), one backward launch."""

    @staticmethod
    def forward(ctx, x, dt):
        ctx.save_for_backward(x, dt)
        return scale_rows(x, dt)

    @staticmethod
    def backward(ctx, dv):
        x, dt = ctx.saved_tensors
        need_dx, need_ddt = ctx.needs_input_grad[:2]
        return scale_rows_backward(dv, x, dt, need_dx, need_ddt)


def scale_values(x: Tensor, dt: Tensor) -> Tensor:
    """v = dt·x, Mamba-2's values: ``v[b, t, h, :] = x[b, t, h, :] · dt[b, t, h]`` (docs/design.md §12.6).

    Args:
        x: ``(batch, n, heads, P)``, float16, bfloat16, float32 or float64, any strides (the layer's is a view
            of its convolution's output).
        dt: ``(batch, n, heads)`` float32 (the step after the softplus), any strides, on x's device.

    Returns:
        A new tensor of x's shape and dtype (contiguous where the kernel runs): each product computed in float32
        and rounded once to x's dtype, so the values of ``(x.float() * dt[..., None]).to(x.dtype)`` bit for bit.
        Differentiable in x and dt: dx = dv·dt in float32 rounded once to x's dtype, ddt = Σ_p dv·x in float32
        (float32, dt's dtype), the PyTorch form's gradients (ddt's sum in the kernel's order).  On CUDA (and
        the CPU under ``TRITON_INTERPRET=1``) the forward and the backward are one Triton launch each, reading
        every tensor through its strides, with no float32 copy; other CPU tensors run the PyTorch form.
        Under ``torch.compile`` it is the operator ``torch.ops.leettriton.scale_values``.

    Raises:
        TypeError, ValueError: before any work, for a non-tensor, a dtype other than the above, x not 4-D, dt not
        of shape x.shape[:-1] or not on x's device.

    Example::

        >>> v = scale_values(x, dt)      # x (B, n, H, P) bfloat16 view, dt (B, n, H) float32 → (B, n, H, P) bfloat16
    """
    _check(x, dt)
    if is_compiling():
        return torch.ops.leettriton.scale_values(x, dt)
    if not _uses_kernel(x):
        return scale_values_torch(x, dt)
    if torch.is_grad_enabled() and (x.requires_grad or dt.requires_grad):
        return _ScaleValues.apply(x, dt)
    return scale_rows(x, dt)


# --------------------------------------------------------------------------- the operators (torch.compile)

@custom_op("leettriton::scale_values", mutates_args=())
def _scale_values_op(x: Tensor, dt: Tensor) -> Tensor:
    if _uses_kernel(x):
        return scale_rows(x, dt)
    return scale_values_torch(x, dt).contiguous()   # the fake's strides, never an input


@_scale_values_op.register_fake
def _scale_values_fake(x, dt):
    _check(x, dt)
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)


@custom_op("leettriton::scale_values_backward", mutates_args=())
def _scale_values_backward_op(dv: Tensor, x: Tensor, dt: Tensor, need_dx: bool,
                              need_ddt: bool) -> tuple[Tensor, Tensor]:
    """(dx, ddt) of :func:`scale_values`; one not asked for is an empty tensor."""
    if _uses_kernel(x):
        dx, ddt = scale_rows_backward(dv, x, dt, need_dx, need_ddt)
    else:
        g = dv.float()
        dx = (g * dt[..., None]).to(x.dtype).contiguous() if need_dx else None
        ddt = (g * x.float()).sum(-1) if need_ddt else None
    return (dx if dx is not None else x.new_empty((0,)),
            ddt if ddt is not None else dt.new_empty((0,), dtype=torch.float32))


@_scale_values_backward_op.register_fake
def _scale_values_backward_fake(dv, x, dt, need_dx, need_ddt):
    dx = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device) if need_dx else x.new_empty((0,))
    ddt = (torch.empty(tuple(dt.shape), dtype=torch.float32, device=dt.device) if need_ddt
           else dt.new_empty((0,), dtype=torch.float32))
    return dx, ddt


def _setup_context(ctx, inputs, output) -> None:
    x, dt = inputs
    ctx.save_for_backward(x, dt)


def _backward(ctx, dv) -> tuple[Optional[Tensor], Optional[Tensor]]:
    x, dt = ctx.saved_tensors
    need_dx, need_ddt = ctx.needs_input_grad[:2]
    dx, ddt = torch.ops.leettriton.scale_values_backward(dv, x, dt, bool(need_dx), bool(need_ddt))
    return (dx if need_dx else None), (ddt if need_ddt else None)


_scale_values_op.register_autograd(_backward, setup_context=_setup_context)
