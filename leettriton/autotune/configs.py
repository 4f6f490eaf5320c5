"""Config spaces per kernel and family, and the autotune wrapper every kernel uses.

Each kernel declares one :class:`KernelSpace`: the axes of its configs per
family (tile sizes, ``num_warps``, ``num_stages``), the interpreter's single
config, and a pruning filter (shared memory, registers, tiles larger than the
problem).  :func:`autotune` turns that into ``@triton.autotune`` with

* every family's configs in the list (built at import, pure Python),
* an ``early_config_prune`` that, at the first launch for a key, keeps only the
  current family's configs that fit (so the GPU is probed lazily, never at import),
* a ``do_bench`` stand-in that never benchmarks under the interpreter.

``LEETTRITON_AUTOTUNE=0`` keeps only the first fitting config of the family
(no benchmarking on the GPU either): the test suite uses it so that hundreds of
shapes do not each tune dozens of configs; ``tests/test_configs.py`` launches
every config explicitly instead.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import triton
from triton import knobs

from .families import FAMILIES, Family, current_family, is_interpreting

__all__ = ["KernelSpace", "autotune", "launch", "chosen_config", "KERNELS", "config_dict", "autotune_enabled",
           "recording", "PinnedConfigWarning"]

ConfigDict = Mapping[str, int]

# Every autotuned kernel of the package, by space name (the tuner reads their choices).
KERNELS: dict[str, Any] = {}


def _default_fits(config: ConfigDict, args: Mapping[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class KernelSpace:
    """The configs one kernel may run with.

    Attributes:
        name: the kernel's key in heuristic files and in :data:`KERNELS`.
        axes: per family name (or ``"default"``), the values of each axis (or a
            list of such dicts: the union of their products, in order); the
            axes ``num_warps`` and ``num_stages`` are launch options, the rest
            are ``tl.constexpr`` meta-parameters of the kernel.
        cpu: the one config used under the interpreter.
        smem: ``smem(config, args) -> bytes``: shared memory the config needs for
            the launch whose named arguments are ``args`` (tensors, sizes).
        fits: ``fits(config, args) -> bool``: any other pruning (registers per
            thread, tiles larger than the problem).
        keep: ``keep(config) -> bool``: drops combinations of the axes that no
            launch could use, whatever its shape, from every family's list.
    """

    name: str
    axes: Mapping[str, Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]]]
    cpu: ConfigDict
    smem: Callable[[ConfigDict, Mapping[str, Any]], int]
    fits: Callable[[ConfigDict, Mapping[str, Any]], bool] = field(default=_default_fits)
    keep: Callable[[ConfigDict], bool] | None = None

    def family_configs(self, family: Family | str) -> list[dict[str, int]]:
        """All configs of a family, before pruning for a particular launch."""
        name = family if isinstance(family, str) else family.name
        if name == "cpu":
            return [dict(self.cpu)]
        axes = self.axes.get(name)
        if axes is None:
            axes = self.axes["default"]
        configs = []
        for part in [axes] if isinstance(axes, Mapping) else axes:  # one product, or a union of products
            keys = list(part)
            configs += [dict(zip(keys, values)) for values in itertools.product(*(part[k] for k in keys))]
        return configs if self.keep is None else [cfg for cfg in configs if self.keep(cfg)]

    def all_configs(self) -> list[dict[str, int]]:
        """The union of every family's configs (the list handed to ``triton.autotune``)."""
        seen: dict[tuple, dict[str, int]] = {}
        for fam in FAMILIES:
            for cfg in self.family_configs(fam):
                seen.setdefault(tuple(sorted(cfg.items())), cfg)
        return list(seen.values())

    def usable(self, family: Family, args: Mapping[str, Any]) -> list[dict[str, int]]:
        """The family's configs that fit a launch with named arguments ``args``."""
        configs = self.family_configs(family)
        if family.name == "cpu":  # the interpreter's one config serves every shape
            return configs
        in_smem = [cfg for cfg in configs if self.smem(cfg, args) <= family.smem_per_block]
        good = [cfg for cfg in in_smem if self.fits(cfg, args)]
        if good or not in_smem:
            return good
        # every config is wasteful for this shape (tiles far larger than a tiny r or d):
        # the one needing the least shared memory still computes it correctly (masked)
        return [min(in_smem, key=lambda cfg: self.smem(cfg, args))]


