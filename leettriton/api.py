"""Validation, layouts, gamma handling and dispatch: the one place the public API is checked.

Every method -- Triton kernel, PyTorch version or user-registered function -- is
reached through :func:`linear_attention`, which validates the call once, builds
a :class:`Problem` (strided ``(batch, heads, n, dim)`` views of the caller's
tensors, never copies) and looks the method up in a dictionary.
"""
from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

from .autotune.families import is_interpreting

__all__ = [
    "Problem", "linear_attention", "decode_step", "register_method", "METHODS", "BUILTIN_METHODS",
    "ALIASES", "MAX_DIM", "canonical_method", "make_problem", "run_problem",
]

MAX_DIM = 256
"""Largest r and d the kernels support (non powers of two are masked)."""

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LAYOUTS = ("bhnd", "bnhd")
PRECISIONS = ("ieee", "tf32")

BUILTIN_METHODS = ("vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention",
                   "fleet_attention")

# The LeetDecoding paper's spellings (and a few common ones) of the built-in methods.
ALIASES = {
    "linear_attn": "vanilla",
    "Vanilla": "vanilla",
    "causal_product": "causal_dot_product",
    "cdotp": "causal_dot_product",
    "Cdotp": "causal_dot_product",
    "block-based": "block_based",
    "blockBased": "block_based",
    "BlockBased": "block_based",
    "Recursion": "recursion",
    "lightningAttention2": "lightning_attention",
    "lightningAttention2_optimized": "lightning_attention",
    "lightning_attn2": "lightning_attention",
    "LA": "lightning_attention",
    "FleetAttention": "fleet_attention",
    "FA": "fleet_attention",
    "lightningAttention2_torch": "lightning_attention_torch",
    "LA_torch": "lightning_attention_torch",
    "FleetAttention_torch": "fleet_attention_torch",
    "FA_torch": "fleet_attention_torch",
    "block-based_torch": "block_based_torch",
}


