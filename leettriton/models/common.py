"""What both models share: transformers' base classes across versions, norms, the MLP, the cache handling,
``generate()`` integration and ``set_attention_method`` (docs/design.md §12.3)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import registry
from ..api import VARLEN_NATIVE
from ..nn import LinearAttentionCache
from ..ops import is_compiling
from ..nn.functional import (check_attention_mask, check_hidden, check_method, check_positions, checked_mask,
                             contiguous_index)
from ..nn.fused import rms_norm_gate, swiglu
from .decoding import DecoderCache, StaticDecoder

try:  # transformers ≥ 4.56 spells it PreTrainedConfig; older releases PretrainedConfig
    from transformers import PreTrainedConfig
except ImportError:  # pragma: no cover - older transformers
    from transformers import PretrainedConfig as PreTrainedConfig
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

__all__ = ["PreTrainedConfig", "LinearAttentionPreTrainedModel", "LinearAttentionGenerationMixin", "RMSNorm", "GatedMLP", "model_output"]

# transformers 5 renamed the outputs' (and forward's) ``past_key_values`` to ``cache``
_CACHE_FIELD = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def model_output(cls, cache, **fields):
    """An output of ``cls`` with the cache under the installed transformers' name for it."""
    fields[_CACHE_FIELD] = cache
    return cls(**fields)


class RMSNorm(nn.Module):
    """RMS norm with a weight, computed in float32 and returned in the input's dtype (one pass:
    :func:`leettriton.nn.fused.rms_norm_gate`)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_gate(x, self.weight, self.eps)


class GatedMLP(nn.Module):
    """down_proj(swish(gate_proj(x)) ⊙ up_proj(x)) (parameter names as flash-linear-attention's GatedMLP); the
    product is one pass in float32 (:func:`leettriton.nn.fused.swiglu`)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class LinearAttentionPreTrainedModel(PreTrainedModel):
    """Base of both models: the cache is a :class:`~leettriton.nn.LinearAttentionCache` the model makes
    itself (transformers' key/value caches do not apply); ``set_attention_method`` switches every layer."""

    base_model_prefix = "model"
    _is_stateful = True
    _supports_cache_class = True
    supports_gradient_checkpointing = False

    def attention_layers(self) -> list[nn.Module]:
        """The model's attention modules (each has ``set_method``)."""
        return [m for m in self.modules() if hasattr(m, "set_method") and hasattr(m, "gamma")]

    def set_attention_method(self, method: str, precision: Optional[str] = None) -> None:
        """Run every attention layer's prefill with ``method`` (any registered name or ``"auto"``).

        Example::

            >>> model.set_attention_method("lightning_attention")
        """
        method = check_method(method)
        for layer in self.attention_layers():
            layer.set_method(method, precision)
        self.config.attention_method = method
        self.config.attention_precision = precision

    def default_use_cache(self, use_cache: Optional[bool], cache) -> bool:
        """``use_cache`` if given; else True when a cache is passed, else ``config.use_cache`` in eval mode and
        False in training mode (a training step keeps no states; pass ``use_cache=True`` or a cache to chain
        pieces of a sequence)."""
        if use_cache is not None:
            return use_cache
        if cache is not None:
            return True
        return bool(self.config.use_cache) and not self.training

    def cache_owner(self) -> tuple:
        """A tag of this model's shape of states: a cache made by another model has another tag."""
        shapes = []
        for layer in self.attention_layers():
            r = getattr(layer, "head_k_dim", None) or (2 * layer.head_dim if getattr(layer, "use_lrpe", False)
                                                       else layer.head_dim)
            d = getattr(layer, "head_v_dim", None) or layer.head_dim
            shapes.append((layer.num_heads, r, d))
        return (self.config.model_type, tuple(shapes))

    def make_cache(self) -> LinearAttentionCache:
        """An empty cache for this model."""
        return LinearAttentionCache(len(self.attention_layers()), owner=self.cache_owner())

    def check_cache(self, cache) -> Optional[LinearAttentionCache]:
        """``cache`` if it can serve this model; an empty transformers cache is replaced by one of ours."""
        if cache is None or isinstance(cache, LinearAttentionCache):
            if cache is not None and cache.owner is not None and cache.owner != self.cache_owner():
                raise ValueError(f"this cache was made by another model ({cache.owner[0]} with states "
                                 f"{cache.owner[1]}); this {self.config.model_type} model needs states "
                                 f"{self.cache_owner()[1]}: use model.make_cache() or no cache")
            return cache
        seen = cache.get_seq_length() if hasattr(cache, "get_seq_length") else None
        if seen == 0:
            return self.make_cache()
        raise TypeError(f"cache must be a leettriton.nn.LinearAttentionCache (from model.make_cache() or a previous "
                        f"output), got {type(cache).__name__}")



def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def _elements_overlap(x: torch.Tensor) -> bool:
    """Whether two elements of ``x`` may share memory: true for a zero stride on a dimension of size > 1 and for
    any layout where a stride, in increasing order, is less than the span of the smaller ones (a sufficient
    test of distinct elements; every layout PyTorch makes without ``as_strided`` passes it)."""
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(x.stride(), x.shape) if sz > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def _memory_span(x: torch.Tensor):
    """(storage, first byte, end byte) of the memory ``x``'s elements lie in, or None when it has none."""
    if x.numel() == 0:
        return None
    extent = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))
    start = x.data_ptr()
    return x.untyped_storage().data_ptr(), start, start + (extent + 1) * x.element_size()


