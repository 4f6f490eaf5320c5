"""RetNet's multi-scale retention layer on leettriton's kernels (docs/design.md §12.1)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .. import api
from .cache import LinearAttentionCache
from .functional import (RotaryTable, activation, attend, check_attention_mask, check_hidden, check_method,
                         check_positions, contiguous_index, decay_tensor, rms_norm)
from .fused import rms_norm_gate

__all__ = ["MultiScaleRetention", "retnet_gammas"]


def retnet_gammas(num_heads: int) -> list[float]:
    """RetNet's fixed decay per head, γ_h = 1 − 2^(−5−h), h = 0 … num_heads − 1 (exact in float64)."""
    return [1.0 - 2.0 ** (-5 - h) for h in range(num_heads)]


class HeadRMSNorm(nn.Module):
    """RMS normalisation of each head's output over its d values, with an optional weight (shared by heads)."""

    def __init__(self, dim: int, eps: float, elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # float32 out
        return rms_norm(x, self.weight, self.eps)


class MultiScaleRetention(nn.Module):
    r"""Retention (RetNet): O = GroupNorm((Q Kᵀ ⊙ D) V) ⊙ swish(X W_G), then the output projection.

    Per head h, with rotary positions on q and k and D[i, j] = γ_h^(i−j), γ_h = 1 − 2^(−5−h).
    Prefill runs :func:`leettriton.linear_attention` with ``method``; a one-token step with a cache
    runs :func:`leettriton.decode_step`.  The 1/√r scale is applied to q here, never in the kernels.
    The per-head normalisation is an RMS norm with a weight, as in flash-linear-attention's RetNet,
    whose parameter names this layer keeps (``q_proj``, ``k_proj``, ``v_proj``, ``g_proj``, ``o_proj``,
    ``g_norm_swish_gate`` or ``g_norm``), so its checkpoints load.

    Args:
        hidden_size: model width.
        num_heads: query heads H.
        num_kv_heads: key/value heads (grouped attention; must divide H); default H.
        expand_k, expand_v: key width H·r = hidden_size·expand_k, value width H·d = hidden_size·expand_v.
        use_output_gate: multiply by the gate activation of ``g_proj(x)``.
        gate_fn: the gate activation (``"swish"``).
        elementwise_affine: the per-head norm has a weight.
        norm_eps: the norm's ε.
        fuse_norm: name the norm ``g_norm_swish_gate`` (as fla does when norm and swish gate are fused)
            rather than ``g_norm``; the computation is the same.
        feature_map: an activation applied to q and k before the rotary embedding, or None.
        rope_base: the rotary base.
        layer_idx: this layer's index in a model's cache.
        method: any registered method or ``"auto"`` (see :data:`leettriton.METHODS`), for prefill.
        precision: ``linear_attention``'s precision for float32 inputs (None: ``"ieee"``).

    Shapes: ``x`` ``(batch, n, hidden_size)`` → ``(batch, n, hidden_size)``.

    Differentiable with every method (``linear_attention``'s backward, docs/design.md §10); a one-token
    call through a cache that needs a gradient runs ``linear_attention`` rather than ``decode_step``,
    which has no backward (docs/design.md §12.2).

    Example::

        >>> layer = MultiScaleRetention(hidden_size=2048, num_heads=8, layer_idx=0).cuda().half()
        >>> cache = LinearAttentionCache()
        >>> with torch.no_grad():
        ...     y = layer(x, cache=cache)               # prefill
        ...     y_t = layer(x_next, cache=cache)        # one token
    """

    def __init__(self, hidden_size: int = 1024, num_heads: int = 8, num_kv_heads: Optional[int] = None, *,
                 expand_k: float = 1.0, expand_v: float = 2.0, use_output_gate: bool = True, gate_fn: str = "swish",
                 elementwise_affine: bool = True, norm_eps: float = 1e-5, fuse_norm: bool = True,
                 feature_map: Optional[str] = None, rope_base: float = 10000.0, layer_idx: Optional[int] = None,
                 method: str = "auto", precision: Optional[str] = None, device=None, dtype=None) -> None:
        super().__init__()
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
        self.hidden_size = hidden_size
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.num_kv_groups = num_heads // num_kv_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        self.layer_idx = layer_idx
        self.use_output_gate = use_output_gate
        self.feature_map_fn = activation(feature_map, "feature_map")
        self.gate_fn = activation(gate_fn, "gate_fn")
        self.fuse_norm_and_gate = fuse_norm and use_output_gate and gate_fn == "swish"
        self.set_method(method, precision)

        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False, **factory)
        self.k_proj = nn.Linear(hidden_size, key_dim // self.num_kv_groups, bias=False, **factory)
        self.v_proj = nn.Linear(hidden_size, value_dim // self.num_kv_groups, bias=False, **factory)
        if use_output_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False, **factory)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False, **factory)
        norm = HeadRMSNorm(self.head_v_dim, norm_eps, elementwise_affine, **factory)
        if self.fuse_norm_and_gate:
            self.g_norm_swish_gate = norm
        else:
            self.g_norm = norm
        self.rotary = RotaryTable(self.head_k_dim, rope_base)
        self.gammas = retnet_gammas(num_heads)
        self._gamma_tensors: dict = {}

    def set_method(self, method: str, precision: Optional[str] = None) -> None:
        """Switch the prefill method (any registered name or ``"auto"``) and the float32 precision."""
        self.method = check_method(method)
        self.precision = precision

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"r={self.head_k_dim}, d={self.head_v_dim}, method={self.method!r}")

    def gamma(self, device) -> torch.Tensor:
        """γ per head, float64 ``(num_heads,)`` on ``device``."""
        return decay_tensor(self.gammas, self._gamma_tensors, device)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache: Optional[LinearAttentionCache] = None) -> torch.Tensor:
        """``hidden_states`` ``(batch, n, hidden_size)``; ``attention_mask`` ``(batch, ≥ n)`` of 0/1 (left padding:
        its last n columns mark this call's tokens; a 0 token adds nothing to the state); ``cache`` continues
        from and updates this layer's state (``layer_idx``).

        A mask with a 0 after a 1 in a row (right padding, a hole) is refused with a ``ValueError``: its values
        are read on each call (one device sync on CUDA; a model reads them once for all its layers), except on a
        one-token step through a cache (:func:`leettriton.nn.functional.check_attention_mask`)."""
        x = hidden_states
        check_hidden("hidden_states", x, self.hidden_size, "(batch, n, hidden_size)")
        B, n, _ = x.shape
        H, r, d = self.num_heads, self.head_k_dim, self.head_v_dim
        entry = cache.layer(self.layer_idx) if cache is not None else None
        offset = entry.seen if entry is not None else 0
        one_token_step = n == 1 and entry is not None and entry.state is not None
        check_attention_mask(attention_mask, B, n, x.device, values=not one_token_step)
        q = self.q_proj(x).view(B, n, H, r)
        k = self.k_proj(x).view(B, n, self.num_kv_heads, r)
        v = self.v_proj(x).view(B, n, self.num_kv_heads, d)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        b = self.rotary.apply(q, offset, scale=r ** -0.5)
        c = self.rotary.apply(k, offset)
        if attention_mask is not None:
            v = v * attention_mask[:, -n:, None, None].to(v.dtype)
        if self.num_kv_groups > 1:
            c = c.repeat_interleave(self.num_kv_groups, dim=2)
            v = v.repeat_interleave(self.num_kv_groups, dim=2)
        o = attend(b, c, v, self.gamma(x.device), method=self.method, precision=self.precision, cache=cache,
                   layer_idx=self.layer_idx)
        return self._output(o, x)

    def decode_token(self, x: torch.Tensor, state: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One token through a state held by the caller: ``x`` ``(batch, hidden_size)`` → ``(batch, hidden_size)``.

        ``state``: this layer's float32 ``(batch, heads, r, d)``, updated in place (:func:`leettriton.decode_step`);
        ``position``: a one-element int64 tensor on x's device holding the token's position (the tokens seen
        before it).  Nothing is read back to the host and nothing allocated depends on values, so a CUDA graph
        can capture the call (:class:`leettriton.models.StaticDecoder` does); the rotary angles are computed
        from ``position`` on the device.  The same arithmetic as a one-token
        :meth:`forward` through a cache, without the cache's bookkeeping.  No gradient (inference only).
        """
        check_hidden("x", x, self.hidden_size, "(batch, hidden_size)")
        position = check_positions(position, None, x.device, "the token's position")
        B = x.shape[0]
        H, r, d = self.num_heads, self.head_k_dim, self.head_v_dim
        q = self.q_proj(x).view(B, H, r)
        k = self.k_proj(x).view(B, self.num_kv_heads, r)
        v = self.v_proj(x).view(B, self.num_kv_heads, d)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        b = self.rotary.apply_at(q, position, scale=r ** -0.5)
        c = self.rotary.apply_at(k, position)
        if self.num_kv_groups > 1:
            c = c.repeat_interleave(self.num_kv_groups, dim=1)
            v = v.repeat_interleave(self.num_kv_groups, dim=1)
        o, _ = api.decode_step(b, c, v, state, self.gamma(x.device))
        return self._output(o, x)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The per-head norm of the attention output ``o`` ``(..., heads, d)``, the gate of ``x``, ``o_proj``."""
        return self.o_proj(self._norm_and_gate(o, x).flatten(-2))

    def _norm_and_gate(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """norm(o) ⊙ gate_fn(g_proj(x)) (or norm(o) without the gate) in x's dtype, computed in float32.

        With the swish gate this is one pass of :func:`leettriton.nn.fused.rms_norm_gate` reading o and g once
        (whichever name the norm has); another gate multiplies the float32 norm by its activation.
        """
        norm = self.g_norm_swish_gate if self.fuse_norm_and_gate else self.g_norm
        if not self.use_output_gate:
            return rms_norm_gate(o, norm.weight, norm.eps, out_dtype=x.dtype)
        g = self.g_proj(x).view(o.shape)
        if self.gate_fn is nn.functional.silu:
            return rms_norm_gate(o, norm.weight, norm.eps, gate=g, gate_act="swish", out_dtype=x.dtype)
        o = rms_norm_gate(o, norm.weight, norm.eps, out_dtype=torch.float32)
        return (o * self.gate_fn(g.float())).to(x.dtype)

    # ------------------------------------------------------------------ serving (docs/design.md §13.5)

    def prefill_packed(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor,
                       state_pool: torch.Tensor, slot_ids: torch.Tensor,
                       has_initial_state: Optional[torch.Tensor] = None, *, method: Optional[str] = None,
                       check_indices: bool = True) -> torch.Tensor:
        """The layer over the packed tokens of N sequences, each sequence's state kept in its pool slot.

        Args:
            hidden_states: ``(T, hidden_size)``: the tokens of every sequence, one sequence after the other.
            cu_seqlens: int32/int64 ``(N + 1,)``: sequence i is rows [cu_seqlens[i], cu_seqlens[i + 1]).
            positions: integer ``(T,)``: each token's position in its own sequence (its rotary angle).
            state_pool: float32 ``(slots, num_heads, r, d)``; sequence i starts from
                ``state_pool[slot_ids[i]]`` when ``has_initial_state[i]`` (else from zero) and leaves its final
                state there, in place.
            slot_ids: int32/int64 ``(N,)``; has_initial_state: bool ``(N,)`` or None (all start from zero).
            method: a method with a packed path (``"auto"``, ``"lightning_attention"``, ``"block_based"``, a
                ``"<method>_torch"`` twin); None: the layer's method.
            check_indices: as in :func:`leettriton.linear_attention_varlen`.

        Returns ``(T, hidden_size)``.  One :func:`leettriton.linear_attention_varlen` call; the projections,
        rotary, norm and gate run on the packed token dimension.  Forward only (call under ``torch.no_grad()``).

        Example::

            >>> y = layer.prefill_packed(x_packed, cu, positions, pool, slots)   # x_packed: (T, hidden)
        """
        b, c, v = self._serving_project(hidden_states, positions)
        o = api.linear_attention_varlen(b, c, v, contiguous_index(cu_seqlens), self.gamma(hidden_states.device),
                                        method=self.method if method is None else method, state_pool=state_pool,
                                        slot_ids=contiguous_index(slot_ids),
                                        has_initial_state=contiguous_index(has_initial_state),
                                        precision=self.precision, check_indices=check_indices)
        return self._serving_output(hidden_states, o)

    def decode_slotted(self, hidden_states: torch.Tensor, positions: torch.Tensor, state_pool: torch.Tensor,
                       slot_ids: torch.Tensor, *, check_slots: bool = True) -> torch.Tensor:
        """One new token for each of B requests: row i continues the state in ``state_pool[slot_ids[i]]``.

        ``hidden_states`` ``(B, hidden_size)``, ``positions`` integer ``(B,)`` (row i's position in its
        sequence), ``slot_ids`` int32/int64 ``(B,)`` (negative: a padding row, whose attention output is zero
        and whose slot is untouched); ``check_slots`` as in :func:`leettriton.decode_step`.  One
        :func:`leettriton.decode_step` call, the states updated in place.  Returns ``(B, hidden_size)``.
        """
        b, c, v = self._serving_project(hidden_states, positions)
        o, _ = api.decode_step(b, c, v, state_pool, self.gamma(hidden_states.device),
                               slot_ids=contiguous_index(slot_ids), check_slots=check_slots)
        return self._serving_output(hidden_states, o)

    def _serving_project(self, x: torch.Tensor, positions: torch.Tensor):
        """b, c ``(tokens, H, r)`` and v ``(tokens, H, d)`` of packed rows ``x`` ``(tokens, hidden_size)``."""
        check_hidden("hidden_states", x, self.hidden_size, "(tokens, hidden_size)")
        positions = check_positions(positions, x.shape[0], x.device, "each token's position in its sequence")
        T = x.shape[0]
        H, r, d = self.num_heads, self.head_k_dim, self.head_v_dim
        q = self.q_proj(x).view(T, H, r)
        k = self.k_proj(x).view(T, self.num_kv_heads, r)
        v = self.v_proj(x).view(T, self.num_kv_heads, d)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        b = self.rotary.apply_at(q, positions, scale=r ** -0.5)
        c = self.rotary.apply_at(k, positions)
        if self.num_kv_groups > 1:
            c = c.repeat_interleave(self.num_kv_groups, dim=1)
            v = v.repeat_interleave(self.num_kv_groups, dim=1)
        return b, c, v

    def _serving_output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Norm, gate and output projection of the attention output ``o`` ``(tokens, H, d)``."""
        return self._output(o, x)
