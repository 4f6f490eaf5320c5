"""leettriton: autotuned Triton kernels for exponentially decaying causal linear attention.

    O = (B Cᵀ ⊙ M) V,   M[i, j] = γ^(i−j) for i ≥ j, else 0

See :func:`linear_attention` for the main entry point, docs/design.md for the design.
"""
from . import registry as _registry
from .api import causal_linear_decoder, decode_step, linear_attention, method_function as _method_function
from .plan import load_heuristics
from .reference import reference
from .registry import register_method, unregister_method

vanilla = _method_function("vanilla")
causal_dot_product = _method_function("causal_dot_product")
block_based = _method_function("block_based")
recursion = _method_function("recursion")
lightning_attention = _method_function("lightning_attention")
fleet_attention = _method_function("fleet_attention")
vanilla_torch = _method_function("vanilla_torch")
causal_dot_product_torch = _method_function("causal_dot_product_torch")
block_based_torch = _method_function("block_based_torch")
recursion_torch = _method_function("recursion_torch")
lightning_attention_torch = _method_function("lightning_attention_torch")
fleet_attention_torch = _method_function("fleet_attention_torch")

__version__ = "0.1.0"


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
    raise AttributeError(f"module 'leettriton' has no attribute {name!r}")


__all__ = [
    "linear_attention", "decode_step", "reference", "register_method", "unregister_method", "METHODS",
    "causal_linear_decoder", "load_heuristics", "benchmark_method",
    "vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention",
    "vanilla_torch", "causal_dot_product_torch", "block_based_torch", "recursion_torch",
    "lightning_attention_torch", "fleet_attention_torch",
]
