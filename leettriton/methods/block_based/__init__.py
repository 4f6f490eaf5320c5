"""block_based: Segment-parallel chunk walk (docs/design.md §3): long sequences with few batch·heads.

Its home: ``kernels.py`` (the Triton kernels and the launcher), ``space.py`` (the config
table of its kernels per GPU family, and its schedule rule).
"""
from ...torch_methods import block_based_torch
from ...kernels import segments_space as SEGMENTS
from ..spec import Method
from . import space
from .kernels import block_based_fwd

METHOD = Method(
    name="block_based",
    launch=block_based_fwd,
    spaces=(space.FWD, SEGMENTS.STATE, SEGMENTS.SCAN),
    torch_twin=block_based_torch,
    schedule=space.schedule,
    alternatives=space.alternatives,
    whole_call=(SEGMENTS.STATE,),
    runs_reversed=True,
    per_token_decay=True,
)
