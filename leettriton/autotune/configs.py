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
import functools
import itertools
import operator
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import triton
from triton import knobs

from .families import FAMILIES, Family, current_family, is_interpreting
from .launcher import direct_launch

__all__ = ["KernelSpace", "autotune", "launch", "chosen_config", "KERNELS", "config_dict", "autotune_enabled",
           "in_family", "pinnable_configs", "recording", "PinnedConfigWarning"]

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
        trial: ``trial(config, args, family) -> bool``: whether the autotuner may time this
            usable config for this launch (default: every one).  A config the launch's other
            parameters were not chosen for (segments sized for another occupancy or tile width) runs only
            when pinned: from a heuristic file, or timed by the tuner with its own schedule
            (``Method.alternatives``).
    """

    name: str
    axes: Mapping[str, Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]]]
    cpu: ConfigDict
    smem: Callable[[ConfigDict, Mapping[str, Any]], int]
    fits: Callable[[ConfigDict, Mapping[str, Any]], bool] = field(default=_default_fits)
    keep: Callable[[ConfigDict], bool] | None = None
    trial: Callable[[ConfigDict, Mapping[str, Any], Family], bool] | None = None

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
        usable = space.usable(family, args)
        if space.trial is not None:
            usable = [c for c in usable if space.trial(c, args, family)] or usable
        wanted = {tuple(sorted(c.items())) for c in usable}
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
    _RECORDERS.append(log)
    try:
        yield log
    finally:
        _launch_log.log = previous
        _RECORDERS.remove(log)


_RECORDERS: list = []  # the logs of every thread's recording() blocks: a direct launch checks for none first


class PinnedConfigWarning(UserWarning):
    """A pinned config (from a heuristic file or a caller) is not one of its kernel's configs on this family."""


_WARNED: set = set()
_MEMBERS: dict[tuple, frozenset] = {}


def in_family(space: KernelSpace, config: ConfigDict, family: Family) -> bool:
    """Whether ``config`` is one of ``space``'s configs on ``family`` (fitting a launch or not)."""
    members = _MEMBERS.get((space.name, family.name))
    if members is None:
        members = _MEMBERS[(space.name, family.name)] = frozenset(
            tuple(sorted(c.items())) for c in space.family_configs(family))
    return tuple(sorted(config.items())) in members


def pinnable_configs(space: KernelSpace, family: Family | str) -> list[dict[str, int]]:
    """The configs of ``space`` a heuristic file measured on ``family`` may pin: the family's list
    (:meth:`KernelSpace.family_configs`, its ``keep`` rule applied).  The interpreter (``cpu``) runs any
    config of the kernel, so a file of the ``cpu`` family may pin its own config or any family's."""
    name = family if isinstance(family, str) else family.name
    if name != "cpu":
        return space.family_configs(name)
    configs = space.family_configs(name)
    return configs + [cfg for cfg in space.all_configs() if cfg not in configs]


def _replace_misfit(space: KernelSpace, config: ConfigDict, args: Mapping[str, Any]) -> ConfigDict:
    """The config launched in place of a pinned ``config`` that does not fit this launch: the family's
    first config that does (docs/design.md §4.4).

    A heuristic file's nearest point may have been measured at another r or d, where its config fit:
    that replacement is part of the documented lookup.  A config that is not one of the family's
    at all means the file (or the caller) pinned a config of other kernels: a
    :class:`PinnedConfigWarning` says so once per kernel and config (the test suite makes it an error).
    """
    family = current_family()
    if not in_family(space, config, family):
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
    if is_interpreting():
        check_arguments(kernel, args)
    if config is not None and not _fits(kernel.space, config, args):
        config = _replace_misfit(kernel.space, config, args)
    if config is None:
        return _autotuned_launch(kernel, grid, args)
    meta = dict(config)
    num_warps = meta.pop("num_warps", 4)
    num_stages = meta.pop("num_stages", 2)
    return kernel.fn[grid](**args, **meta, num_warps=num_warps, num_stages=num_stages)


def check_arguments(kernel, args: Mapping[str, Any]) -> None:
    """Every launch argument must be a parameter of ``kernel``: a compiled launch refuses an unknown keyword
    (``KeyError``), which Triton's interpreter lets pass; checked under the interpreter so that a CPU run finds
    what a GPU run would refuse."""
    names = getattr(kernel, "arg_names", None) or getattr(getattr(kernel, "fn", None), "arg_names", None)
    if names is None:   # not a Triton kernel (a stand-in): nothing to check against
        return
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise TypeError(f"{getattr(kernel.fn, '__name__', kernel)}: launch arguments that are not its parameters: "
                        f"{', '.join(unknown)}")


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


def chosen_configs(log) -> dict[str, dict[str, int]]:
    """{kernel space name: the config its autotuner ran last} for the kernels of a :func:`recording` log
    (those whose autotuner has run)."""
    configs = {}
    for kernel, _args in log:
        chosen = chosen_config(kernel)
        if chosen is not None:
            configs[kernel.space.name] = chosen
    return configs


