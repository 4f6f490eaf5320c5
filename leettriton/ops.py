"""The public entry points as registered operators (``torch.ops.leettriton.*``), which ``torch.compile``
traces as single opaque nodes (docs/design.md §4.6).

Each operator's body is the entry point's eager path, run as it is (its plan, its launches); its fake
implementation gives every output's shape, dtype and strides from the inputs' metadata alone, so the
compiler traces the call without running it.  The state, the state pool and the varlen pool are declared
as mutated arguments (updated in place, never returned); ``linear_attention`` has its backward as an
operator of its own, registered as the forward's autograd formula (docs/design.md §10).

The public functions call these operators only while a trace is being made
(:func:`torch.compiler.is_compiling`): eager calls keep their own path and host time.  Inside a compiled
region no check reads a tensor's values where the kernels guard them (CUDA tensors, or the interpreter): γ's
range, the slot ids and the sequence offsets are left to those guards (a γ out of range gives NaN rows, ids
and offsets are clamped: docs/design.md §4.6).

γ travels as a tensor (``gamma``) or a float (``gamma_value``), never both; methods, layouts and precisions
as strings.  The eager entry points are bound by :mod:`leettriton.api` (:func:`bind`), which sits above this
module.
"""
from __future__ import annotations

import contextlib
import numbers
from functools import partial
from typing import Callable, Optional

import torch
from torch import Tensor

from .autograd import all_grads
from .autotune.families import is_interpreting
from .kernels.tree import check_parents
from .problem import device_guards_only, make_problem

__all__ = ["bind", "is_compiling", "custom_op", "guarded", "split_gamma", "linear_attention", "linear_attention_varlen",
           "decode_step", "decode_tokens", "OPS"]

_EAGER: dict[str, Callable] = {}


def _never() -> bool:
    return False


