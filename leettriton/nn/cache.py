"""The generation cache: one float32 state per layer and the number of tokens that layer has seen.

A linear-attention layer needs nothing of the past but its state S (batch, heads, r, d) and, for
position encodings, how many tokens came before (docs/design.md §12.2); a layer with a short causal
convolution (Mamba-2, simple GLA) also keeps the convolution's last inputs.  This module needs no
``transformers``: the models hand the same object to ``generate()``, which only calls the methods
below (``reorder_cache``, ``crop``, ``get_seq_length``, ...).
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["LinearAttentionCache", "LayerState"]


class LayerState:
    """One layer's entry: its float32 ``state`` (or None before the first token), ``seen`` tokens and, for a
    layer with a short convolution, ``conv_state`` ``(batch, channels, kernel_size − 1)``: the convolution's
    last inputs, in the layer's dtype (None for a layer without one)."""

    __slots__ = ("state", "seen", "record_past", "past", "conv_state")

    def __init__(self) -> None:
        self.state: Optional[torch.Tensor] = None
        self.conv_state: Optional[torch.Tensor] = None
        self.seen = 0
        self.record_past = False
        # (seen, state, conv_state) before each update
        self.past: list[tuple[int, Optional[torch.Tensor], Optional[torch.Tensor]]] = []

    def __repr__(self) -> str:
        shape = None if self.state is None else tuple(self.state.shape)
        conv = "" if self.conv_state is None else f", conv_state={tuple(self.conv_state.shape)}"
        return f"LayerState(seen={self.seen}, state={shape}{conv})"


