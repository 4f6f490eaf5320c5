"""The float64 oracle: the operator computed from its definition.

Short sequences use the dense decayed mask, O = (B Cᵀ ⊙ M) V + γ^(t+1) B S₀;
long ones a chunked float64 recurrence (dense within a chunk, the float64 state
between chunks), so a check at n = 100 000 needs memory for one chunk, not n².
Every decay factor is exp2(λ · distance) with distance ≥ 0, in float64.

Causal for any values (docs/nonfinite.md): masked entries of the decayed scores are selected to
zero, never multiplied by it, and a non-finite value of v at row k reaches rows ≥ k only
(:func:`_lower_product`), so a non-finite input at row k leaves every row before k as it would be
without it.
"""
from __future__ import annotations

from typing import Optional

import torch

from .problem import check_bool, expand_heads, log2_gamma64, make_problem, to_bhnd as _bhnd

__all__ = ["reference"]

DENSE_MAX_N = 1024
CHUNK = 256


def _gamma64(gamma, heads: int, device) -> Optional[torch.Tensor]:
    if gamma is None:
        return None
    if isinstance(gamma, torch.Tensor):
        return gamma.detach().reshape(heads).to(device=device, dtype=torch.float64)
    return torch.full((heads,), float(gamma), dtype=torch.float64, device=device)


def _lower_product(a, x):
    """``a @ x`` over the last two dims for a lower-triangular ``a`` (entries above the diagonal exactly
    zero), with row i of the result depending on rows j ≤ i of ``x`` only, for any values.

    A plain product multiplies the zeros above the diagonal by every row of ``x``, and 0 · ±inf is NaN:
    a non-finite x_k would spoil every row.  Here the product takes ``x`` with its non-finite entries
    set to zero, and each column's rows from its first non-finite entry on take the plain product (the
    value the definition gives them, ±inf or NaN)."""
    bad = ~torch.isfinite(x)
    clean = a @ torch.where(bad, torch.zeros((), dtype=x.dtype, device=x.device), x)
    reached = torch.cummax(bad, dim=-2).values
    return torch.where(reached, a @ x, clean)


def _chunk(b, c, v, lam, state):
    """Output of one chunk given the state before it; returns (out, state after). All float64."""
    T = b.shape[2]
    t = torch.arange(T, device=b.device, dtype=torch.float64)
    scores = b @ c.transpose(-1, -2)                                   # [B, H, T, T]
    dist = t[:, None] - t[None, :]
    causal = dist >= 0
    if lam is None:
        mask = causal.to(torch.float64)
        row_decay = torch.ones(1, 1, T, 1, dtype=torch.float64, device=b.device)
        col_decay = torch.ones(1, 1, T, 1, dtype=torch.float64, device=b.device)
        total = torch.ones(1, 1, 1, 1, dtype=torch.float64, device=b.device)
    else:
        lam = lam.view(1, -1, 1, 1)
        mask = torch.where(causal, torch.exp2(lam * dist.clamp(min=0)), torch.zeros((), dtype=torch.float64,
                                                                                  device=b.device))
    # masked (and decayed-away) scores are selected out: 0 · inf would be NaN
        row_decay = torch.exp2(lam * (t + 1).view(1, 1, T, 1))        # γ^(i+1): state seen by row i
        col_decay = torch.exp2(lam * (T - 1 - t).view(1, 1, T, 1))    # γ^(T-1-j): key j at the chunk's end
        total = torch.exp2(lam * T)
    zero = torch.zeros((), dtype=torch.float64, device=b.device)
    out = _lower_product(torch.where(mask == 0, zero, scores * mask), v)
    if state is not None:
        out = out + (b * row_decay) @ state
        state = total * state + (c * col_decay).transpose(-1, -2) @ v
    else:
        state = (c * col_decay).transpose(-1, -2) @ v
    return out, state


def _chunk_per_token(b, c, v, a, state):
    """:func:`_chunk` with a per-token decay ``a`` (B, H, T) ≤ 0 in float64: M[i, j] = exp(G_i − G_j) for
    i ≥ j with G the chunk's prefix sum of a (G_i − G_j = a_{j+1} + … + a_i ≤ 0), selected by the causal mask
    (never an entry above the diagonal multiplied by 0).  A value > 0 or NaN is NaN in every row it decays."""
    T = b.shape[2]
    a = torch.where(a <= 0, a, torch.full((), float("nan"), dtype=a.dtype, device=a.device))
    G = torch.cumsum(a, dim=-1)                                         # [B, H, T]
    t = torch.arange(T, device=b.device)
    causal = t[:, None] >= t[None, :]
    zero = torch.zeros((), dtype=torch.float64, device=b.device)
    diff = G[..., :, None] - G[..., None, :]
    mask = torch.where(causal, torch.exp(torch.where(causal, diff, zero)), zero)
    scores = b @ c.transpose(-1, -2)
    out = _lower_product(torch.where(causal, scores * mask, zero), v)
    tail = (G[..., -1:] - G).unsqueeze(-1)                              # a_{j+1} + … + a_{T−1}: key j at the end
    new = (c * torch.exp(tail)).transpose(-1, -2) @ v
    if state is not None:
        out = out + (b * torch.exp(G).unsqueeze(-1)) @ state
        new = torch.exp(G[..., -1]).view(*G.shape[:2], 1, 1) * state + new
    return out, new


