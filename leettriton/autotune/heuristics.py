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
    """A heuristic file that cannot be used (corrupt, foreign or from another version)."""


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


def _fail(path: str, why: str):
    raise HeuristicsError(f"heuristic file {path}: {why}")


def read_heuristics(path: str, family: Optional[str] = None, methods: Collection[str] = ()) -> Heuristics:
    """Read and check a heuristic file; ``family`` (if given) must match the file's, and every
    method it names must be one of ``methods`` (the registered names, handed in by the caller).

    Raises :class:`HeuristicsError` naming the file for anything unusable:
    unreadable or not JSON, another format, a foreign family, unknown methods
    or kernels, malformed points.
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
    if family is not None and data.get("family") != family:
        _fail(path, f"was measured on the {data.get('family')!r} family, but this device is {family!r}")
    points = data.get("points")
    if not isinstance(points, list):
        _fail(path, "has no list of points")
    for i, p in enumerate(points):
        try:
            keys_ok = (isinstance(p["dtype"], str) and all(isinstance(p[k], int) and p[k] > 0
                                                           for k in ("r", "d", "bh", "n")))
        except (KeyError, TypeError):
            keys_ok = False
        if not keys_ok:
            _fail(path, f"point {i} lacks dtype, decay, r, d, bh or n")
        best = p.get("best")
        if best is None:
            continue
        if best not in methods:
            _fail(path, f"point {i} names an unknown method {best!r}")
        config = p.get("config") or {}
        if not isinstance(config, dict) or any(k not in KERNELS or not isinstance(v, dict)
                                               for k, v in config.items()):
            _fail(path, f"point {i} has a config for unknown kernels: {sorted(config)}")
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