class _Unregistered:
    """Where torch has no ``torch.library.custom_op`` (before 2.4): the function as it is, never called (the
    public functions dispatch to the operators only while compiling, which :func:`is_compiling` then denies)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def register_fake(self, fn: Callable) -> Callable:
        return fn

    def register_autograd(self, *args, **kwargs) -> None:
        pass


_custom_op = getattr(torch.library, "custom_op", None)
if _custom_op is not None:
    is_compiling: Callable[[], bool] = torch.compiler.is_compiling
    """``torch.compiler.is_compiling`` itself (the compiler knows the function)."""
else:
    is_compiling = _never

    def _custom_op(name, *, mutates_args):
        return _Unregistered


custom_op = _custom_op
"""``torch.library.custom_op`` (a stand-in that registers nothing where torch lacks it): for the operators other
modules above this one register (:mod:`leettriton.distributed`'s state pass)."""


def bind(**entry_points: Callable) -> None:
    """The eager entry points the operators' bodies run (``linear_attention``, ``linear_attention_varlen``,
    ``decode_step``, ``decode_tokens``), given by :mod:`leettriton.api` as it loads."""
    _EAGER.update(entry_points)


def split_gamma(gamma, heads: Optional[int] = None, device=None) -> tuple[Optional[Tensor], Optional[float]]:
    """γ as the operators take it: ``(tensor, None)``, ``(None, float)`` or ``(None, None)`` (no decay).

    A float's value is checked here (it is known while tracing); a tensor's type, shape (given ``heads``) and
    device (given ``device``), never its values, which are left to the kernels (docs/design.md §4.6)."""
    if gamma is None:
        return None, None
    if isinstance(gamma, Tensor):
        if not gamma.is_floating_point():
            raise TypeError(f"gamma must be a floating-point tensor, got dtype {gamma.dtype}")
        if heads is not None and tuple(gamma.shape) not in ((heads,), (heads, 1)):
            raise ValueError(f"gamma must have shape ({heads},) or ({heads}, 1) (one γ per head), "
                             f"got shape {tuple(gamma.shape)}")
        if device is not None and gamma.device != device:
            raise ValueError(f"gamma must be on the inputs' device {device}, got {gamma.device}")
        return gamma, None
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
        raise TypeError(f"gamma must be None, a float or a tensor of shape (heads,) or (heads, 1), got "
                        f"{type(gamma).__name__}")
    g = float(gamma)
    if not (0.0 < g <= 1.0):
        raise ValueError(f"gamma must lie in (0, 1], got {g!r}")
    return None, g


def _gamma(gamma: Optional[Tensor], gamma_value: Optional[float]):
    return gamma if gamma is not None else gamma_value


def guarded(*tensors: Optional[Tensor]):
    """The context an operator's body runs in: where the kernels guard the values they read (CUDA tensors,
    or CPU tensors under the interpreter), no check reads them on the host, so no call syncs and a CUDA
    graph can capture it; the PyTorch twins (CPU outside the interpreter) keep their checks, which cost no
    sync."""
    t = next(x for x in tensors if x is not None)
    if t.device.type == "cuda" or is_interpreting():
        return device_guards_only()
    return contextlib.nullcontext()


def _fresh(x: Tensor, *inputs: Optional[Tensor]) -> Tensor:
    """``x``, or a copy where it shares memory with one of ``inputs`` (an operator never returns an input)."""
    if any(t is not None and t.numel() and x.numel() and t.untyped_storage().data_ptr() ==
           x.untyped_storage().data_ptr() for t in inputs):
        return x.clone()
    return x


_NO_STATE = (0,)
"""The shape of an operator's state output that was not asked for (the operators return fixed tuples)."""


def _no_state(like: Tensor) -> Tensor:
    return torch.empty(_NO_STATE, dtype=torch.float32, device=like.device)


# --------------------------------------------------------------------------- linear_attention

@_custom_op("leettriton::linear_attention", mutates_args=())
def _linear_attention(b: Tensor, c: Tensor, v: Tensor, gamma: Optional[Tensor], gamma_value: Optional[float],
                      initial_state: Optional[Tensor], method: str, layout: str, return_state: bool,
                      precision: Optional[str], log_decay: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    with torch.no_grad(), guarded(v):
        res = _EAGER["linear_attention"](b, c, v, _gamma(gamma, gamma_value), method=method, layout=layout,
                                         initial_state=initial_state, return_state=return_state, precision=precision,
                                         log_decay=log_decay)
    out, state = res if return_state else (res, _no_state(v))
    return out, _fresh(state, initial_state)


@_linear_attention.register_fake
def _linear_attention_fake(b, c, v, gamma, gamma_value, initial_state, method, layout, return_state, precision,
                           log_decay=None):
    # the eager call's own checks of shapes, dtypes, devices and options, and its own allocations
    with torch.no_grad(), device_guards_only():
        p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                              precision=precision, differentiable=True, log_decay=log_decay)
    return out, p.state if return_state else _no_state(v)


@_custom_op("leettriton::linear_attention_backward", mutates_args=())
def _linear_attention_backward(grad_out: Optional[Tensor], grad_state: Optional[Tensor], b: Tensor, c: Tensor,
                               v: Tensor, initial_state: Optional[Tensor], gamma: Optional[Tensor],
                               gamma_value: Optional[float], method: str, layout: str, precision: Optional[str],
                               need_b: bool, need_c: bool, need_v: bool,
                               need_state: bool, log_decay: Optional[Tensor] = None, final: Optional[Tensor] = None,
                               need_gamma: bool = False,
                               need_a: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (db, dc, dv, dS₀, dγ, da) of docs/design.md §10.1 and §10.6 by three calls of
    the forward; one not asked for is an empty tensor."""
    g = _gamma(gamma, gamma_value)
    with torch.no_grad(), guarded(v):
        op = partial(_EAGER["linear_attention"], method=method, layout=layout, precision=precision)
        db, dc, dv, ds0, dgamma, da = all_grads(
            op, b, c, v, initial_state, g, log_decay, final, grad_out, grad_state, layout, need_b=need_b,
            need_c=need_c, need_v=need_v, need_s0=need_state, need_gamma=need_gamma, need_a=need_a)
    inputs = (grad_out, grad_state, b, c, v, initial_state, gamma, log_decay)
    return tuple(_grad_result(x, like, need, *inputs)
                 for x, like, need in ((db, b, need_b), (dc, c, need_c), (dv, v, need_v),
                                       (ds0, initial_state, need_state), (dgamma, gamma, need_gamma),
                                       (da, log_decay, need_a)))


def _grad_result(x: Optional[Tensor], like: Optional[Tensor], need: bool, *inputs) -> Tensor:
    """One gradient as the backward operator returns it: contiguous, of ``like``'s shape and dtype (zeros where
    no term reached it), never an input; an empty tensor where it was not asked for."""
    if not need or like is None:
        return torch.empty((0,), dtype=torch.float32 if like is None else like.dtype,
                           device=inputs[4].device)
    if x is None:
        return torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    return _fresh(x.to(like.dtype).contiguous(), *inputs)


@_linear_attention_backward.register_fake
def _linear_attention_backward_fake(grad_out, grad_state, b, c, v, initial_state, gamma, gamma_value, method, layout,
                                    precision, need_b, need_c, need_v, need_state, log_decay=None, final=None,
                                    need_gamma=False, need_a=False):
    def grad(like, need):
        if not need or like is None:
            return v.new_empty((0,), dtype=torch.float32 if like is None else like.dtype)
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    return (grad(b, need_b), grad(c, need_c), grad(v, need_v), grad(initial_state, need_state),
            grad(gamma, need_gamma), grad(log_decay, need_a))


def _setup_context(ctx, inputs, output) -> None:
    b, c, v, gamma, gamma_value, initial_state, method, layout, return_state, precision, log_decay = inputs
    decay_grad = (gamma is not None and gamma.requires_grad) or (log_decay is not None and log_decay.requires_grad)
    final = output[1] if (return_state and decay_grad) else None
    ctx.save_for_backward(b, c, v, initial_state, gamma, log_decay, final)
    ctx.options = (gamma_value, method, layout, precision)
    ctx.set_materialize_grads(False)  # a gradient that is not given (an unused output) is None, not zeros


def _backward(ctx, grad_out, grad_state):
    b, c, v, s0, gamma, log_decay, final = ctx.saved_tensors
    gamma_value, method, layout, precision = ctx.options
    need = ctx.needs_input_grad
    need_b, need_c, need_v, need_s0 = need[0], need[1], need[2], need[5]
    need_gamma = need[3] and gamma is not None
    need_a = len(need) > 10 and need[10] and log_decay is not None
    if grad_state is not None and grad_state.numel() == 0:  # the state that was not asked for
        grad_state = None
    if grad_out is None and grad_state is None:
        return (None,) * len(need)
    db, dc, dv, ds0, dgamma, da = torch.ops.leettriton.linear_attention_backward(
        grad_out, grad_state, b, c, v, s0, gamma, gamma_value, method, layout, precision, need_b, need_c, need_v,
        need_s0 and s0 is not None, log_decay, final, need_gamma, need_a)
    grads = (db if need_b else None, dc if need_c else None, dv if need_v else None, dgamma if need_gamma else None,
             None, ds0 if need_s0 and s0 is not None else None, None, None, None, None, da if need_a else None)
    return grads[:len(need)]


_linear_attention.register_autograd(_backward, setup_context=_setup_context)


def linear_attention(b, c, v, gamma=None, *, method: str = "auto", layout: str = "bhnd", initial_state=None,
                     return_state: bool = False, precision: Optional[str] = None, log_decay=None):
    """:func:`leettriton.linear_attention` through its operator (the arguments and results are the same)."""
    axis = 1 if layout == "bhnd" else 2   # the output's heads: the most of b's, c's and v's (docs/design.md §1.7)
    heads = (max(x.shape[axis] for x in (b, c, v)) if all(isinstance(x, Tensor) and x.dim() == 4 for x in (b, c, v))
             else None)
    g, g_value = split_gamma(gamma, heads, v.device if isinstance(v, Tensor) else None)
    out, state = torch.ops.leettriton.linear_attention(b, c, v, g, g_value, initial_state, method, layout,
                                                       bool(return_state), precision, log_decay)
    return (out, state) if return_state else out


# --------------------------------------------------------------------------- decode

@_custom_op("leettriton::decode_step", mutates_args=("state",))
def _decode_step(b_t: Tensor, c_t: Tensor, v_t: Tensor, state: Tensor, gamma: Optional[Tensor],
                 gamma_value: Optional[float], slot_ids: Optional[Tensor],
                 log_decay: Optional[Tensor] = None) -> Tensor:
    with torch.no_grad(), guarded(v_t):
        out, _ = _EAGER["decode_step"](b_t, c_t, v_t, state, _gamma(gamma, gamma_value), slot_ids=slot_ids,
                                       check_slots=False if slot_ids is not None and _skips(v_t) else True,
                                       log_decay=log_decay)
    return out


@_decode_step.register_fake
def _decode_step_fake(b_t, c_t, v_t, state, gamma, gamma_value, slot_ids, log_decay=None):
    return torch.empty((b_t.shape[0], state.shape[1], v_t.shape[-1]), dtype=v_t.dtype, device=v_t.device)


def _skips(x: Tensor) -> bool:
    """Whether an operator's body skips the index checks (the kernels guard the indices: docs/design.md §4.6)."""
    return x.device.type == "cuda" or is_interpreting()


@_custom_op("leettriton::decode_tokens", mutates_args=("state",))
def _decode_tokens(b: Tensor, c: Tensor, v: Tensor, state: Tensor, gamma: Optional[Tensor],
                   gamma_value: Optional[float], slot_ids: Optional[Tensor],
                   keep_states: bool, log_decay: Optional[Tensor] = None,
                   parents: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    with torch.no_grad(), guarded(v):
        res = _EAGER["decode_tokens"](b, c, v, state, _gamma(gamma, gamma_value), slot_ids=slot_ids,
                                      keep_states=keep_states,
                                      check_slots=False if slot_ids is not None and _skips(v) else True,
                                      log_decay=log_decay, parents=parents)
    return res[0], res[2] if keep_states else _no_state(v)


@_decode_tokens.register_fake
def _decode_tokens_fake(b, c, v, state, gamma, gamma_value, slot_ids, keep_states, log_decay=None, parents=None):
    B, _, K, r = b.shape
    H = state.shape[1]   # the output's heads (grouped heads: docs/design.md §1.7)
    if parents is not None:  # its metadata, checked while tracing (its values: the kernel's guard)
        check_parents(parents, B, K, v.device)
    out = torch.empty((B, H, K, v.shape[-1]), dtype=v.dtype, device=v.device)
    if not keep_states:
        return out, _no_state(v)
    return out, torch.empty((B, H, K + 1, r, v.shape[-1]), dtype=torch.float32, device=v.device)


def decode_step(b_t, c_t, v_t, state, gamma=None, *, slot_ids=None, log_decay=None):
    """:func:`leettriton.decode_step` through its operator: ``(o_t, state)``, ``state`` updated in place."""
    g, g_value = split_gamma(gamma)
    return torch.ops.leettriton.decode_step(b_t, c_t, v_t, state, g, g_value, slot_ids, log_decay), state


def decode_tokens(b, c, v, state, gamma=None, *, slot_ids=None, keep_states: bool = False, log_decay=None,
                  parents=None):
    """:func:`leettriton.decode_tokens` through its operator."""
    g, g_value = split_gamma(gamma)
    out, kept = torch.ops.leettriton.decode_tokens(b, c, v, state, g, g_value, slot_ids, bool(keep_states),
                                                   log_decay, parents)
    return (out, state, kept) if keep_states else (out, state)


# --------------------------------------------------------------------------- varlen

@_custom_op("leettriton::linear_attention_varlen", mutates_args=("state_pool", "out"))
def _linear_attention_varlen(b: Tensor, c: Tensor, v: Tensor, cu_seqlens: Tensor, gamma: Optional[Tensor],
                             gamma_value: Optional[float], method: str, state_pool: Optional[Tensor],
                             slot_ids: Optional[Tensor], has_initial_state: Optional[Tensor], return_state: bool,
                             precision: Optional[str], log_decay: Optional[Tensor],
                             out: Optional[Tensor], checkpoint_every: Optional[int],
                             checkpoint_slots: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """With ``out`` (mutated in place) the output slot of the result is an empty stand-in: an operator never
    returns one of its inputs.  No argument has a default: a mutated argument after a defaulted one is missing
    from the boxed call where it is left at its default, which torch 2.11's in-place bookkeeping indexes."""
    with torch.no_grad(), guarded(v):
        res = _EAGER["linear_attention_varlen"](
            b, c, v, cu_seqlens, _gamma(gamma, gamma_value), method=method, state_pool=state_pool,
            slot_ids=slot_ids, has_initial_state=has_initial_state, return_state=return_state, precision=precision,
            check_indices=not _skips(v), log_decay=log_decay, out=out, checkpoint_every=checkpoint_every,
            checkpoint_slots=checkpoint_slots)
    o, states = (res[0], res[1]) if return_state else (res, None)
    if out is not None:
        o = v.new_empty((0,))
    if return_state and state_pool is None:
        return o, states
    return o, _no_state(v)


@_linear_attention_varlen.register_fake
def _linear_attention_varlen_fake(b, c, v, cu_seqlens, gamma, gamma_value, method, state_pool, slot_ids,
                                  has_initial_state, return_state, precision, log_decay, out, checkpoint_every,
                                  checkpoint_slots):
    T, _, r = b.shape
    H = max(b.shape[1], c.shape[1], v.shape[1])   # the output's heads (grouped heads: docs/design.md §1.7)
    shape = (0,) if out is not None else (T, H, v.shape[-1])
    out = torch.empty(shape, dtype=v.dtype, device=v.device)
    if return_state and state_pool is None:
        return out, torch.empty((cu_seqlens.shape[0] - 1, H, r, v.shape[-1]), dtype=torch.float32, device=v.device)
    return out, _no_state(v)


def linear_attention_varlen(b, c, v, cu_seqlens, gamma=None, *, method: str = "auto", state_pool=None, slot_ids=None,
                            has_initial_state=None, return_state: bool = False, precision: Optional[str] = None,
                            log_decay=None, out=None, checkpoint_every=None, checkpoint_slots=None):
    """:func:`leettriton.linear_attention_varlen` through its operator (``out``, if given, written in place; the
    checkpoints, as the final states, written to the pool, a mutated argument)."""
    g, g_value = split_gamma(gamma, max(b.shape[1], c.shape[1], v.shape[1]), v.device)
    res, states = torch.ops.leettriton.linear_attention_varlen(b, c, v, cu_seqlens, g, g_value, method, state_pool,
                                                               slot_ids, has_initial_state, bool(return_state),
                                                               precision, log_decay, out, checkpoint_every,
                                                               checkpoint_slots)
    out = res if out is None else out
    if not return_state:
        return out
    return out, (state_pool if state_pool is not None else states)


OPS = ("linear_attention", "linear_attention_backward", "decode_step", "decode_tokens", "linear_attention_varlen")
"""The operators' names in ``torch.ops.leettriton``."""
