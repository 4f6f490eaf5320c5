"""What the layers share: the attention call (prefill or one-token step), rotary tables, norms, activations.

The attention itself is always :func:`leettriton.linear_attention` (any number of tokens) or
:func:`leettriton.decode_step` (one token with a state), on ``(batch, n, heads, dim)`` views of the
projections (layout ``"bnhd"``, no copies): docs/design.md §12.1.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .. import api, registry
from ..problem import requires_grad
from .cache import LinearAttentionCache
from .fused import rotary, uses_kernels

__all__ = ["ACTIVATIONS", "activation", "check_method", "attend", "rms_norm", "RotaryTable", "decay_tensor"]


def _one_plus_elu(x):
    return 1 + F.elu(x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swish": F.silu, "silu": F.silu, "relu": F.relu, "elu": F.elu, "gelu": F.gelu, "sigmoid": torch.sigmoid,
    "1+elu": _one_plus_elu, "identity": lambda x: x,
}
"""Activations the layers accept by name (for q/k feature maps and output gates)."""


def activation(name: Optional[str], what: str) -> Optional[Callable]:
    """The activation called ``name`` (None: none), or a ValueError naming ``what`` and the choices."""
    if name is None:
        return None
    if name not in ACTIVATIONS:
        raise ValueError(f"{what} must be one of {sorted(ACTIVATIONS)} or None, got {name!r}")
    return ACTIVATIONS[name]


def check_method(method) -> str:
    """``method`` as the registry knows it (every registered method, the paper's spellings, ``"auto"``)."""
    return registry.canonical_method(method)


def decay_tensor(gammas: Sequence[float], cache: dict, device: torch.device) -> torch.Tensor:
    """The per-head γ as a float64 tensor on ``device``, made once per device.

    Not a buffer: ``module.to(torch.bfloat16)`` would round a buffer's γ (1 − 2^-12 is not a bfloat16).
    The tensor is never handed out, so it cannot change under the kernels (docs/design.md §2.6).
    """
    hit = cache.get(device)
    if hit is None:
        hit = cache[device] = torch.tensor(list(gammas), dtype=torch.float64, device=device)
    return hit


def attend(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, *, method: str,
           precision: Optional[str], cache: Optional[LinearAttentionCache], layer_idx: Optional[int]) -> torch.Tensor:
    """O = (B Cᵀ ⊙ M) V for ``(batch, n, heads, dim)`` inputs, continuing from the cache's state if given.

    Without a cache: one ``linear_attention`` call.  With one: a one-token call on a layer that already
    has a state is ``decode_step`` (state updated in place); any other call is ``linear_attention`` from
    the cached state, whose final state replaces it.  ``decode_step`` has no backward, so a one-token call
    that needs a gradient (grad mode on and an input or the cached state requiring grad) is a
    one-row ``linear_attention`` call instead: the same values, differentiable, the state replaced rather
    than written in place (docs/design.md §12.2).  Returns ``(batch, n, heads, d)`` in v's dtype.
    """
    if cache is None:
        return api.linear_attention(b, c, v, gamma, method=method, layout="bnhd", precision=precision)
    entry = cache.layer(layer_idx)
    state = entry.state
    B, n, H, r = b.shape
    d = v.shape[-1]
    if state is not None and tuple(state.shape) != (B, H, r, d):
        raise ValueError(f"cache layer {layer_idx} holds a state of shape {tuple(state.shape)}, but this layer needs "
                         f"(batch, heads, r, d) = {(B, H, r, d)}: a cache of another model or of another batch")
    if n == 1 and state is not None and not requires_grad(b, c, v, state):
        state = cache.step_in_place(layer_idx)
        o, _ = api.decode_step(b[:, 0], c[:, 0], v[:, 0], state, gamma)
        return o.unsqueeze(1)
    o, state = api.linear_attention(b, c, v, gamma, method=method, layout="bnhd", initial_state=state,
                                    return_state=True, precision=precision)
    cache.update(layer_idx, state, n)
    return o


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """x / rms(x) (times ``weight``) over the last dimension, computed in float32; returns float32."""
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


class RotaryTable:
    """Rotary position embedding (RoPE, rotating the two halves of each head, no xPos scaling).

    cos/sin of position × inverse frequency, in float32, kept per device and grown as positions
    grow; :meth:`apply` rotates ``(batch, n, heads, dim)`` rows for positions offset … offset + n − 1
    and multiplies by ``scale`` in the same pass.  Where the fused ops run their kernels (CUDA, or the
    interpreter), both methods are one :func:`leettriton.nn.fused.rotary` pass that computes the same float32
    angles itself (no table, no float32 temporaries); elsewhere the table and PyTorch arithmetic below.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        if dim % 2:
            raise ValueError(f"the rotary dimension (the head's key size) must be even, got {dim}")
        self.dim = dim
        self.base = float(base)
        self._tables: dict = {}
        self._inv_freqs: dict = {}

    def inv_freq(self, device) -> torch.Tensor:
        """1 / base^(2i / dim), float32 ``(dim / 2,)`` on ``device``, made once per device (never handed to a
        caller that could change it: the kernels and the table read it)."""
        hit = self._inv_freqs.get(device)
        if hit is None:
            arange = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
            hit = self._inv_freqs[device] = 1.0 / (self.base ** (arange / self.dim))
        return hit

    def table(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self._tables.get(device)
        if hit is None or hit[0].shape[0] < length:
            size = max(length, 2 * (hit[0].shape[0] if hit is not None else 0), 256)
            t = torch.arange(size, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq(device))
            hit = self._tables[device] = (torch.cos(freqs), torch.sin(freqs))
        return hit

    def apply(self, x: torch.Tensor, offset: int, scale: float = 1.0) -> torch.Tensor:
        """Rotate ``x`` ``(batch, n, heads, dim)`` for positions offset … offset + n − 1, times ``scale``."""
        if uses_kernels(x):
            return rotary(x, self.inv_freq(x.device), offset=offset, scale=scale)
        n = x.shape[1]
        cos, sin = self.table(offset + n, x.device)
        cos = cos[offset:offset + n, None, :]          # [n, 1, dim/2]
        sin = sin[offset:offset + n, None, :]
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return self._rotate(x, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf[..., :self.dim // 2], xf[..., self.dim // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def apply_at(self, x: torch.Tensor, positions: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Rotate rows ``x`` ``(tokens, heads, dim)``, row i at position ``positions[i]`` (``(tokens,)``, any
        integer dtype), times ``scale``; a one-element ``positions`` rotates every row for that position (one
        token of a batch).  The serving and static decode paths, where each position lives on the device.

        The angles are computed from the positions on the device (no table look-up: no host read of the
        largest position, nothing for a CUDA graph to outgrow); they are the table's float32 values,
        position × inverse frequency, so the result is that of :meth:`apply` at the same position.
        """
        if uses_kernels(x) and positions.device == x.device:
            return rotary(x, self.inv_freq(x.device), positions=positions, scale=scale)
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq(x.device)[None]   # [tokens or 1, dim/2]
        cos, sin = torch.cos(freqs)[:, None, :], torch.sin(freqs)[:, None, :]
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return self._rotate(x, cos, sin)


def head_scale(r: int) -> float:
    return 1.0 / math.sqrt(r)
