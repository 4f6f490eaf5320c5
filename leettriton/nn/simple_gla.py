"""Simple gated linear attention (GLA with one gate per head and token) on leettriton's kernels
(docs/design.md §12.6)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cache import LinearAttentionCache
from .conv import ShortConvolution
from .functional import activation, attend, check_attention_mask, check_hidden, check_per_token_method
from .fused import rms_norm_gate
from .retention import HeadRMSNorm

__all__ = ["SimpleGatedLinearAttention"]


class SimpleGatedLinearAttention(nn.Module):
    r"""Simple GLA: linear attention whose decay is a gate per head and token, a_t = logsigmoid(x_t W_gk + b) / τ.

    q, k, v = q_proj(x), k_proj(x), v_proj(x), each (by default) through its short causal convolution with
    SiLU (``q_conv1d``, ``k_conv1d``, ``v_conv1d``), then the optional ``feature_map`` on q and k; per head h
    (key/value heads shared by groups of ``num_heads / num_kv_heads`` query heads):

        S_t = exp(a_t) S_{t−1} + k_tᵀ v_t,  o_t = (q_t / √r) S_t,

    which is :func:`leettriton.linear_attention` with b = q / √r, c = k and ``log_decay`` = a
    (docs/design.md §1.6), τ = ``gate_logit_normalizer``.  Then the per-head RMS norm of o (with a weight)
    times swish(g_proj(x)) (``g_norm_swish_gate``, or ``g_norm`` times ``gate_fn``), and ``o_proj``.

    Parameter names, shapes and constructor arguments are flash-linear-attention's
    ``fla.layers.SimpleGatedLinearAttention`` (``q_proj``, ``k_proj``, ``v_proj``, ``g_proj``, ``q_conv1d``,
    ``k_conv1d``, ``v_conv1d``, ``gk_proj``, ``g_norm_swish_gate`` or ``g_norm``, ``o_proj``), so its
    weights load with ``load_state_dict(strict=True)``.

    Args:
        mode: accepted for configurations written for fla (``"chunk"`` or ``"fused_recurrent"``); ``method``
            chooses.
        hidden_size: model width.
        expand_k, expand_v: key width H·r = hidden_size·expand_k, value width H·d = hidden_size·expand_v.
        num_heads: heads H; num_kv_heads: key/value heads (must divide H; default H).
        feature_map: an activation of q and k (after the convolution), or None.
        use_short_conv, conv_size, conv_bias: the short convolutions of q, k and v.
        gate_fn: the output gate's activation; elementwise_affine: the norm has a weight; norm_eps: its ε.
        gate_logit_normalizer: τ.
        fuse_norm: with ``gate_fn="swish"``, name the norm ``g_norm_swish_gate`` (else ``g_norm``).
        layer_idx: this layer's index in a cache.
        method: any method that takes a per-token decay, for prefill; precision: for float32 inputs.

    Shapes: ``hidden_states`` ``(batch, n, hidden_size)`` → ``(batch, n, hidden_size)``.  The cache entry
    holds the float32 state ``(batch, heads, r, d)`` and the three convolutions' last ``conv_size − 1``
    inputs (one tensor, q's channels, then k's, then v's).

    Example::

        >>> layer = SimpleGatedLinearAttention(hidden_size=2048, num_heads=16, layer_idx=0).cuda().bfloat16()
        >>> cache = LinearAttentionCache()
        >>> with torch.no_grad():
        ...     y = layer(x, cache=cache)
        ...     y_t = layer(x_next, cache=cache)
    """

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0,
                 num_heads: int = 4, num_kv_heads: Optional[int] = None, feature_map: Optional[str] = None,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False, gate_fn: str = "swish",
                 elementwise_affine: Optional[bool] = True, norm_eps: float = 1e-5, gate_logit_normalizer: float = 16,
                 fuse_norm: bool = True, layer_idx: Optional[int] = None, *, method: str = "auto",
                 precision: Optional[str] = None, device=None, dtype=None) -> None:
        super().__init__()
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"mode must be 'chunk' or 'fused_recurrent', got {mode!r}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads must divide num_heads, got num_heads={num_heads}, "
                             f"num_kv_heads={num_kv_heads}")
        key_dim, value_dim = hidden_size * expand_k, hidden_size * expand_v
        if not (math.isclose(key_dim, round(key_dim)) and math.isclose(value_dim, round(value_dim))):
            raise ValueError(f"hidden_size * expand_k and hidden_size * expand_v must be integers, got {key_dim} "
                             f"and {value_dim}")
        key_dim, value_dim = round(key_dim), round(value_dim)
        if key_dim % num_heads or value_dim % num_heads:
            raise ValueError(f"the key width {key_dim} and value width {value_dim} must split into num_heads="
                             f"{num_heads} heads")
        if gate_logit_normalizer <= 0:
            raise ValueError(f"gate_logit_normalizer must be positive, got {gate_logit_normalizer!r}")
        self.mode, self.hidden_size, self.expand_k, self.expand_v = mode, hidden_size, expand_k, expand_v
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.num_kv_groups = num_heads // num_kv_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.key_dim_per_group = key_dim // self.num_kv_groups
        self.value_dim_per_group = value_dim // self.num_kv_groups
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        self.feature_map_fn = activation(feature_map, "feature_map")
        self.use_short_conv, self.conv_size, self.conv_bias = use_short_conv, conv_size, conv_bias
        self.gate_logit_normalizer, self.layer_idx = gate_logit_normalizer, layer_idx
        self.fuse_norm_and_gate = gate_fn == "swish" and fuse_norm
        self.gate_fn = activation(gate_fn, "gate_fn")
        self.set_method(method, precision)

        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False, **factory)
        self.k_proj = nn.Linear(hidden_size, self.key_dim_per_group, bias=False, **factory)
        self.v_proj = nn.Linear(hidden_size, self.value_dim_per_group, bias=False, **factory)
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False, **factory)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(key_dim, conv_size, bias=conv_bias, activation="silu", **factory)
            self.k_conv1d = ShortConvolution(self.key_dim_per_group, conv_size, bias=conv_bias, activation="silu",
                                             **factory)
            self.v_conv1d = ShortConvolution(self.value_dim_per_group, conv_size, bias=conv_bias, activation="silu",
                                             **factory)
        self.gk_proj = nn.Linear(hidden_size, num_heads, **factory)
        norm = HeadRMSNorm(self.head_v_dim, norm_eps, bool(elementwise_affine), **factory)
        if self.fuse_norm_and_gate:
            self.g_norm_swish_gate = norm
        else:
            self.g_norm = norm
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False, **factory)

    def set_method(self, method: str, precision: Optional[str] = None) -> None:
        """Switch the prefill method (one that takes a per-token decay, or ``"auto"``) and the float32
        precision."""
        self.method, self.precision = check_per_token_method(method), precision

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"r={self.head_k_dim}, d={self.head_v_dim}, method={self.method!r}")

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache: Optional[LinearAttentionCache] = None) -> torch.Tensor:
        """As :meth:`leettriton.nn.Mamba2.forward`: a 0 in ``attention_mask`` enters the convolutions as zeros,
        adds nothing to the state (its v is 0) and leaves the state undecayed (its a is 0)."""
        x = hidden_states
        check_hidden("hidden_states", x, self.hidden_size, "(batch, n, hidden_size)")
        Bsz, n, _ = x.shape
        H, r, d = self.num_heads, self.head_k_dim, self.head_v_dim
        entry = cache.layer(self.layer_idx) if cache is not None else None
        check_attention_mask(attention_mask, Bsz, n, x.device,
                             values=not (n == 1 and entry is not None and entry.state is not None))
        mask = None if attention_mask is None else attention_mask[:, -n:, None].to(x.dtype)   # [B, n, 1]

        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if self.use_short_conv:
            q, k, v, conv_state = self._convolve(q, k, v, mask, entry, cache is not None)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        if mask is not None:
            v = v * mask
        log_decay = F.logsigmoid(self.gk_proj(x).float()) / self.gate_logit_normalizer   # [B, n, H] float32
        if mask is not None:
            log_decay = log_decay * mask.float()                                        # a padded token: no decay
        b = q.unflatten(-1, (H, r)) * r ** -0.5
        c = k.unflatten(-1, (self.num_kv_heads, r))      # grouped key/value heads (§1.7), read in place
        v = v.unflatten(-1, (self.num_kv_heads, d))
        o = attend(b, c, v, None, method=self.method, precision=self.precision, cache=cache,
                   layer_idx=self.layer_idx, log_decay=log_decay, conv_state=conv_state)
        return self.o_proj(self._norm_and_gate(o, x).flatten(-2))

    def _convolve(self, q, k, v, mask, entry, keep_state: bool):
        """q, k, v through their short convolutions (inputs masked first), from and to the cache's one
        convolution state (q's channels, then k's, then v's)."""
        widths = [self.key_dim, self.key_dim_per_group, self.value_dim_per_group]
        state = None if entry is None else entry.conv_state
        if state is not None and tuple(state.shape) != (q.shape[0], sum(widths), self.conv_size - 1):
            raise ValueError(f"cache layer {self.layer_idx} holds a convolution state of shape {tuple(state.shape)}, "
                             f"but this layer needs (batch, channels, conv_size − 1) = "
                             f"{(q.shape[0], sum(widths), self.conv_size - 1)}")
        states = [None] * 3 if state is None else state.split(widths, dim=1)
        outs, new = [], []
        for x, conv, s in zip((q, k, v), (self.q_conv1d, self.k_conv1d, self.v_conv1d), states):
            y, s = conv(x if mask is None else x * mask, s, return_state=keep_state)
            outs.append(y)
            new.append(s)
        return (*outs, torch.cat(new, dim=1) if keep_state else None)

    def _norm_and_gate(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """norm(o) ⊙ gate_fn(g_proj(x)) in x's dtype, computed in float32 (one pass of
        :func:`leettriton.nn.fused.rms_norm_gate` with the swish gate)."""
        g = self.g_proj(x).view(o.shape)
        norm = self.g_norm_swish_gate if self.fuse_norm_and_gate else self.g_norm
        if self.gate_fn is F.silu:
            return rms_norm_gate(o, norm.weight, norm.eps, gate=g, gate_act="swish", out_dtype=x.dtype)
        o = rms_norm_gate(o, norm.weight, norm.eps, out_dtype=torch.float32)
        return (o * self.gate_fn(g.float())).to(x.dtype)
