"""Attention layers of linear-attention language models on leettriton's kernels, and their generation cache.

Plain ``torch.nn.Module``s (no ``transformers`` needed): :class:`MultiScaleRetention` (RetNet) and
:class:`NormLinearAttention` (TransNormerLLM's Lightning Attention), with a ``method=`` switch over
every registered method and ``"auto"``, and :class:`LinearAttentionCache` for prefill, chunked
prefill and one-token decoding (docs/design.md §12).
"""
from .cache import LayerState, LinearAttentionCache
from .functional import ACTIVATIONS
from .lightning import NormLinearAttention, transnormer_gammas, transnormer_slopes
from .retention import MultiScaleRetention, retnet_gammas

__all__ = ["MultiScaleRetention", "NormLinearAttention", "LinearAttentionCache", "LayerState", "ACTIVATIONS",
           "retnet_gammas", "transnormer_slopes", "transnormer_gammas"]
