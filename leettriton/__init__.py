"""leettriton: autotuned Triton kernels for exponentially decaying causal linear attention.

    O = (B Cᵀ ⊙ M) V,   M[i, j] = γ^(i−j) for i ≥ j, else 0

See :func:`linear_attention` for the main entry point.
"""
from . import methods as _methods  # noqa: F401  (registers the built-in methods)
from .api import METHODS, _method_function, decode_step, linear_attention, register_method
from .compat import causal_linear_decoder
from .dispatch import load_heuristics
from .reference import reference

vanilla = _method_function("vanilla")
causal_dot_product = _method_function("causal_dot_product")
block_based = _method_function("block_based")
recursion = _method_function("recursion")
lightning_attention = _method_function("lightning_attention")
fleet_attention = _method_function("fleet_attention")



def benchmark_method(fn, *args, **kwargs):
    """Check a method of your own against the fp64 oracle, then time it beside ``auto`` and the built-ins.

    See :func:`leettriton.bench.benchmark_method` for the arguments.
    """
    from .bench import benchmark_method as _benchmark_method  # on use: `python -m leettriton.bench` stays clean

    return _benchmark_method(fn, *args, **kwargs)


if "auto" not in METHODS:
    METHODS.append("auto")

__version__ = "0.1.0"

__all__ = [
    "linear_attention", "decode_step", "reference", "register_method", "METHODS", "causal_linear_decoder",
    "load_heuristics", "benchmark_method",
    "vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention",
]
