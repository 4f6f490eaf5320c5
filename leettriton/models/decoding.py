"""Greedy decoding on fixed buffers, optionally replayed from one CUDA graph per token (docs/design.md §12.4).

``generate()`` runs each new token through the model's ``forward`` and transformers' generation loop:
dozens of small launches and Python steps per token, whose host time, not the GPU's, sets the speed of a
small batch.  :class:`StaticDecoder` allocates everything once (one float32 state per layer, the token,
its position, the logits), runs the one-token forward of the whole model (``decode_token``: embeddings,
every block's :meth:`~leettriton.nn.MultiScaleRetention.decode_token`, the final norm, the head, the
argmax) on those buffers, and on CUDA captures it in a CUDA graph, so that a token costs one replay.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

__all__ = ["StaticDecoder", "DecoderCache"]


class DecoderCache(dict):
    """A model's :class:`StaticDecoder` per (batch size, device, dtype, graph): copied or pickled empty, since a
    copy of a model has parameters of its own (and a CUDA graph cannot be copied)."""

    def __deepcopy__(self, memo) -> "DecoderCache":
        return DecoderCache()

    def __reduce__(self):
        return DecoderCache, ()


class StaticDecoder:
    """Greedy decoding of a causal LM of :mod:`leettriton.models` on preallocated buffers.

    The prompt is prefilled by the model's ``forward`` (its attention method, its cache); its final states
    are copied into this decoder's state buffers, and each further token runs the model's
    ``decode_token`` on them: states updated in place by :func:`leettriton.decode_step`, the position a
    device tensor incremented on the device, no host sync, no allocation that depends on values.  With
    ``cuda_graph`` that step is captured once in a CUDA graph and replayed per token.  The tokens are those
    of ``model.generate(..., do_sample=False)`` (greedy), the logits those of the model's one-token forward
    through a cache (tests/test_models.py).

    The buffers and the graph point at the model's parameters as they are when the decoder is built: a
    change of the parameters' values in place is seen, a change of their storage (``model.to(...)``,
    assigning new tensors) is refused by :meth:`prefill` with a ``RuntimeError``; build a new decoder then.

    Args:
        model: a ``RetNetForCausalLM`` or ``TransNormerForCausalLM`` (any device and dtype).
        batch_size: the rows decoded together (every prompt given to this decoder has this many).
        max_length: the most tokens a row will hold, prompt and generated tokens together.
        cuda_graph: capture the one-token step in a CUDA graph (default: when the model is on CUDA; an error
            on another device).

    Example::

        >>> decoder = StaticDecoder(model, batch_size=1, max_length=4096)     # captures on CUDA
        >>> tokens = decoder.generate(input_ids, max_new_tokens=128)           # (1, n + 128)
        >>> logits = decoder.prefill(input_ids)                                # or step by step:
        >>> logits = decoder.step(logits.argmax(-1))                           # (batch, vocab), a buffer
    """

    def __init__(self, model, batch_size: int, max_length: int, *, cuda_graph: Optional[bool] = None) -> None:
        if not hasattr(model, "decode_token") or not hasattr(model, "cache_owner"):
            raise TypeError(f"model must be a causal LM of leettriton.models, got {type(model).__name__}")
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        param = next(model.parameters())
        device = param.device
        if cuda_graph is None:
            cuda_graph = device.type == "cuda"
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs the model on a CUDA device, it is on {device}")
        self.model = model
        self.batch_size, self.max_length, self.device = batch_size, max_length, device
        self.cuda_graph = bool(cuda_graph)
        self.states = [torch.zeros(batch_size, heads, r, d, dtype=torch.float32, device=device)
                       for heads, r, d in model.cache_owner()[1]]
        self.token = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.parameters = _storage(model)
        self.logits: Optional[torch.Tensor] = None
        self.next_token: Optional[torch.Tensor] = None
        self.graph = None
        self.length = 0   # tokens in the states (host copy of the position)
        if self.cuda_graph:
            self._capture()

    def fits(self, model) -> bool:
        """Whether this decoder still serves ``model`` (the same model, its parameters where they were)."""
        return model is self.model and _storage(model) == self.parameters

    def _forward(self) -> None:
        """The one-token step on the buffers: logits, their argmax, and the position moved on."""
        self.logits = self.model.decode_token(self.token, self.states, self.position)
        self.next_token = self.logits.argmax(-1)
        self.position.add_(1)

    @torch.no_grad()
    def _capture(self) -> None:
        # the first calls compile the kernels, check decode_step's inputs and gamma (one sync each) and
        # set up cuBLAS: run them on a side stream before capturing, as CUDA graphs require
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._forward()
        for state in self.states:   # the warm-up's values: prefill replaces them
            state.zero_()
        self.position.zero_()

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Run the prompt ``input_ids`` ``(batch_size, n)`` (left padding marked by ``attention_mask``, as in
        ``generate()``) through the model and load its states; returns the last position's logits
        ``(batch_size, vocab)``."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != self.batch_size:
            raise ValueError(f"input_ids must be a (batch_size={self.batch_size}, n) tensor of token ids, got "
                             f"{_describe(input_ids)}")
        n = input_ids.shape[1]
        if not 1 <= n < self.max_length:
            raise ValueError(f"the prompt has {n} tokens; this decoder holds 1 to max_length - 1 = "
                             f"{self.max_length - 1} before the first generated token")
        if not self.fits(self.model):
            raise RuntimeError("the model's parameters moved since this decoder was built (model.to(...) or new "
                               "tensors): build a new StaticDecoder")
        cache = self.model.make_cache()
        if isinstance(attention_mask, torch.Tensor):
            attention_mask = attention_mask.to(self.device)   # as input_ids
        out = self.model(input_ids.to(self.device), attention_mask=attention_mask, cache=cache, use_cache=True,
                         logits_to_keep=1)
        for i, state in enumerate(self.states):
            state.copy_(cache.get_state(i))
        self.position.fill_(n)
        self.length = n
        return out.logits[:, -1]

    @torch.no_grad()
    def step(self, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Feed one token per row (``tokens`` ``(batch_size,)``; None: the previous step's argmax) and return the
        logits ``(batch_size, vocab)``: a buffer that the next step overwrites (clone it to keep it)."""
        if self.length == 0:
            raise RuntimeError("prefill a prompt before stepping")
        if self.length >= self.max_length:
            raise ValueError(f"this decoder holds max_length={self.max_length} tokens per row; build one with a "
                             f"larger max_length")
        if tokens is not None:
            self.token.copy_(tokens.reshape(self.batch_size))
        elif self.next_token is not None:
            self.token.copy_(self.next_token)
        else:
            raise ValueError("the first step needs its tokens (the prefill's argmax)")
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()
        self.length += 1
        return self.logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: Optional[torch.Tensor] = None,
                 eos_token_id: Union[int, Sequence[int], None] = None,
                 pad_token_id: Optional[int] = None) -> torch.Tensor:
        """Greedy decoding: ``input_ids`` ``(batch_size, n)`` followed by ``max_new_tokens`` tokens.

        With ``eos_token_id`` (an id or a list of ids), a row that has produced one continues with
        ``pad_token_id`` (default: the first EOS id) and the output ends at the step where every row has
        finished, as ``generate()`` does; the finished rows are tracked on the device and read once, at
        the end.  Returns ``(batch_size, n + generated)`` int64 tokens.
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        n = input_ids.shape[1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else 0
        if n + max_new_tokens > self.max_length:
            raise ValueError(f"{n} prompt tokens + max_new_tokens={max_new_tokens} exceed this decoder's "
                             f"max_length={self.max_length}")
        next_token = self.prefill(input_ids, attention_mask).argmax(-1)
        out = torch.empty(self.batch_size, max_new_tokens, dtype=torch.long, device=self.device)
        eos = None
        if eos_token_id is not None:
            ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
            eos = torch.tensor(ids, dtype=torch.long, device=self.device)
            pad = torch.tensor(ids[0] if pad_token_id is None else pad_token_id, dtype=torch.long,
                               device=self.device)
            finished = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
            all_finished = torch.zeros(max_new_tokens, dtype=torch.bool, device=self.device)
        for i in range(max_new_tokens):
            if eos is not None:
                next_token = torch.where(finished, pad, next_token)
                finished |= torch.isin(next_token, eos)
                all_finished[i] = finished.all()
            out[:, i] = next_token
            if i + 1 < max_new_tokens:
                self.step(next_token)
                next_token = self.next_token
        if eos is not None:   # the one read of the device: where generation would have stopped
            done = all_finished.nonzero()
            if len(done):
                out = out[:, :int(done[0]) + 1]
        return torch.cat((input_ids.to(self.device), out), 1)


def _storage(model) -> tuple:
    return tuple(p.data_ptr() for p in model.parameters())


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
