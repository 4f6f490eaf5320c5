"""The method table: built-in methods, their PyTorch twins, the paper's spellings, and user methods.

The table starts empty and is filled by explicit calls (:func:`install_builtins`,
made once by the API module; :func:`register_method`), never as a side effect of
importing a method's module.  :func:`method_names` is the immutable view the
public ``leettriton.METHODS`` reflects.

A user method has one contract everywhere -- ``register_method``,
``benchmark_method`` and ``causal_linear_decoder`` (docs/design.md §6)::

    fn(b, c, v, gamma) -> o

b, c: ``(batch, heads, n, r)`` views, v: ``(batch, heads, n, d)`` (any strides);
gamma: ``None`` when there is no decay, else a float32 tensor ``(heads,)`` of γ.
It may also take the keywords ``initial_state`` (float32 ``(batch, heads, r, d)``
or None), ``return_state`` (then it returns ``(o, final_state)``) and
``precision``; a call that needs a keyword the function does not take is a clear
error, never a silently different computation.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

from .compat import ALIASES
from .methods import BUILTIN_METHODS, Method
from .problem import Problem, type_name

__all__ = ["install_builtins", "register_method", "canonical_method", "method_names", "builtin", "torch_twin",
           "user_method", "UserMethod", "BUILTIN_METHODS", "ALIASES", "per_token_methods", "check_per_token", "supports_per_token"]

_BUILTIN: dict[str, Method] = {}
_TORCH: dict[str, Callable[[Problem], None]] = {}   # "<name>_torch" -> PyTorch version
_USER: dict[str, "UserMethod"] = {}
_NAMES: tuple[str, ...] = ()


def _refresh() -> None:
    global _NAMES
    _NAMES = tuple(_BUILTIN) + tuple(_TORCH) + ("auto",) + tuple(_USER)


def install_builtins(methods: Mapping[str, Method]) -> None:
    """Put the built-in ``methods`` (and their ``_torch`` twins) in the table."""
    for name, method in methods.items():
        _BUILTIN[name] = method
        _TORCH[f"{name}_torch"] = method.torch_twin
    _refresh()


def method_names() -> tuple[str, ...]:
    """Every registered name: built-ins, their ``_torch`` versions, ``auto``, user methods."""
    return _NAMES


def builtin(name: str) -> Optional[Method]:
    """The built-in :class:`Method` called ``name``, or None."""
    return _BUILTIN.get(name)


def torch_method(name: str) -> Optional[Callable[[Problem], None]]:
    """The PyTorch method called ``name`` (``"<method>_torch"``), or None."""
    return _TORCH.get(name)


def torch_twin(name: str) -> Optional[str]:
    """The ``_torch`` name of built-in ``name`` (what CPU tensors run outside the interpreter)."""
    return f"{name}_torch" if name in _BUILTIN else None


def user_method(name: str) -> Optional["UserMethod"]:
    return _USER.get(name)


def per_token_methods() -> tuple[str, ...]:
    """The names that take a per-token decay (``log_decay``, docs/design.md §1.6): ``auto``, the built-ins
    whose :class:`Method` says ``per_token_decay``, and every ``_torch`` twin."""
    return ("auto",) + tuple(n for n, m in _BUILTIN.items() if m.per_token_decay) + tuple(_TORCH)


def supports_per_token(name: str) -> bool:
    """Whether method ``name`` (canonical) takes a per-token decay."""
    return name == "auto" or name in _TORCH or (name in _BUILTIN and _BUILTIN[name].per_token_decay)


def check_per_token(name: str) -> None:
    """A call with ``log_decay`` of method ``name`` (canonical): ``NotImplementedError`` naming the methods
    that support it, when this one does not (a user method never does: its contract has no such argument)."""
    if supports_per_token(name):
        return
    raise NotImplementedError(
        f"method {name!r} does not support a per-token decay (log_decay) yet; methods that do: "
        f"{', '.join(repr(m) for m in per_token_methods())}")


def canonical_method(method) -> str:
    """The registered name for ``method`` (resolving the paper's spellings)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, got {type_name(method)}")
    name = ALIASES.get(method, method)
    if name == "auto" or name in _BUILTIN or name in _TORCH or name in _USER:
        return name
    raise ValueError(f"unknown method {method!r}; registered methods: {', '.join(_NAMES)}")


# --------------------------------------------------------------------------- user methods

_OPTIONAL = ("initial_state", "return_state", "precision")


@dataclass(frozen=True)
class UserMethod:
    """A function with the user-method contract (module docstring), and the keywords it takes."""

    fn: Callable
    takes: frozenset

    @classmethod
    def wrap(cls, fn: Callable) -> "UserMethod":
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type_name(fn)}")
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # builtins without a signature: assume the plain contract
            return cls(fn, frozenset())
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return cls(fn, frozenset(_OPTIONAL))
        positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        if len(positional) < 4 and not varargs:
            raise TypeError(f"a method must take (b, c, v, gamma); {getattr(fn, '__name__', fn)!r} takes "
                            f"{len(positional)} positional argument(s)")
        names = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
        return cls(fn, frozenset(k for k in _OPTIONAL if k in names))

    def __call__(self, b, c, v, gamma, *, initial_state=None, return_state: bool = False,
                 precision: str = "ieee"):
        """Call the function, passing only the keywords it takes; refuses a call it cannot honour."""
        name = getattr(self.fn, "__name__", repr(self.fn))
        kwargs = {}
        for key, value, needed in (("initial_state", initial_state, initial_state is not None),
                                   ("return_state", return_state, return_state),
                                   ("precision", precision, False)):
            if key in self.takes:
                kwargs[key] = value
            elif needed:
                raise TypeError(f"method {name!r} was called with {key}, but it takes no {key!r} keyword: "
                                f"add it to its signature (docs/design.md §6)")
        return self.fn(b, c, v, gamma, **kwargs)

    def run(self, p: Problem) -> None:
        """Fill ``p.out`` (and ``p.state``) by calling the function on ``p``; checks what it returns."""
        B, H, n, r, d = p.shape
        gamma = None if p.gamma is None else p.gamma.to(torch.float32)
        result = self(p.b, p.c, p.v, gamma, initial_state=p.initial_state, return_state=p.state is not None,
                      precision=p.precision)
        out, state = (result if p.state is not None else (result, None))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, H, n, d):
            raise ValueError(f"registered method returned {type_name(out)}, expected an output of shape "
                             f"{(B, H, n, d)}")
        p.out.copy_(out)
        if p.state is not None:
            if not isinstance(state, torch.Tensor) or tuple(state.shape) != (B, H, r, d):
                raise ValueError(f"registered method returned state {type_name(state)}, expected shape "
                                 f"{(B, H, r, d)}")
            p.state.copy_(state)