def reference(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
              precision: Optional[str] = None, device=None, log_decay=None):
    """The float64 oracle, with the signature of :func:`leettriton.linear_attention`.

    Inputs are validated exactly as for ``linear_attention``; the computation is
    done in float64 on ``device`` (default: the inputs' device) from the
    definition, with γ taken in float64 from ``gamma`` as given.  ``precision``
    is accepted for signature compatibility and ignored.

    Returns:
        The float64 output in the inputs' layout; with ``return_state=True``,
        ``(output, state)`` with the float64 final state ``(batch, heads, r, d)``.

    Causal for any values: a non-finite input at row k reaches rows ≥ k only, each row that depends on it
    getting the value the definition gives it (docs/nonfinite.md).

    Differentiable: when b, c, v, ``initial_state`` or ``log_decay`` requires grad, autograd records the
    float64 computation, so its gradients are the oracle's gradients (γ stays a constant).  Give it float32
    copies of 16-bit inputs to get them back in float32.

    ``log_decay``: the per-token decay of :func:`leettriton.linear_attention` (docs/design.md §1.6),
    M[i, j] = exp(a_{j+1} + … + a_i) from differences of its prefix sum within a chunk, in float64.

    Grouped heads (docs/design.md §1.7): b, c and v may have fewer heads than the output, each count dividing
    the most of them, H; output head h reads head h // (H / heads) of each, from the definition (its heads
    repeated), and autograd sums each shared head's gradient over its group.
    """
    check_bool("return_state", return_state)
    p, _ = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=False,
                        precision=precision, where="reference", differentiable=True, log_decay=log_decay)
    B, H, n, r, d = p.shape
    dev = torch.device(device) if device is not None else p.v.device
    lam = None
    if p.gamma is not None:
        lam = log2_gamma64(_gamma64(gamma, H, dev))   # NaN outside (0, 1], as every path (§2.6)
    state = None if initial_state is None else initial_state.to(device=dev, dtype=torch.float64)
    out = torch.empty((B, H, n, d), dtype=torch.float64, device=dev)
    step = max(n, 1) if n <= DENSE_MAX_N else CHUNK
    for t0 in range(0, n, step):
        sl = slice(t0, min(n, t0 + step))
        # grouped heads: output head h reads head h // (H / heads) of each (docs/design.md §1.7)
        bb, cc, vv = (expand_heads(x[:, :, sl].to(device=dev, dtype=torch.float64), H) for x in (p.b, p.c, p.v))
        if p.log_decay is not None:
            a = p.log_decay[:, :, sl].to(device=dev, dtype=torch.float64)
            out[:, :, sl], state = _chunk_per_token(bb, cc, vv, a, state)
        else:
            out[:, :, sl], state = _chunk(bb, cc, vv, lam, state)
    if state is None:
        state = torch.zeros((B, H, r, d), dtype=torch.float64, device=dev)
    out = _bhnd(out, layout)
    return (out, state) if return_state else out


# --------------------------------------------------------------------------- tolerances

TOLERANCES = {"float32": 1e-5, "tf32": 2e-3, "float16": 2e-3, "bfloat16": 1e-2}
"""Bound on the relative error ‖out − ref‖ / ‖ref‖ against :func:`reference`, by input dtype.

``"float32"`` is float32 inputs with ``precision="ieee"`` (true float32 products), ``"tf32"``
float32 inputs with ``precision="tf32"`` (10-bit mantissa products; the peers compute so by
design).  The one table the tests, ``leettriton.bench`` and :func:`benchmark_method` judge by.
TF32 rounds every operand, so the tests measure its error against the terms' magnitudes (the oracle
on the inputs' absolute values) rather than a cancelled output (docs/design.md §2.5).
"""


def tolerance(dtype: torch.dtype, precision: Optional[str] = None) -> float:
    """The relative-error bound of :data:`TOLERANCES` for inputs of ``dtype`` computed at ``precision``.

    ``precision`` (``None``, ``"ieee"`` or ``"tf32"``) matters for float32 only: 16-bit inputs
    have their own bound whatever it is.

    Example::

        >>> tolerance(torch.float16), tolerance(torch.float32), tolerance(torch.float32, "tf32")
        (0.002, 1e-05, 0.002)
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"tolerance: dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype!r}")
    if dtype == torch.float32 and precision == "tf32":
        return TOLERANCES["tf32"]
    return TOLERANCES[str(dtype).replace("torch.", "")]


__all__ += ["TOLERANCES", "tolerance"]