@dataclass
class Problem:
    """One validated call, as every method implementation receives it.

    Tensors are views in ``(batch, heads, n, dim)`` order with the caller's
    strides (the ``bnhd`` layout is a transposed view, not a copy).

    Attributes:
        b, c: ``(B, H, n, r)`` views.
        v: ``(B, H, n, d)`` view.
        log2_gamma: ``(H,)`` float32 tensor of λ = log2 γ on the inputs' device, or
            ``None`` when there is no decay (γ = 1 for every head).
        initial_state: ``(B, H, r, d)`` float32 or ``None`` (zero state).
        out: ``(B, H, n, d)`` view of the output the method must fill (dtype of v).
        state: ``(B, H, r, d)`` float32 the method must fill with the final state,
            or ``None`` when the caller did not ask for it.
        precision: ``"ieee"`` or ``"tf32"``: how float32 products are done
            (16-bit inputs always use tensor cores with float32 accumulation).
    """

    b: torch.Tensor
    c: torch.Tensor
    v: torch.Tensor
    log2_gamma: Optional[torch.Tensor]
    initial_state: Optional[torch.Tensor]
    out: torch.Tensor
    state: Optional[torch.Tensor]
    precision: str

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(batch, heads, n, r, d)``."""
        B, H, n, r = self.b.shape
        return B, H, n, r, self.v.shape[-1]

    @property
    def has_decay(self) -> bool:
        return self.log2_gamma is not None


# --------------------------------------------------------------------------- errors

def _type_name(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (numbers.Number, str)) else type(x).__name__


def _check_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(x)}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got dtype {x.dtype}")
    return x


def _check_dims(r: int, d: int, where: str) -> None:
    for label, size in (("r (last dim of b and c)", r), ("d (last dim of v)", d)):
        if size > MAX_DIM:
            raise NotImplementedError(
                f"{where}: {label} = {size} exceeds the supported maximum of {MAX_DIM}")
        if size < 1:
            raise ValueError(f"{where}: {label} must be at least 1, got {size}")


# --------------------------------------------------------------------------- gamma

class _GammaCache:
    """Validated λ = log2 γ per gamma, so a CUDA gamma is checked (one sync) once per version."""

    def __init__(self) -> None:
        self._tensors: dict[int, tuple] = {}
        self._floats: dict[tuple, Optional[torch.Tensor]] = {}

    def from_float(self, g: float, heads: int, device: torch.device) -> Optional[torch.Tensor]:
        key = (g, heads, device)
        hit = self._floats.get(key, False)
        if hit is not False:
            return hit
        lam = None if g == 1.0 else torch.full((heads,), math.log2(g), dtype=torch.float32, device=device)
        if len(self._floats) > 256:
            self._floats.clear()
        self._floats[key] = lam
        return lam

    def from_tensor(self, g: torch.Tensor) -> Optional[torch.Tensor]:
        key = id(g)
        hit = self._tensors.get(key)
        if hit is not None:
            ref, version, ptr, lam = hit
            if ref() is g and version == g._version and ptr == g.data_ptr():
                return lam
        flat = g.detach().reshape(-1).double()
        lam64 = torch.log2(flat)
        # one device->host transfer for every check
        bad_low, bad_high, bad_nan, all_one = torch.stack([
            (flat <= 0).any(), (flat > 1).any(), torch.isnan(flat).any(), (flat == 1).all()]).tolist()
        if bad_nan or bad_low or bad_high:
            what = "NaN" if bad_nan else ("≤ 0" if bad_low else "> 1")
            raise ValueError(f"gamma must hold values in (0, 1], got a value {what} in {_type_name(g)}")
        lam = None if all_one else lam64.float()
        self._tensors[key] = (weakref.ref(g, lambda _r, k=key: self._tensors.pop(k, None)), g._version,
                              g.data_ptr(), lam)
        return lam


_GAMMAS = _GammaCache()


def _log2_gamma(gamma, heads: int, device: torch.device) -> Optional[torch.Tensor]:
    if gamma is None:
        return None
    if isinstance(gamma, bool) or not isinstance(gamma, (numbers.Real, torch.Tensor)):
        raise TypeError(f"gamma must be None, a float or a tensor of shape ({heads},) or ({heads}, 1), "
                        f"got {_type_name(gamma)}")
    if isinstance(gamma, torch.Tensor):
        if not gamma.is_floating_point():
            raise TypeError(f"gamma must be a floating-point tensor, got dtype {gamma.dtype}")
        if tuple(gamma.shape) not in ((heads,), (heads, 1)):
            raise ValueError(f"gamma must have shape ({heads},) or ({heads}, 1) (one γ per head), "
                             f"got shape {tuple(gamma.shape)}")
        if gamma.device != device:
            raise ValueError(f"gamma must be on the inputs' device {device}, got {gamma.device}")
        return _GAMMAS.from_tensor(gamma)
    g = float(gamma)
    if math.isnan(g) or not (0.0 < g <= 1.0):
        raise ValueError(f"gamma must lie in (0, 1], got {g!r}")
    return _GAMMAS.from_float(g, heads, device)


# --------------------------------------------------------------------------- problems

def _new_empty(shape, dtype, device) -> torch.Tensor:
    """Allocates every output of the package (tests replace it to poison outputs)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "bhnd" else x.transpose(1, 2)


def _check_autograd(*tensors) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(
            "leettriton computes the forward pass only: an input requires grad, but no backward is "
            "implemented. Run under torch.no_grad() / torch.inference_mode(), or detach the inputs.")


