"""The short causal convolution of Mamba-2 and simple GLA: depthwise, over the last few tokens, with a state.

Output token t of channel ch is act(bias_ch + Σ_k w[ch, k] · x[t − K + 1 + k, ch]), k = 0 … K − 1, with
the tokens before the first read from the state (the K − 1 inputs before this call; zeros at the start of
a sequence).  The state after a call is its last K − 1 inputs, so a prefill of n tokens followed by
one-token calls gives the outputs of one prefill of every token (docs/design.md §12.6).  PyTorch's
``conv1d`` does the work.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .functional import activation as named_activation

__all__ = ["ShortConvolution", "causal_conv1d"]


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], state: Optional[torch.Tensor],
                  act=None, *, return_state: bool = False):
    """The causal depthwise convolution of ``x`` ``(batch, n, channels)`` continuing from ``state``.

    Args:
        x: ``(batch, n, channels)``.
        weight: ``(channels, 1, K)`` (``nn.Conv1d``'s depthwise weight); bias: ``(channels,)`` or None.
        state: ``(batch, channels, K − 1)``, the K − 1 inputs before ``x`` (None: zeros).
        act: a function applied to the output, or None.
        return_state: also return the state after ``x``: its last K − 1 inputs (earlier ones from ``state``).

    Returns ``(y, new_state)``: y ``(batch, n, channels)`` in x's dtype, new_state ``(batch, channels, K − 1)``
    (contiguous, a new tensor) or None.
    """
    B, n, C = x.shape
    K = weight.shape[-1]
    if state is None:
        state = x.new_zeros(B, C, K - 1)
    if n == 0:   # nothing to convolve (conv1d refuses an input shorter than its kernel): the state stays
        return x.new_empty(B, 0, C), state.to(x.dtype) if return_state else None
    full = torch.cat([state.to(x.dtype), x.transpose(1, 2)], dim=-1)   # [B, C, K - 1 + n]
    y = F.conv1d(full, weight.to(x.dtype), None if bias is None else bias.to(x.dtype), groups=C).transpose(1, 2)
    if act is not None:
        y = act(y)
    new_state = full[..., full.shape[-1] - (K - 1):].contiguous() if return_state else None
    return y, new_state


class ShortConvolution(nn.Conv1d):
    """A depthwise causal convolution of ``kernel_size`` tokens with an optional activation (a ``nn.Conv1d``:
    parameters ``weight`` ``(hidden_size, 1, kernel_size)`` and, with ``bias``, ``bias`` ``(hidden_size,)``).

    Args:
        hidden_size: channels.
        kernel_size: tokens the convolution reads (K).
        bias: a bias per channel.
        activation: a name of :data:`leettriton.nn.ACTIVATIONS` applied to the output, or None.

    ``forward(x, state=None, return_state=False)`` is :func:`causal_conv1d` with this module's weights.

    Example::

        >>> conv = ShortConvolution(256, 4)
        >>> y, state = conv(x[:, :10], return_state=True)              # x: (batch, n, 256)
        >>> y_next, state = conv(x[:, 10:11], state, return_state=True)
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False, activation: Optional[str] = "silu",
                 device=None, dtype=None) -> None:
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(f"kernel_size must be a positive int, got {kernel_size!r}")
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, padding=kernel_size - 1,
                         bias=bias, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.activation = activation
        self.act = named_activation(activation, "activation")

    def forward(self, x: torch.Tensor, state: Optional[torch.Tensor] = None,
                return_state: bool = False):   # noqa: D102 (the class docstring)
        return causal_conv1d(x, self.weight, self.bias, state, self.act, return_state=return_state)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation}"