class LinearAttentionGenerationMixin(GenerationMixin):
    """``generate()`` for the causal LMs: no key/value cache, only the tokens the state has not seen are fed."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False   # generate() must not make a key/value cache: the model makes its own

    def prepare_inputs_for_generation(self, input_ids, cache=None, past_key_values=None, attention_mask=None,
                                      inputs_embeds=None, use_cache=True, **generate_kwargs):
        """The tokens the cache has not seen yet (all of them without a cache), the cache and the mask.

        ``generate_kwargs`` are what each transformers release adds to this call (positions, flags); the
        models need none of them.
        """
        cache = cache if cache is not None else past_key_values
        seen = cache.get_seq_length() if isinstance(cache, LinearAttentionCache) else 0
        inputs = {"cache": cache, "attention_mask": attention_mask, "use_cache": use_cache}
        if inputs_embeds is not None and seen == 0:
            inputs.update(input_ids=None, inputs_embeds=inputs_embeds)
        else:
            inputs.update(input_ids=input_ids[:, seen:])
        if "logits_to_keep" in generate_kwargs:
            inputs["logits_to_keep"] = generate_kwargs["logits_to_keep"]
        return inputs

    def _reorder_cache(self, cache, beam_idx):
        cache.reorder_cache(beam_idx)
        return cache

    def decode_token(self, token: torch.Tensor, states, position: torch.Tensor) -> torch.Tensor:
        """The logits ``(batch, vocab)`` of one token per row, ``token`` ``(batch,)``, through per-layer float32
        ``states`` (updated in place) at the position held by the one-element int64 tensor ``position``.

        No host sync and no value-dependent allocation: the step :class:`~leettriton.models.StaticDecoder`
        captures in a CUDA graph.  The same arithmetic as a one-token ``forward`` through a cache.
        """
        return self.lm_head(self.model.decode_token(token, states, position))

    @torch.no_grad()
    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask=None, eos_token_id=None,
                        pad_token_id=None, cuda_graph: Optional[bool] = None) -> torch.Tensor:
        """Greedy decoding on fixed buffers, on CUDA replayed from a CUDA graph per token: the tokens of
        ``generate(input_ids, do_sample=False, ...)``, without its per-token Python and launches.

        ``input_ids`` ``(batch, n)``; ``attention_mask`` marks left padding; without ``eos_token_id`` exactly
        ``max_new_tokens`` are generated (as ``generate`` with ``min_new_tokens=max_new_tokens``).  The model
        keeps one :class:`~leettriton.models.StaticDecoder` per batch size, device and dtype, reused while the
        parameters stay where they are and the length fits (a longer request captures a new one).  Returns
        ``(batch, n + generated)``.

        Example::

            >>> tokens = model.generate_greedy(input_ids, max_new_tokens=128)     # CUDA graph on CUDA
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (batch, n) tensor of token ids, got "
                             f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else input_ids!r}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        param = next(self.parameters())
        key = (input_ids.shape[0], param.device, param.dtype, cuda_graph)
        decoders = self.__dict__.setdefault("_static_decoders", DecoderCache())
        decoder = decoders.get(key)
        needed = input_ids.shape[1] + max_new_tokens
        if decoder is None or decoder.max_length < needed or not decoder.fits(self):
            length = max(needed, 2 * decoder.max_length if decoder is not None else 0, 1024)
            decoders.pop(key, None)   # its graph's memory goes before the new one is captured
            decoder = decoders[key] = StaticDecoder(self, input_ids.shape[0], length, cuda_graph=cuda_graph)
        return decoder.generate(input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id)

    # ------------------------------------------------------------------ serving (docs/design.md §13.5)

    def make_state_pools(self, slots: int, device=None) -> list[torch.Tensor]:
        """One zeroed float32 state pool ``(slots, heads, r, d)`` per attention layer, on ``device`` (default: the
        model's), for :meth:`prefill_packed` and :meth:`decode_slotted`.

        Example::

            >>> pools = model.make_state_pools(64)
        """
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        device = self.device if device is None else torch.device(device)
        return [torch.zeros((slots,) + shape, dtype=torch.float32, device=device)
                for shape in self.cache_owner()[1]]

    def _check_serving_inputs(self, input_ids, positions, state_pools):
        """input_ids, positions and the pools of a serving call, checked before any work: ``(input_ids,
        positions)``, positions made contiguous (None stays None: only RetNet's rotary and LRPE read them)."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.is_floating_point() \
                or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be a 1-D integer tensor (the packed tokens), got "
                             f"{_describe(input_ids)}")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids must be on the model's device {self.device}, got {input_ids.device}")
        if positions is not None:
            positions = check_positions(positions, input_ids.shape[0], input_ids.device,
                                        "each token's position in its sequence, the shape of input_ids")
        self._check_state_pools(state_pools)
        return input_ids, positions

    def _check_state_pools(self, state_pools) -> None:
        """One float32 pool ``(slots, heads, r, d)`` per layer on the model's device, the same slot count in each,
        and no two elements of the pools in one place: a pool whose elements overlap (an ``expand``-ed tensor)
        or two layers' pools sharing memory would let one state's update overwrite another's.  Checked for
        every pool before any layer runs, so a bad pool of a later layer leaves the earlier layers' untouched."""
        shapes = self.cache_owner()[1]
        if not isinstance(state_pools, (list, tuple)) or len(state_pools) != len(shapes):
            size = len(state_pools) if hasattr(state_pools, "__len__") else "?"
            raise ValueError(f"state_pools must be a list of {len(shapes)} pools, one per layer "
                             f"(model.make_state_pools), got {type(state_pools).__name__} of length {size}")
        slots = None
        spans = []
        for i, (pool, shape) in enumerate(zip(state_pools, shapes)):
            name = f"state_pools[{i}]"
            if not isinstance(pool, torch.Tensor) or pool.dtype != torch.float32:
                raise TypeError(f"{name} must be a float32 tensor (slots, heads, r, d) = (slots,) + {shape}, got "
                                f"{_describe(pool)}")
            if pool.dim() != 4 or tuple(pool.shape[1:]) != tuple(shape):
                raise ValueError(f"{name} must have shape (slots, heads, r, d) = (slots,) + {shape} (layer {i}'s "
                                 f"states), got shape {tuple(pool.shape)}")
            if pool.device != self.device:
                raise ValueError(f"{name} must be on the model's device {self.device}, got {pool.device}")
            if slots is not None and pool.shape[0] != slots:
                raise ValueError(f"state_pools must all have the same number of slots (one slot id names a slot "
                                 f"of every layer), got {slots} in state_pools[0] and {pool.shape[0]} in {name}")
            slots = pool.shape[0]
            if _elements_overlap(pool):
                raise ValueError(f"{name} must not have elements that share memory (it is written in place; an "
                                 f"expanded or self-overlapping view would let one slot's update change others), "
                                 f"got strides {tuple(pool.stride())} for shape {tuple(pool.shape)}: pass a "
                                 f"contiguous pool (model.make_state_pools)")
            span = None if is_compiling() else _memory_span(pool)   # addresses are not traced (§4.6)
            if span is not None:
                spans.append(span + (i,))
        spans.sort()   # by storage, then first byte: an overlap is between neighbours
        for (storage, _, end, i), (next_storage, next_start, _, j) in zip(spans, spans[1:]):
            if storage == next_storage and next_start < end:
                raise ValueError(f"state_pools[{min(i, j)}] and state_pools[{max(i, j)}] share memory: each layer "
                                 f"needs a pool of its own (model.make_state_pools), or one layer's states would "
                                 f"overwrite another's")

    def _check_token_values(self, input_ids: torch.Tensor, check) -> None:
        """Token ids in [0, vocab): an id outside would index the embedding out of bounds (on CUDA a device-side
        assert that ends the process's CUDA context).  One device sync on CUDA, skipped with ``check`` False (the
        caller's ``check_indices`` / ``check_slots``, as the index checks of docs/design.md §13.3) and while a CUDA
        graph is being captured or ``torch.compile`` traces (no check reads tensor values there: §4.6)."""
        if check is not True or input_ids.numel() == 0 or is_compiling() or (
                input_ids.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return
        vocab = self.get_input_embeddings().num_embeddings
        low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()   # the one sync
        if low < 0 or high >= vocab:
            raise ValueError(f"input_ids must be token ids in [0, vocab_size={vocab}), got "
                             f"{low if low < 0 else high}")

    def _check_packed_methods(self, method: Optional[str]) -> None:
        """Every layer's packed prefill method (``method``, or the layer's own) has a packed path, checked before
        the first layer writes its pool."""
        for layer in self.attention_layers():
            name = registry.canonical_method(layer.method if method is None else method)
            if name not in ("auto",) + VARLEN_NATIVE and registry.torch_method(name) is None:
                raise NotImplementedError(
                    f"prefill_packed: layer {layer.layer_idx} would run method {name!r}, which has no packed "
                    f"(variable-length) path; pass method= 'auto', {', '.join(repr(m) for m in VARLEN_NATIVE)} or "
                    f"a '<method>_torch' twin")

    def _run_serving(self, input_ids, attend) -> torch.Tensor:
        """Embed packed ``input_ids``, run every block with its attention given by ``attend(layer_index, attn, x)``,
        then the final norm: the hidden states ``(tokens, hidden)``."""
        embed, blocks, final_norm = self.model.decoder_parts()
        hidden = embed(input_ids)
        for i, block in enumerate(blocks):
            hidden = block.forward_with(hidden, lambda attn, x, i=i: attend(i, attn, x))
        return final_norm(hidden)

    @torch.no_grad()
    def prefill_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor,
                       state_pools: list, slot_ids: torch.Tensor, has_initial_state: Optional[torch.Tensor] = None, *,
                       method: Optional[str] = None, all_tokens: bool = False,
                       check_indices: bool = True) -> torch.Tensor:
        """The prompts of N requests in one pass: each layer runs one packed
        :func:`leettriton.linear_attention_varlen` call and keeps each sequence's final state in its pool slot.

        Args:
            input_ids: integer ``(T,)``: the prompts one after the other.
            cu_seqlens: int32/int64 ``(N + 1,)`` on the model's device: sequence i is tokens
                [cu_seqlens[i], cu_seqlens[i + 1]).  A zero-length sequence has no last token: its row of the
                result is zeros, and its slot receives its start state, as in
                :func:`leettriton.linear_attention_varlen` (the slot's own state with ``has_initial_state``,
                else zero); no other sequence's logits or slot depend on it.
            positions: integer ``(T,)``: each token's position in its own sequence (0 … for a new prompt; the
                tokens already in the slot's state onwards for a continued one).  Float positions are refused.
            state_pools: one float32 pool ``(slots, heads, r, d)`` per layer (:meth:`make_state_pools`), updated
                in place; each its own memory (an expanded pool, or two layers sharing one, is refused), all with
                the same slot count.
            slot_ids: int32/int64 ``(N,)``: each sequence's slot.
            has_initial_state: bool ``(N,)``: continue sequence i from its slot's state (else start from zero, as
                a new request must); None: all start from zero.
            method: the packed prefill's method (None: each layer's, which must have a packed path).
            all_tokens: return the logits of every token ``(T, vocab)`` instead of each sequence's last.
            check_indices: as in :func:`leettriton.linear_attention_varlen`.

        Returns:
            The logits of each sequence's last token, ``(N, vocab)`` (``(T, vocab)`` with ``all_tokens``).

        Projections, norms and the MLP run on the packed token dimension; no loop over sequences.  Index tensors
        are read through their strides (a strided one is copied once, here, for every layer).  Every argument is
        checked before a pool is written; reading the values of input_ids (each call), cu_seqlens and slot_ids
        (each tensor version) costs a device sync on CUDA unless ``check_indices`` is False (docs/design.md §13.3).
        Inference only (runs under ``torch.no_grad()``).

        Example::

            >>> pools = model.make_state_pools(8)
            >>> ids = torch.tensor([5, 9, 2, 7, 7], device="cuda")            # prompts [5, 9, 2] and [7, 7]
            >>> cu = torch.tensor([0, 3, 5], device="cuda")
            >>> pos = torch.tensor([0, 1, 2, 0, 1], device="cuda")
            >>> logits = model.prefill_packed(ids, cu, pos, pools, torch.tensor([4, 0], device="cuda"))   # (2, vocab)
        """
        input_ids, positions = self._check_serving_inputs(input_ids, positions, state_pools)
        self._check_packed_methods(method)
        self._check_token_values(input_ids, check_indices)
        cu_seqlens, slot_ids, has_initial_state = (contiguous_index(x) for x in (cu_seqlens, slot_ids,
                                                                                   has_initial_state))
        hidden = self._run_serving(input_ids, lambda i, attn, x: attn.prefill_packed(
            x, cu_seqlens, positions, state_pools[i], slot_ids, has_initial_state, method=method,
            check_indices=check_indices))
        if all_tokens:
            return self.lm_head(hidden)
        return self._last_token_logits(hidden, cu_seqlens)

    def _last_token_logits(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The logits of each sequence's last row of ``hidden`` ``(T, hidden)``, zeros for an empty sequence; the
        offsets clamped to [0, T] as the packed kernels read them (unchecked ones give wrong rows, never an
        access out of bounds).  On the device, no sync."""
        T, N = hidden.shape[0], cu_seqlens.shape[0] - 1
        if T == 0:
            return self.lm_head(hidden.new_zeros((N, hidden.shape[1])))
        offsets = cu_seqlens.clamp(0, T)
        empty = offsets[1:] <= offsets[:-1]
        logits = self.lm_head(hidden[(offsets[1:] - 1).clamp_min(0).long()])
        return logits.masked_fill(empty[:, None], 0)

    @torch.no_grad()
    def decode_slotted(self, input_ids: torch.Tensor, positions: torch.Tensor, state_pools: list,
                       slot_ids: torch.Tensor, *, check_slots: bool = True) -> torch.Tensor:
        """One new token for each of B running requests, each layer one slotted :func:`leettriton.decode_step`.

        Args:
            input_ids: integer ``(B,)``: row i's newest token.
            positions: integer ``(B,)``: that token's position in its sequence (the tokens before it).
            state_pools: as in :meth:`prefill_packed`; row i reads and updates ``state_pools[l][slot_ids[i]]``.
            slot_ids: int32/int64 ``(B,)``; a negative id is a padding row (its logits are to be ignored, no state
                is touched), so a caller can keep fixed-size buffers.
            check_slots: as in :func:`leettriton.decode_step`; also whether the token ids are checked to lie in
                [0, vocab) (a device sync on CUDA).

        Returns:
            logits ``(B, vocab)``.  Inference only (runs under ``torch.no_grad()``).

        Example::

            >>> logits = model.decode_slotted(last_tokens, lengths, pools, slots)
        """
        input_ids, positions = self._check_serving_inputs(input_ids, positions, state_pools)
        self._check_token_values(input_ids, check_slots)
        slot_ids = contiguous_index(slot_ids)
        hidden = self._run_serving(input_ids, lambda i, attn, x: attn.decode_slotted(
            x, positions, state_pools[i], slot_ids, check_slots=check_slots))
        return self.lm_head(hidden)

    def causal_lm_forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, cache=None,
                          past_key_values=None, use_cache=None, output_hidden_states=None, return_dict=None,
                          labels=None, logits_to_keep=0):
        """The shared body of both models' ``forward``."""
        if cache is not None and past_key_values is not None:
            raise ValueError("give the cache as cache or as past_key_values, not both")
        cache = cache if cache is not None else past_key_values
        use_cache = self.default_use_cache(use_cache, cache)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                         cache=cache, use_cache=use_cache, output_hidden_states=output_hidden_states)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0 and labels is None:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            shifted = torch.cat((labels[:, 1:], torch.full_like(labels[:, :1], -100)), 1).to(logits.device)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                                               ignore_index=-100)
        new_cache = getattr(out, _CACHE_FIELD)
        if not return_dict:
            return tuple(x for x in (loss, logits, new_cache, out.hidden_states) if x is not None)
        return model_output(CausalLMOutputWithPast, new_cache, loss=loss, logits=logits,
                            hidden_states=out.hidden_states)


