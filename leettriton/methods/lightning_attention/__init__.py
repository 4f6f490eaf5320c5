"""lightning_attention: Lightning Attention-2: one fused chunk walk per sequence (docs/design.md §3).

Its home: ``kernels.py`` (its instance of the chunk walk, kernels/walk.py, and its launcher), ``space.py`` (the config
table of its kernels per GPU family).
"""
from ...torch_methods import lightning_attention_torch
from ..spec import Method
from . import space
from .kernels import lightning_attention_fwd

METHOD = Method(
    name="lightning_attention",
    launch=lightning_attention_fwd,
    spaces=(space.FWD,),
    torch_twin=lightning_attention_torch,
    runs_reversed=True,
    per_token_decay=True,
)
