"""vanilla: The tiled quadratic form (docs/design.md §3): cheapest for very short sequences.

Its home: ``kernels.py`` (the Triton kernels and the launcher), ``space.py`` (the config
table of its kernels per GPU family).
"""
from ...torch_methods import vanilla_torch
from ...kernels import segments_space as SEGMENTS
from ...kernels import token_decay as TOKEN
from ..spec import Method
from . import space
from .kernels import vanilla_fwd

METHOD = Method(
    name="vanilla",
    launch=vanilla_fwd,
    spaces=(space.FWD, SEGMENTS.STATE, TOKEN.STATE),
    torch_twin=vanilla_torch,
    runs_reversed=True,
    per_token_decay=True,
)
