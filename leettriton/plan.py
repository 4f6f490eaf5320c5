"""From a validated call to what runs: ``auto``'s choice and the :class:`Plan` of every call.

A plan -- the method, the pinned config of each of its kernels (or None: they
autotune), and its schedule -- is resolved once per key (method, device, dtype,
flags, r, d, batch·heads, n) and cached; the method's launcher then only
launches (docs/design.md §4).

``method="auto"``: with a heuristic file for the device's family
(``LEETTRITON_HEURISTICS=path``, :func:`load_heuristics`, or the packaged
``autotune/heuristics/<family>.json``) the nearest measured point decides, and
its configs are launched directly (no autotune benchmarking on the call path).
Without one, :func:`fallback` decides and the kernels autotune themselves.
"""
from __future__ import annotations

from typing import Mapping, Optional

from . import registry
from .autotune import heuristics as _heuristics
from .autotune.families import Family, current_family, is_interpreting
from .methods import Plan
from .problem import Problem

__all__ = ["Plan", "resolve", "run_problem", "run_reversed", "choose", "fallback", "load_heuristics", "clear_plans",
           "known_call", "remember_call"]

_DTYPE_NAMES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
_PLANS: dict[tuple, Plan] = {}
_MAX_PLANS = 4096


def fallback(p: Problem, family: Family) -> str:
    """The documented rule used when no heuristic file covers the device.

    * n ≤ 64: ``vanilla`` (one tile: the quadratic form is cheapest);
    * batch·heads·⌈d / 64⌉ ≥ 2 × the family's multiprocessors: ``lightning_attention``
      (the fused walk already fills the GPU);
    * otherwise ``block_based`` (it also splits the sequence into segments).
    """
    B, H, n, r, d = p.shape
    if n <= 64:
        return "vanilla"
    if B * H * max(1, -(-d // 64)) >= 2 * family.num_sms:
        return "lightning_attention"
    return "block_based"


def _cpu_outside_interpreter(p: Problem) -> bool:
    return p.v.device.type == "cpu" and not is_interpreting()


def choose(p: Problem) -> tuple[str, Optional[Mapping]]:
    """``auto``'s method (and pinned kernel configs, or None to autotune) for ``p``.

    CPU tensors outside the interpreter run ``lightning_attention_torch``.
    """
    B, H, n, r, d = p.shape
    if _cpu_outside_interpreter(p):
        return "lightning_attention_torch", None
    family = current_family(p.v.device)
    table = _heuristics.active_heuristics(family.name, registry.method_names())
    if table is not None:
        hit = table.lookup(_DTYPE_NAMES[str(p.v.dtype)], p.has_decay, r, d, B * H, n)
        if hit is not None:
            return hit
    return fallback(p, family), None


PER_TOKEN_AUTO = "causal_dot_product"
"""``auto``'s method for a short sequence (n ≤ 64) with a per-token decay, where the heuristic file names none that
takes it: the recurrence (:func:`choose_per_token`)."""


def choose_per_token(p: Problem) -> tuple[str, Optional[Mapping]]:
    """``auto``'s method for ``p`` with a per-token decay, among those that take one (``Method.per_token_decay``):
    the heuristic file's method where it takes one (its configs, measured with a constant decay, are left to the
    autotuner: the per-token walk forms its decays per chunk), else :func:`fallback`'s, with
    :data:`PER_TOKEN_AUTO` where that one takes none (every built-in method takes one: a method added without it).  CPU tensors outside the interpreter run
    ``lightning_attention_torch``."""
    name, _ = choose(p)
    if registry.torch_method(name) is not None or registry.supports_per_token(name):
        return name, None
    name = fallback(p, current_family(p.v.device))
    return (name if registry.supports_per_token(name) else PER_TOKEN_AUTO), None


def _build(p: Problem, name: str, configs: Optional[Mapping]) -> Plan:
    if name == "auto" and p.log_decay is not None:
        name, configs = choose_per_token(p)
    elif name == "auto":
        name, configs = choose(p)
    user = registry.user_method(name)
    if user is not None:
        return Plan(name, lambda prob, plan: user.run(prob))
    if _cpu_outside_interpreter(p) and registry.torch_twin(name) is not None:
        name, configs = registry.torch_twin(name), None
    twin = registry.torch_method(name)
    if twin is not None:
        return Plan(name, lambda prob, plan: twin(prob))
    method = registry.builtin(name)
    schedule = method.schedule(p, current_family(p.v.device), configs)
    return Plan(name, method.launch, configs, schedule)


def resolve(p: Problem, name: str, configs: Optional[Mapping] = None) -> Plan:
    """The plan for running registered method ``name`` (or ``"auto"``) on ``p``.

    ``configs`` pins kernel configs (space name → config) and bypasses the cache;
    otherwise the plan is cached per key until the heuristics in use change.
    """
    if configs is not None:
        return _build(p, name, configs)
    B, H, n, r, d = p.shape
    key = (name, p.v.device, p.v.dtype, p.gamma is not None, p.initial_state is not None, p.state is not None,
           p.precision, B * H, n, r, d, _heuristics.generation(), p.log_decay is not None)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _build(p, name, None)
        if registry.user_method(plan.method) is None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def clear_plans() -> None:
    """Forget every cached plan (the next call of each shape resolves its plan again)."""
    _PLANS.clear()
    _CALLS.clear()


_CALLS: dict = {}


def known_call(key):
    """What :func:`remember_call` kept for a call signature ``key`` (None if nothing, or if the heuristics
    in use changed since): the public functions' fast path (docs/design.md §4.5).  Forgotten with the plans."""
    hit = _CALLS.get(key)
    if hit is not None and hit[0] == _heuristics.generation():
        return hit[1]
    return None


def remember_call(key, entry) -> None:
    """Keep ``entry`` for the calls of signature ``key`` (a public function's; it holds a plan)."""
    if len(_CALLS) >= _MAX_PLANS:
        _CALLS.clear()
    _CALLS[key] = (_heuristics.generation(), entry)


def run_problem(p: Problem, method: str, config: Optional[Mapping] = None) -> None:
    """Fill ``p.out`` (and ``p.state``) with registered ``method``; ``config`` pins kernel configs."""
    B, H, n, r, d = p.shape
    if n == 0 or B == 0 or H == 0:
        if p.state is not None:
            if p.initial_state is not None:
                p.state.copy_(p.initial_state)
            else:
                p.state.zero_()
        return
    plan = resolve(p, method, config)
    plan.run(p, plan)


def run_reversed(p: Problem, method: str) -> bool:
    """Fill ``p.out`` (and ``p.state``) of a reversed problem (``p.reverse``: docs/design.md §10.3) with
    registered ``method`` (or ``"auto"``), when the method that runs addresses reversed rows.

    Returns False, having run nothing, when it does not (a user method, a PyTorch method -- what CPU
    tensors run outside the interpreter --, or a built-in without ``runs_reversed``): the caller then
    runs the method on reversed copies.  The plan is the one of the same problem run forwards (the
    addressing changes no choice of method, config or schedule).
    """
    if not p.reverse:
        raise ValueError("run_reversed takes a reversed problem (Problem.reverse); run_problem runs the others")
    if p.log_decay is not None:   # its reversed decays are shifted by a row: the backward makes them itself
        return False
    B, H, n, r, d = p.shape
    if n == 0 or B == 0 or H == 0:
        run_problem(p, method)   # no rows: nothing is addressed
        return True
    plan = resolve(p, method)
    builtin = registry.builtin(plan.method)
    if builtin is None or not builtin.runs_reversed:
        return False
    plan.run(p, plan)
    return True


def load_heuristics(path: Optional[str], family: Optional[str] = None):
    """Use the heuristic file at ``path`` for ``method="auto"`` from now on.

    The file must have been measured on ``family`` (default: the current
    device's family; under the interpreter, ``cpu``).  ``path=None`` drops any
    file, so ``auto`` uses :func:`fallback`.  Returns the loaded
    :class:`~leettriton.autotune.heuristics.Heuristics` (or None).

    Raises ``HeuristicsError`` (a ``ValueError``) naming the file when it is
    unreadable, corrupt, or measured on another family.
    """
    family = family or current_family().name
    loaded = None if path is None else _heuristics.read_heuristics(path, family, registry.method_names())
    _heuristics.set_heuristics(loaded, family)
    return loaded
