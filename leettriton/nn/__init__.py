"""Attention layers of linear-attention language models on leettriton's kernels, and their generation cache.

Plain ``torch.nn.Module``s (no ``transformers`` needed): :class:`MultiScaleRetention` (RetNet) and
:class:`NormLinearAttention` (TransNormerLLM's Lightning Attention), with a ``method=`` switch over
every registered method and ``"auto"``; :class:`Mamba2` and :class:`SimpleGatedLinearAttention`, whose
decay is per token and whose parameters are flash-linear-attention's (docs/design.md §12.6); and
:class:`LinearAttentionCache` for prefill, chunked prefill and one-token decoding (docs/design.md §12).
"""
from .cache import LayerState, LinearAttentionCache
from .conv import ShortConvolution
from .functional import ACTIVATIONS
from .lightning import NormLinearAttention, transnormer_gammas, transnormer_slopes
from .mamba2 import Mamba2
from .retention import MultiScaleRetention, retnet_gammas
from .simple_gla import SimpleGatedLinearAttention

__all__ = ["MultiScaleRetention", "NormLinearAttention", "Mamba2", "SimpleGatedLinearAttention", "ShortConvolution",
           "LinearAttentionCache", "LayerState", "ACTIVATIONS", "retnet_gammas", "transnormer_slopes",
           "transnormer_gammas"]
