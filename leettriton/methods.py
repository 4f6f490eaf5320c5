"""The registry of built-in methods: a dictionary from name to implementation.

Every implementation has the signature ``impl(problem, config=None) -> None``
and fills ``problem.out`` (and ``problem.state``).  Triton methods are paired
with their PyTorch version, which runs for CPU tensors outside the interpreter.
"""
from __future__ import annotations

from . import torch_methods
from .api import BUILTIN_METHODS, _register_builtin
from .kernels.block_based import block_based_fwd
from .kernels.causal_dot_product import causal_dot_product_fwd
from .kernels.fleet_attention import fleet_attention_fwd
from .kernels.lightning_attention import lightning_attention_fwd
from .kernels.recursion import recursion_fwd
from .kernels.vanilla import vanilla_fwd

TRITON_IMPLS = {
    "vanilla": vanilla_fwd,
    "causal_dot_product": causal_dot_product_fwd,
    "block_based": block_based_fwd,
    "recursion": recursion_fwd,
    "lightning_attention": lightning_attention_fwd,
    "fleet_attention": fleet_attention_fwd,
}

TORCH_IMPLS = {f"{name}_torch": getattr(torch_methods, f"{name}_torch") for name in BUILTIN_METHODS}

for _name in BUILTIN_METHODS:
    _register_builtin(_name, TRITON_IMPLS[_name], torch_twin=f"{_name}_torch")
for _name, _impl in TORCH_IMPLS.items():
    _register_builtin(_name, _impl)