class LinearAttentionCache:
    """Per-layer recurrent states of a linear-attention model, for prefill, chunked prefill and decoding.

    Each layer's entry holds its float32 state ``(batch, heads, r, d)`` and the number of tokens it has
    seen (the rotary offset of the next token).  A layer called with a cache starts from its entry's
    state and leaves its final state there: a prefill of n tokens followed by m one-token steps gives the
    outputs of one prefill of n + m tokens (docs/design.md §1.3).  The one-token step updates the state
    in place (:func:`leettriton.decode_step`); everything else replaces it.

    Args:
        num_layers: number of layers, or None to grow on first use.
        owner: a tag of the model that made the cache (a model refuses a cache with another tag).

    Example::

        >>> cache = LinearAttentionCache()
        >>> y = layer(x[:, :100], cache=cache)       # prefill
        >>> y_t = layer(x[:, 100:101], cache=cache)  # one token, S updated in place
    """

    is_compileable = False

    def __init__(self, num_layers: Optional[int] = None, owner: Optional[tuple] = None) -> None:
        if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool)
                                       or num_layers < 0):
            raise ValueError(f"num_layers must be None or an int ≥ 0, got {num_layers!r}")
        self.layers: list[LayerState] = [LayerState() for _ in range(num_layers or 0)]
        self.owner = owner
        self.record_past = False   # set by activate_past_recording(): layers added later record too

    # ------------------------------------------------------------------ per-layer access

    def layer(self, layer_idx: int) -> LayerState:
        """The entry of layer ``layer_idx`` (created, empty, if the cache has fewer layers)."""
        if not isinstance(layer_idx, int) or isinstance(layer_idx, bool) or layer_idx < 0:
            raise ValueError(f"layer_idx must be a non-negative int to use a cache, got {layer_idx!r} "
                             f"(give each layer its index: layer_idx=...)")
        while len(self.layers) <= layer_idx:
            entry = LayerState()
            entry.record_past = self.record_past
            self.layers.append(entry)
        return self.layers[layer_idx]

    def get_state(self, layer_idx: int) -> Optional[torch.Tensor]:
        """Layer ``layer_idx``'s float32 state ``(batch, heads, r, d)``, or None before its first token."""
        return self.layer(layer_idx).state

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        """Tokens seen by layer ``layer_idx`` (0 for a layer not yet run)."""
        layer_idx = 0 if layer_idx is None else layer_idx
        return self.layers[layer_idx].seen if layer_idx < len(self.layers) else 0

    def update(self, layer_idx: int, state: torch.Tensor, new_tokens: int,
               conv_state: Optional[torch.Tensor] = None) -> None:
        """Store layer ``layer_idx``'s new ``state`` (and ``conv_state``, if given) after ``new_tokens`` more
        tokens."""
        entry = self.layer(layer_idx)
        if entry.record_past:
            entry.past.append((entry.seen, entry.state, entry.conv_state))
        entry.state = state
        if conv_state is not None:
            entry.conv_state = conv_state
        entry.seen += new_tokens

    def step_in_place(self, layer_idx: int, conv_state: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Layer ``layer_idx``'s state, for a one-token step that writes it in place and counts one token;
        ``conv_state``, if given, replaces the entry's (a new tensor: the old one is never written).

        While recording, a copy of the state is kept first (so :meth:`crop` can go back).
        """
        entry = self.layer(layer_idx)
        if entry.record_past:
            entry.past.append((entry.seen, entry.state.clone(), entry.conv_state))
        if conv_state is not None:
            entry.conv_state = conv_state
        entry.seen += 1
        return entry.state

    def get_conv_state(self, layer_idx: int) -> Optional[torch.Tensor]:
        """Layer ``layer_idx``'s short-convolution inputs ``(batch, channels, kernel_size − 1)``, or None."""
        return self.layer(layer_idx).conv_state

    # ------------------------------------------------------------------ transformers' Cache interface

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"LinearAttentionCache(layers={self.layers})"

    @property
    def is_linear(self) -> list[bool]:
        return [True] * len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    @property
    def is_croppable(self) -> bool:
        """Whether :meth:`crop` can go back (only while past states are recorded)."""
        return self.record_past and all(entry.record_past for entry in self.layers)

    @property
    def batch_size(self) -> int:
        for entry in self.layers:
            if entry.state is not None:
                return entry.state.shape[0]
        return -1

    def get_max_length(self, layer_idx: Optional[int] = None) -> Optional[int]:
        return None   # a recurrent state has no length limit

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0

    def has_previous_state(self, layer_idx: Optional[int] = None, state_idx: Optional[int] = None) -> bool:
        entries = self.layers if layer_idx is None else self.layers[layer_idx:layer_idx + 1]
        # len, not bool(list): torch 2.11's compiler does not trace the latter
        return len(entries) > 0 and all(entry.state is not None for entry in entries)

    def reset(self) -> None:
        """Forget every token: the next call starts from a zero state at position 0."""
        for entry in self.layers:
            entry.state = None
            entry.conv_state = None
            entry.seen = 0
            entry.past = []

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep, for each new batch row i, the state of row ``beam_idx[i]`` (beam search).

        ``beam_idx``: a 1-D integer tensor of rows in [0, batch), checked before any state changes (reading its
        range costs one device sync on CUDA; an index out of range would otherwise be a device-side assert).
        """
        self._select("beam_idx", beam_idx)

    def _select(self, name: str, rows) -> None:
        self._check_rows(name, rows)

        def select(s):
            return None if s is None else s.index_select(0, rows.to(s.device))

        for entry in self.layers:
            entry.state, entry.conv_state = select(entry.state), select(entry.conv_state)
            entry.past = [(seen, select(s), select(conv)) for seen, s, conv in entry.past]

    def _check_rows(self, name: str, rows) -> None:
        """``rows`` a 1-D integer tensor of batch rows in [0, batch) (any range while no state is held)."""
        if not isinstance(rows, torch.Tensor) or rows.is_floating_point() or rows.is_complex() \
                or rows.dtype == torch.bool:
            got = f"a {rows.dtype} tensor" if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise TypeError(f"{name} must be a 1-D integer tensor of batch rows, got {got}")
        if rows.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor of batch rows, got shape {tuple(rows.shape)}")
        batch = self.batch_size
        if batch < 0 or rows.numel() == 0:
            return
        low, high = torch.stack([rows.min(), rows.max()]).tolist()
        if low < 0 or high >= batch:
            raise ValueError(f"{name} must hold rows in [0, {batch}) (the cache's batch), got "
                             f"{low if low < 0 else high}")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices`` (as :meth:`reorder_cache`)."""
        self._select("indices", indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times, as ``generate`` does for beams and several sequences."""
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"repeats must be a positive int, got {repeats!r}")

        def repeat(s):
            return None if s is None else s.repeat_interleave(repeats, dim=0)

        for entry in self.layers:
            entry.state, entry.conv_state = repeat(entry.state), repeat(entry.conv_state)
            entry.past = [(seen, repeat(s), repeat(conv)) for seen, s, conv in entry.past]

    def activate_past_recording(self) -> None:
        """Keep every layer's state before each update, so that :meth:`crop` can return to it (layers the cache
        gains later, as one built without ``num_layers`` does on first use, record too)."""
        self.record_past = True
        for entry in self.layers:
            entry.record_past = True

    def crop(self, max_length: int) -> None:
        """Go back to the first ``max_length`` tokens (a negative value removes that many tokens).

        A recurrent state cannot be un-decayed, so this restores a recorded state
        (:meth:`activate_past_recording`); without one, only cropping to 0 (:meth:`reset`) or to
        the current length (a no-op) is possible, and anything else raises ``ValueError``.
        """
        if not isinstance(max_length, int) or isinstance(max_length, bool):
            raise TypeError(f"max_length must be an int (negative: tokens to remove), got {max_length!r}")
        plan = []   # every layer is checked before any is changed
        for i, entry in enumerate(self.layers):
            target = entry.seen + max_length if max_length < 0 else max_length
            if target < 0:
                raise ValueError(f"crop({max_length}): layer {i} has seen only {entry.seen} tokens")
            if target >= entry.seen:
                continue
            if target == 0:
                plan.append((entry, None))
                continue
            kept = [k for k, (seen, _, _) in enumerate(entry.past) if seen == target]
            if not kept:
                raise ValueError(
                    f"crop({max_length}): layer {i} holds the state after {entry.seen} tokens and no recorded "
                    f"state after {target}; a recurrent state cannot be rolled back (call "
                    f"activate_past_recording() before the tokens to undo, or reset())")
            plan.append((entry, kept[-1]))
        for entry, k in plan:
            if k is None:
                entry.state, entry.conv_state, entry.seen, entry.past = None, None, 0, []
            else:
                entry.seen, entry.state, entry.conv_state = entry.past[k]
                del entry.past[k:]

    def to(self, device) -> "LinearAttentionCache":
        for entry in self.layers:
            if entry.state is not None:
                entry.state = entry.state.to(device)
            if entry.conv_state is not None:
                entry.conv_state = entry.conv_state.to(device)
        return self