def make_problem(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
                 precision: Optional[str] = None, where: str = "linear_attention") -> tuple[Problem, torch.Tensor]:
    """Validate a call and build its :class:`Problem`.

    Returns the problem and the output tensor in the caller's layout (the
    problem's ``out`` is a view of it).  Raises ``TypeError``/``ValueError`` for
    bad input, naming the argument, what was expected and what was given.
    """
    b = _check_tensor("b", b)
    c = _check_tensor("c", c)
    v = _check_tensor("v", v)
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhnd' or 'bnhd', got {layout!r}")
    dims = "(batch, heads, n, dim)" if layout == "bhnd" else "(batch, n, heads, dim)"
    for name, x in (("b", b), ("c", c), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D {dims} for layout '{layout}', got shape {tuple(x.shape)}")
    if not (b.dtype == c.dtype == v.dtype):
        raise TypeError(f"b, c and v must share one dtype, got {b.dtype}, {c.dtype}, {v.dtype}")
    if not (b.device == c.device == v.device):
        raise ValueError(f"b, c and v must be on one device, got {b.device}, {c.device}, {v.device}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be None, 'ieee' or 'tf32', got {precision!r}")
    if not isinstance(return_state, bool):
        raise TypeError(f"return_state must be a bool, got {_type_name(return_state)}")
    _check_autograd(b, c, v, initial_state, gamma)

    bb, cc, vv = _bhnd(b, layout), _bhnd(c, layout), _bhnd(v, layout)
    B, H, n, r = bb.shape
    if tuple(cc.shape) != (B, H, n, r):
        raise ValueError(f"c must have the shape of b {tuple(b.shape)}, got {tuple(c.shape)}")
    if tuple(vv.shape[:3]) != (B, H, n):
        raise ValueError(f"v must match b in batch, heads and n {dims}: b has shape {tuple(b.shape)}, "
                         f"v has shape {tuple(v.shape)}")
    d = vv.shape[-1]
    _check_dims(r, d, where)
    device = v.device

    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor):
            raise TypeError(f"initial_state must be None or a torch.Tensor, got {_type_name(initial_state)}")
        if initial_state.dtype != torch.float32:
            raise TypeError(f"initial_state must be float32, got dtype {initial_state.dtype}")
        if tuple(initial_state.shape) != (B, H, r, d):
            raise ValueError(f"initial_state must have shape (batch, heads, r, d) = {(B, H, r, d)}, "
                             f"got {tuple(initial_state.shape)}")
        if initial_state.device != device:
            raise ValueError(f"initial_state must be on the inputs' device {device}, got {initial_state.device}")

    log2_gamma = _log2_gamma(gamma, H, device)

    out_shape = (B, H, n, d) if layout == "bhnd" else (B, n, H, d)
    out_user = _new_empty(out_shape, v.dtype, device)
    state = _new_empty((B, H, r, d), torch.float32, device) if return_state else None
    if precision is None:
        precision = "ieee"
    problem = Problem(bb, cc, vv, log2_gamma, initial_state, _bhnd(out_user, layout), state, precision)
    return problem, out_user


# --------------------------------------------------------------------------- registry

# name -> implementation taking (problem, config); config is a dict of per-kernel configs or None
_IMPLS: dict[str, Callable[[Problem, Optional[Mapping]], None]] = {}
# Triton method -> its PyTorch version, used for CPU tensors outside the interpreter
_TORCH_TWIN: dict[str, str] = {}
# user-registered name -> function with the public signature
_USER: dict[str, Callable] = {}

METHODS: list[str] = []
"""Names of every registered method (built-ins, their ``_torch`` versions, ``auto``, user methods)."""


def _register_builtin(name: str, impl: Callable[[Problem, Optional[Mapping]], None],
                      torch_twin: Optional[str] = None) -> None:
    _IMPLS[name] = impl
    if torch_twin is not None:
        _TORCH_TWIN[name] = torch_twin
    if name not in METHODS:
        METHODS.append(name)


