"""Persisted, measured heuristic files: which method and config to run for a shape.

A file ``heuristics/<family>.json`` is written only by ``python -m leettriton.tune``.
It records how it was measured (device, versions, date, command, grid) and, per
measured point (dtype, decay, r, d, batch·heads, n), the time of every method at
its best config and the winner::

    {"format": "leettriton-heuristics/1", "family": "h100",
     "measured": {"device": ..., "torch": ..., "triton": ..., "date": ..., "command": ...},
     "grid": {"dtype": [...], "decay": [...], "rd": [[r, d], ...], "bh": [...], "n": [...]},
     "points": [{"dtype": "float16", "decay": true, "r": 128, "d": 128, "bh": 32, "n": 2048,
                 "best": "block_based", "config": {<kernel space>: {<config>}},
                 "times_ms": {<method>: ms or null}, "configs": {<method>: {...}},
                 "measured": {"git_sha": ..., "date": ..., "timing": "graph replay", ...},
                 "pruned": [<method>, ...]}, ...]}     # optional: left out (``tune --prune``)

Loading checks the whole file once (:func:`read_heuristics`): the keys each level must hold and their
JSON types, the dtype names, the methods named (``auto`` is never a choice), each point once, and
every pinned config one of its kernel's configs on the file's family; anything else is a
:class:`HeuristicsError` naming the file, the point and the key (docs/design.md §5.4).  Calls then
trust the loaded table.

At call time :func:`lookup` takes the nearest point -- exact on dtype and decay,
nearest in log2 space on batch·heads, n, r and d, a tie going to the point with the
smallest (r, d, batch·heads, n), so the answer never depends on the order of the
file's points -- and returns its method and config; answers are cached per shape,
so a call costs a dictionary lookup.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Collection, Mapping, Optional

FORMAT = "leettriton-heuristics/1"
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heuristics")

__all__ = ["HeuristicsError", "Heuristics", "read_heuristics", "active_heuristics", "set_heuristics",
           "default_path", "FORMAT"]


class HeuristicsError(ValueError):
    """A heuristic file that cannot be used: unreadable, corrupt, foreign, from another version, or
    holding a field of the wrong type or value (docs/design.md §5.4).

    The message names the file, and for a bad point its index and key fields, the key, what was
    expected and what was found.  Attributes: ``path``; ``point``: the point's index, or None for
    the file as a whole; ``key``: the offending key (``config['vanilla.fwd']['BT']``), or None.
    """

    def __init__(self, message: str, path: Optional[str] = None, point: Optional[int] = None,
                 key: Optional[str] = None):
        super().__init__(message)
        self.path, self.point, self.key = path, point, key


def default_path(family: str) -> str:
    return os.path.join(HERE, f"{family}.json")


class Heuristics:
    """A loaded heuristic file (see the module docstring for the format)."""

    def __init__(self, data: Mapping[str, Any], path: str):
        self.path = path
        self.data = data
        self.family: str = data["family"]
        self.points: list[dict] = [p for p in data["points"] if p.get("best")]
        self._by_kind: dict[tuple[str, bool], list[dict]] = {}
        for p in self.points:
            self._by_kind.setdefault((p["dtype"], bool(p["decay"])), []).append(p)
        self._cached = functools.lru_cache(maxsize=4096)(self._lookup)

    def lookup(self, dtype: str, decay: bool, r: int, d: int, bh: int, n: int) -> Optional[tuple[str, dict]]:
        """``(method, config)`` of the nearest measured point, or None when no point has this dtype and decay."""
        return self._cached(dtype, decay, r, d, bh, n)

    def nearest_point(self, dtype: str, decay: bool, r: int, d: int, bh: int, n: int) -> Optional[dict]:
        """The measured point :meth:`lookup` takes for this shape (with every method's times and configs), or
        None when no point has this dtype and decay: the nearest in (log batch·heads, log n, log r, log d)."""
        candidates = self._by_kind.get((dtype, decay))
        if not candidates:
            return None
        want = [math.log2(max(x, 1)) for x in (bh, n, r, d)]

        def distance(p):
            have = [math.log2(max(p[k], 1)) for k in ("bh", "n", "r", "d")]
            # a shape halfway between two points (n = 4096 between 2048 and 8192) takes the smaller one
            return sum((a - b) ** 2 for a, b in zip(want, have)), p["r"], p["d"], p["bh"], p["n"]

        return min(candidates, key=distance)

    def _lookup(self, dtype, decay, r, d, bh, n):
        best = self.nearest_point(dtype, decay, r, d, bh, n)
        if best is None:
            return None
        return best["best"], best.get("config") or {}


DTYPES = ("float16", "bfloat16", "float32")  # the input dtypes a point may name (those the kernels take)
FILE_KEYS = ("format", "family", "points")
POINT_KEYS = ("dtype", "decay", "r", "d", "bh", "n", "best")   # "best": null where nothing was measured
_SHAPE_KEYS = ("r", "d", "bh", "n")
_MISSING = object()


def _found(value: Any) -> str:
    """``value`` as the file spells it, and its JSON type."""
    if value is None:
        return "null"
    kind = ("a boolean" if isinstance(value, bool) else
            "an integer" if isinstance(value, int) else "a number" if isinstance(value, float) else
            "a string" if isinstance(value, str) else "a list" if isinstance(value, list) else "an object")
    text = json.dumps(value)
    return f"{text if len(text) <= 80 else text[:77] + '...'} ({kind})"


def _is_int(value: Any) -> bool:
    return type(value) is int   # a JSON integer: not a boolean, a string or a number with a fraction


def _hint(path: str) -> str:
    hint = " Correct the file, or measure it again with `python -m leettriton.tune` (docs/design.md §5.5)"
    if os.environ.get("LEETTRITON_HEURISTICS") == path:
        hint += "; unset LEETTRITON_HEURISTICS to use the packaged file"
    return hint + "."


def _fail(path: str, why: str, point: Optional[int] = None, key: Optional[str] = None):
    raise HeuristicsError(f"heuristic file {path}: {why}.{_hint(path)}", path, point, key)


class _Checker:
    """Checks one loaded file against the format (docs/design.md §5.4): every key's type, the required
    keys of the file and of each point, the methods named, and every pinned config a member of its
    kernel's configs on the file's family."""

    def __init__(self, path: str, family: str, methods: Collection[str], kernels: Mapping[str, Any]):
        self.path, self.family, self.kernels = path, family, kernels
        self.methods = tuple(m for m in methods if m != "auto")   # auto is what reads the file, not a choice
        self.members: dict[str, tuple[frozenset, list[dict]]] = {}
        self.where, self.index = "", None

    def fail(self, key: str, expected: str, found: Any = _MISSING):
        what = f"lacks the key {key}" if found is _MISSING else f"{key} is {_found(found)}"
        _fail(self.path, f"{self.where}{what}; expected {expected}", self.index, key)

    def point(self, i: int, p: Any, seen: dict) -> None:
        self.index = i
        if not isinstance(p, dict):
            self.where = f"point {i}: "
            self.fail(f"points[{i}]", "an object", p)
        fields = {k: p[k] for k in ("dtype", "decay", *_SHAPE_KEYS) if k in p}
        self.where = f"point {i} {json.dumps(fields)}: "
        for k in POINT_KEYS:
            if k not in p:
                self.fail(repr(k), f"every point to hold {', '.join(POINT_KEYS)} ('best': null where "
                                   f"nothing was measured)")
        if not isinstance(p["dtype"], str) or p["dtype"] not in DTYPES:
            self.fail("'dtype'", f"one of {', '.join(map(repr, DTYPES))}", p["dtype"])
        if not isinstance(p["decay"], bool):
            self.fail("'decay'", "a JSON boolean (true or false)", p["decay"])
        for k in _SHAPE_KEYS:
            if not _is_int(p[k]) or p[k] <= 0:
                self.fail(repr(k), "a positive integer", p[k])
        key = (p["dtype"], p["decay"], *(p[k] for k in _SHAPE_KEYS))
        if key in seen:
            self.fail("'dtype', 'decay', 'r', 'd', 'bh', 'n'",
                      f"each point once (point {seen[key]} has the same ones)", list(key))
        seen[key] = i
        best = p["best"]
        if best is not None:
            self.method("'best'", best)
        config = p.get("config")
        if config is not None:
            self.configs("config", config)
        configs = p.get("configs", {})
        if not isinstance(configs, dict):
            self.fail("'configs'", "an object: {method: {kernel: config}}", configs)
        for method, cfgs in configs.items():
            self.method(f"a method of 'configs' ({method!r})", method)
            if cfgs is not None:
                self.configs(f"configs[{method!r}]", cfgs)
        times = p.get("times_ms", {})
        if not isinstance(times, dict):
            self.fail("'times_ms'", "an object: {method: milliseconds or null}", times)
        for method, ms in times.items():
            self.method(f"a method of 'times_ms' ({method!r})", method)
            if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms >= 0):
                self.fail(f"times_ms[{method!r}]", "a non-negative number of milliseconds, or null", ms)
        pruned = p.get("pruned", [])
        if not isinstance(pruned, list):
            self.fail("'pruned'", "a list of methods", pruned)
        for j, method in enumerate(pruned):
            self.method(f"pruned[{j}]", method)

    def method(self, key: str, name: Any) -> None:
        if not isinstance(name, str):
            self.fail(key, "a method name (a string)", name)
        if name == "auto":
            self.fail(key, f"a method auto may run, not auto itself: one of {', '.join(self.methods)}", name)
        if name not in self.methods:
            self.fail(key, f"a registered method, not an unknown method {name!r}: one of "
                           f"{', '.join(self.methods)}", name)

    def configs(self, key: str, configs: Any) -> None:
        """``configs``: {kernel space name: config}, as a point's ``config`` holds them."""
        if not isinstance(configs, dict):
            self.fail(key, "an object: {kernel space name: config}", configs)
        unknown = sorted(k for k in configs if k not in self.kernels)
        if unknown:
            self.fail(key, f"configs of known kernels, not a config for unknown kernels {unknown}: "
                           f"kernels are {', '.join(sorted(self.kernels))}", configs)
        for name, cfg in configs.items():
            self.config(f"{key}[{name!r}]", name, cfg)

    def config(self, key: str, name: str, cfg: Any) -> None:
        """``cfg`` must be one of kernel ``name``'s configs on the file's family: the space's own list, its
        ``keep`` rule applied (``pinnable_configs``), so a rule of the space is never restated here."""
        from .configs import pinnable_configs

        if name not in self.members:
            listed = pinnable_configs(self.kernels[name].space, self.family)
            self.members[name] = (frozenset(tuple(sorted(c.items())) for c in listed), listed)
        members, listed = self.members[name]
        on = f"kernel '{name}' on the {self.family} family"
        if not isinstance(cfg, dict):
            self.fail(key, f"a config of {on} (an object)", cfg)
        for k, value in cfg.items():
            if not _is_int(value):
                self.fail(f"{key}[{k!r}]", "an integer", value)
        if tuple(sorted(cfg.items())) in members:
            return
        params = {k for c in listed for k in c}
        for k in cfg:
            if k not in params:
                self.fail(f"{key}[{k!r}]", f"only the parameters of {on}: {', '.join(sorted(params))}",
                          cfg[k])
        for k in sorted(params):
            if k not in cfg and all(k in c for c in listed):
                self.fail(f"{key}[{k!r}]", f"every config of {on} to set it")
        for k, value in cfg.items():
            values = sorted({c[k] for c in listed if k in c})
            if value not in values:
                self.fail(f"{key}[{k!r}]", f"one of {values} ({on})", value)
        self.fail(key, f"one of the configs of {on}: each value is one of its configs', but none combines them "
                       f"(the space's rules leave this combination out)", cfg)


def read_heuristics(path: str, family: Optional[str] = None, methods: Collection[str] = ()) -> Heuristics:
    """Read and check a heuristic file; ``family`` (if given) must match the file's, and every
    method it names must be one of ``methods`` (the registered names, handed in by the caller;
    ``auto`` is never a point's choice).

    The whole file is checked once, here (:class:`Heuristics` then trusts it): the required keys of
    the file (:data:`FILE_KEYS`) and of every point (:data:`POINT_KEYS`), their JSON types (``decay``
    a boolean, sizes positive integers, config values integers), the dtype names (:data:`DTYPES`),
    each point once, every method named known, and every pinned config -- a point's ``config`` and each
    method's in ``configs`` -- one of its kernel's configs on the file's family
    (:func:`~leettriton.autotune.configs.pinnable_configs`).

    Raises :class:`HeuristicsError` naming the file, and for a bad point its index, key fields and
    the key, with what was expected and what was found.
    """
    from .configs import KERNELS

    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        _fail(path, f"cannot be read ({e.strerror})")
    except ValueError as e:
        _fail(path, f"is not valid JSON ({e})")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        _fail(path, f"is not a leettriton heuristic file (expected format {FORMAT!r})")
    for k in FILE_KEYS:
        if k not in data:
            _fail(path, f"lacks the key {k!r}; expected a file holding {', '.join(FILE_KEYS)}", key=repr(k))
    if not isinstance(data["family"], str) or not data["family"]:
        _fail(path, f"'family' is {_found(data['family'])}; expected a family name (a string)", key="'family'")
    if family is not None and data["family"] != family:
        _fail(path, f"was measured on the {data['family']!r} family, but this device is {family!r}",
              key="'family'")
    for k in ("measured", "grid"):
        if not isinstance(data.get(k, {}), dict):
            _fail(path, f"{k!r} is {_found(data[k])}; expected an object", key=repr(k))
    points = data["points"]
    if not isinstance(points, list):
        _fail(path, f"'points' is {_found(points)}; expected a list of points", key="'points'")
    check = _Checker(path, data["family"], methods, KERNELS)
    seen: dict[tuple, int] = {}
    for i, p in enumerate(points):
        check.point(i, p, seen)
    return Heuristics(data, path)


_ACTIVE: dict[str, Optional[Heuristics]] = {}


_GENERATION = [0]


def generation() -> int:
    """A number that changes whenever the heuristics in use change (plans cached before are stale)."""
    return _GENERATION[0]


def set_heuristics(heuristics: Optional[Heuristics], family: str) -> None:
    """Use ``heuristics`` for ``family`` from now on (None: the fallback rule)."""
    _ACTIVE[family] = heuristics
    _GENERATION[0] += 1


def active_heuristics(family: str, methods: Collection[str]) -> Optional[Heuristics]:
    """The heuristics in use for ``family``: ``LEETTRITON_HEURISTICS``, else the packaged file, else None."""
    if family in _ACTIVE:
        return _ACTIVE[family]
    path = os.environ.get("LEETTRITON_HEURISTICS")
    if path:
        found = read_heuristics(path, family, methods)
    elif os.path.exists(default_path(family)):
        found = read_heuristics(default_path(family), family, methods)
    else:
        found = None
    _ACTIVE[family] = found
    return found