_DATA_PTR = torch.Tensor.data_ptr
# The current device (Triton launches on it) and its current stream, as Triton's own launch path reads them;
# looked up on first use (a CPU build of torch has neither).  perf/host_overhead.py replaces both, and
# COMPILED_DEVICE, to run the compiled launch path with Triton's launcher stubbed out.
COMPILED_DEVICE = "cuda"


def _current_device() -> int:
    global _current_device
    _current_device = torch._C._cuda_getDevice  # from now on the function itself, not this frame
    return _current_device()


def _current_stream(device: int) -> int:
    global _current_stream
    _current_stream = torch._C._cuda_getCurrentRawStream
    return _current_stream(device)


_reduce, _or = functools.reduce, operator.or_


def _live(hook):
    """A launch hook Triton would call, or None: Triton's hooks are chains that may hold nothing."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


class Launch:
    """One key's launch, everything but the tensors fixed: the compiled kernel and its grid, and every
    other argument in the kernel's order (docs/design.md §4.5).

    Calling it with the tensors (in the order of :attr:`CompiledLaunches.pointers`) launches and returns
    True, or returns False, launching nothing, when the fixed parts do not hold for this call: another
    current device, a tensor not 16-byte aligned, an autotuned choice the autotuner no longer holds, or a
    launch recorder listening (the caller then launches through :meth:`CompiledLaunches.launch`).  Under
    the interpreter (``run`` None) the same fixed arguments go through :func:`launch`, so the key and the
    argument tuple are exercised on the CPU too.
    """

    __slots__ = ("kernel", "names", "take", "fixed", "config", "grid", "device", "run", "function", "packed",
                 "compiled", "tuned", "tuned_key", "direct", "coop", "pdl")

    def __init__(self, owner: "CompiledLaunches", args: Mapping[str, Any], grid, config, compiled=None,
                 device=None, tuned=None) -> None:
        self.kernel = owner.kernel
        self.config = config
        self.compiled = compiled
        self.device = device
        pointers = {name: i for i, name in enumerate(owner.pointers)}
        if compiled is None:  # the interpreter: launch() takes the named arguments and the config
            self.names = tuple(name for name in owner.arg_names if name in args)
            self.grid = grid
            self.run = self.function = self.packed = self.direct = self.coop = self.pdl = None
        else:  # the compiled launcher takes every argument in order, the config's meta-parameters included
            meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
            self.names = owner.arg_names
            args = {**args, **meta}
            grid_now = tuple(grid(meta) if callable(grid) else grid)
            self.grid = grid_now + (1,) * (3 - len(grid_now))
            self.run, self.function, self.packed = compiled.run, compiled.function, compiled.packed_metadata
            # the launcher's C function, called as its Python wrapper would call it, where that wrapper's
            # form is known (autotune/launcher.py); else None, and the launcher is called as it is
            direct = direct_launch(self.run)
            self.direct = None if direct is None else direct[0]
            self.coop, self.pdl = (None, None) if direct is None else direct[1][:2]
        others = [name for name in self.names if name not in pointers]
        self.fixed = tuple(args[name] for name in others)
        where = {name: len(pointers) + i for i, name in enumerate(others)}
        where.update(pointers)
        order = [where[name] for name in self.names]
        # None when the kernel takes its tensors first, in the order of ``pointers``: the pointers and the
        # fixed arguments are then the launcher's arguments as they are
        self.take = None if order == list(range(len(order))) else operator.itemgetter(*order)
        self.tuned, self.tuned_key = tuned, None
        if tuned is not None:  # the autotuner's key of this choice: it is reused while the autotuner holds it
            self.tuned_key = next((k for k, c in self.kernel.cache.items() if c is tuned), None)

    def __call__(self, tensors: tuple) -> bool:
        run = self.run
        if run is None:
            values = tensors + self.fixed
            if self.take is not None:
                values = self.take(values)
            launch(self.kernel, self.grid, self.config, **dict(zip(self.names, values)))
            return True
        if _RECORDERS and getattr(_launch_log, "log", None) is not None:
            return False
        tuned = self.tuned
        if tuned is not None:
            kernel = self.kernel
            if kernel.cache.get(self.tuned_key) is not tuned:
                return False
            kernel.best_config = tuned  # as Triton's autotuner says which config ran
        device = _current_device()
        if device != self.device:
            return False
        ptrs = tuple(map(_DATA_PTR, tensors))
        if _reduce(_or, ptrs) & 15:
            return False  # compiled for 16-byte aligned pointers; this call's are not all aligned
        values = ptrs + self.fixed
        if self.take is not None:
            values = self.take(values)
        # the current stream is read on every call: it changes under a CUDA graph's capture, and callers
        # switch streams; the device is read for the same reason (both are C calls of a few tens of ns)
        stream = _current_stream(device)
        g0, g1, g2 = self.grid
        runtime = knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        # Triton's hooks are chains (empty unless a profiler listens), or a function or None in older releases
        if (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True)):
            direct = self.direct
            if direct is not None:  # what run(...) below does, without its Python frame (no scratch to allocate)
                direct(g0, g1, g2, stream, self.function, self.coop, self.pdl, None, None, self.packed, None, None,
                       None, *values)
            else:
                run(g0, g1, g2, stream, self.function, self.packed, None, None, None, *values)
            return True
        enter, leave = _live(enter), _live(leave)
        metadata = self.compiled.launch_metadata(self.grid, stream, *values)
        run(g0, g1, g2, stream, self.function, self.packed, metadata, enter, leave, *values)
        return True


ALL_COMPILED_LAUNCHES: list["CompiledLaunches"] = []


class CompiledLaunches:
    """The compiled kernels of one autotuned kernel by a caller's specialisation key, launched directly.

    A launch through Triton's ``JITFunction.run`` binds and specialises every argument, hashes the
    result and looks the compiled kernel up again on every call: tens of microseconds of host time,
    more than a one-token decode step takes on the GPU.  A caller that names, in one hashable key,
    everything Triton specialises a kernel on -- each tensor's dtype, the value of each specialised
    integer (sizes, strides), the flags -- and everything the config choice depends on (the autotune key,
    the pinned config), launches the first call of each key through :func:`launch` (autotuning or pinned
    config, compile) and keeps a :class:`Launch`: the compiled kernel, its grid and every argument but
    the tensors.  Later calls of the key call the Launch with the tensors alone (16-byte alignment, the
    one property of a tensor Triton specialises on besides its dtype, is checked there), straight
    through the compiled kernel's launcher on the current device's current stream (docs/design.md §4.5).
    The key must also fix the grid.  :meth:`key` is such a key for any launch: every argument but the
    tensors by value, the tensors by dtype.

    ``pointers`` names the kernel's tensor arguments, in the order a Launch takes them.  Under the
    interpreter the Launch goes through :func:`launch` with its fixed arguments (so the same key and
    argument logic runs on the CPU); tensors on another device (the ``meta`` device of the launch
    recorder) always go through :func:`launch`.
    """

    MAX_LAUNCHES = 4096

    def __init__(self, kernel, pointers: Sequence[str]) -> None:
        self.kernel = kernel
        self.arg_names = tuple(kernel.fn.arg_names)
        self.pointers = tuple(pointers)
        meta = {k for k in kernel.space.cpu if k not in ("num_warps", "num_stages")}
        self.by_value = tuple(n for n in self.arg_names if n not in self.pointers and n not in meta)
        self.launches: dict[Any, Launch] = {}
        # Triton chose the interpreter or the compiler when the kernel was decorated: that cannot change
        self.interpreted = is_interpreting()
        ALL_COMPILED_LAUNCHES.append(self)

    def key(self, config: ConfigDict | None, args: Mapping[str, Any], grid_key=None) -> tuple:
        """A key that holds everything a launch with named arguments ``args`` and ``config`` depends on:
        the config, every argument but the tensors by value (sizes, strides, flags: what Triton
        specialises on, and more), the tensors by dtype (their alignment is checked by the Launch), and
        ``grid_key``: whatever else the grid reads (a batch size the kernel does not take, say)."""
        return (None if config is None else tuple(config.items()), tuple([args[n] for n in self.by_value]),
                tuple([args[n].dtype for n in self.pointers]), grid_key)

    def launch_args(self, grid, config: ConfigDict | None, args: dict, grid_key=None) -> Launch | None:
        """:meth:`launch` with the key :meth:`key` gives; the device is that of ``v_ptr`` (the inputs')."""
        key = (None if config is None else tuple(config.items()), tuple([args[n] for n in self.by_value]),
               tuple([args[n].dtype for n in self.pointers]), grid_key)
        return self.launch(key, grid, config, args, args["v_ptr"].device)

    def launch(self, key, grid, config: ConfigDict | None, args: dict, device: torch.device) -> Launch | None:
        """Launch with named arguments ``args`` (no config entries) on tensors of ``device``; ``grid(meta)``
        as for :func:`launch`.  Returns the Launch later calls of ``key`` may make directly (None when
        there is none: tensors off CUDA outside the interpreter, pointers not 16-byte aligned)."""
        tensors = tuple([args[name] for name in self.pointers])
        if self.interpreted:
            where = key
        elif device.type != COMPILED_DEVICE:
            launch(self.kernel, grid, config, **args)
            return None
        else:
            where = (_current_device(), key)
        hit = self.launches.get(where)
        if hit is not None and hit(tensors):
            return hit
        if config is not None and not _fits(self.kernel.space, config, args):
            config = _replace_misfit(self.kernel.space, config, args)
        if self.interpreted:
            entry = Launch(self, args, grid, config)
            entry(tensors)
        else:
            kernel = launch(self.kernel, grid, config, **args)
            tuned = None if config is not None else getattr(self.kernel, "best_config", None)
            ran = config if config is not None else chosen_config(self.kernel)
            aligned = not any(_DATA_PTR(x) & 15 for x in tensors)
            hooked = tuned is not None and tuned.pre_hook is not None  # a hook Triton runs before each launch
            if kernel is None or ran is None or not hasattr(kernel, "run") or not aligned or hooked:
                return None
            entry = Launch(self, args, grid, ran, kernel, where[0], tuned)
        if len(self.launches) >= self.MAX_LAUNCHES:
            self.launches.clear()
        self.launches[where] = entry
        return entry