def autotune_enabled() -> bool:
    """False when ``LEETTRITON_AUTOTUNE=0``: each kernel then runs its family's first fitting config."""
    return os.environ.get("LEETTRITON_AUTOTUNE", "1") not in ("0", "off", "false")


def config_dict(config: "triton.Config") -> dict[str, int]:
    """A ``triton.Config`` as the plain dict used in heuristic files."""
    out = dict(config.kwargs)
    out["num_warps"] = config.num_warps
    out["num_stages"] = config.num_stages
    return out


def _to_triton(cfg: ConfigDict) -> "triton.Config":
    meta = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
    return triton.Config(meta, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2))


_bench_state = threading.local()


def _do_bench(kernel_call, quantiles):
    # Never benchmark under the interpreter (every config is equally slow), nor a
    # single surviving config (older Triton benchmarks even a list of one).
    if is_interpreting() or getattr(_bench_state, "single", False):
        return [0.0 for _ in quantiles]
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


class NoConfigFits(ValueError):
    pass


def autotune(space: KernelSpace, key: Sequence[str], **kwargs):
    """``@triton.autotune`` over ``space``, pruned lazily to the current family.

    ``key`` names the kernel arguments the choice depends on: feature flags and
    the sizes r, d -- never the sequence length.  Extra keyword arguments
    (``restore_value``, ``reset_to_zero``) go to ``triton.autotune``.
    """
    def prune(configs, named_args, **meta):
        family = current_family()
        args = {**named_args, **meta}
        wanted = {tuple(sorted(c.items())) for c in space.usable(family, args)}
        kept = [c for c in configs if tuple(sorted(config_dict(c).items())) in wanted]
        if not kept:
            raise NoConfigFits(
                f"leettriton: no config of kernel '{space.name}' fits the {family.name} family "
                f"(shared memory {family.smem_per_block} B) for this launch")
        if not autotune_enabled():
            # keep the family's order: its first fitting config
            order = [tuple(sorted(c.items())) for c in space.family_configs(family)]
            kept.sort(key=lambda c: order.index(tuple(sorted(config_dict(c).items()))))
            kept = kept[:1]
        _bench_state.single = len(kept) == 1
        return kept

    def decorate(fn):
        tuned = triton.autotune(
            configs=[_to_triton(c) for c in space.all_configs()],
            key=list(key),
            prune_configs_by={"early_config_prune": prune},
            do_bench=_do_bench,
            **kwargs,
        )(fn)
        tuned.space = space
        tuned.key_names = tuple(key)
        tuned.chosen = {}  # launch key -> (Config, its launch kwargs): see launch()
        KERNELS[space.name] = tuned
        return tuned

    return decorate


_launch_log = threading.local()
_FITS_CACHE: dict[tuple, bool] = {}
_STRIDES = ("b_strides", "c_strides", "v_strides", "o_strides")  # (batch, head, row, column) each


