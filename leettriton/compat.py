"""``causal_linear_decoder``: the entry point of the LeetDecoding package, for code written against it."""
from __future__ import annotations

from typing import Optional

from .api import linear_attention


def causal_linear_decoder(B, C, V, is_mask_weight: bool = False, gamma=None, attn_method: Optional[str] = None):
    """LeetDecoding's ``causal_linear_decoder(q, k, v, is_mask_weight, gamma, attn_method)``.

    Args:
        B, C: ``(batch, heads, n, r)``; V: ``(batch, heads, n, d)``.
        is_mask_weight: False for the plain causal mask (γ = 1); True for the
            decayed mask, which needs ``gamma``.
        gamma: **the decay factor itself**, as in the paper's formula
            M[i, j] = γ^(i−j): a float in (0, 1] or a tensor of shape ``(heads,)``.
            (LeetDecoding's ``is_need_exp`` path, which took −ln γ, is not offered:
            pass ``torch.exp(-x)`` yourself.)
        attn_method: a method name, in leettriton's or the paper's spelling
            (``"lightningAttention2"``, ``"FleetAttention"``, ``"block-based"``, ...);
            ``None`` picks the fastest (``"auto"``).

    Returns:
        The output ``(batch, heads, n, d)`` in V's dtype.
    """
    if not isinstance(is_mask_weight, bool):
        raise TypeError(f"is_mask_weight must be a bool, got {type(is_mask_weight).__name__}")
    if is_mask_weight and gamma is None:
        raise ValueError("is_mask_weight=True needs gamma, the decay factor per head")
    if not is_mask_weight and gamma is not None:
        raise ValueError("gamma was given with is_mask_weight=False; pass is_mask_weight=True to use the decay")
    return linear_attention(B, C, V, gamma, method="auto" if attn_method is None else attn_method)
