"""RetNet and TransNormerLLM as ``transformers`` causal LMs on leettriton's kernels (extra ``models``).

``pip install "leettriton[models]"``; ``import leettriton`` never imports this package or
``transformers`` (docs/design.md §12.3).
"""
from .decoding import StaticDecoder
from .retnet import RetNetConfig, RetNetForCausalLM, RetNetModel
from .transnormer import TransNormerConfig, TransNormerForCausalLM, TransNormerModel

__all__ = ["RetNetConfig", "RetNetModel", "RetNetForCausalLM", "TransNormerConfig", "TransNormerModel",
           "TransNormerForCausalLM", "StaticDecoder", "ContinuousBatchingGenerator", "Completion", "sample_tokens"]


def __getattr__(name):
    """The generator (:mod:`leettriton.models.serving`) is imported on first use, so that
    ``python -m leettriton.models.serving`` does not find it imported already."""
    if name in ("ContinuousBatchingGenerator", "Completion", "sample_tokens"):
        from . import serving
        return getattr(serving, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