def _fits(space: KernelSpace, config: ConfigDict, args: Mapping[str, Any]) -> bool:
    """Whether ``config`` fits this launch on the current family (cached per shape class:
    the sizes r, d (and KW), the dot precision, the dtype of v, which rows are 16-element aligned
    and the inner strides -- what the spaces' ``smem`` and ``fits`` functions read besides the config)."""
    family = current_family()
    v = args.get("v_ptr")
    key = (space.name, family.name, tuple(config.items()), args.get("R"), args.get("D"), args.get("KW"),
           args.get("DOT_PRECISION"), getattr(v, "dtype", None),
           tuple(args[k][2] % 16 == 0 if k in args else True for k in _STRIDES),
           tuple(args[k][3] if k in args else None for k in _STRIDES))
    hit = _FITS_CACHE.get(key)
    if hit is None:
        if family.name == "cpu":
            hit = True  # the interpreter runs any config
        else:
            hit = space.smem(config, args) <= family.smem_per_block and space.fits(config, args)
        _FITS_CACHE[key] = hit
    return hit


@contextlib.contextmanager
def recording():
    """Collect ``(kernel, args)`` for every launch made inside the block (they still run)."""
    log: list[tuple[Any, dict]] = []
    previous = getattr(_launch_log, "log", None)
    _launch_log.log = log
    try:
        yield log
    finally:
        _launch_log.log = previous


class PinnedConfigWarning(UserWarning):
    """A pinned config (from a heuristic file or a caller) is not one of its kernel's configs on this family."""


_WARNED: set = set()
_MEMBERS: dict[tuple, frozenset] = {}


def _in_family(space: KernelSpace, config: ConfigDict, family: Family) -> bool:
    members = _MEMBERS.get((space.name, family.name))
    if members is None:
        members = _MEMBERS[(space.name, family.name)] = frozenset(
            tuple(sorted(c.items())) for c in space.family_configs(family))
    return tuple(sorted(config.items())) in members


def _replace_misfit(space: KernelSpace, config: ConfigDict, args: Mapping[str, Any]) -> ConfigDict:
    """The config launched in place of a pinned ``config`` that does not fit this launch: the family's
    first config that does (docs/design.md §4.4).

    A heuristic file's nearest point may have been measured at another r or d, where its config fit:
    that replacement is part of the documented lookup.  A config that is not one of the family's
    at all means the file (or the caller) pinned a config of other kernels: a
    :class:`PinnedConfigWarning` says so once per kernel and config (the test suite makes it an error).
    """
    family = current_family()
    if not _in_family(space, config, family):
        key = (space.name, tuple(sorted(config.items())))
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(PinnedConfigWarning(
                f"leettriton: the pinned config {dict(config)} of kernel '{space.name}' is not one of its "
                f"configs on the {family.name} family (a heuristic file measured with other kernels?); the "
                f"family's first config that fits runs instead. Measure the file again with "
                f"`python -m leettriton.tune`."), stacklevel=4)
    return space.usable(family, args)[0]


def launch(kernel, grid, config: ConfigDict | None, **args):
    """Launch an autotuned ``kernel``: by its autotuner, or directly with ``config``.

    ``config`` (a dict such as a heuristic file holds) bypasses autotuning:
    the call costs one compile and no benchmarking.  A pinned config that does
    not fit this launch is replaced by the family's first config that does
    (:func:`_replace_misfit`), with a :class:`PinnedConfigWarning` when it is not
    one of the family's configs at all.
    """
    log = getattr(_launch_log, "log", None)
    if log is not None:
        log.append((kernel, args))
    if config is not None and not _fits(kernel.space, config, args):
        config = _replace_misfit(kernel.space, config, args)
    if config is None:
        return _autotuned_launch(kernel, grid, args)
    meta = dict(config)
    num_warps = meta.pop("num_warps", 4)
    num_stages = meta.pop("num_stages", 2)
    return kernel.fn[grid](**args, **meta, num_warps=num_warps, num_stages=num_stages)


