"""The public functions: :func:`linear_attention`, one function per method, :func:`decode_step`,
:func:`causal_linear_decoder`.

Each validates its call once (problem.py), resolves the registered method name
(registry.py) and runs the call's plan (plan.py): docs/design.md §4.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch

from . import ops, problem, registry
from .autograd import attach_backward
from .compat import decoder_arguments
from .kernels.decode import decode_step_impl, decode_tokens_impl
from .kernels.tree import decode_tree
from .autotune import is_interpreting
from .methods import builtin_methods
from .kernels.walk import launch_varlen_walk
from .plan import known_call, remember_call, resolve, run_problem
from .problem import (Problem, byte_extent, check_autograd, check_bool, check_constant_gamma, check_dims,
                      check_gamma_values, check_index, check_own_memory, check_pool, check_slot_values, check_state,
                      check_heads, check_tensor, check_token_triple, check_unshared, index_as_read, make_problem,
                      make_varlen_problem, requires_grad, resolve_gamma)

__all__ = ["linear_attention", "linear_attention_varlen", "decode_step", "decode_tokens", "method_function", "causal_linear_decoder"]

registry.install_builtins(builtin_methods())


def linear_attention(b, c, v, gamma=None, *, method: str = "auto", layout: str = "bhnd", initial_state=None,
                     return_state: bool = False, precision: Optional[str] = None, log_decay=None):
    """Exponentially decaying causal linear attention, O = (B Cᵀ ⊙ M) V with M[i, j] = γ^(i−j) for i ≥ j.

    Per batch element and head: S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t, with
    S_{−1} = ``initial_state`` (or 0).  No softmax, no 1/√d scale, no normaliser.

    Args:
        b, c: ``(batch, heads_k, n, r)`` (layout ``"bhnd"``) or ``(batch, n, heads_k, r)``
            (layout ``"bnhd"``); float16, bfloat16 or float32; any strides.
        v: ``(batch, heads_v, n, d)`` or ``(batch, n, heads_v, d)``, same dtype and device.
            Grouped heads (docs/design.md §1.7): heads_k and heads_v may differ when one divides the other;
            the output has heads = max(heads_k, heads_v), and output head h reads b, c at head
            h // (heads / heads_k) and v at head h // (heads / heads_v), without copies (Mamba-2's shared B
            and C, GQA; shared values, GVA).  Counts that do not divide: a ``ValueError`` naming them.
            Everything below that has a heads axis (gamma, log_decay, the states) is per output head.
        gamma: decay per head: ``None`` (γ = 1, plain causal linear attention), a
            float in (0, 1], or a tensor of shape ``(heads,)`` or ``(heads, 1)``.
        method: ``"auto"`` (default: the fastest method for this shape on this GPU,
            from the heuristic file), a built-in name (see :data:`METHODS`), one of
            the paper's spellings, or a name given to :func:`register_method`.
        layout: ``"bhnd"`` (default) or ``"bnhd"``. The output has the same layout.
        initial_state: float32 ``(batch, heads, r, d)`` state before the first token.
        return_state: also return the final state S_{n−1} (float32 ``(batch, heads, r, d)``).
        precision: float32 inputs only: ``"ieee"`` (default, true fp32 products) or
            ``"tf32"`` (tensor cores, faster).  16-bit inputs always use tensor
            cores with float32 accumulation.
        log_decay: a per-token decay instead of ``gamma`` (giving both is a ValueError): a_t ≤ 0, the
            natural log of the decay of token t, ``(batch, heads, n)`` in layout ``"bhnd"`` or
            ``(batch, n, heads)`` in ``"bnhd"``, float32 or the inputs' dtype, any strides (read as it
            is).  Then S_t = exp(a_t) S_{t−1} + c_tᵀ v_t and M[i, j] = exp(a_{j+1} + … + a_i)
            (docs/design.md §1.6).  Methods that support it: :func:`registry.per_token_methods`; others
            raise ``NotImplementedError``.  Its values are not read on the host (no device sync): a value
            > 0 or NaN makes the rows it decays NaN (CPU tensors outside the interpreter are checked).

    Returns:
        The output, dtype and layout of ``v``; with ``return_state=True``, ``(output, state)``.

    Autograd: when b, c, v or ``initial_state`` requires grad, the output (and the returned state)
    is differentiable for every method.  The backward is three more calls of the same method
    (``auto`` chooses again for each), and only the inputs are kept for it; the ``_torch`` methods
    are differentiated by PyTorch's autograd itself (docs/design.md §10).  ``log_decay`` and a gamma
    tensor that requires grad (a learnable decay) get their gradients from the same three calls
    (docs/design.md §10.6).  With grouped heads the gradient of a shared b, c or v is the sum over the output
    heads that read it (docs/design.md §1.7).

    Non-finite inputs: row t depends on rows ≤ t only, for any values.  A ±inf or NaN at row k of b, c or
    v may make rows ≥ k non-finite and leaves rows < k as they would be without it (docs/nonfinite.md,
    which also gives float16's score range).

    Example::

        >>> b = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16)
        >>> c, v = torch.randn_like(b), torch.randn_like(b)
        >>> o = leettriton.linear_attention(b, c, v, gamma=0.99)
        >>> o, s = leettriton.linear_attention(b, c, v, 0.99, return_state=True)
    """
    if ops.is_compiling():  # a trace: one registered operator (docs/design.md §4.6)
        return ops.linear_attention(b, c, v, gamma, method=method, layout=layout, initial_state=initial_state,
                                    return_state=return_state, precision=precision, log_decay=log_decay)
    # The fast path (docs/design.md §4.5): a call whose signature -- everything the checks, the plan and the
    # launches read but the tensors' addresses and γ's values -- ran before skips to its plan's launches
    try:
        g, s, a = gamma, initial_state, log_decay
        key = ("linear_attention", method, layout, type(b), type(c), type(v), b.shape, c.shape, v.shape, b.stride(),
               c.stride(), v.stride(), b.dtype, c.dtype, v.dtype, b.device, c.device, v.device,
               None if s is None else (type(s), s.shape, s.stride(), s.dtype, s.device), type(return_state),
               return_state, type(precision), precision,
               (type(g), g.shape, g.stride(), g.dtype, g.device) if isinstance(g, torch.Tensor) else (type(g), g),
               None if a is None else (type(a), a.shape, a.stride(), a.dtype, a.device))
        call = known_call(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable options: the checks say what
        key = call = None
    if call is not None and not (torch.is_grad_enabled() and requires_grad(b, c, v, initial_state, gamma, log_decay)):
        return call(b, c, v, gamma, initial_state, log_decay)
    if log_decay is not None or requires_grad(gamma):
        return _with_decay(b, c, v, gamma, method, layout, initial_state, return_state, precision, log_decay, key)
    name = registry.canonical_method(method)
    if requires_grad(b, c, v, initial_state, gamma):
        check_constant_gamma(gamma)
        if registry.torch_method(name) is None or _is_empty(b):
            op = partial(linear_attention, method=name, layout=layout, precision=precision)
            return attach_backward(op, b, c, v, gamma, layout=layout, initial_state=initial_state,
                                   return_state=return_state)
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision, differentiable=registry.torch_method(name) is not None)
    if key is not None and not _is_empty(out) and registry.user_method(name) is None and \
            (p.gamma is None or p.gamma is gamma or not isinstance(gamma, torch.Tensor)):
        p.memo = {}
        run_problem(p, name)
        as_is = p.gamma is not None and p.gamma is gamma
        remember_call(key, _Call(resolve(p, name), p, layout, return_state, as_is, p.memo))
    else:
        run_problem(p, name)
    return (out, p.state) if return_state else out


def _with_decay(b, c, v, gamma, method, layout, initial_state, return_state, precision, log_decay, key=None):
    """A call with a per-token decay, or with a gamma that requires grad (a learnable decay): validated,
    then run through the plan of a method that supports it, or through the autograd node whose backward
    gives the decay's gradient (docs/design.md §1.6, §10.6).  A per-token call that needs no gradient is
    remembered under its signature ``key`` (which holds the decay's shape and strides) for the fast path."""
    name = registry.canonical_method(method)
    if log_decay is not None:
        registry.check_per_token(name)
    twin = registry.torch_method(name) is not None
    grads = requires_grad(b, c, v, initial_state, gamma, log_decay)
    if grads and (requires_grad(gamma) or not twin or _is_empty(b)):
        # validate first (shapes, dtypes, log_decay), with the tensors detached
        with torch.no_grad():
            make_problem(b, c, v, None if requires_grad(gamma) else gamma, layout=layout, initial_state=initial_state,
                         return_state=return_state, precision=precision, differentiable=True, log_decay=log_decay)
        op = partial(linear_attention, method=name, layout=layout, precision=precision)
        return attach_backward(op, b, c, v, gamma, layout=layout, initial_state=initial_state,
                               return_state=return_state, log_decay=log_decay)
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision, differentiable=twin, log_decay=log_decay)
    if key is not None and not grads and log_decay is not None and not _is_empty(out) and p.gamma is None:
        p.memo = {}
        run_problem(p, name)
        remember_call(key, _Call(resolve(p, name), p, layout, return_state, False, p.memo))
    else:
        run_problem(p, name)
    return (out, p.state) if return_state else out


