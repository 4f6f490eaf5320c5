"""What the layers share: the attention call (prefill or one-token step), rotary tables, norms, activations.

The attention itself is always :func:`leettriton.linear_attention` (any number of tokens) or
:func:`leettriton.decode_step` (one token with a state), on ``(batch, n, heads, dim)`` views of the
projections (layout ``"bnhd"``, no copies): docs/design.md §12.1.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .. import api, registry
from ..problem import requires_grad
from .cache import LinearAttentionCache
from ..ops import is_compiling
from .fused import rotary, uses_kernels
from .scale import scale_values

__all__ = ["ACTIVATIONS", "activation", "check_method", "attend", "rms_norm", "RotaryTable", "decay_tensor",
           "check_per_token_method", "check_hidden", "check_positions", "check_attention_mask", "checked_mask",
           "contiguous_index", "scale_values"]


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


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def check_per_token_method(method) -> str:
    """A layer's prefill method that takes a per-token decay (or ``"auto"``): its canonical name, else a
    ValueError naming the methods that do."""
    name = check_method(method)
    if not registry.supports_per_token(name):
        raise ValueError(f"method must take a per-token decay (one of {registry.per_token_methods()}), got "
                         f"{method!r}")
    return name


def check_hidden(name: str, x, hidden_size: int, shape: str) -> None:
    """``x`` a floating-point tensor of ``shape`` (e.g. ``"(batch, n, hidden_size)"``: its rank, the last size
    ``hidden_size``), else a clear error before a projection would raise deep inside ``nn.Linear``."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor {shape}, got {_describe(x)}")
    if x.dim() != shape.count(",") + 1 or x.shape[-1] != hidden_size:
        raise ValueError(f"{name} must have shape {shape} with hidden_size={hidden_size}, got shape "
                         f"{tuple(x.shape)}")


def contiguous_index(x):
    """An index tensor (cu_seqlens, slot ids, flags) as one contiguous tensor, so that every path reads the
    values its logical view holds (a contiguous tensor is returned as it is; anything else is left for the
    operator's checks to name)."""
    return x.contiguous() if isinstance(x, torch.Tensor) else x


def is_integer_tensor(x: torch.Tensor) -> bool:
    """Whether ``x`` holds integers (bool, floating and complex tensors do not)."""
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def check_positions(positions, rows: Optional[int], device: torch.device, what: str) -> torch.Tensor:
    """``positions`` as the serving and decoding paths read it: an integer tensor of shape ``(rows,)`` (None:
    one element) on ``device``, made contiguous (a strided view is copied once, so every path reads what it
    means).  Float positions are refused on every path alike: a rotary or LRPE angle is position × frequency of
    an integer position (docs/design.md §13.5)."""
    want = f"({rows},)" if rows is not None else "(1,)"
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be an integer tensor of shape {want} ({what}), got {_describe(positions)}")
    if not is_integer_tensor(positions):   # a ValueError, as the fused ops' own check of the same rule
        raise ValueError(f"positions must be an integer tensor of shape {want} ({what}), got {_describe(positions)}")
    if tuple(positions.shape) != ((rows,) if rows is not None else (1,)):
        raise ValueError(f"positions must have shape {want} ({what}), got shape {tuple(positions.shape)}")
    if positions.device != device:
        raise ValueError(f"positions must be on the inputs' device {device}, got {positions.device}")
    return positions.contiguous()


_CHECKED_MASK: contextvars.ContextVar = contextvars.ContextVar("leettriton_checked_mask", default=None)


@contextlib.contextmanager
def checked_mask(attention_mask: Optional[torch.Tensor]):
    """Within the block, :func:`check_attention_mask` does not read ``attention_mask``'s values again: a model
    checks its mask once and then runs its layers, each of which would otherwise read it (one device sync each
    on CUDA).  While ``torch.compile`` traces, no value is read (docs/design.md §4.6), so the block does nothing."""
    if is_compiling():
        yield
        return
    token = _CHECKED_MASK.set(attention_mask)
    try:
        yield
    finally:
        _CHECKED_MASK.reset(token)