def decoder_token(embed, blocks, final_norm, token, states, position):
    """Embeddings → every block's ``decode_token`` (its own state) → final norm, for one token per row."""
    if len(states) != len(blocks):
        raise ValueError(f"states must hold one state per layer ({len(blocks)}), got {len(states)}")
    hidden = embed(token)
    for block, state in zip(blocks, states):
        hidden = block.decode_token(hidden, state, position)
    return final_norm(hidden)


def decoder_forward(model, embed, blocks, final_norm, input_ids, attention_mask, inputs_embeds, cache, use_cache,
                    output_hidden_states):
    """Embeddings → blocks → final norm, with the cache made, checked and threaded through the blocks.

    Every input is checked before any work: ``input_ids`` a (batch, n) integer tensor on the model's device or
    ``inputs_embeds`` (batch, n, hidden_size); ``attention_mask`` (batch, ≥ n) of 0/1 marking left padding only
    (its values read once per call, not again by each layer, one device sync on CUDA, except on a one-token
    step through a cache: :func:`leettriton.nn.functional.check_attention_mask`)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids and inputs_embeds")
    if inputs_embeds is None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex() \
                or input_ids.dtype == torch.bool or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (batch, n) integer tensor of token ids, got {_describe(input_ids)}")
        if input_ids.device != model.device:
            raise ValueError(f"input_ids must be on the model's device {model.device}, got {input_ids.device}")
        batch, n = input_ids.shape
    else:
        check_hidden("inputs_embeds", inputs_embeds, model.config.hidden_size, "(batch, n, hidden_size)")
        batch, n = inputs_embeds.shape[:2]
    cache = model.check_cache(cache)
    if use_cache and cache is None:
        cache = model.make_cache()
    one_token_step = n == 1 and use_cache and cache is not None and cache.has_previous_state(0)
    check_attention_mask(attention_mask, batch, n, model.device, values=not one_token_step)
    hidden = embed(input_ids) if inputs_embeds is None else inputs_embeds
    states = () if output_hidden_states else None
    with checked_mask(attention_mask):   # the layers do not read its values again
        for block in blocks:
            if output_hidden_states:
                states += (hidden,)
            hidden = block(hidden, attention_mask, cache if use_cache else None)
    hidden = final_norm(hidden)
    if output_hidden_states:
        states += (hidden,)
    return model_output(BaseModelOutputWithPast, cache if use_cache else None, last_hidden_state=hidden,
                        hidden_states=states)