def register_method(name: str, fn: Callable) -> None:
    """Register ``fn`` as a method usable as ``linear_attention(..., method=name)``.

    ``fn`` is called with validated inputs as
    ``fn(b, c, v, gamma, initial_state=..., return_state=..., precision=...)`` where
    ``b, c, v`` are ``(batch, heads, n, dim)`` views (any strides), ``gamma`` is a
    float32 tensor of shape ``(heads,)`` (all ones when there is no decay) and
    ``initial_state`` is ``None`` or float32 ``(batch, heads, r, d)``.  It returns
    the output ``(batch, heads, n, d)``, or ``(output, final_state)`` when
    ``return_state`` is true.

    Example::

        def mine(b, c, v, gamma, *, initial_state=None, return_state=False, precision="ieee"):
            ...
        leettriton.register_method("mine", mine)
        o = leettriton.linear_attention(b, c, v, 0.9, method="mine")
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {_type_name(name)}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {_type_name(fn)}")
    if name in _IMPLS or name in ALIASES or name == "auto":
        raise ValueError(f"method name {name!r} is taken by a built-in method")
    _USER[name] = fn
    if name not in METHODS:
        METHODS.append(name)


def canonical_method(method) -> str:
    """The registered name for ``method`` (resolving the paper's spellings)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, got {_type_name(method)}")
    name = ALIASES.get(method, method)
    if name == "auto" or name in _IMPLS or name in _USER:
        return name
    raise ValueError(f"unknown method {method!r}; registered methods: {', '.join(METHODS)}")


def _run_user(fn: Callable, p: Problem) -> None:
    B, H, n, r, d = p.shape
    gamma = (torch.ones(H, dtype=torch.float32, device=p.v.device) if p.log2_gamma is None
             else torch.exp2(p.log2_gamma))
    result = fn(p.b, p.c, p.v, gamma, initial_state=p.initial_state, return_state=p.state is not None,
                precision=p.precision)
    out, state = (result if p.state is not None else (result, None))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, H, n, d):
        raise ValueError(f"registered method returned {_type_name(out)}, expected an output of shape "
                         f"{(B, H, n, d)}")
    p.out.copy_(out)
    if p.state is not None:
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != (B, H, r, d):
            raise ValueError(f"registered method returned state {_type_name(state)}, expected shape "
                             f"{(B, H, r, d)}")
        p.state.copy_(state)


def run_problem(p: Problem, method: str, config: Optional[Mapping] = None) -> None:
    """Fill ``p.out`` (and ``p.state``) with ``method``; ``config`` pins kernel configs."""
    B, H, n, r, d = p.shape
    if n == 0 or B == 0 or H == 0:
        if p.state is not None:
            if p.initial_state is not None:
                p.state.copy_(p.initial_state)
            else:
                p.state.zero_()
        return
    if method == "auto":
        from .dispatch import choose

        method, config = choose(p)
    if method in _USER:
        _run_user(_USER[method], p)
        return
    if p.v.device.type == "cpu" and not is_interpreting() and method in _TORCH_TWIN:
        method, config = _TORCH_TWIN[method], None
    _IMPLS[method](p, config)


# --------------------------------------------------------------------------- public

def linear_attention(b, c, v, gamma=None, *, method: str = "auto", layout: str = "bhnd", initial_state=None,
                     return_state: bool = False, precision: Optional[str] = None):
    """Exponentially decaying causal linear attention, O = (B Cᵀ ⊙ M) V with M[i, j] = γ^(i−j) for i ≥ j.

    Per batch element and head: S_t = γ S_{t−1} + c_tᵀ v_t, o_t = b_t S_t, with
    S_{−1} = ``initial_state`` (or 0).  No softmax, no 1/√d scale, no normaliser.

    Args:
        b, c: ``(batch, heads, n, r)`` (layout ``"bhnd"``) or ``(batch, n, heads, r)``
            (layout ``"bnhd"``); float16, bfloat16 or float32; any strides.
        v: ``(batch, heads, n, d)`` or ``(batch, n, heads, d)``, same dtype and device.
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

    Returns:
        The output, dtype and layout of ``v``; with ``return_state=True``, ``(output, state)``.

    Example::

        >>> b = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16)
        >>> c, v = torch.randn_like(b), torch.randn_like(b)
        >>> o = leettriton.linear_attention(b, c, v, gamma=0.99)
        >>> o, s = leettriton.linear_attention(b, c, v, 0.99, return_state=True)
    """
    name = canonical_method(method)
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision)
    run_problem(p, name)
    return (out, p.state) if return_state else out


