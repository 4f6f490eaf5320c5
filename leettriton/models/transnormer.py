"""TransNormerLLM as a transformers causal LM on leettriton's kernels (docs/design.md §12.3).

Field and parameter names follow the published TransNormerLLM model (``decoder_embed_dim``,
``decoder_layers``, ``decoder_attention_heads``; ``model.layers.N.token_mixer.qkvu_proj``, ...), with the
common names ``hidden_size``, ``num_heads`` and ``num_hidden_layers`` as aliases.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from ..nn import NormLinearAttention
from ..nn.lightning import Lrpe, norm_layer
from .common import (LinearAttentionGenerationMixin, LinearAttentionPreTrainedModel, PreTrainedConfig,
                     decoder_forward, decoder_token)

__all__ = ["TransNormerConfig", "TransNormerModel", "TransNormerForCausalLM"]


class TransNormerConfig(PreTrainedConfig):
    """TransNormerLLM's configuration.

    Fields: ``decoder_embed_dim`` (alias ``hidden_size``), ``decoder_attention_heads`` (alias ``num_heads``),
    ``decoder_layers`` (alias ``num_hidden_layers``), ``vocab_size``, ``hidden_dim`` (attention width; r = d =
    hidden_dim / heads), ``glu_dim`` (the simple GLU's width), ``linear_act_fun`` (activation of q and k),
    ``norm_type`` (``"simplermsnorm"``), ``linear_use_lrpe_list`` (per layer, 1 = LRPE on q and k),
    ``no_scale_embedding`` (else embeddings × √decoder_embed_dim), ``bias``, ``init_std``; and leettriton's
    ``attention_method`` / ``attention_precision``.

    Example (TransNormerLLM-7B's attention: 32 heads, r = d = 128)::

        >>> config = TransNormerConfig(hidden_size=4096, num_heads=32, num_hidden_layers=30, vocab_size=64000)
    """

    model_type = "transnormer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {"hidden_size": "decoder_embed_dim", "num_heads": "decoder_attention_heads",
                     "num_attention_heads": "decoder_attention_heads", "num_hidden_layers": "decoder_layers"}

    def __init__(self, pad_token_id: int = 0, bos_token_id: int = 1, eos_token_id: int = 2, vocab_size: int = 64000,
                 use_cache: bool = True, init_std: float = 0.02, decoder_embed_dim: int = 1024,
                 decoder_layers: int = 24, decoder_attention_heads: int = 8, no_scale_embedding: bool = False,
                 add_bos_token: bool = False, norm_type: str = "simplermsnorm",
                 linear_use_lrpe_list: Optional[Sequence[int]] = None, hidden_dim: Optional[int] = None,
                 linear_act_fun: str = "silu", glu_dim: int = 2816, bias: bool = False,
                 hidden_size: Optional[int] = None, num_heads: Optional[int] = None,
                 num_hidden_layers: Optional[int] = None, attention_method: str = "auto",
                 attention_precision: Optional[str] = None, tie_word_embeddings: bool = False, **kwargs) -> None:
        kwargs.pop("num_attention_heads", None)
        self.vocab_size = vocab_size
        self.use_cache = use_cache
        self.init_std = init_std
        self.decoder_embed_dim = decoder_embed_dim if hidden_size is None else hidden_size
        self.decoder_layers = decoder_layers if num_hidden_layers is None else num_hidden_layers
        self.decoder_attention_heads = decoder_attention_heads if num_heads is None else num_heads
        self.no_scale_embedding = no_scale_embedding
        self.add_bos_token = add_bos_token
        self.norm_type = norm_type
        self.linear_use_lrpe_list = list(linear_use_lrpe_list or [])
        self.hidden_dim = self.decoder_embed_dim if hidden_dim is None else hidden_dim
        self.linear_act_fun = linear_act_fun
        self.glu_dim = glu_dim
        self.bias = bias
        self.attention_method = attention_method
        self.attention_precision = attention_precision
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


class SimpleGLU(nn.Module):
    """l3(l1(x) ⊙ l2(x)): TransNormerLLM's GLU, without an activation."""

    def __init__(self, dim: int, glu_dim: int, bias: bool) -> None:
        super().__init__()
        self.l1 = nn.Linear(dim, glu_dim, bias=bias)
        self.l2 = nn.Linear(dim, glu_dim, bias=bias)
        self.l3 = nn.Linear(glu_dim, dim, bias=bias)

    def forward(self, x):
        return self.l3(self.l1(x) * self.l2(x))


class TransNormerBlock(nn.Module):
    """token_norm → NormLinearAttention → residual, channel_norm → simple GLU → residual."""

    def __init__(self, config: TransNormerConfig, layer_idx: int) -> None:
        super().__init__()
        dim = config.decoder_embed_dim
        lrpe = config.linear_use_lrpe_list
        self.token_norm = norm_layer(config.norm_type, dim)
        self.token_mixer = NormLinearAttention(
            dim, config.decoder_attention_heads, config.hidden_dim, layer_idx=layer_idx,
            num_layers=config.decoder_layers, act=config.linear_act_fun, norm_type=config.norm_type,
            use_lrpe=bool(lrpe[layer_idx]) if layer_idx < len(lrpe) else False, bias=config.bias,
            method=config.attention_method, precision=config.attention_precision)
        self.channel_norm = norm_layer(config.norm_type, dim)
        glu_dim = dim if config.glu_dim == -1 else config.glu_dim
        self.channel_mixer = SimpleGLU(dim, glu_dim, config.bias)

    def forward(self, hidden, attention_mask, cache):
        hidden = hidden + self.token_mixer(self.token_norm(hidden), attention_mask, cache)
        return hidden + self.channel_mixer(self.channel_norm(hidden))

    def decode_token(self, hidden, state, position):
        """One token ``(batch, hidden_size)`` through a state held by the caller (no host sync)."""
        hidden = hidden + self.token_mixer.decode_token(self.token_norm(hidden), state, position)
        return hidden + self.channel_mixer(self.channel_norm(hidden))

    def forward_with(self, hidden, attend):
        """The block with its attention call given: ``attend(self.token_mixer, normed_hidden)`` (serving paths)."""
        hidden = hidden + attend(self.token_mixer, self.token_norm(hidden))
        return hidden + self.channel_mixer(self.channel_norm(hidden))


class TransNormerPreTrainedModel(LinearAttentionPreTrainedModel):
    config_class = TransNormerConfig
    _no_split_modules = ["TransNormerBlock"]

    def _init_weights(self, module):
        if isinstance(module, Lrpe):   # not a Linear or a norm: its own initial frequencies
            H, _, D = module.theta.shape
            with torch.no_grad():
                module.theta.copy_((10000 ** (-2 / (H * D) * torch.arange(H * D, dtype=torch.float32)))
                                   .reshape(H, 1, D))
            return
        super()._init_weights(module)


class TransNormerModel(TransNormerPreTrainedModel):
    """Scaled embeddings, the TransNormer blocks and the final norm (``model.*`` of the causal LM)."""

    def __init__(self, config: TransNormerConfig) -> None:
        super().__init__(config)
        if config.decoder_layers > 1 and len(config.linear_use_lrpe_list) not in (0, config.decoder_layers):
            raise ValueError(f"linear_use_lrpe_list must have one entry per layer ({config.decoder_layers}), got "
                             f"{len(config.linear_use_lrpe_list)}")
        dim = config.decoder_embed_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, dim, config.pad_token_id)
        self.layers = nn.ModuleList(TransNormerBlock(config, i) for i in range(config.decoder_layers))
        self.final_norm = norm_layer(config.norm_type, dim)
        self.embed_scale = 1.0 if config.no_scale_embedding else math.sqrt(dim)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def embed(self, input_ids):
        return self.embed_scale * self.embed_tokens(input_ids)

    def decoder_parts(self):
        """(embed, blocks, final norm): what the serving paths run around the attention (docs/design.md §13.5)."""
        return self.embed, self.layers, self.final_norm

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, cache=None, use_cache=None,
                output_hidden_states=None, past_key_values=None, return_dict=None):
        cache = cache if cache is not None else past_key_values
        use_cache = self.default_use_cache(use_cache, cache)
        return decoder_forward(self, self.embed, self.layers, self.final_norm, input_ids, attention_mask,
                               inputs_embeds, cache, use_cache,
                               output_hidden_states)

    def decode_token(self, token, states, position):
        """The final hidden state ``(batch, hidden_size)`` of one token per row (:func:`decoder_token`)."""
        return decoder_token(self.embed, self.layers, self.final_norm, token, states, position)


class TransNormerForCausalLM(TransNormerPreTrainedModel, LinearAttentionGenerationMixin):
    """TransNormerLLM with its language-model head, for ``generate()``.

    Args:
        config: a :class:`TransNormerConfig`.
        method: overrides ``config.attention_method``.
    """

    def __init__(self, config: TransNormerConfig, method: Optional[str] = None) -> None:
        if method is not None:
            config.attention_method = method
        super().__init__(config)
        self.model = TransNormerModel(config)
        self.lm_head = nn.Linear(config.decoder_embed_dim, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, cache=None, past_key_values=None,
                use_cache=None, output_hidden_states=None, return_dict=None, labels=None, logits_to_keep=0, **unused):
        """As :meth:`RetNetForCausalLM.forward`."""
        return self.causal_lm_forward(input_ids, attention_mask, inputs_embeds, cache, past_key_values, use_cache,
                                      output_hidden_states, return_dict, labels, logits_to_keep)
