"""fleet_attention: FleetAttention: a decayed scan per rank column (docs/design.md §3).

Its home: ``kernels.py`` (the Triton kernels and the launcher), ``space.py`` (the config
table of its kernels per GPU family, and its schedule rule).
"""
from ...torch_methods import fleet_attention_torch
from ...kernels import segments_space as SEGMENTS
from ...kernels import token_decay as TOKEN
from ..spec import Method
from . import space
from .kernels import fleet_attention_fwd

METHOD = Method(
    name="fleet_attention",
    launch=fleet_attention_fwd,
    spaces=(space.FWD, SEGMENTS.STATE, SEGMENTS.SCAN, TOKEN.STATE, TOKEN.SCAN),
    torch_twin=fleet_attention_torch,
    schedule=space.schedule,
    runs_reversed=True,
    per_token_decay=True,
)
