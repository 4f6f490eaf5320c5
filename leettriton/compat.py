"""What code written against the LeetDecoding package needs: its method spellings and the arguments
of its ``causal_linear_decoder`` (the function itself is :func:`leettriton.causal_linear_decoder`)."""
from __future__ import annotations

from typing import Optional

from .problem import type_name

__all__ = ["ALIASES", "decoder_arguments"]

# The LeetDecoding paper's spellings (and a few common ones) of the built-in methods.
ALIASES = {
    "linear_attn": "vanilla",
    "Vanilla": "vanilla",
    "causal_product": "causal_dot_product",
    "cdotp": "causal_dot_product",
    "Cdotp": "causal_dot_product",
    "block-based": "block_based",
    "blockBased": "block_based",
    "BlockBased": "block_based",
    "Recursion": "recursion",
    "lightningAttention2": "lightning_attention",
    "lightningAttention2_optimized": "lightning_attention",
    "lightning_attn2": "lightning_attention",
    "LA": "lightning_attention",
    "FleetAttention": "fleet_attention",
    "FA": "fleet_attention",
    "lightningAttention2_torch": "lightning_attention_torch",
    "LA_torch": "lightning_attention_torch",
    "FleetAttention_torch": "fleet_attention_torch",
    "FA_torch": "fleet_attention_torch",
    "block-based_torch": "block_based_torch",
}


def decoder_arguments(is_mask_weight, gamma, attn_method: Optional[str]):
    """LeetDecoding's ``(is_mask_weight, gamma, attn_method)`` as leettriton's ``(gamma, method)``.

    ``is_mask_weight`` False is the plain causal mask (γ = 1); True is the decayed
    mask, which needs ``gamma``, **the decay factor itself** (a float in (0, 1] or
    a tensor ``(heads,)``).  LeetDecoding's ``is_need_exp`` path, which took −ln γ,
    is not offered: pass ``torch.exp(-x)``.  ``attn_method`` None is ``"auto"``.
    """
    if not isinstance(is_mask_weight, bool):
        raise TypeError(f"is_mask_weight must be a bool, got {type_name(is_mask_weight)}")
    if is_mask_weight and gamma is None:
        raise ValueError("is_mask_weight=True needs gamma, the decay factor per head")
    if not is_mask_weight and gamma is not None:
        raise ValueError("gamma was given with is_mask_weight=False; pass is_mask_weight=True to use the decay")
    return gamma, "auto" if attn_method is None else attn_method
