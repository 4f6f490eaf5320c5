"""RetNet and TransNormerLLM as ``transformers`` causal LMs on leettriton's kernels (extra ``models``).

``pip install "leettriton[models]"``; ``import leettriton`` never imports this package or
``transformers`` (docs/design.md §12.3).
"""
from .decoding import StaticDecoder
from .retnet import RetNetConfig, RetNetForCausalLM, RetNetModel
from .transnormer import TransNormerConfig, TransNormerForCausalLM, TransNormerModel

__all__ = ["RetNetConfig", "RetNetModel", "RetNetForCausalLM", "TransNormerConfig", "TransNormerModel",
           "TransNormerForCausalLM", "StaticDecoder"]
