"""recursion: Divide and conquer over leaf blocks, level by level (docs/design.md §3).

Its home: ``kernels.py`` (the Triton kernels and the launcher), ``space.py`` (the config
table of its kernels per GPU family, and its schedule rule).
"""
from ...torch_methods import recursion_torch
from ...kernels import segments_space as SEGMENTS
from ...kernels import token_decay as TOKEN
from ..spec import Method
from . import space
from .kernels import recursion_fwd

METHOD = Method(
    name="recursion",
    launch=recursion_fwd,
    spaces=(space.FWD, space.LEVEL, SEGMENTS.STATE, TOKEN.STATE),
    torch_twin=recursion_torch,
    schedule=space.schedule,
    runs_reversed=True,
    per_token_decay=True,
)