class _Call:
    """A validated call signature of :func:`linear_attention` and what it resolved to: the plan, γ's
    tensor (a float's, cached by value) or "γ as it is", the output shapes, and the launchers' memo.
    Calling it runs the plan on a new Problem of the same signature (docs/design.md §4.5)."""

    __slots__ = ("plan", "gamma", "gamma_as_is", "out_like", "state_like", "transposed", "precision", "memo",
                 "return_state", "per_token")

    def __init__(self, plan, p: Problem, layout: str, return_state: bool, gamma_as_is: bool, memo: dict) -> None:
        B, H, n, r, d = p.shape
        # a float γ's tensor (cached by value, never handed out) is kept; a caller's γ tensor is not
        self.plan, self.gamma, self.gamma_as_is, self.memo = plan, None if gamma_as_is else p.gamma, gamma_as_is, memo
        self.transposed = layout != "bhnd"
        device = p.out.device
        self.out_like = problem.output_template((B, n, H, d) if self.transposed else (B, H, n, d), p.out.dtype, device)
        self.state_like = problem.output_template((B, H, r, d), torch.float32, device) if return_state else None
        self.precision, self.return_state = p.precision, return_state
        self.per_token = p.log_decay is not None

    def __call__(self, b, c, v, gamma, initial_state, log_decay=None):
        gamma_h = self.gamma
        if self.gamma_as_is:
            check_gamma_values(gamma)  # once per tensor version (a dictionary lookup after that)
            gamma_h = gamma
        out = problem.new_like(self.out_like)
        state = None if self.state_like is None else problem.new_like(self.state_like)
        if self.per_token:   # the values: checked on CPU tensors outside the interpreter only (§1.6)
            problem.check_log_decay_values(log_decay)
        if self.transposed:
            p = Problem(b.transpose(1, 2), c.transpose(1, 2), v.transpose(1, 2), gamma_h, initial_state,
                        out.transpose(1, 2), state, self.precision, self.memo,
                        log_decay=None if log_decay is None else log_decay.transpose(1, 2))
        else:
            p = Problem(b, c, v, gamma_h, initial_state, out, state, self.precision, self.memo, log_decay=log_decay)
        plan = self.plan
        plan.run(p, plan)
        return (out, state) if self.return_state else out


def _is_empty(x) -> bool:
    """An empty problem runs no method, so its output would not join the graph: it takes the autograd node."""
    return isinstance(x, torch.Tensor) and x.numel() == 0


def _method_function(name: str) -> Callable:
    def method_fn(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
                  precision: Optional[str] = None, log_decay=None):
        return linear_attention(b, c, v, gamma, method=name, layout=layout, initial_state=initial_state,
                                return_state=return_state, precision=precision, log_decay=log_decay)

    method_fn.__name__ = method_fn.__qualname__ = name
    method_fn.__doc__ = (f"``linear_attention(..., method='{name}')``: see :func:`linear_attention` for the "
                         f"arguments.\n\nCUDA tensors run the Triton kernel; CPU tensors run "
                         f"``{name}_torch`` (or the kernel itself under ``TRITON_INTERPRET=1``).")
    return method_fn


def method_function(name: str) -> Callable:
    """``linear_attention`` with ``method=name`` fixed: the public function of a built-in method."""
    def method_fn(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
                  precision: Optional[str] = None, log_decay=None):
        return linear_attention(b, c, v, gamma, method=name, layout=layout, initial_state=initial_state,
                                return_state=return_state, precision=precision, log_decay=log_decay)

    method_fn.__name__ = method_fn.__qualname__ = name
    base = name[:-len("_torch")] if name.endswith("_torch") else name
    if name.endswith("_torch"):
        runs = f"the PyTorch version of ``{base}`` (on CPU and CUDA tensors alike)"
    else:
        runs = (f"CUDA tensors run the Triton kernel; CPU tensors run ``{name}_torch`` (or the kernel "
                f"itself under ``TRITON_INTERPRET=1``)")
    method_fn.__doc__ = (f"``linear_attention(..., method='{name}')``: see :func:`linear_attention` for the "
                         f"arguments.\n\n{runs}.")
    return method_fn