def check_attention_mask(attention_mask, batch: int, n: int, device: torch.device, *, values: bool = True) -> None:
    """``attention_mask`` ``(batch, ≥ n)`` of 0/1 marking left padding: in each row every 0 comes before every 1.

    Structure is checked on the host.  With ``values`` the entries are read too (one device sync on CUDA, never
    while a CUDA graph is being captured, nor inside :func:`checked_mask` of this mask): a 0 after a 1 (right
    padding, or a hole) or a value other than 0 and 1 is refused, since a recurrent state cannot skip a token
    and the next token would follow the padding (docs/design.md §12.1).  The models check their mask once per
    call and leave one-token steps through a cache unchecked (a sync per generated token).  While
    ``torch.compile`` traces, the values are not read (no check reads tensor values there: docs/design.md §4.6).
    """
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.is_complex():
        raise TypeError(f"attention_mask must be a (batch, length) tensor of 0/1 (left padding), got "
                        f"{_describe(attention_mask)}")
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < n:
        raise ValueError(f"attention_mask must have shape (batch={batch}, length ≥ {n}) (its last {n} columns mark "
                         f"this call's tokens), got shape {tuple(attention_mask.shape)}")
    if attention_mask.device != device:
        raise ValueError(f"attention_mask must be on the inputs' device {device}, got {attention_mask.device}")
    if not values or attention_mask.numel() == 0 or is_compiling() or _CHECKED_MASK.get() is attention_mask or (
            attention_mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    mask = attention_mask.detach()
    not_binary = (mask != 0) & (mask != 1)
    ones = mask != 0
    right_padded = ones[:, :-1] & ~ones[:, 1:]                      # a 1 followed by a 0
    bad_value, bad_order = torch.stack([not_binary.any(), right_padded.any()]).tolist()   # the one sync
    if bad_value:
        row, col = (int(i) for i in not_binary.nonzero()[0])
        raise ValueError(f"attention_mask must hold only 0 and 1, got attention_mask[{row}, {col}] = "
                         f"{mask[row, col].item()}")
    if bad_order:
        row, col = (int(i) for i in right_padded.nonzero()[0])
        raise ValueError(f"attention_mask must mark left padding only (each row 0s, then 1s): got a 0 after a 1 in "
                         f"row {row} (columns {col} and {col + 1}); right padding or a hole cannot be skipped by a "
                         f"recurrent state: pad on the left (tokenizer.padding_side = 'left')")


def decay_tensor(gammas: Sequence[float], cache: dict, device: torch.device) -> torch.Tensor:
    """The per-head γ as a float64 tensor on ``device``, made once per device.

    Not a buffer: ``module.to(torch.bfloat16)`` would round a buffer's γ (1 − 2^-12 is not a bfloat16).
    The tensor is never handed out, so it cannot change under the kernels (docs/design.md §2.6).
    """
    hit = cache.get(device)
    if hit is None:
        hit = cache[device] = torch.tensor(list(gammas), dtype=torch.float64, device=device)
    return hit


def attend(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, gamma: Optional[torch.Tensor], *, method: str,
           precision: Optional[str], cache: Optional[LinearAttentionCache], layer_idx: Optional[int],
           log_decay: Optional[torch.Tensor] = None, conv_state: Optional[torch.Tensor] = None) -> torch.Tensor:
    """O = (B Cᵀ ⊙ M) V for ``(batch, n, heads, dim)`` inputs, continuing from the cache's state if given; b, c
    and v may have fewer heads than the output, each dividing its count (grouped heads, docs/design.md §1.7).

    The decay is ``gamma`` per head or ``log_decay`` ``(batch, n, heads)`` per token (docs/design.md §1.6).
    Without a cache: one ``linear_attention`` call.  With one: a one-token call on a layer that already
    has a state is ``decode_step`` (state updated in place); any other call is ``linear_attention`` from
    the cached state, whose final state replaces it.  ``decode_step`` has no backward, so a one-token call
    that needs a gradient (grad mode on and an input or the cached state requiring grad) is a
    one-row ``linear_attention`` call instead: the same values, differentiable, the state replaced rather
    than written in place (docs/design.md §12.2).  ``conv_state``, a layer's new short-convolution inputs,
    is stored in the cache entry at the same step.  Returns ``(batch, n, heads, d)`` in v's dtype.
    """
    if cache is None:
        return api.linear_attention(b, c, v, gamma, method=method, layout="bnhd", precision=precision,
                                    log_decay=log_decay)
    entry = cache.layer(layer_idx)
    state = entry.state
    B, n, _, r = b.shape
    H, d = max(b.shape[2], v.shape[2]), v.shape[-1]      # the output's heads (grouped heads: docs/design.md §1.7)
    if state is not None and tuple(state.shape) != (B, H, r, d):
        raise ValueError(f"cache layer {layer_idx} holds a state of shape {tuple(state.shape)}, but this layer needs "
                         f"(batch, heads, r, d) = {(B, H, r, d)}: a cache of another model or of another batch")
    if n == 1 and state is not None and not requires_grad(b, c, v, state, log_decay):
        state = cache.step_in_place(layer_idx, conv_state)
        o, _ = api.decode_step(b[:, 0], c[:, 0], v[:, 0], state, gamma,
                               log_decay=None if log_decay is None else log_decay[:, 0])
        return o.unsqueeze(1)
    o, state = api.linear_attention(b, c, v, gamma, method=method, layout="bnhd", initial_state=state,
                                    return_state=True, precision=precision, log_decay=log_decay)
    cache.update(layer_idx, state, n, conv_state)
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
        if not isinstance(positions, torch.Tensor) or not is_integer_tensor(positions):
            raise ValueError(f"positions must be an integer tensor of shape ({x.shape[0]},) or (1,), got "
                             f"{_describe(positions)}")
        if uses_kernels(x) and positions.device == x.device:
            return rotary(x, self.inv_freq(x.device), positions=positions, scale=scale)
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq(x.device)[None]   # [tokens or 1, dim/2]
        cos, sin = torch.cos(freqs)[:, None, :], torch.sin(freqs)[:, None, :]
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return self._rotate(x, cos, sin)


def head_scale(r: int) -> float:
    return 1.0 / math.sqrt(r)
