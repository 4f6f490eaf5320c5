"""The backward pass: the operator's gradients as three more calls of the operator (docs/design.md §10).

With do = ∂L/∂O and dS = ∂L/∂S_{n−1} (the returned final state's gradient, or none), per batch
element and head:

    db_i  = Σ_{j ≤ i} γ^(i−j) (do_i · v_j) c_j + γ^(i+1) do_i S₀ᵀ
    dc_j  = Σ_{i ≥ j} γ^(i−j) (do_i · v_j) b_i + γ^(n−1−j) v_j dSᵀ
    dv_j  = Σ_{i ≥ j} γ^(i−j) (b_i · c_j) do_i + γ^(n−1−j) c_j dS
    dS₀   = γ Σ_i γ^i b_iᵀ do_i + γ^n dS

db is the operator itself with (b, c, v, S₀) = (do, v, c, S₀ᵀ).  dc and dv are the operator run
backwards in time: with rows reversed (flip along n), i ≥ j becomes i' ≤ j', so
dc = flip(LA(flip(v), flip(do), flip(b))) and dv = flip(LA(flip(c), flip(b), flip(do))); the reversed
dv call's final state is Σ_i γ^i b_iᵀ do_i, which gives dS₀.  No flip is a copy: each reversed call is a
reversed problem (``Problem.reverse``), whose kernels read and write row t at row n − 1 − t of the
tensors as they are (kernels/abi.py), so its output comes out in the caller's order.  Where the method
that runs cannot address rows so (a user method, a PyTorch method, a backward with ``create_graph``),
the flips are copies made by one kernel (kernels/reverse.py): v, b and do reversed by one launch, then
c, then each output back (docs/design.md §10.3).  The terms in dS are one product each.
Every decay factor is exp2(λ · distance) with distance ≥ 0: nothing is divided by a decay.

So every method -- and ``auto``, which chooses again for each of the three calls -- has a backward
with no kernel of its own, and the only tensors kept from the forward are its inputs.

Grouped heads (docs/design.md §1.7): b, c or v may have fewer heads than the output.  The three calls then
take them as they are (the kernels read each group's head, no copy) and give each gradient per output head,
(batch, H, n, ·); the terms of the final state's gradient are formed per output head by broadcasting the
group; then the gradient of a shared tensor is the sum over its group, one ``sum`` over a view that splits
the heads into (heads, group) (:func:`group_sum`).  dS₀, dγ and da are per output head, as their tensors.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional

import torch

from . import registry
from .autotune.families import is_interpreting
from .kernels.decay_grad import decay_grad
from .kernels.reverse import reverse_rows
from .plan import run_problem, run_reversed
from .problem import log2_gamma64, make_problem, requires_grad, resolve_gamma, to_bhnd

__all__ = ["LinearAttentionFunction", "attach_backward", "output_grads", "reversed_call", "forward_call", "add_state_term",
           "initial_state_grad", "log2_gamma", "add_tail_term", "initial_state_grad_of", "decay_prefix", "decay_grad_of",
           "reversed_decay", "all_grads"]

Operator = Callable
"""``op(b, c, v, gamma, *, initial_state=None, return_state=False)`` -> ``o`` or ``(o, state)``: the
forward operator with its method, layout and precision fixed (``functools.partial`` of
``linear_attention``), called by the forward and by each of the three calls of the backward.  The
reversed calls read the method and precision from the partial's keywords (:func:`reversed_call`); any
other callable is run on reversed copies."""


class LinearAttentionFunction(torch.autograd.Function):
    """O (and the final state) as an autograd node whose backward is three calls of the same operator.

    ``apply(b, c, v, initial_state, gamma, op, layout, return_state, log_decay)``: b, c, v in ``layout``;
    initial_state ``(batch, heads, r, d)`` or None; gamma as ``linear_attention`` takes it (a tensor may
    require grad: a learnable decay); ``op`` the :data:`Operator`; ``log_decay`` the per-token decay (or
    None).  Saves b, c, v, the initial state, a gamma tensor, the per-token decay and, when a decay's
    gradient is asked for and the state is returned, the final state; nothing else.
    """

    @staticmethod
    def forward(ctx, b, c, v, initial_state, gamma, op: Operator, layout: str, return_state: bool, log_decay=None):
        ctx.set_materialize_grads(False)  # a gradient that is not given (an unused output) is None, not zeros
        kw = {} if log_decay is None else {"log_decay": log_decay}
        result = op(b, c, v, gamma, initial_state=initial_state, return_state=return_state, **kw)
        ctx.op, ctx.layout = op, layout
        ctx.gamma = None if isinstance(gamma, torch.Tensor) else gamma
        decay_grad = ctx.needs_input_grad[4] or (len(ctx.needs_input_grad) > 8 and ctx.needs_input_grad[8])
        final = result[1] if (return_state and decay_grad) else None
        ctx.save_for_backward(b, c, v, initial_state, gamma if isinstance(gamma, torch.Tensor) else None, log_decay,
                              final)
        return result

    @staticmethod
    def backward(ctx, grad_out, grad_state=None):
        b, c, v, s0, gamma_tensor, log_decay, final = ctx.saved_tensors
        gamma = ctx.gamma if gamma_tensor is None else gamma_tensor
        need = ctx.needs_input_grad
        db, dc, dv, ds0, dgamma, da = all_grads(
            ctx.op, b, c, v, s0, gamma, log_decay, final, grad_out, grad_state, ctx.layout, need_b=need[0],
            need_c=need[1], need_v=need[2], need_s0=need[3], need_gamma=need[4], need_a=len(need) > 8 and need[8])
        grads = (db, dc, dv, ds0, dgamma, None, None, None, da)
        return grads[:len(need)]   # apply may be given eight inputs (no log_decay)


def all_grads(op: Operator, b, c, v, s0, gamma, log_decay, final, grad_out, grad_state, layout: str, *, need_b: bool,
              need_c: bool, need_v: bool, need_s0: bool, need_gamma: bool, need_a: bool):
    """Every gradient of the operator (docs/design.md §10, §10.6): ``(db, dc, dv, dS₀, dγ, da)``,
    each None unless asked for.  ``final`` is the returned final state (needed for a decay's gradient when
    the state has a gradient), ``gamma`` a tensor for dγ, ``log_decay`` the per-token decay or None."""
    decay_grad = need_gamma or need_a
    db, dc, dv, state_rev = output_grads(op, b, c, v, s0, gamma, grad_out, layout, need_b=need_b or decay_grad,
                                         need_c=need_c or decay_grad, need_v=need_v, need_state=need_s0,
                                         log_decay=log_decay)
    ds0 = None
    n = to_bhnd(b, layout).shape[2]
    heads = max(to_bhnd(x, layout).shape[1] for x in (b, c, v))   # the output's (grouped heads: §1.7)
    G = decay_prefix(gamma, log_decay, heads, n, layout, v.device)
    if grad_state is not None or state_rev is not None:
        tail = None if G is None else G[..., -1:] - G                       # a_{j+1} + … + a_{n−1} ≤ 0
        if grad_state is not None:
            if need_c or decay_grad:
                dc = add_tail_term(dc, v, grad_state.transpose(-1, -2), tail, layout, c.dtype)
            if need_v:
                dv = add_tail_term(dv, c, grad_state, tail, layout, v.dtype)
        if need_s0:
            ds0 = initial_state_grad_of(state_rev, grad_state, G)
    da = dgamma = None
    if decay_grad:
        da = decay_grad_of(b, c, db, dc, grad_state, final, layout, n)
        if need_gamma:
            # a_t = ln γ_h for every t: dγ_h = Σ_{batch, t} da_t / γ_h
            dgamma = (da.sum(dim=(0, 2)) / gamma.detach().reshape(heads).double()).reshape(
                gamma.shape).to(gamma.dtype)
        da = to_bhnd_3(da, layout).to(log_decay.dtype) if need_a else None
    # per output head so far: the gradient of a shared (grouped) tensor sums its group
    db = group_sum(db, b, layout) if need_b else None
    dc = group_sum(dc, c, layout) if need_c else None
    dv = group_sum(dv, v, layout)
    return db, dc, dv, ds0, dgamma, da


def group_sum(grad: Optional[torch.Tensor], x: torch.Tensor, layout: str) -> Optional[torch.Tensor]:
    """``grad`` (per output head, in ``layout``) summed over the group of output heads that read each head of
    ``x`` (docs/design.md §1.7): ``grad`` itself where ``x`` has a head per output head; else one ``sum`` over
    the view that splits the head axis into (x's heads, group), in ``grad``'s dtype."""
    axis = 1 if layout == "bhnd" else 2
    if grad is None or grad.shape[axis] == x.shape[axis]:
        return grad
    return grad.unflatten(axis, (x.shape[axis], -1)).sum(axis + 1)


def _by_group(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, h, ·, ·)`` (``h`` dividing ``heads``) as ``(B, h, 1, ·, ·)``, to broadcast against a tensor of
    ``heads`` heads split as ``(B, h, heads / h, ·, ·)`` (:func:`_split`): each head meets its group, no copy."""
    return x.unsqueeze(2)


def _split(y: torch.Tensor, h: int) -> torch.Tensor:
    """``y`` ``(B or 1, H, …)`` viewed as ``(B or 1, h, H / h, …)``: its heads in groups of h (a view; groups of
    one where y has h heads, no heads included)."""
    return y.unsqueeze(2) if y.shape[1] == h else y.unflatten(1, (h, -1))


def _reverse_rows(tensors, layout: str) -> list:
    """:func:`reverse_rows` of the backward's tensors, one launch for those of one head count (grouped heads:
    b, c, v and the output's gradient may differ in heads, docs/design.md §1.7)."""
    axis = 1 if layout == "bhnd" else 2
    if len({x.shape[axis] for x in tensors}) == 1:
        return reverse_rows(tensors, layout, check=False)
    return [reverse_rows([x], layout, check=False)[0] for x in tensors]


def to_bhnd_3(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A ``(batch, heads, n)`` tensor in ``layout``'s order (``bnhd``: ``(batch, n, heads)``), a view."""
    return x if layout == "bhnd" else x.transpose(1, 2)


def decay_prefix(gamma, log_decay, heads: int, n: int, layout: str, device) -> Optional[torch.Tensor]:
    """G_t = a_0 + … + a_t in float64, ``(batch or 1, heads, n)``, or None without decay: the per-token decay's
    prefix sum, or t + 1 times ln γ (docs/design.md §10.6).  A value > 0 or NaN is NaN (as on every path).
    None for an empty sequence too (no factor to apply)."""
    if n == 0:
        return None
    if log_decay is not None:
        a = to_bhnd_3(log_decay.detach(), layout).double()
        a = torch.where(a <= 0, a, torch.full((), float("nan"), dtype=a.dtype, device=a.device))
        return torch.cumsum(a, dim=-1)
    lam = log2_gamma(gamma.detach() if isinstance(gamma, torch.Tensor) else gamma, heads, device)
    if lam is None:
        return None
    t = torch.arange(1, n + 1, device=device, dtype=torch.float64)
    return (lam * math.log(2.0)).view(1, -1, 1) * t.view(1, 1, -1)


def decay_grad_of(b, c, db, dc, ds, final, layout: str, n: int) -> torch.Tensor:
    """∂L/∂a_t (float64, ``(batch, heads, n)``) from the gradients of b and c (the full ones: with the
    initial and the final state's terms) and the final state's: dG_i = b_i · db_i − c_i · dc_i, plus
    Σ dS ⊙ S_{n−1} at i = n − 1 when the state was returned, then da_t = Σ_{i ≥ t} dG_i
    (docs/design.md §10.6).  The products are summed in float32.  Where the kernels run (CUDA tensors, or
    CPU tensors under the interpreter) dG is one pass of kernels/decay_grad.py, reading b, c, db, dc as they
    are; on the CPU otherwise, the same sums in PyTorch on float32 copies."""
    some = db if db is not None else dc
    if some is None:   # neither gradient: no term
        bb = to_bhnd(b, layout)
        heads = final.shape[1] if final is not None else bb.shape[1]
        dG = torch.zeros((bb.shape[0], heads, bb.shape[2]), dtype=torch.float64, device=bb.device)
    elif some.device.type == "cuda" or is_interpreting():
        dG = decay_grad(b, c, db, dc, layout, check=False).double()
    else:
        dG = _decay_grad_torch(b, c, db, dc, layout).double()
    if ds is not None and final is not None and n:
        dG[..., -1] += (ds.double() * final.double()).sum(dim=(-1, -2))
    return torch.flip(torch.cumsum(torch.flip(dG, [-1]), -1), [-1])


def _decay_grad_torch(b, c, db, dc, layout: str) -> torch.Tensor:
    """dG_i = b_i · db_i − c_i · dc_i (float32, ``(batch, heads, n)``; db or dc may be None, not both) in
    PyTorch: the CPU's form of :func:`~leettriton.kernels.decay_grad.decay_grad`."""
    bb, cc = to_bhnd(b, layout).float(), to_bhnd(c, layout).float()
    # db, dc per output head; b, c per their own heads (grouped heads: each meets its group, §1.7)
    dG = None
    if db is not None:
        dG = (_by_group(bb) * _split(to_bhnd(db, layout).float(), bb.shape[1])).sum(-1).flatten(1, 2)
    if dc is not None:
        term = (_by_group(cc) * _split(to_bhnd(dc, layout).float(), cc.shape[1])).sum(-1).flatten(1, 2)
        dG = -term if dG is None else dG - term
    return dG


def output_grads(op: Operator, b, c, v, s0, gamma, grad_out, layout: str, *, need_b: bool, need_c: bool,
                 need_v: bool, need_state: bool, log_decay=None):
    """The output's share of the gradients: the three calls of docs/design.md §10.1 with no final-state term.

    ``grad_out`` is ∂L/∂O in ``layout`` (or None: every result None); ``s0`` the forward's initial state (or
    None).  Returns ``(db, dc, dv, state_rev)``, each None unless asked for: db, dc, dv in the inputs' dtype,
    and ``state_rev`` = Σ_i γ^i b_iᵀ do_i (float32 ``(batch, heads, r, d)``), the reversed dv call's final
    state, from which :func:`initial_state_grad` forms dS₀.

    With a per-token decay a (``log_decay``, in ``layout``), db's call takes a as it is, and the reversed
    calls take the reversed decays a'_t = a_{n−t} (a'_0 = 0: M transposed, docs/design.md §10.6), on reversed
    copies; ``state_rev`` is then Σ_i exp(a_1 + … + a_i) b_iᵀ do_i.
    """
    db = dc = dv = state_rev = None
    if grad_out is None:
        return db, dc, dv, state_rev
    if need_b:
        # a gradient may come expanded (stride 0): the call gets a copy, freed when it returns
        do = grad_out.contiguous()
        s0_t = None if s0 is None else s0.transpose(-1, -2)
        db = forward_call(op, do, v, c, gamma, layout, initial_state=s0_t, log_decay=log_decay)
        if db is None:
            kw = {} if log_decay is None else {"log_decay": log_decay}
            db = op(do, v, c, gamma, initial_state=s0_t, **kw)
    if not (need_c or need_v or need_state):
        return db, dc, dv, state_rev
    if log_decay is not None:
        return (db,) + _reversed_per_token(op, b, c, v, gamma, grad_out, layout, log_decay, need_c=need_c,
                                           need_v=need_v, need_state=need_state)
    # the reversed calls read the tensors as they are (docs/design.md §10.3); a call whose method cannot
    # takes reversed copies, each freed as soon as its last call has read it (peak memory), b and do shared
    b_rev = do_rev = None
    if need_c:
        dc = reversed_call(op, v, grad_out, b, gamma, layout)
        if dc is None:
            v_rev, b_rev, do_rev = _reverse_rows([v, b, grad_out], layout)
            rev = op(v_rev, do_rev, b_rev, gamma)
            del v_rev
            if not (need_v or need_state):
                b_rev = do_rev = None
            (dc,) = reverse_rows([rev], layout, check=False)
            del rev
    if need_v or need_state:
        res = reversed_call(op, c, b, grad_out, gamma, layout, return_state=need_state)
        if res is None:
            if b_rev is None:
                b_rev, do_rev = _reverse_rows([b, grad_out], layout)
            (c_rev,) = reverse_rows([c], layout, check=False)
            res = op(c_rev, b_rev, do_rev, gamma, return_state=need_state)
            del c_rev
            b_rev = do_rev = None
            rev, state_rev = res if need_state else (res, None)
            del res
            if need_v:
                (dv,) = reverse_rows([rev], layout, check=False)
            del rev
        else:
            dv, state_rev = res if need_state else (res, None)
            if not need_v:
                dv = None
    return db, dc, dv, state_rev


def reversed_decay(log_decay: torch.Tensor, layout: str) -> torch.Tensor:
    """The per-token decay of the operator run backwards in time: a'_t = a_{n−t} for t ≥ 1, a'_0 = 0, so that
    a'_{i'+1} + … + a'_{j'} = a_{j+1} + … + a_i for i' = n − 1 − i, j' = n − 1 − j (Mᵀ reversed is M's form).
    A new tensor in ``layout``'s order."""
    axis = 2 if layout == "bhnd" else 1
    a = log_decay.detach()
    flipped = torch.flip(a, [axis]).narrow(axis, 0, max(a.shape[axis] - 1, 0))
    zero = torch.zeros_like(a.narrow(axis, 0, min(1, a.shape[axis])))
    return torch.cat([zero, flipped], dim=axis)


def _reversed_per_token(op: Operator, b, c, v, gamma, grad_out, layout: str, log_decay, *, need_c: bool,
                        need_v: bool, need_state: bool):
    """dc, dv and ``state_rev`` of :func:`output_grads` with a per-token decay: the reversed calls on
    reversed copies with :func:`reversed_decay`."""
    dc = dv = state_rev = None
    a_rev = reversed_decay(log_decay, layout)
    v_rev, b_rev, do_rev = _reverse_rows([v, b, grad_out], layout)
    if need_c:
        rev = op(v_rev, do_rev, b_rev, gamma, log_decay=a_rev)
        (dc,) = reverse_rows([rev], layout, check=False)
    del v_rev
    if need_v or need_state:
        (c_rev,) = reverse_rows([c], layout, check=False)
        res = op(c_rev, b_rev, do_rev, gamma, return_state=need_state, log_decay=a_rev)
        rev, state_rev = res if need_state else (res, None)
        if need_v:
            (dv,) = reverse_rows([rev], layout, check=False)
    return dc, dv, state_rev


def reversed_call(op: Operator, b, c, v, gamma, layout: str, *, return_state: bool = False):
    """flip(op(flip(b), flip(c), flip(v))) -- the operator run backwards in time -- with no copy, or None.

    b, c, v in ``layout``, as they are (any strides).  The call is a reversed problem (``Problem.reverse``):
    its row t is row n − 1 − t of each tensor and of the output, so the output comes back in the inputs'
    order (docs/design.md §10.3).  With ``return_state``, ``(output, state)``: the reversed call's final
    state, Σ_t γ^t c_tᵀ v_t over the tensors' own rows t.

    Returns None, having run nothing, where the call needs reversed copies instead: ``op`` is not a
    ``functools.partial`` of ``linear_attention`` (its method and precision are read from the keywords),
    its method (or the one ``auto`` picks for this shape) does not address reversed rows (a user method,
    a PyTorch method: CPU tensors outside the interpreter), or the call itself must be differentiable
    (a backward with ``create_graph=True``, which nests the autograd node).
    """
    spec = _builtin_operator(op, layout, b, c, v)
    if spec is None:
        return None
    name, precision = spec
    p, out = make_problem(b, c, v, gamma, layout=layout, return_state=return_state, precision=precision,
                          reverse=True, two_part=True)
    if not run_reversed(p, name):
        return None
    return (out, p.state) if return_state else out


def forward_call(op: Operator, b, c, v, gamma, layout: str, *, initial_state=None, log_decay=None):
    """``op(b, c, v, gamma, initial_state=…)`` as the backward's db call makes it: a problem whose bfloat16
    operands are formed in two parts (``Problem.two_part``, docs/design.md §10.4), as the reversed calls'
    are; or None, having run nothing, where ``op`` is not a ``functools.partial`` of ``linear_attention``
    with a built-in Triton method (or ``auto``) or the call must be differentiable (the caller then calls
    ``op`` itself)."""
    spec = _builtin_operator(op, layout, b, c, v, initial_state)
    if spec is None:
        return None
    name, precision = spec
    if log_decay is not None and not registry.supports_per_token(name):
        return None
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, precision=precision,
                          two_part=True, log_decay=log_decay)
    run_problem(p, name)
    return out


def _builtin_operator(op: Operator, layout: str, *tensors) -> Optional[tuple[str, Optional[str]]]:
    """``(method, precision)`` of ``op`` where the backward may build its call's problem itself: ``op`` is
    ``partial(linear_attention, …)`` in ``layout`` with a built-in Triton method (or ``auto``) and none of
    ``tensors`` requires grad (a call that must be differentiable goes through ``op``); else None."""
    spec = _operator_keywords(op)
    if spec is None or spec["layout"] != layout or requires_grad(*tensors):
        return None
    name = registry.canonical_method(spec["method"])
    if registry.user_method(name) is not None or registry.torch_method(name) is not None:
        return None
    return name, spec["precision"]


def _operator_keywords(op: Operator) -> Optional[dict]:
    """``method`` and ``precision`` of an operator that is ``partial(linear_attention, method=…, layout=…,
    precision=…)`` (the layout is the caller's, passed along), else None."""
    if not isinstance(op, partial) or op.args or getattr(op.func, "__name__", None) != "linear_attention":
        return None
    keywords = op.keywords
    if set(keywords) != {"method", "layout", "precision"}:
        return None
    return keywords


def log2_gamma(gamma, heads: int, device) -> Optional[torch.Tensor]:
    """λ = log2 γ in float64, ``(heads,)``, or None without decay (NaN outside (0, 1]: docs/design.md §2.6)."""
    g = resolve_gamma(gamma, heads, device)
    return None if g is None else log2_gamma64(g)


def add_tail_term(grad: Optional[torch.Tensor], x: torch.Tensor, ds: torch.Tensor, tail: Optional[torch.Tensor],
                   layout: str, dtype: torch.dtype) -> torch.Tensor:
    """``grad`` + exp(tail_j) x_j ds (x: the caller's ``(·, n, ·)`` tensor, ds ``(B, H, ·, ·)``), cast to ``dtype``;
    ``tail`` ``(B or 1, H, n)`` float64 holds a_{j+1} + … + a_{n−1} ≤ 0 (γ^(n−1−j) for a constant decay), or
    None without decay.

    The sum is formed in float32 (float64 for float64 states) and rounded once.
    """
    acc = torch.promote_types(ds.dtype, torch.float32)
    xb = to_bhnd(x, layout).to(acc)
    # per output head, ds's: a grouped x meets each of its group's heads by broadcasting (docs/design.md §1.7)
    h = xb.shape[1]
    xg = _by_group(xb)
    if tail is not None:
        xg = xg * _split(torch.exp(tail).unsqueeze(-1).to(acc), h)
    term = (xg @ _split(ds.to(acc), h)).flatten(1, 2)
    term = to_bhnd(term, layout)                                                # the caller's layout
    if grad is not None:
        term = term + grad.to(acc)
    return term.to(dtype)


def initial_state_grad_of(state_rev: Optional[torch.Tensor], ds: Optional[torch.Tensor],
                          G: Optional[torch.Tensor]) -> torch.Tensor:
    """dS₀ = exp(a_0) · state_rev + exp(G_{n−1}) dS (γ · Σ_i γ^i b_iᵀ do_i + γ^n dS for a constant decay;
    either part may be absent); ``G`` the prefix sum of :func:`decay_prefix`, or None without decay."""
    parts = []
    if state_rev is not None:
        parts.append(state_rev if G is None else state_rev * torch.exp(G[..., 0]).view(*G.shape[:2], 1, 1).to(
            state_rev.dtype))
    if ds is not None:
        parts.append(ds if G is None else ds * torch.exp(G[..., -1]).view(*G.shape[:2], 1, 1).to(ds.dtype))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _decay(lam: Optional[torch.Tensor], dist: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """exp2(λ · dist) shaped ``(1, heads, len(dist), 1)`` in ``dtype`` (dist ≥ 0), or None without decay."""
    if lam is None:
        return None
    return torch.exp2(lam.view(1, -1, 1, 1) * dist.to(torch.float64).view(1, 1, -1, 1)).to(dtype)


def add_state_term(grad: Optional[torch.Tensor], x: torch.Tensor, ds: torch.Tensor, lam, layout: str,
                   dtype: torch.dtype) -> torch.Tensor:
    """``grad`` + γ^(n−1−j) x_j ds (x: the caller's ``(·, n, ·)`` tensor, ds ``(B, H, ·, ·)``), cast to ``dtype``.

    The sum is formed in float32 (float64 for float64 states) and rounded once.
    """
    acc = torch.promote_types(ds.dtype, torch.float32)
    xb = to_bhnd(x, layout).to(acc)
    n, h = xb.shape[2], xb.shape[1]
    w = _decay(lam, torch.arange(n - 1, -1, -1, device=x.device), acc)        # γ^(n−1−j)
    # per output head, ds's: a grouped x meets each of its group's heads by broadcasting (docs/design.md §1.7)
    xg = _by_group(xb) if w is None else _by_group(xb) * _split(w, h)
    term = (xg @ _split(ds.to(acc), h)).flatten(1, 2)                          # [B, H, n, ·] @ [B, H, ·, ·]
    term = to_bhnd(term, layout)                                                # the caller's layout
    if grad is not None:
        term = term + grad.to(acc)
    return term.to(dtype)


def initial_state_grad(state_rev: Optional[torch.Tensor], ds: Optional[torch.Tensor], lam,
                       n: int) -> torch.Tensor:
    """dS₀ = γ · Σ_i γ^i b_iᵀ do_i + γ^n dS (either part may be absent)."""
    parts = []
    if state_rev is not None:
        parts.append(state_rev if lam is None else state_rev * _decay(lam, torch.ones(1, device=lam.device),
                                                                      state_rev.dtype))
    if ds is not None:
        parts.append(ds if lam is None else ds * _decay(lam, torch.full((1,), n, device=lam.device), ds.dtype))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def attach_backward(op: Operator, b, c, v, gamma, *, layout: str, initial_state, return_state: bool, log_decay=None):
    """``op``'s result (o, or (o, state)) as outputs of a :class:`LinearAttentionFunction` node."""
    return LinearAttentionFunction.apply(b, c, v, initial_state, gamma, op, layout, return_state, log_decay)
