"""leettriton: autotuned Triton kernels for exponentially decaying causal linear attention.

    O = (B Cᵀ ⊙ M) V,   M[i, j] = γ^(i−j) for i ≥ j, else 0

See :func:`linear_attention` for the main entry point, docs/design.md for the design.
"""
from . import registry as _registry
from ._version import __version__
from .api import (causal_linear_decoder, decode_step, decode_tokens, linear_attention, linear_attention_varlen,
                  method_function as _method_function)
from .methods import BUILTIN_METHODS
from .plan import load_heuristics
from .reference import reference
from .registry import register_method, unregister_method

# one public function per built-in method and per PyTorch version: leettriton.vanilla(b, c, v, 0.9), ...
vanilla, causal_dot_product, block_based, recursion, lightning_attention, fleet_attention = (
    _method_function(name) for name in BUILTIN_METHODS)
(vanilla_torch, causal_dot_product_torch, block_based_torch, recursion_torch, lightning_attention_torch,
 fleet_attention_torch) = (_method_function(f"{name}_torch") for name in BUILTIN_METHODS)



def benchmark_method(fn, *args, **kwargs):
    """Check a method of your own against the float64 oracle, then time it beside ``auto`` and the built-ins.

    ``fn`` follows the user-method contract (docs/design.md §6).  See
    :func:`leettriton.bench.benchmark_method` for the arguments.
    """
    from .bench import benchmark_method as _benchmark_method  # on use: importing leettriton stays light

    return _benchmark_method(fn, *args, **kwargs)


def __getattr__(name):
    if name == "METHODS":  # an immutable tuple that reflects every registration
        return _registry.method_names()
    if name == "distributed":  # sequence parallelism: loaded on first use, not by `import leettriton`
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module 'leettriton' has no attribute {name!r}")


__all__ = [
    "linear_attention", "linear_attention_varlen", "decode_step", "decode_tokens", "reference", "register_method", "unregister_method", "METHODS",
    "causal_linear_decoder", "load_heuristics", "benchmark_method",
    "vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention",
    "vanilla_torch", "causal_dot_product_torch", "block_based_torch", "recursion_torch",
    "lightning_attention_torch", "fleet_attention_torch",
]
