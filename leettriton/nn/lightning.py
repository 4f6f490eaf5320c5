"""TransNormerLLM's Lightning-Attention layer (NormLinearAttention) on leettriton's kernels (docs/design.md §12.1)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .. import api
from .cache import LinearAttentionCache
from .functional import (activation, attend, check_attention_mask, check_hidden, check_method, check_positions,
                         contiguous_index, decay_tensor, is_integer_tensor)
from .fused import lrpe, rms_norm_gate, uses_kernels

__all__ = ["NormLinearAttention", "transnormer_slopes", "transnormer_gammas"]


def transnormer_slopes(num_heads: int) -> list[float]:
    """TransNormerLLM's base decay rates per head (ALiBi's geometric slopes): for H a power of two,
    s_h = 2^(−8 (h + 1) / H); otherwise the power-of-two list is completed with every other slope of
    the list for twice the heads."""
    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if num_heads < 1:
        raise ValueError(f"num_heads must be at least 1, got {num_heads}")
    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    below = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(below) + transnormer_slopes(2 * below)[0::2][:num_heads - below]


def transnormer_gammas(num_heads: int, layer_idx: int, num_layers: int) -> list[float]:
    """γ per head of layer ``layer_idx`` of ``num_layers``: exp(−s_h · (1 − layer_idx / (num_layers − 1) + 1e-5)).

    Early layers decay fastest; the last layer's γ is within 1e-5·s_h of 1 (TransNormerLLM's schedule).
    """
    if not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx must lie in [0, num_layers), got layer_idx={layer_idx}, num_layers={num_layers}")
    factor = 1 - layer_idx / max(num_layers - 1, 1) + 1e-5
    return [math.exp(-s * factor) for s in transnormer_slopes(num_heads)]


class SimpleRMSNorm(nn.Module):
    """x / rms(x) over the last dimension, no weight (TransNormerLLM's SRMSNorm), in x's dtype (one pass:
    :func:`leettriton.nn.fused.rms_norm_gate`)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_gate(x, None, self.eps)


def norm_layer(norm_type: str, dim: int, eps: float = 1e-6, device=None, dtype=None) -> nn.Module:
    """``"simplermsnorm"`` (TransNormerLLM's default) or ``"layernorm"``."""
    if norm_type == "simplermsnorm":
        return SimpleRMSNorm(dim, eps)
    if norm_type == "layernorm":
        return nn.LayerNorm(dim, device=device, dtype=dtype)
    raise ValueError(f"norm_type must be 'simplermsnorm' or 'layernorm', got {norm_type!r}")


class Lrpe(nn.Module):
    """Linearised relative position encoding: x ↦ [x cos(θ t), x sin(θ t)] per head (doubles the key size r).

    b_t · c_s then depends on t − s only: Σ_k q_k k_k cos(θ_k (t − s)).  Where the fused ops run their kernels
    (CUDA, or the interpreter) both methods are one :func:`leettriton.nn.fused.lrpe` pass (the same float32
    angles); elsewhere the PyTorch arithmetic below.
    """

    def __init__(self, num_heads: int, head_dim: int, device=None) -> None:
        super().__init__()
        d = num_heads * head_dim
        self.theta = nn.Parameter((10000 ** (-2 / d * torch.arange(d, device=device, dtype=torch.float32)))
                                  .reshape(num_heads, 1, head_dim))

    def forward(self, x: torch.Tensor, offset: int) -> torch.Tensor:   # x: (B, n, H, D) -> (B, n, H, 2D)
        if uses_kernels(x, self.theta):
            return lrpe(x, self.theta, offset=offset)
        n = x.shape[1]
        t = torch.arange(offset, offset + n, device=x.device, dtype=torch.float32)
        angle = t[:, None, None] * self.theta.float()[:, 0, :][None]   # [n, H, D]
        return self._encode(x, angle)

    @staticmethod
    def _encode(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return torch.cat((xf * torch.cos(angle), xf * torch.sin(angle)), dim=-1).to(x.dtype)

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows ``x`` ``(tokens, H, D)``, row i at position ``positions[i]`` → ``(tokens, H, 2D)``; a one-element
        ``positions`` (a tensor on x's device, read there: no host sync) encodes every row at that position.
        The same arithmetic as :meth:`forward`."""
        if not isinstance(positions, torch.Tensor) or not is_integer_tensor(positions):
            got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise ValueError(f"positions must be an integer tensor of shape ({x.shape[0]},) or (1,), got {got}")
        if uses_kernels(x, self.theta) and positions.device == x.device:
            return lrpe(x, self.theta, positions=positions)
        angle = positions.to(torch.float32)[:, None, None] * self.theta.float()[:, 0, :][None]   # [tokens or 1, H, D]
        return self._encode(x, angle)


class NormLinearAttention(nn.Module):
    r"""TransNormerLLM's gated, normalised linear attention with Lightning-Attention decay.

    q, k, v, u = split(X W_qkvu); Q = φ(q), K = φ(k) (φ = ``act``, SiLU by default);
    O = Norm((Q Kᵀ ⊙ M) V) ⊙ u, then ``out_proj``, where M[i, j] = γ_h^(i−j) and γ_h comes from the
    head's slope rate scaled by the layer's depth (:func:`transnormer_gammas`), and Norm is a
    weight-free RMS norm over the whole ``hidden_dim`` (SRMSNorm).  No 1/√r scale: the norm makes
    the output scale-free.  Parameter names follow the published TransNormerLLM model
    (``qkvu_proj``, ``out_proj``, ``lrpe.theta``).

    Args:
        hidden_size: model width (``decoder_embed_dim``).
        num_heads: heads H.
        hidden_dim: inner width H·d (default ``hidden_size``); r = d = hidden_dim / H (2r with LRPE).
        layer_idx, num_layers: position of the layer in its model, which sets γ; ``layer_idx`` is also
            its index in a cache.
        act: activation of q and k.
        norm_type: ``"simplermsnorm"`` or ``"layernorm"``.
        use_lrpe: apply the linearised relative position encoding to q and k.
        bias: biases in the projections.
        norm_eps: ε of the output norm.
        method, precision: as for :class:`MultiScaleRetention`.

    Shapes: ``x`` ``(batch, n, hidden_size)`` → ``(batch, n, hidden_size)``.
    """

    def __init__(self, hidden_size: int = 1024, num_heads: int = 8, hidden_dim: Optional[int] = None, *,
                 layer_idx: int = 0, num_layers: int = 1, act: str = "silu", norm_type: str = "simplermsnorm",
                 use_lrpe: bool = False, bias: bool = False, norm_eps: float = 1e-6, method: str = "auto",
                 precision: Optional[str] = None, device=None, dtype=None) -> None:
        super().__init__()
        hidden_dim = hidden_size if hidden_dim is None else hidden_dim
        if num_heads < 1 or hidden_dim % num_heads:
            raise ValueError(f"hidden_dim={hidden_dim} must split into num_heads={num_heads} heads")
        self.hidden_size, self.hidden_dim, self.num_heads = hidden_size, hidden_dim, num_heads
        self.head_dim = hidden_dim // num_heads
        self.layer_idx, self.num_layers = layer_idx, num_layers
        self.act = activation(act, "act")
        self.set_method(method, precision)
        factory = {"device": device, "dtype": dtype}
        self.qkvu_proj = nn.Linear(hidden_size, 4 * hidden_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(hidden_dim, hidden_size, bias=bias, **factory)
        self.norm = norm_layer(norm_type, hidden_dim, norm_eps, **factory)
        self.use_lrpe = use_lrpe
        if use_lrpe:
            self.lrpe = Lrpe(num_heads, self.head_dim, device=device)
        self.gammas = transnormer_gammas(num_heads, layer_idx, num_layers)
        self._gamma_tensors: dict = {}

    def set_method(self, method: str, precision: Optional[str] = None) -> None:
        """Switch the prefill method (any registered name or ``"auto"``) and the float32 precision."""
        self.method = check_method(method)
        self.precision = precision

    def extra_repr(self) -> str:
        r = 2 * self.head_dim if self.use_lrpe else self.head_dim
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, r={r}, d={self.head_dim}, "
                f"layer_idx={self.layer_idx}, method={self.method!r}")

    def gamma(self, device) -> torch.Tensor:
        """γ per head, float64 ``(num_heads,)`` on ``device``."""
        return decay_tensor(self.gammas, self._gamma_tensors, device)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache: Optional[LinearAttentionCache] = None) -> torch.Tensor:
        """As :meth:`MultiScaleRetention.forward`."""
        x = hidden_states
        check_hidden("hidden_states", x, self.hidden_size, "(batch, n, hidden_size)")
        B, n, _ = x.shape
        H, D = self.num_heads, self.head_dim
        entry = cache.layer(self.layer_idx) if cache is not None else None
        one_token_step = n == 1 and entry is not None and entry.state is not None
        check_attention_mask(attention_mask, B, n, x.device, values=not one_token_step)
        q, k, v, u = self.qkvu_proj(x).chunk(4, dim=-1)
        b, c = self.act(q.view(B, n, H, D)), self.act(k.view(B, n, H, D))
        v = v.view(B, n, H, D)
        if self.use_lrpe:
            offset = entry.seen if entry is not None else 0
            b, c = self.lrpe(b, offset), self.lrpe(c, offset)
        if attention_mask is not None:
            v = v * attention_mask[:, -n:, None, None].to(v.dtype)
        o = attend(b, c, v, self.gamma(x.device), method=self.method, precision=self.precision, cache=cache,
                   layer_idx=self.layer_idx)
        return self.out_proj(self._norm_and_gate(o.reshape(B, n, H * D), u))

    def decode_token(self, x: torch.Tensor, state: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One token through a state held by the caller, as :meth:`MultiScaleRetention.decode_token`:
        ``x`` ``(batch, hidden_size)`` → ``(batch, hidden_size)``, ``state`` float32 ``(batch, heads, r, d)``
        updated in place, ``position`` a one-element int64 tensor on x's device (used by LRPE).  No host sync:
        a CUDA graph can capture it.  The same arithmetic as a one-token :meth:`forward` through a cache."""
        check_hidden("x", x, self.hidden_size, "(batch, hidden_size)")
        position = check_positions(position, None, x.device, "the token's position")
        B = x.shape[0]
        H, D = self.num_heads, self.head_dim
        q, k, v, u = self.qkvu_proj(x).chunk(4, dim=-1)
        b, c = self.act(q.view(B, H, D)), self.act(k.view(B, H, D))
        if self.use_lrpe:
            b, c = self.lrpe.at(b, position), self.lrpe.at(c, position)
        o, _ = api.decode_step(b, c, v.view(B, H, D), state, self.gamma(x.device))
        return self.out_proj(self._norm_and_gate(o.reshape(B, H * D), u))

    def _norm_and_gate(self, o: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """u ⊙ Norm(o) for ``o`` ``(..., hidden_dim)``: with SRMSNorm one float32 pass reading o and u once
        (:func:`leettriton.nn.fused.rms_norm_gate`), rounded once to u's dtype."""
        if isinstance(self.norm, SimpleRMSNorm):
            return rms_norm_gate(o, None, self.norm.eps, gate=u, gate_act="identity", out_dtype=u.dtype)
        return u * self.norm(o)

    # ------------------------------------------------------------------ serving (docs/design.md §13.5)

    def prefill_packed(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                       positions: Optional[torch.Tensor], state_pool: torch.Tensor, slot_ids: torch.Tensor,
                       has_initial_state: Optional[torch.Tensor] = None, *, method: Optional[str] = None,
                       check_indices: bool = True) -> torch.Tensor:
        """As :meth:`MultiScaleRetention.prefill_packed`; ``positions`` is needed only with LRPE (else None)."""
        b, c, v, u = self._serving_project(hidden_states, positions)
        o = api.linear_attention_varlen(b, c, v, contiguous_index(cu_seqlens), self.gamma(hidden_states.device),
                                        method=self.method if method is None else method, state_pool=state_pool,
                                        slot_ids=contiguous_index(slot_ids),
                                        has_initial_state=contiguous_index(has_initial_state),
                                        precision=self.precision, check_indices=check_indices)
        return self.out_proj(self._norm_and_gate(o.reshape(o.shape[0], self.hidden_dim), u))

    def decode_slotted(self, hidden_states: torch.Tensor, positions: Optional[torch.Tensor], state_pool: torch.Tensor,
                       slot_ids: torch.Tensor, *, check_slots: bool = True) -> torch.Tensor:
        """As :meth:`MultiScaleRetention.decode_slotted`; ``positions`` is needed only with LRPE (else None)."""
        b, c, v, u = self._serving_project(hidden_states, positions)
        o, _ = api.decode_step(b, c, v, state_pool, self.gamma(hidden_states.device),
                               slot_ids=contiguous_index(slot_ids), check_slots=check_slots)
        return self.out_proj(self._norm_and_gate(o.reshape(o.shape[0], self.hidden_dim), u))

    def _serving_project(self, x: torch.Tensor, positions: Optional[torch.Tensor]):
        """b, c, v ``(tokens, H, ·)`` and the gate u ``(tokens, hidden_dim)`` of packed rows ``x``."""
        check_hidden("hidden_states", x, self.hidden_size, "(tokens, hidden_size)")
        T = x.shape[0]
        if self.use_lrpe or positions is not None:   # checked alike whether LRPE reads them or not
            positions = check_positions(positions, T, x.device, "each token's position in its sequence, for LRPE")
        H, D = self.num_heads, self.head_dim
        q, k, v, u = self.qkvu_proj(x).chunk(4, dim=-1)
        b, c = self.act(q.view(T, H, D)), self.act(k.view(T, H, D))
        if self.use_lrpe:
            b, c = self.lrpe.at(b, positions), self.lrpe.at(c, positions)
        return b, c, v.view(T, H, D), u