def decode_step(b_t, c_t, v_t, state, gamma=None, *, slot_ids=None, check_slots: bool = True, log_decay=None):
    """One generated token: S ← γ S + c_tᵀ v_t, o_t = b_t S.  The state is updated **in place**.

    Args:
        b_t, c_t: ``(batch, heads_k, r)``; v_t: ``(batch, heads_v, d)``; one dtype
            (float16, bfloat16 or float32), one device.  heads_k and heads_v may differ when one divides
            the other (grouped heads, docs/design.md §1.7): the step has heads = max(heads_k, heads_v), as
            its state, γ, the decay and o_t; b_t, c_t, v_t are read without copies.
        state: float32 ``(batch, heads, r, d)``, e.g. from
            ``linear_attention(..., return_state=True)``; overwritten with the new state.
            With ``slot_ids``: a pool ``(slots, heads, r, d)`` of states (docs/design.md §13.1).
            Written in place, so its elements must not overlap (an expanded state is refused) and it
            must share no memory with b_t, c_t, v_t, gamma or slot_ids: a ValueError naming the argument,
            before anything is written (docs/design.md §13.3).  b_t, c_t, v_t may overlap (expanded views).
        gamma: as in :func:`linear_attention`.
        slot_ids: ``None``, or an int32/int64 tensor ``(batch,)`` on the inputs' device: row i reads
            and updates ``state[slot_ids[i]]`` in place; a negative id is padding (its output row is
            zero and no state is touched).  The slot is read by the kernel itself: no gather, no copy.
            Any strides: a strided one (``ids[::2]``) is copied to a contiguous tensor on every call, and
            the checks read that copy, which is what the kernel reads (docs/design.md §13.3).
        check_slots: check the slot ids' values (below ``slots``, no slot twice), which costs one device
            sync on CUDA, once per version of the ``slot_ids`` tensor (never during CUDA graph capture).
            ``False`` skips it: a repeated slot is then a race, and an id past the pool gives a NaN output
            row and touches no state.
        log_decay: the step's per-token decay instead of gamma (both: ValueError): a ≤ 0 of shape
            ``(batch, heads)``, float32 or the inputs' dtype, any strides: S ← exp(a) S + c_tᵀ v_t
            (docs/design.md §1.6).  Its values are not read on the host (a > 0 or NaN gives NaN).

    Returns:
        ``(o_t, state)``: o_t ``(batch, heads, d)`` in v_t's dtype, and ``state`` itself.

    On CUDA the step launches one kernel and never synchronises, so it can be
    captured in a CUDA graph: call it once before capture so that a tensor gamma
    is validated (one sync per gamma tensor version) and a float gamma is cached;
    a slotted step captured with a fixed ``slot_ids`` buffer reads whatever ids the
    buffer holds at each replay.

    Example::

        >>> o, state = leettriton.linear_attention(b, c, v, 0.99, return_state=True)   # prefill
        >>> o_t, state = leettriton.decode_step(b_t, c_t, v_t, state, 0.99)            # one token
        >>> pool = torch.zeros(256, heads, r, d, device="cuda")                         # a server's states
        >>> o_t, pool = leettriton.decode_step(b_t, c_t, v_t, pool, 0.99, slot_ids=slots)
    """
    if ops.is_compiling():  # a trace: one registered operator (docs/design.md §4.6)
        _check_compiled_step(b_t, c_t, v_t, state, gamma, slot_ids, check_slots, True)
        return ops.decode_step(b_t, c_t, v_t, state, gamma, slot_ids=slot_ids, log_decay=log_decay)
    if log_decay is not None:
        out, _ = _decode_per_token(b_t, c_t, v_t, state, gamma, log_decay, slot_ids, False, check_slots, True)
        return out, state
    if slot_ids is not None:
        out, _ = _decode_tokens(b_t, c_t, v_t, state, gamma, slot_ids, False, check_slots, one_token=True)
        return out, state
    # The fast path (docs/design.md §4.5): a call whose signature -- everything the checks and the launch
    # read but the tensors' addresses and γ's values -- was validated and launched before repeats that launch
    try:
        g = gamma
        key = (type(b_t), type(c_t), type(v_t), type(state), b_t.shape, c_t.shape, v_t.shape, state.shape,
               b_t.stride(), c_t.stride(), v_t.stride(), state.stride(), b_t.dtype, c_t.dtype, v_t.dtype, state.dtype,
               b_t.device, c_t.device, v_t.device, state.device,
               (type(g), g.shape, g.stride(), g.dtype, g.device) if isinstance(g, torch.Tensor) else (type(g), g))
        step = _DECODE_STEPS.get(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable gamma: the checks say what
        key = step = None
    if step is not None and not (torch.is_grad_enabled() and requires_grad(b_t, c_t, v_t, state, gamma)):
        launch, gamma_h, template, extents = step
        if gamma_h is _GAMMA_AS_IS:
            check_gamma_values(gamma)  # once per tensor version (a dictionary lookup after that)
            gamma_h = gamma
        _check_state_apart(state, b_t, c_t, v_t, gamma_h, None, extents, ("b_t", "c_t", "v_t"))
        out = problem.new_like(template)
        if launch is not None and launch((b_t, c_t, v_t, out, out if gamma_h is None else gamma_h, state, state)):
            return out, state
    if step is None:
        _check_decode_step(b_t, c_t, v_t, state)
    B, r = b_t.shape[0], b_t.shape[-1]
    H = state.shape[1]   # the output's heads: b_t, c_t, v_t may be grouped (docs/design.md §1.7)
    d = v_t.shape[-1]
    check_constant_gamma(gamma)
    check_autograd("decode_step", b_t, c_t, v_t, state)
    gamma_h = resolve_gamma(gamma, H, v_t.device)
    extents = _extents(state, b_t, c_t, v_t, gamma_h, None)
    _check_state_apart(state, b_t, c_t, v_t, gamma_h, None, extents, ("b_t", "c_t", "v_t"))
    out = problem.new_empty((B, H, d), v_t.dtype, v_t.device)
    launch = decode_step_impl(b_t, c_t, v_t, state, gamma_h, out) if B and H else None
    if key is not None and (gamma_h is None or gamma_h is gamma or not isinstance(gamma, torch.Tensor)):
        if len(_DECODE_STEPS) >= 1024:
            _DECODE_STEPS.clear()
        # a float γ's tensor is cached by value and never handed out: it can be kept; a tensor γ handed to
        # the kernel as it is has its values checked again on every version.  No launch to repeat (an
        # empty step, pointers not 16-byte aligned): the signature's checks are still done
        as_is = gamma_h is not None and gamma_h is gamma
        _DECODE_STEPS[key] = (launch, _GAMMA_AS_IS if as_is else gamma_h,
                              problem.output_template((B, H, d), v_t.dtype, v_t.device), extents)
    return out, state


def _extents(state, b, c, v, gamma_h, slot_ids) -> tuple:
    """The bytes each of state, b, c, v, γ (a tensor, or None) and the slot ids (or None) span: what
    :func:`_check_state_apart` compares, fixed by a repeated call's signature (kept with it)."""
    return tuple(0 if x is None else byte_extent(x) for x in (state, b, c, v, gamma_h, slot_ids))


def _check_state_apart(state, b, c, v, gamma_h, slot_ids, extents: tuple, names: tuple,
                       decay_name: str = "gamma") -> None:
    """The state (or pool), updated in place, shares no memory with what the step reads: b, c, v (called
    ``names``), γ (or the per-token decay: ``decay_name``) and the slot ids (docs/design.md §13.3;
    :func:`problem.check_unshared`).  Two pointers per tensor on every call, the extents being the signature's."""
    size, eb, ec, ev, eg, es = extents
    if not (size and eb and ec and ev):   # an empty step reads and writes nothing
        return
    lo = state.data_ptr()
    hi = lo + size
    # written out, not looped: this runs on every repeated step
    p_b, p_c, p_v = b.data_ptr(), c.data_ptr(), v.data_ptr()
    if ((p_b < hi and lo < p_b + eb) or (p_c < hi and lo < p_c + ec) or (p_v < hi and lo < p_v + ev)
            or (eg and gamma_h is not None and _within(gamma_h.data_ptr(), eg, lo, hi))
            or (es and slot_ids is not None and _within(slot_ids.data_ptr(), es, lo, hi))):
        nb, nc, nv = names   # the message names it
        check_unshared("state", state, ((nb, b), (nc, c), (nv, v), (decay_name, gamma_h), ("slot_ids", slot_ids)))


def _within(start: int, span: int, lo: int, hi: int) -> bool:
    """Whether bytes [start, start + span) meet [lo, hi)."""
    return start < hi and lo < start + span


_DECODE_STEPS: dict = {}
"""decode_step's validated signatures: signature → (the launch to repeat or None, γ's tensor or _GAMMA_AS_IS, the
output's template for :func:`problem.new_like`, the tensors' extents for :func:`_check_state_apart`).  The signature
holds each tensor's type, shape, strides, dtype and device and γ's kind (None or a number by type and value; a
tensor by type, shape, strides, dtype and device), so a call that matches it passes every check a first call made,
except γ's values, checked per tensor version, and the state's memory apart from the inputs', checked per call."""
_GAMMA_AS_IS = object()


def _check_decode_step(b_t, c_t, v_t, state) -> None:
    """decode_step's checks of its tensors (anything else: gamma, autograd, is checked on every call)."""
    (b_t, c_t, v_t), (B, H, r, d) = check_token_triple(("b_t", "c_t", "v_t"), b_t, c_t, v_t,
                                                       "(batch, heads, dim)", "batch and heads")
    check_dims(r, d, "decode_step")
    check_state("state", state, (B, H, r, d), v_t.device)
    check_own_memory("state", state)


def decode_tokens(b, c, v, state, gamma=None, *, slot_ids=None, keep_states: bool = False,
                  check_slots: bool = True, log_decay=None, parents=None):
    """k new tokens per sequence in one launch (speculative-decoding verification): k decode steps.

    Token j of row i updates the state, S ← γ S + c_jᵀ v_j, and gives o_j = b_j S, for j = 0 … k − 1,
    in order, in place on the state (docs/design.md §13.1).

    Args:
        b, c: ``(batch, heads_k, k, r)``; v: ``(batch, heads_v, k, d)``; k ≥ 1; one dtype and device.
            Grouped heads as in :func:`decode_step`: the state, γ, the decay and o have the most of the two.
        state: float32 ``(batch, heads, r, d)``, or with ``slot_ids`` a pool ``(slots, heads, r, d)``; written
            in place, so refused as in :func:`decode_step` when its elements overlap or it shares memory
            with what the call reads.
        gamma: as in :func:`linear_attention`.
        slot_ids, check_slots: as in :func:`decode_step`.
        keep_states: also return ``states``, float32 ``(batch, heads, k + 1, r, d)``: ``states[:, :, j]``
            is the state after the first j tokens (j = 0: the state before the call), so a server that
            accepts the first a_i tokens of row i rolls back with ``pool[slot_ids[i]] = states[i, :, a_i]``.
            A padding row's kept states are zeros.
        log_decay: a per-token decay instead of gamma: ``(batch, heads, k)``, a ≤ 0, token j's factor
            exp(a_j), as in :func:`decode_step`.
        parents: ``None`` (a chain), or an int32/int64 tensor ``(batch, k)`` on the inputs' device, any
            strides (read as it is): a tree of draft tokens per row (docs/design.md §13.7).  Token j's
            parent is ``parents[i, j]`` ∈ {−1, 0, …, j − 1}, −1 being the state before the call: its state is
            S_j = γ S_parent + c_jᵀ v_j and its output o_j = b_j S_j.  ``parents[i, j] = j − 1`` is the chain,
            with the same result.  The state (or pool) is then **not** written: ``states[:, :, j + 1]`` (with
            ``keep_states``) is token j's state and index 0 the state before the call, and
            :func:`leettriton.serving.commit_tree` writes the accepted node's state into the slot.  A parent
            outside −1 … j − 1 is read as −1 by the kernels (its values are not read on the host: no sync);
            CPU tensors outside the interpreter check them (ValueError).

    Returns:
        ``(o, state)``, or ``(o, state, states)`` with ``keep_states``: o ``(batch, heads, k, d)`` in v's
        dtype; ``state`` itself, after all k tokens (with ``parents``: as it was).

    Example::

        >>> o, pool, states = leettriton.decode_tokens(b, c, v, pool, 0.99, slot_ids=slots, keep_states=True)
        >>> pool[slots] = states[torch.arange(len(slots)), :, accepted]   # roll back (rows without padding)
    """
    check_bool("keep_states", keep_states)
    if ops.is_compiling():  # a trace: one registered operator (docs/design.md §4.6)
        _check_compiled_step(b, c, v, state, gamma, slot_ids, check_slots, False)
        return ops.decode_tokens(b, c, v, state, gamma, slot_ids=slot_ids, keep_states=keep_states,
                                 log_decay=log_decay, parents=parents)
    if parents is not None:  # a tree of draft tokens (docs/design.md §13.7): kernels/tree.py
        slot_ids = index_as_read(slot_ids)
        _check_decode_tokens(b, c, v, state, slot_ids, check_slots, False)
        out, kept = decode_tree(b, c, v, state, gamma, parents, slot_ids=slot_ids, keep_states=keep_states,
                                check_slots=check_slots, log_decay=log_decay)
    elif log_decay is not None:
        out, kept = _decode_per_token(b, c, v, state, gamma, log_decay, slot_ids, keep_states, check_slots, False)
    else:
        out, kept = _decode_tokens(b, c, v, state, gamma, slot_ids, keep_states, check_slots, one_token=False)
    return (out, state, kept) if keep_states else (out, state)


def _decode_tokens(b, c, v, state, gamma, slot_ids, keep_states: bool, check_slots: bool, *, one_token: bool):
    """Validate a slotted or multi-token step and launch it; returns (out (B, H, k, d), or (B, H, d) for
    ``one_token``, kept or None).

    As for :func:`decode_step`, a call whose signature (here also the slot ids' type, shape, strides, dtype
    and device, ``check_slots`` and ``keep_states``) was checked and launched before repeats its launch
    (docs/design.md §4.5); the slot ids' values are checked once per tensor version (docs/design.md §13.3).
    The slot ids are taken contiguous first, as the kernel reads them (:func:`problem.index_as_read`), so the
    signature, the checks and the launch all see the tensor the kernel reads."""
    slot_ids = index_as_read(slot_ids)
    try:
        g, s = gamma, slot_ids
        signature = (one_token, type(check_slots), check_slots, keep_states, type(b), type(c), type(v), type(state),
                     b.shape, c.shape, v.shape, state.shape, b.stride(), c.stride(), v.stride(), state.stride(),
                     b.dtype, c.dtype, v.dtype, state.dtype, b.device, c.device, v.device, state.device,
                     None if s is None else (type(s), s.shape, s.stride(), s.dtype, s.device),
                     (type(g), g.shape, g.stride(), g.dtype, g.device) if isinstance(g, torch.Tensor) else (type(g), g))
        step = _TOKEN_STEPS.get(signature)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable gamma: the checks say what
        signature = step = None
    if step is not None and not (torch.is_grad_enabled() and requires_grad(b, c, v, state, gamma)):
        launch, gamma_h, out_like, kept_like, slots, extents = step
        if slot_ids is not None:
            check_slot_values("slot_ids", slot_ids, slots, check_slots)
        if gamma_h is _GAMMA_AS_IS:
            check_gamma_values(gamma)
            gamma_h = gamma
        _check_state_apart(state, b, c, v, gamma_h, slot_ids, extents,
                           ("b_t", "c_t", "v_t") if one_token else ("b", "c", "v"))
        out = problem.new_like(out_like)  # one token: (B, H, d), as decode_step returns it
        if one_token:  # the one-token step's kernel, slotted (decode_step_impl)
            if launch is not None and launch((b, c, v, out, out if gamma_h is None else gamma_h, state, slot_ids)):
                return out, None
        else:
            kept = None if kept_like is None else problem.new_like(kept_like)
            if launch is not None and launch((b, c, v, out, out if gamma_h is None else gamma_h, state,
                                              state if slot_ids is None else slot_ids, state if kept is None else kept,
                                              out)):
                return out, kept
    if step is None:
        _check_decode_tokens(b, c, v, state, slot_ids, check_slots, one_token)
    B, H, r = b.shape[0], state.shape[1], b.shape[-1]   # H: the output's (grouped heads, docs/design.md §1.7)
    K = 1 if one_token else b.shape[2]
    d = v.shape[-1]
    if slot_ids is not None:
        check_slot_values("slot_ids", slot_ids, state.shape[0], check_slots)
    check_constant_gamma(gamma)
    check_autograd("decode_step" if one_token else "decode_tokens", b, c, v, state)
    gamma_h = resolve_gamma(gamma, H, v.device)
    extents = _extents(state, b, c, v, gamma_h, slot_ids)
    names = ("b_t", "c_t", "v_t") if one_token else ("b", "c", "v")
    _check_state_apart(state, b, c, v, gamma_h, slot_ids, extents, names)
    out = problem.new_empty((B, H, d) if one_token else (B, H, K, d), v.dtype, v.device)
    kept_shape = (B, H, K + 1, r, d) if keep_states else None
    kept = problem.new_empty(kept_shape, torch.float32, v.device) if keep_states else None
    if not (B and H):
        launch = None
    elif one_token:  # one token, slotted: the one-token step's kernel with its slot flag (one kernel, one tuning)
        launch = decode_step_impl(b, c, v, state, gamma_h, out, slot_ids)
    else:
        launch = decode_tokens_impl(b, c, v, state, gamma_h, out, slot_ids, kept)
    if signature is not None and (gamma_h is None or gamma_h is gamma or not isinstance(gamma, torch.Tensor)):
        if len(_TOKEN_STEPS) >= 1024:
            _TOKEN_STEPS.clear()
        as_is = gamma_h is not None and gamma_h is gamma
        out_like = problem.output_template((B, H, d) if one_token else (B, H, K, d), v.dtype, v.device)
        kept_like = None if kept_shape is None else problem.output_template(kept_shape, torch.float32, v.device)
        _TOKEN_STEPS[signature] = (launch, _GAMMA_AS_IS if as_is else gamma_h, out_like, kept_like, state.shape[0],
                                   extents)
    return out, kept


def _decode_per_token(b, c, v, state, gamma, log_decay, slot_ids, keep_states: bool, check_slots: bool,
                      one_token: bool):
    """A decode step (``one_token``) or k steps with a per-token decay (docs/design.md §1.6): the k-token kernel
    with its ``PER_TOKEN_DECAY`` flag (one token: a token axis of one).  Returns (out, kept or None).

    As for a constant γ (:func:`_decode_tokens`), a call whose signature (the tensors' types, shapes, strides,
    dtypes and devices, the decay's included, and the flags) was checked and launched before repeats its
    launch: the slot ids' and the decay's values checked as on every call, the state's memory apart from what
    the step reads (docs/design.md §4.5)."""
    where = "decode_step" if one_token else "decode_tokens"
    slot_ids = index_as_read(slot_ids)
    try:
        s, a = slot_ids, log_decay
        signature = ("log_decay", one_token, type(check_slots), check_slots, keep_states, type(b), type(c), type(v),
                     type(state), type(a), b.shape, c.shape, v.shape, state.shape, a.shape, b.stride(), c.stride(),
                     v.stride(), state.stride(), a.stride(), b.dtype, c.dtype, v.dtype, state.dtype, a.dtype, b.device,
                     c.device, v.device, state.device, a.device, gamma is None,
                     None if s is None else (type(s), s.shape, s.stride(), s.dtype, s.device))
        step = _TOKEN_STEPS.get(signature)
    except (AttributeError, TypeError, RuntimeError):  # not tensors: the checks say what
        signature = step = None
    if step is not None and not (torch.is_grad_enabled() and requires_grad(b, c, v, state, log_decay)):
        launch, _, out_like, kept_like, slots, extents = step
        if slot_ids is not None:
            check_slot_values("slot_ids", slot_ids, slots, check_slots)
        problem.check_log_decay_values(log_decay)
        names = ("b_t", "c_t", "v_t") if one_token else ("b", "c", "v")
        _check_state_apart(state, b, c, v, log_decay, slot_ids, extents, names, "log_decay")
        out, kept = problem.new_like(out_like), None if kept_like is None else problem.new_like(kept_like)
        if one_token:
            b3, c3, v3, ld = b.unsqueeze(2), c.unsqueeze(2), v.unsqueeze(2), log_decay.unsqueeze(-1)
        else:
            b3, c3, v3, ld = b, c, v, log_decay
        if launch is not None and launch((b3, c3, v3, out, out, state, state if slot_ids is None else slot_ids,
                                          state if kept is None else kept, ld)):
            return (out.squeeze(2) if one_token else out), kept
    _check_decode_tokens(b, c, v, state, slot_ids, check_slots, one_token)
    check_autograd(where, b, c, v, state, log_decay)
    if one_token:
        b, c, v = b.unsqueeze(2), c.unsqueeze(2), v.unsqueeze(2)
    B, _, K, r = b.shape
    H = state.shape[1]   # the output's heads: b, c, v may be grouped (docs/design.md §1.7)
    d = v.shape[-1]
    shape, axes = ((B, H), "(batch, heads)") if one_token else ((B, H, K), "(batch, heads, k)")
    ld = problem.resolve_log_decay(log_decay, gamma, shape, v.dtype, v.device, where=where, axes=axes)
    if one_token:
        ld = ld.unsqueeze(-1)
    if slot_ids is not None:
        check_slot_values("slot_ids", slot_ids, state.shape[0], check_slots)
    names = ("b_t", "c_t", "v_t") if one_token else ("b", "c", "v")
    check_unshared("state", state, ((names[0], b), (names[1], c), (names[2], v), ("log_decay", log_decay),
                                    ("slot_ids", slot_ids)))
    out = problem.new_empty((B, H, K, d), v.dtype, v.device)
    kept_shape = (B, H, K + 1, r, d) if keep_states else None
    kept = problem.new_empty(kept_shape, torch.float32, v.device) if keep_states else None
    launch = decode_tokens_impl(b, c, v, state, None, out, slot_ids, kept, log_decay=ld) if B and H else None
    if signature is not None:
        if len(_TOKEN_STEPS) >= 1024:
            _TOKEN_STEPS.clear()
        out_like = problem.output_template((B, H, K, d), v.dtype, v.device)
        kept_like = None if kept_shape is None else problem.output_template(kept_shape, torch.float32, v.device)
        extents = _extents(state, b, c, v, log_decay, slot_ids)
        _TOKEN_STEPS[signature] = (launch, None, out_like, kept_like, state.shape[0], extents)
    return (out.squeeze(2) if one_token else out), kept


_TOKEN_STEPS: dict = {}
"""The slotted / k-token step's validated signatures: signature → (the launch to repeat, γ's tensor or
_GAMMA_AS_IS, the output's template (one token: without the token axis), the kept states' template or None,
the number of state rows, the tensors' extents), as :data:`_DECODE_STEPS`."""


VARLEN_NATIVE = ("lightning_attention", "block_based")
"""Methods whose kernels walk a packed batch natively (the packed chunk walk: docs/design.md §13.2)."""


def linear_attention_varlen(b, c, v, cu_seqlens, gamma=None, *, method: str = "auto", state_pool=None, slot_ids=None,
                            has_initial_state=None, return_state: bool = False, precision: Optional[str] = None,
                            check_indices: bool = True, log_decay=None, out=None, checkpoint_every=None,
                            checkpoint_slots=None):
    """The operator over a packed batch of variable-length sequences, each on its own (docs/design.md §13.2).

    Sequence i is rows [cu_seqlens[i], cu_seqlens[i + 1]) of the packed tokens; its output is that of
    :func:`linear_attention` run on it alone, from its initial state.

    Args:
        b, c: ``(T, heads_k, r)``; v: ``(T, heads_v, d)``: the tokens of every sequence, one after the other
            (float16, bfloat16 or float32; any strides: no copy is made).  Grouped heads as in
            :func:`linear_attention` (docs/design.md §1.7): gamma, the pool, the states and the output have
            heads = max(heads_k, heads_v).
        cu_seqlens: int32/int64 ``(N + 1,)`` on the inputs' device: 0, then non-decreasing, ending at most at
            T.  Zero-length sequences are allowed; rows past ``cu_seqlens[-1]`` are padding (a fixed-size
            buffer's: neither read nor written), as are the sequences of a fixed-size ``cu_seqlens`` whose
            offsets repeat (empty).
        gamma: as in :func:`linear_attention` (per head, shared by the sequences).
        method: ``"auto"`` (the packed chunk walk), ``"lightning_attention"`` or ``"block_based"`` (the same
            walk), or a ``"<method>_torch"`` twin (one PyTorch call per sequence: a reference path, with a
            loop over sequences on the host).  CPU tensors outside the interpreter run
            ``lightning_attention_torch`` that way.  Other methods raise ``NotImplementedError``.
        state_pool: float32 ``(slots, heads, r, d)``, or None.  With a pool, sequence i starts from
            ``state_pool[slot_ids[i]]`` when ``has_initial_state[i]`` (else from zero), and its final state
            is written to that slot **in place**.  Slots no sequence names are not touched.  A pool whose
            elements overlap (an expanded one), or that shares memory with b, c, v, gamma or an index
            tensor, is refused with a ValueError before any work (docs/design.md §13.3).
        slot_ids: int32/int64 ``(N,)``: each sequence's slot (needed with a pool); a negative id: the
            sequence starts from zero and its final state is not kept.
        has_initial_state: bool ``(N,)`` (or integer, nonzero = true), or None: every sequence starts from zero.
            cu_seqlens, slot_ids and has_initial_state may have any strides: a strided one is copied to a
            contiguous tensor on every call, and the value checks read that copy, which is what the kernel
            reads (docs/design.md §13.3).
        return_state: without a pool, also return the final states, float32 ``(N, heads, r, d)``; with a
            pool, also return the pool itself.
        precision: as in :func:`linear_attention`.
        check_indices: check the values of cu_seqlens, slot_ids and checkpoint_slots (one device sync each on
            CUDA, once per tensor version); ``False`` skips it (the kernel clamps what it reads, so bad offsets give wrong
            rows, never an access out of bounds; a repeated slot is a race).
        log_decay: a per-token decay instead of gamma, ``(T, heads)`` (a ≤ 0, float32 or the inputs' dtype, any
            strides; docs/design.md §1.6), read by the packed chunk walk as it is (``auto``,
            ``"lightning_attention"``, ``"block_based"``) or by a ``"<method>_torch"`` twin.
        out: a preallocated output ``(T, heads, d)`` of v's dtype, written in place (its padding rows are left
            as they are) and returned; with fixed-size buffers, ``check_indices=False`` and ``slot_ids`` −1 for
            padding sequences, a batch of prefills and one-token decodes is one call whose launch does not
            depend on values, so a CUDA graph can capture it (docs/design.md §13.8).
        checkpoint_every: K, a positive multiple of 64, with ``checkpoint_slots``: state checkpoints for prefix
            caching (docs/design.md §13.9).  Sequence i's state after each K-th of its own rows, (j + 1)·K, is
            written to ``state_pool[checkpoint_slots[i, j]]``: the final state :func:`linear_attention` of its
            first (j + 1)·K rows from its start state returns, so a later call that starts from that slot
            continues it.  Written by the same launch as the prefill (no further pass over b, c, v), by every
            packed method (``auto``, ``"lightning_attention"``, ``"block_based"``, the ``"<method>_torch"``
            twins), with γ or ``log_decay``.
        checkpoint_slots: int32/int64 ``(N, M)``, any strides (a strided one is copied once, as the other index
            tensors): entry [i, j] the pool slot of sequence i's j-th checkpoint, −1 for none; checkpoints past a
            sequence's length (j ≥ length // K) and past M are not written.  Needs a pool.  Its values are checked
            with the other indices (``check_indices``): each in [−1, slots), no slot twice and none shared with
            ``slot_ids`` (two writes of one state), else a ValueError before any work; unchecked, the kernel
            writes only slots in [0, slots).

    Returns:
        The output ``(T, heads, d)`` in v's dtype; with ``return_state=True``, ``(output, states)``.

    Forward only: inputs that require grad are refused.  One launch for the whole batch (per 256 keys of r).

    Example::

        >>> cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32, device="cuda")     # 3 prompts, one empty
        >>> pool = torch.zeros(64, heads, r, d, device="cuda")
        >>> slots = torch.tensor([7, 3, 12], device="cuda")
        >>> o = leettriton.linear_attention_varlen(b, c, v, cu, 0.99, state_pool=pool, slot_ids=slots)
        >>> o_t, pool = leettriton.decode_step(b_t, c_t, v_t, pool, 0.99, slot_ids=slots)   # then decode
    """
    if ops.is_compiling():  # a trace: one registered operator (docs/design.md §4.6)
        # the checks of metadata alone, made while tracing (γ's: split_gamma's)
        make_varlen_problem(b, c, v, cu_seqlens, None, state_pool=state_pool, slot_ids=slot_ids,
                            has_initial_state=has_initial_state, return_state=return_state, precision=precision,
                            check_indices=False, out=out, checkpoint_every=checkpoint_every,
                            checkpoint_slots=checkpoint_slots)
        return ops.linear_attention_varlen(b, c, v, cu_seqlens, gamma, method=method, state_pool=state_pool,
                                           slot_ids=slot_ids, has_initial_state=has_initial_state,
                                           return_state=return_state, precision=precision, log_decay=log_decay,
                                           out=out, checkpoint_every=checkpoint_every,
                                           checkpoint_slots=checkpoint_slots)
    name = registry.canonical_method(method)
    p, out = make_varlen_problem(b, c, v, cu_seqlens, gamma, state_pool=state_pool, slot_ids=slot_ids,
                                 has_initial_state=has_initial_state, return_state=return_state,
                                 precision=precision, check_indices=check_indices, out=out,
                                 checkpoint_every=checkpoint_every, checkpoint_slots=checkpoint_slots)
    B, H, T, r, d = p.shape
    if log_decay is not None:
        check_autograd("linear_attention_varlen", log_decay)
        ld = problem.resolve_log_decay(log_decay, gamma, (T, H), p.v.dtype, p.v.device,
                                       where="linear_attention_varlen", axes="(T, heads)")
        p.log_decay = ld.transpose(0, 1).unsqueeze(0)   # (1, H, T), a view
        if registry.torch_method(name) is None and name not in ("auto",) + VARLEN_NATIVE:
            raise NotImplementedError(
                f"linear_attention_varlen: method {name!r} does not take a per-token decay (log_decay) for a packed "
                f"batch; use 'auto', {', '.join(repr(m) for m in VARLEN_NATIVE)} or a '<method>_torch' twin")
    if name in ("auto",) + VARLEN_NATIVE and p.v.device.type == "cpu" and not is_interpreting():
        name = "lightning_attention_torch"
    if registry.torch_method(name) is not None:
        _varlen_by_sequence(p, registry.torch_method(name))
    elif name in ("auto",) + VARLEN_NATIVE:
        if p.num_seqs and H:
            launch_varlen_walk(p)
    else:
        raise NotImplementedError(
            f"linear_attention_varlen: method {name!r} has no packed (variable-length) path; use 'auto', "
            f"{', '.join(repr(m) for m in VARLEN_NATIVE)} or a '<method>_torch' twin")
    return (out, p.state) if return_state else out


def _varlen_by_sequence(p, twin) -> None:
    """The packed batch one sequence at a time through a PyTorch twin (a loop on the host: the reference path).
    With checkpoints (docs/design.md §13.9) a sequence runs as consecutive calls of K rows and a last shorter
    one, each from the state the one before returned, the state after each K-th row written to its slot."""
    B, H, T, r, d = p.shape
    bounds = p.cu_seqlens.tolist()
    slots = p.slot_ids.tolist() if p.slot_ids is not None else None
    starts = p.has_initial.tolist() if p.has_initial is not None else None
    every = p.checkpoint_every
    table = p.checkpoint_slots.tolist() if p.checkpoint_slots is not None else None
    for i in range(p.num_seqs):
        slot = slots[i] if slots is not None else i
        initial = p.initial_state[slot:slot + 1] if starts is not None and starts[i] and slot >= 0 else None
        final = torch.empty((1, H, r, d), dtype=torch.float32, device=p.v.device)
        start, end = bounds[i], bounds[i + 1]
        step = every or max(end - start, 1)
        for j, first in enumerate(range(start, end, step)):
            rows = slice(first, min(first + step, end))
            if j:
                initial = final.clone()   # the state after the rows before: this piece's start
            twin(Problem(p.b[:, :, rows], p.c[:, :, rows], p.v[:, :, rows], p.gamma, initial, p.out[:, :, rows], final,
                         p.precision, log_decay=None if p.log_decay is None else p.log_decay[:, :, rows]))
            at = table[i][j] if table is not None and j < len(table[i]) else -1
            if every and rows.stop - rows.start == every and 0 <= at < p.pool_slots:
                p.state[at:at + 1].copy_(final)
        if end == start:
            final.copy_(initial) if initial is not None else final.zero_()
        if p.state is not None and slot >= 0:
            p.state[slot:slot + 1].copy_(final)


def _check_compiled_step(b, c, v, state, gamma, slot_ids, check_slots, one_token: bool) -> None:
    """A traced step's checks: those of its tensors' metadata, made while tracing; the slot ids' values are
    left to the kernel's guard (docs/design.md §4.6)."""
    if one_token and slot_ids is None:
        _check_decode_step(b, c, v, state)
    else:
        _check_decode_tokens(b, c, v, state, slot_ids, check_slots, one_token)
    check_constant_gamma(gamma)
    ops.split_gamma(gamma, max(b.shape[1], c.shape[1], v.shape[1]), v.device)
    check_autograd("decode_step" if one_token else "decode_tokens", b, c, v, state)


def _check_decode_tokens(b, c, v, state, slot_ids, check_slots: bool, one_token: bool) -> None:
    """The slotted / multi-token step's checks of its tensors (the slot ids' values: check_slot_values)."""
    names = ("b_t", "c_t", "v_t") if one_token else ("b", "c", "v")
    rank = 3 if one_token else 4
    dims = "(batch, heads, dim)" if one_token else "(batch, heads, k, dim)"
    b, c, v = (check_tensor(name, x) for name, x in zip(names, (b, c, v)))
    for name, x in zip(names, (b, c, v)):
        if x.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D {dims}, got shape {tuple(x.shape)}")
    if not (b.dtype == c.dtype == v.dtype):
        raise TypeError(f"{', '.join(names[:2])} and {names[2]} must share one dtype, got {b.dtype}, {c.dtype}, "
                        f"{v.dtype}")
    if not (b.device == c.device == v.device):
        raise ValueError(f"{', '.join(names[:2])} and {names[2]} must be on one device, got {b.device}, "
                         f"{c.device}, {v.device}")
    if one_token:
        b, c, v = b.unsqueeze(2), c.unsqueeze(2), v.unsqueeze(2)
    B, H, K, r = b.shape
    lead = "batch and heads" if one_token else "batch, heads and k"
    shapes = tuple(x.squeeze(2).shape if one_token else x.shape for x in (b, c, v))
    c_wrong = f"{names[1]} must have the shape of {names[0]} {shapes[0]}, got {shapes[1]}"
    v_wrong = f"{names[2]} must match {names[0]} in {lead}: {names[0]} has shape {shapes[0]}, {names[2]} has shape {shapes[2]}"
    if (c.shape[0], c.shape[2], c.shape[3]) != (B, K, r):
        raise ValueError(c_wrong)
    if (v.shape[0], v.shape[2]) != (B, K):
        raise ValueError(v_wrong)
    # grouped heads (docs/design.md §1.7): the output's heads are the most of the three, each dividing it
    H = check_heads(names, (H, c.shape[1], v.shape[1]), c_wrong, v_wrong)
    if K < 1:
        raise ValueError(f"decode_tokens needs k ≥ 1 new tokens per sequence, got k = {K}")
    d = v.shape[-1]
    check_dims(r, d, "decode_tokens")
    check_bool("check_slots", check_slots)
    if slot_ids is None:
        check_state("state", state, (B, H, r, d), v.device)
    else:
        check_pool("state", state, H, r, d, v.device)
        check_index("slot_ids", slot_ids, B, v.device, "the state pool's slot of each batch row, < 0: padding")
    check_own_memory("state", state)


def causal_linear_decoder(B, C, V, is_mask_weight: bool = False, gamma=None, attn_method: Optional[str] = None):
    """LeetDecoding's ``causal_linear_decoder(q, k, v, is_mask_weight, gamma, attn_method)``.

    Args:
        B, C: ``(batch, heads, n, r)``; V: ``(batch, heads, n, d)``.
        is_mask_weight: False for the plain causal mask (γ = 1); True for the
            decayed mask, which needs ``gamma``.
        gamma: **the decay factor itself**, as in the paper's formula
            M[i, j] = γ^(i−j): a float in (0, 1] or a tensor of shape ``(heads,)``.
            (LeetDecoding's ``is_need_exp`` path, which took −ln γ, is not offered:
            pass ``torch.exp(-x)`` yourself.)
        attn_method: a method name, in leettriton's or the paper's spelling
            (``"lightningAttention2"``, ``"FleetAttention"``, ``"block-based"``, ...),
            a registered user method, or ``None`` for the fastest (``"auto"``).

    Returns:
        The output ``(batch, heads, n, d)`` in V's dtype.
    """
    gamma, method = decoder_arguments(is_mask_weight, gamma, attn_method)
    return linear_attention(B, C, V, gamma, method=method)


ops.bind(linear_attention=linear_attention, linear_attention_varlen=linear_attention_varlen,
         decode_step=decode_step, decode_tokens=decode_tokens)
