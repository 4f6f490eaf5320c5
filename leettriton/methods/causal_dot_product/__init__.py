"""causal_dot_product: The row-by-row recurrence with the state in registers (docs/design.md §3).

Its home: ``kernels.py`` (the Triton kernels and the launcher), ``space.py`` (the config
table of its kernels per GPU family).
"""
from ...torch_methods import causal_dot_product_torch
from ..spec import Method
from . import space
from .kernels import causal_dot_product_fwd

METHOD = Method(
    name="causal_dot_product",
    launch=causal_dot_product_fwd,
    spaces=(space.FWD,),
    torch_twin=causal_dot_product_torch,
    runs_reversed=True,
    per_token_decay=True,
)