def _autotuned_launch(kernel, grid, args):
    """``kernel[grid](**args)``, the autotuner's choice for this key launched directly once made.

    Triton's autotuner recomputes its key from every argument on each call (tens of
    microseconds for the ~45 arguments of these kernels).  The key here is the one
    Triton uses (the ``key`` arguments and the dtype of every tensor argument); a choice
    is reused only while the autotuner still holds it (clearing ``kernel.cache`` forces a
    new tuning), and ``kernel.best_config`` is kept up to date as Triton does.
    """
    key = (tuple(args[k] for k in kernel.key_names),
           tuple(a.dtype for a in args.values() if isinstance(a, torch.Tensor)))
    hit = kernel.chosen.get(key)
    if hit is not None:
        cfg, kwargs = hit
        if any(c is cfg for c in kernel.cache.values()):
            kernel.best_config = cfg
            return kernel.fn[grid](**args, **kwargs)
    ret = kernel[grid](**args)
    cfg = getattr(kernel, "best_config", None)
    if cfg is not None and cfg.pre_hook is None:
        kernel.chosen[key] = (cfg, cfg.all_kwargs())
    return ret


def chosen_config(kernel) -> dict[str, int] | None:
    """The config the autotuner of ``kernel`` ran last, as a dict (``None`` before any run)."""
    best = getattr(kernel, "best_config", None)
    return None if best is None else config_dict(best)


class CompiledLaunches:
    """The compiled kernels of one autotuned kernel by a caller's specialisation key, launched directly.

    A launch through Triton's ``JITFunction.run`` binds and specialises every argument, hashes the
    result and looks the compiled kernel up again on every call: tens of microseconds of host time,
    more than a one-token decode step takes on the GPU.  A caller that can name, in one hashable key,
    everything Triton specialises a kernel on -- each tensor's dtype and 16-byte alignment, the value
    of each specialised integer (sizes, strides), the flags -- and everything the config choice depends
    on (the autotune key), launches the first call of each key through :func:`launch` (autotuning or
    pinned config, compile), keeps the compiled kernel, its config and its grid, and launches every later
    call of the key straight through the compiled kernel's launcher, on the current device's current
    stream (docs/design.md §4.5).  The key must also fix the grid.  Under the interpreter there is
    nothing compiled: every call goes through :func:`launch`.
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.arg_names = tuple(kernel.fn.arg_names)
        self.compiled: dict[Any, tuple] = {}
        # Triton chose the interpreter or the compiler when the kernel was decorated: that cannot change
        self.interpreted = is_interpreting()

    def launch(self, key, grid, config: ConfigDict | None, args: dict, device: torch.device) -> None:
        """Launch with named arguments ``args`` (no config entries) on tensors of ``device``; ``grid(meta)``
        as for :func:`launch`.  Tensors that are not on a CUDA device (the ``meta`` device of the launch
        recorder) go through :func:`launch`, as under the interpreter."""
        if self.interpreted or device.type != "cuda":
            launch(self.kernel, grid, config, **args)
            return
        device = torch._C._cuda_getDevice()  # the current device, which Triton launches on (CUDA is up)
        hit = self.compiled.get((device, key))
        if hit is None:
            if config is not None and not _fits(self.kernel.space, config, args):
                config = _replace_misfit(self.kernel.space, config, args)
            kernel = launch(self.kernel, grid, config, **args)
            ran = config if config is not None else chosen_config(self.kernel)
            if kernel is not None and ran is not None and hasattr(kernel, "run"):
                meta = {k: v for k, v in ran.items() if k not in ("num_warps", "num_stages")}
                grid_now = tuple(grid(meta) if callable(grid) else grid)
                self.compiled[(device, key)] = (kernel, meta, grid_now + (1,) * (3 - len(grid_now)))
            return
        kernel, meta, (g0, g1, g2) = hit
        values = [args[name] if name in args else meta[name] for name in self.arg_names]
        runtime = knobs.runtime
        stream = torch._C._cuda_getCurrentRawStream(device)  # what Triton's own launch path uses
        metadata = None if runtime.launch_enter_hook is None else kernel.launch_metadata((g0, g1, g2), stream, *values)
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, metadata,
                   runtime.launch_enter_hook, runtime.launch_exit_hook, *values)
