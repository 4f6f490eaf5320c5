"""What a built-in method is to the rest of the package: :class:`Method`, and the :class:`Plan` it runs.

Each method's home, ``leettriton/methods/<name>/``, holds its Triton kernels
and launcher (``kernels.py``), its config table and schedule (``space.py``),
and one :class:`Method` (``__init__.py``) that names them (docs/design.md §3, §4).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..autotune.configs import KernelSpace
from ..autotune.families import Family
from ..problem import Problem

__all__ = ["Method", "Plan", "no_schedule"]


@dataclass(frozen=True)
class Plan:
    """How one call runs, resolved once per shape key (docs/design.md §4).

    Attributes:
        method: the registered name that runs.
        configs: kernel space name → pinned config (a heuristic file's choice), or
            None: the kernels autotune themselves.
        schedule: the method's own launch parameters for this shape (e.g. the
            segment length), from its ``schedule`` rule.
    """

    method: str
    run: Callable[[Problem, "Plan"], None]
    configs: Optional[Mapping[str, Mapping[str, int]]] = None
    schedule: Mapping[str, Any] = field(default_factory=dict)

    def config(self, space: KernelSpace) -> Optional[Mapping[str, int]]:
        """The pinned config of the kernel of ``space``, or None to autotune it."""
        return None if self.configs is None else self.configs.get(space.name)


def no_schedule(p: Problem, family: Family, configs: Optional[Mapping]) -> Mapping[str, Any]:
    return {}


def no_alternatives(p: Problem, family: Family) -> Sequence[Mapping[str, Mapping[str, int]]]:
    return ()


@dataclass(frozen=True)
class Method:
    """A built-in method.

    Attributes:
        name: its registered name.
        launch: ``launch(problem, plan)`` fills ``problem.out`` (and ``problem.state``): it only
            launches, with the plan's configs and schedule.
        spaces: the config space of every kernel it may launch (the tuner and the
            heuristic files name kernels by these spaces' names).
        torch_twin: the PyTorch version, ``twin(problem)``, run for CPU tensors outside the interpreter.
        schedule: ``schedule(problem, family, configs) -> dict``: the method's launch parameters for
            this shape (segment or leaf length), part of the plan.
        alternatives: ``alternatives(problem, family) -> [configs]``: pinned configs (space name →
            config) that the tuner times besides the autotuned choice, each under the schedule its
            own configs give (the autotuner times every config under one schedule).
        whole_call: spaces of kernels whose configs the tuner also times in the whole call: after the
            autotuned choice (and the alternatives), each other config of such a kernel that fits its
            launch, pinned beside the chosen configs of the others (an autotuner times its kernel
            alone, which can rank configs differently: leettriton/tune.py, ``_refined``).
        runs_reversed: ``launch`` runs a reversed problem (``Problem.reverse``, docs/design.md §10.3)
            correctly: every kernel it launches takes b, c, v and the output from ``problem_args``,
            and the launcher cuts the sequence only through ``Problem.rows``.  A method without it
            gets reversed copies from the backward instead.
        per_token_decay: ``launch`` runs a problem with a per-token decay (``Problem.log_decay``,
            docs/design.md §1.6); ``method="auto"`` with one picks such a method, and naming a method
            without it raises ``NotImplementedError``.
    """

    name: str
    launch: Callable[[Problem, Plan], None]
    spaces: tuple[KernelSpace, ...]
    torch_twin: Callable[[Problem], None]
    schedule: Callable[[Problem, Family, Optional[Mapping]], Mapping[str, Any]] = no_schedule
    alternatives: Callable[[Problem, Family], Sequence[Mapping[str, Mapping[str, int]]]] = no_alternatives
    whole_call: tuple[KernelSpace, ...] = ()
    runs_reversed: bool = False
    per_token_decay: bool = False