def _method_function(name: str) -> Callable:
    def method_fn(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
                  precision: Optional[str] = None):
        return linear_attention(b, c, v, gamma, method=name, layout=layout, initial_state=initial_state,
                                return_state=return_state, precision=precision)

    method_fn.__name__ = method_fn.__qualname__ = name
    method_fn.__doc__ = (f"``linear_attention(..., method='{name}')``: see :func:`linear_attention` for the "
                         f"arguments.\n\nCUDA tensors run the Triton kernel; CPU tensors run "
                         f"``{name}_torch`` (or the kernel itself under ``TRITON_INTERPRET=1``).")
    return method_fn


def decode_step(b_t, c_t, v_t, state, gamma=None):
    """One generated token: S ← γ S + c_tᵀ v_t, o_t = b_t S.  The state is updated **in place**.

    Args:
        b_t, c_t: ``(batch, heads, r)``; v_t: ``(batch, heads, d)``; one dtype
            (float16, bfloat16 or float32), one device.
        state: float32 ``(batch, heads, r, d)``, e.g. from
            ``linear_attention(..., return_state=True)``; overwritten with the new state.
        gamma: as in :func:`linear_attention`.

    Returns:
        ``(o_t, state)``: o_t ``(batch, heads, d)`` in v_t's dtype, and ``state`` itself.

    On CUDA the step launches one kernel and never synchronises, so it can be
    captured in a CUDA graph: call it once before capture so that a tensor gamma
    is validated (one sync per gamma tensor version) and a float gamma is cached.

    Example::

        >>> o, state = leettriton.linear_attention(b, c, v, 0.99, return_state=True)   # prefill
        >>> o_t, state = leettriton.decode_step(b_t, c_t, v_t, state, 0.99)            # one token
    """
    from .kernels.decode import decode_step_impl

    b_t = _check_tensor("b_t", b_t)
    c_t = _check_tensor("c_t", c_t)
    v_t = _check_tensor("v_t", v_t)
    for name, x in (("b_t", b_t), ("c_t", c_t), ("v_t", v_t)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be 3-D (batch, heads, dim), got shape {tuple(x.shape)}")
    if not (b_t.dtype == c_t.dtype == v_t.dtype):
        raise TypeError(f"b_t, c_t and v_t must share one dtype, got {b_t.dtype}, {c_t.dtype}, {v_t.dtype}")
    if not (b_t.device == c_t.device == v_t.device):
        raise ValueError(f"b_t, c_t and v_t must be on one device, got {b_t.device}, {c_t.device}, {v_t.device}")
    B, H, r = b_t.shape
    if tuple(c_t.shape) != (B, H, r):
        raise ValueError(f"c_t must have the shape of b_t {tuple(b_t.shape)}, got {tuple(c_t.shape)}")
    if tuple(v_t.shape[:2]) != (B, H):
        raise ValueError(f"v_t must match b_t in batch and heads: b_t has shape {tuple(b_t.shape)}, v_t has "
                         f"shape {tuple(v_t.shape)}")
    d = v_t.shape[-1]
    _check_dims(r, d, "decode_step")
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state must be a torch.Tensor, got {_type_name(state)}")
    if state.dtype != torch.float32:
        raise TypeError(f"state must be float32, got dtype {state.dtype}")
    if tuple(state.shape) != (B, H, r, d):
        raise ValueError(f"state must have shape (batch, heads, r, d) = {(B, H, r, d)}, got {tuple(state.shape)}")
    if state.device != v_t.device:
        raise ValueError(f"state must be on the inputs' device {v_t.device}, got {state.device}")
    _check_autograd(b_t, c_t, v_t, state, gamma)
    log2_gamma = _log2_gamma(gamma, H, v_t.device)
    out = _new_empty((B, H, d), v_t.dtype, v_t.device)
    if B and H:
        decode_step_impl(b_t, c_t, v_t, state, log2_gamma, out)
    return out, state