def register_method(name: str, fn: Callable) -> None:
    """Register ``fn`` as a method usable as ``linear_attention(..., method=name)``.

    ``fn`` follows the user-method contract (docs/design.md §6): it is called as
    ``fn(b, c, v, gamma)`` with validated ``(batch, heads, n, dim)`` views (any
    strides) and ``gamma`` ``None`` (no decay) or a float32 tensor ``(heads,)``,
    and returns the output ``(batch, heads, n, d)``.  If it takes the keywords
    ``initial_state``, ``return_state`` or ``precision``, they are passed; a call
    that needs one it does not take raises ``TypeError``.

    Example::

        def mine(b, c, v, gamma):
            return leettriton.reference(b, c, v, gamma).to(v.dtype)
        leettriton.register_method("mine", mine)
        o = leettriton.linear_attention(b, c, v, 0.9, method="mine")
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {type_name(name)}")
    if name in _BUILTIN or name in _TORCH or name in ALIASES or name == "auto":
        raise ValueError(f"method name {name!r} is taken by a built-in method")
    _USER[name] = UserMethod.wrap(fn)
    _refresh()


def unregister_method(name: str) -> None:
    """Remove the user method ``name`` (a no-op if there is none)."""
    if _USER.pop(name, None) is not None:
        _refresh()
