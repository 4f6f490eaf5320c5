"""PyTorch versions of the six methods (placeholder: only vanilla_torch so far)."""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from .api import Problem


def vanilla_torch(p: Problem, config: Optional[Mapping] = None) -> None:
    B, H, n, r, d = p.shape
    b, c, v = (x.float() for x in (p.b, p.c, p.v))
    t = torch.arange(n, device=b.device)
    dist = (t[:, None] - t[None, :])
    causal = dist >= 0
    if p.log2_gamma is None:
        mask = causal.float().expand(H, n, n)
    else:
        mask = torch.where(causal, torch.exp2(p.log2_gamma.view(H, 1, 1) * dist.clamp(min=0)), 0.0)
    out = ((b @ c.transpose(-1, -2)) * mask) @ v
    if p.initial_state is not None:
        row = torch.ones(H, n, 1, device=b.device) if p.log2_gamma is None else \
            torch.exp2(p.log2_gamma.view(H, 1, 1) * (t + 1).view(1, n, 1))
        out = out + (b * row) @ p.initial_state
    p.out.copy_(out)
    if p.state is not None:
        col = torch.ones(H, n, 1, device=b.device) if p.log2_gamma is None else \
            torch.exp2(p.log2_gamma.view(H, 1, 1) * (n - 1 - t).view(1, n, 1))
        s = (c * col).transpose(-1, -2) @ v
        if p.initial_state is not None:
            total = 1.0 if p.log2_gamma is None else torch.exp2(p.log2_gamma * n).view(1, H, 1, 1)
            s = s + total * p.initial_state
        p.state.copy_(s)


def _todo(name):
    def impl(p: Problem, config: Optional[Mapping] = None) -> None:
        raise NotImplementedError(name)
    return impl


causal_dot_product_torch = _todo("causal_dot_product_torch")
block_based_torch = _todo("block_based_torch")
recursion_torch = _todo("recursion_torch")
lightning_attention_torch = _todo("lightning_attention_torch")
fleet_attention_torch = _todo("fleet_attention_torch")
