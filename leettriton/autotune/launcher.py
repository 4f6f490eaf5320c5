"""Triton's compiled launcher called without its Python wrapper, where that wrapper's form is known.

A compiled kernel's ``run`` is Triton's launcher object.  Its ``__call__`` is Python: it allocates the
kernel's scratch buffers (of leettriton's kernels only the chunk walk that reads through tensor descriptors
has any, docs/design.md §3.4) and calls the launcher's C function with two flags and the two scratch
pointers in front of the arguments it was given.  For a one-token decode
step, whose GPU time is a few microseconds, those lines are a measurable share of the time of a call
from Python (docs/design.md §4.5).  :func:`direct_launch` gives that C function and the flags for a
launcher whose class's ``__call__`` is a known form (its source, whitespace removed, hashed: Triton 3.6's)
and whose kernel has no scratch; a :class:`~leettriton.autotune.configs.Launch` then calls the C function
itself, exactly as the wrapper would.  Any other launcher (another Triton release, a kernel with scratch,
a stand-in) gives None and is called as it is: the direct call is never a guess at a form not checked.
"""
from __future__ import annotations

import hashlib
import inspect
from typing import Any, Callable, Optional

__all__ = ["direct_launch", "call_form"]

KNOWN_FORMS = frozenset({
    # triton 3.6.0 (backends/nvidia/driver.py, CudaLauncher.__call__): scratch allocated when its size is
    # nonzero, then self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
    # self.launch_pdl, global_scratch, profile_scratch, *args)
    "0ff2b3219ec9f5067def7f5b72cf4ed0f1b544e98655c5e548c7e933e3ab3a19",
})
"""Hashes (:func:`call_form`) of the launcher ``__call__`` forms whose C call :func:`direct_launch` makes."""

_FORMS: dict[type, Optional[str]] = {}


def call_form(cls: type) -> Optional[str]:
    """The sha256 of the source of ``cls.__call__`` with all whitespace removed (None without Python source),
    read once per class."""
    if cls in _FORMS:
        return _FORMS[cls]
    try:
        source = inspect.getsource(cls.__call__)
    except (OSError, TypeError):  # a builtin, a C type, no source on disk
        form = None
    else:
        form = hashlib.sha256("".join(source.split()).encode()).hexdigest()
    _FORMS[cls] = form
    return form


def direct_launch(launcher: Any) -> Optional[tuple[Callable, tuple]]:
    """``(launch, flags)`` for a launcher of a known form with no scratch, else None.

    ``launch(gridX, gridY, gridZ, stream, function, *flags, *args)`` is then what ``launcher(gridX, gridY,
    gridZ, stream, function, *args)`` does: ``flags`` are its cooperative-grid and programmatic-dependent-
    launch flags and the two scratch pointers (None, as the wrapper passes for a size of zero).
    """
    if call_form(type(launcher)) not in KNOWN_FORMS:
        return None
    if getattr(launcher, "global_scratch_size", None) != 0 or getattr(launcher, "profile_scratch_size", None) != 0:
        return None
    launch = getattr(launcher, "launch", None)
    if not callable(launch):
        return None
    return launch, (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None)
