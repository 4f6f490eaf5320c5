"""Mamba-2's mixer (the state-space duality layer) on leettriton's kernels (docs/design.md §12.6)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cache import LinearAttentionCache
from .conv import ShortConvolution
from .functional import (activation, attend, check_attention_mask, check_hidden, check_per_token_method,
                         scale_values)

__all__ = ["Mamba2", "GatedRMSNorm"]


class GatedRMSNorm(nn.Module):
    """Mamba-2's gated RMS norm over groups of channels: y ⊙ swish(z), then x / rms(x) within each group of
    ``group_size`` channels, times ``weight`` (``norm_before_gate=False``, Mamba-2's default); or the norm
    first and the gate after (``norm_before_gate=True``).  Computed in float32.

    Args:
        hidden_size: channels (``weight`` ``(hidden_size,)``).
        eps: added to the mean square.
        group_size: channels per group (None: one group of ``hidden_size``).
        norm_before_gate: normalise before multiplying by swish(z).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        group_size = hidden_size if group_size is None else group_size
        if group_size < 1 or hidden_size % group_size:
            raise ValueError(f"group_size must divide hidden_size={hidden_size}, got {group_size}")
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, y: torch.Tensor, z: Optional[torch.Tensor] = None,
                out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``y``, ``z`` ``(..., hidden_size)`` → the same shape in ``out_dtype`` (default y's dtype)."""
        x = y.float()
        gate = None if z is None else F.silu(z.float())
        if gate is not None and not self.norm_before_gate:
            x = x * gate
        grouped = x.unflatten(-1, (-1, self.group_size))
        x = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2) * self.weight.float()
        if gate is not None and self.norm_before_gate:
            x = x * gate
        return x.to(y.dtype if out_dtype is None else out_dtype)


class Mamba2(nn.Module):
    r"""Mamba-2's mixer: a short causal convolution, then the state-space duality (SSD) as our operator.

    ``in_proj`` gives the gate z, the convolution's input (x, B, C) and dt per head; after the depthwise
    causal convolution ``conv1d`` and its activation, per head h (of ``num_heads``, head dim P, state N,
    B and C shared by the ``n_groups`` groups of heads: head h reads group h // (num_heads / n_groups)):

        dt_t = clamp(softplus(dt_t + dt_bias_h), dt_limit),  A_h = −exp(A_log_h),
        S_t = exp(A_h dt_t) S_{t−1} + B_tᵀ (dt_t x_t),  y_t = C_t S_t + D_h x_t,

    which is :func:`leettriton.linear_attention` with b = C, c = B, v = dt·x and the per-token decay
    ``log_decay`` = A·dt (docs/design.md §1.6).  Then the gated RMS norm ``norm`` (y ⊙ swish(z), normalised
    within each group) or, without ``rmsnorm``, y ⊙ act(z), and ``out_proj``.

    Parameter names, shapes and constructor arguments are flash-linear-attention's ``fla.layers.Mamba2``
    (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``), so its weights load
    with ``load_state_dict(strict=True)``; the initialisation follows the same rules (dt log-uniform in
    [dt_min, dt_max] stored as softplus⁻¹, A uniform in ``A_init_range``, D and the norm's weight ones).

    Args:
        num_heads: heads (None or 0: expand · hidden_size / head_dim, which it must equal if given).
        head_dim: P; state_size: N; hidden_size: model width; expand: inner width / hidden_size.
        n_groups: groups of heads sharing B and C (must divide the heads).
        conv_kernel, conv_init, use_conv_bias: the convolution's width, uniform init bound, bias.
        hidden_act: the convolution's activation (and the gate's without ``rmsnorm``).
        A_init_range, dt_min, dt_max, dt_init_floor: initialisation of A_log and dt_bias.
        D_has_hdim: D per channel (inner width) rather than per head.
        rmsnorm, norm_before_gate, norm_eps: the gated norm.
        dt_limit: (low, high) clamp of dt after the softplus.
        use_bias: biases in ``in_proj`` and ``out_proj``.
        chunk_size: accepted for configurations written for fla; the methods choose their own tiling.
        layer_idx: this layer's index in a cache.
        method: any method that takes a per-token decay (:func:`leettriton.registry.per_token_methods`), for
            prefill; precision: ``linear_attention``'s for float32 inputs.

    Shapes: ``hidden_states`` ``(batch, n, hidden_size)`` → ``(batch, n, hidden_size)``.  The cache entry
    holds the float32 SSM state ``(batch, heads, N, P)`` and the convolution's last ``conv_kernel − 1``
    inputs; any split of a sequence into prefill calls and one-token steps gives the outputs of one prefill.

    Example::

        >>> layer = Mamba2(num_heads=64, head_dim=64, hidden_size=2048, state_size=128, layer_idx=0).cuda()
        >>> cache = LinearAttentionCache()
        >>> with torch.no_grad():
        ...     y = layer(x, cache=cache)               # prefill
        ...     y_t = layer(x_next, cache=cache)        # one token: decode_step with the token's decay
    """

    def __init__(self, num_heads: Optional[int] = None, head_dim: int = 64, hidden_size: int = 2048,
                 state_size: int = 128, expand: int = 2, n_groups: int = 1, conv_kernel: int = 4,
                 conv_init: Optional[float] = None, use_conv_bias: bool = True, hidden_act: str = "silu",
                 A_init_range: tuple = (1, 16), D_has_hdim: bool = False, rmsnorm: bool = True,
                 norm_before_gate: bool = False, dt_min: float = 0.001, dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4, dt_limit: tuple = (0.0, float("inf")), use_bias: bool = False,
                 norm_eps: float = 1e-5, chunk_size: int = 256, layer_idx: Optional[int] = None, *,
                 method: str = "auto", precision: Optional[str] = None, device=None, dtype=None) -> None:
        super().__init__()
        intermediate_size = int(expand * hidden_size)
        if head_dim < 1 or intermediate_size % head_dim:
            raise ValueError(f"expand * hidden_size = {intermediate_size} must be a multiple of head_dim, got "
                             f"head_dim={head_dim}")
        heads = intermediate_size // head_dim
        if num_heads not in (None, 0) and num_heads != heads:
            raise ValueError(f"num_heads * head_dim must equal expand * hidden_size = {intermediate_size}, got "
                             f"num_heads={num_heads}, head_dim={head_dim}")
        if n_groups < 1 or heads % n_groups:
            raise ValueError(f"n_groups must divide num_heads={heads}, got n_groups={n_groups}")
        if len(dt_limit) != 2 or not dt_limit[0] <= dt_limit[1]:
            raise ValueError(f"dt_limit must be (low, high) with low ≤ high, got {dt_limit!r}")
        self.hidden_size, self.expand, self.intermediate_size = hidden_size, expand, intermediate_size
        self.num_heads, self.head_dim, self.ssm_state_size, self.n_groups = heads, head_dim, state_size, n_groups
        self.conv_kernel_size, self.conv_init, self.use_conv_bias = conv_kernel, conv_init, use_conv_bias
        self.activation, self.act = hidden_act, activation(hidden_act, "hidden_act")
        self.A_init_range, self.D_has_hdim = A_init_range, D_has_hdim
        self.rmsnorm, self.norm_before_gate, self.norm_eps = rmsnorm, norm_before_gate, norm_eps
        self.dt_limit, self.dt_min, self.dt_max = (float(dt_limit[0]), float(dt_limit[1])), dt_min, dt_max
        self.use_bias, self.chunk_size, self.layer_idx = use_bias, chunk_size, layer_idx
        self.set_method(method, precision)

        factory = {"device": device, "dtype": dtype}
        self.conv_dim = intermediate_size + 2 * n_groups * state_size
        self.conv1d = ShortConvolution(self.conv_dim, conv_kernel, bias=use_conv_bias, activation=None, **factory)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        self.in_proj = nn.Linear(hidden_size, intermediate_size + self.conv_dim + heads, bias=use_bias, **factory)
        # dt log-uniform in [dt_min, dt_max] (at least dt_init_floor), stored as its softplus inverse
        dt = torch.exp(torch.rand(heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(**factory))
        self.A_log = nn.Parameter(torch.empty(heads).uniform_(*A_init_range).log().to(**factory))
        self.norm = GatedRMSNorm(intermediate_size, norm_eps, intermediate_size // n_groups, norm_before_gate,
                                 **factory) if rmsnorm else None
        self.D = nn.Parameter(torch.ones(intermediate_size if D_has_hdim else heads, **factory))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.out_proj = nn.Linear(intermediate_size, hidden_size, bias=use_bias, **factory)

    def set_method(self, method: str, precision: Optional[str] = None) -> None:
        """Switch the prefill method (one that takes a per-token decay, or ``"auto"``) and the float32
        precision."""
        self.method, self.precision = check_per_token_method(method), precision

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"state_size={self.ssm_state_size}, n_groups={self.n_groups}, method={self.method!r}")

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache: Optional[LinearAttentionCache] = None) -> torch.Tensor:
        """``hidden_states`` ``(batch, n, hidden_size)``; ``attention_mask`` ``(batch, ≥ n)`` of 0/1 marking left
        padding (its last n columns are this call's tokens): a 0 token enters the convolution as zeros, adds
        nothing to the state and leaves it undecayed; ``cache`` continues from and updates this layer's SSM
        and convolution states (``layer_idx``).  A mask is checked as
        :meth:`leettriton.nn.MultiScaleRetention.forward` checks it."""
        x = hidden_states
        check_hidden("hidden_states", x, self.hidden_size, "(batch, n, hidden_size)")
        Bsz, n, _ = x.shape
        H, P, N, G = self.num_heads, self.head_dim, self.ssm_state_size, self.n_groups
        entry = cache.layer(self.layer_idx) if cache is not None else None
        check_attention_mask(attention_mask, Bsz, n, x.device,
                             values=not (n == 1 and entry is not None and entry.state is not None))
        mask = None if attention_mask is None else attention_mask[:, -n:, None].to(x.dtype)   # [B, n, 1]

        z, xbc, dt = self.in_proj(x).split([self.intermediate_size, self.conv_dim, H], dim=-1)
        if mask is not None:
            xbc = xbc * mask
        conv_state = None if entry is None else entry.conv_state
        if conv_state is not None and tuple(conv_state.shape) != (Bsz, self.conv_dim, self.conv_kernel_size - 1):
            raise ValueError(f"cache layer {self.layer_idx} holds a convolution state of shape "
                             f"{tuple(conv_state.shape)}, but this layer needs (batch, channels, conv_kernel − 1) "
                             f"= {(Bsz, self.conv_dim, self.conv_kernel_size - 1)}")
        xbc, conv_state = self.conv1d(xbc, conv_state, return_state=cache is not None)
        xbc = self.act(xbc)
        if mask is not None:
            xbc = xbc * mask
        xs, Bm, Cm = xbc.split([self.intermediate_size, G * N, G * N], dim=-1)
        xs = xs.unflatten(-1, (H, P))                                              # [B, n, H, P]

        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.dt_limit)  # [B, n, H] float32
        log_decay = dt * -torch.exp(self.A_log.float())                            # a_t = A·dt ≤ 0
        if mask is not None:
            log_decay = log_decay * mask.float()                                   # a padded token: no decay
        v = scale_values(xs, dt)                                                   # dt·x in x's dtype
        b = Cm.unflatten(-1, (G, N))            # [B, n, G, N]: groups of heads share B and C (§1.7), read in place
        c = Bm.unflatten(-1, (G, N))
        o = attend(b, c, v, None, method=self.method, precision=self.precision, cache=cache,
                   layer_idx=self.layer_idx, log_decay=log_decay, conv_state=conv_state)

        D = self.D.float().view(H, P) if self.D_has_hdim else self.D.float()[:, None]
        y = (o.float() + xs.float() * D).flatten(-2)                               # [B, n, H·P] float32
        if self.rmsnorm:
            y = self.norm(y, z, out_dtype=x.dtype)
        else:
            y = (y * self.act(z.float())).to(x.dtype)
        return self.out_proj(y)
