"""RetNet as a transformers causal LM on leettriton's kernels, loading flash-linear-attention's checkpoints.

The configuration fields and the parameter names are those of flash-linear-attention's
``RetNetConfig`` / ``RetNetForCausalLM`` (an interface: a checkpoint saved by fla loads with
``strict`` names); the modules are leettriton's own (docs/design.md §12.3).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..nn import MultiScaleRetention
from .common import (GatedMLP, LinearAttentionGenerationMixin, LinearAttentionPreTrainedModel, PreTrainedConfig, RMSNorm,
                     decoder_forward, decoder_token)

__all__ = ["RetNetConfig", "RetNetModel", "RetNetForCausalLM"]


class RetNetConfig(PreTrainedConfig):
    """RetNet's configuration, with flash-linear-attention's field names and defaults.

    Key fields: ``hidden_size``, ``num_heads``, ``num_kv_heads``, ``num_hidden_layers``, ``vocab_size``,
    ``expand_k`` / ``expand_v`` (key width H·r = hidden_size·expand_k, value width H·d =
    hidden_size·expand_v), ``hidden_ratio`` / ``intermediate_size`` (the MLP), ``norm_eps``.
    leettriton's own: ``attention_method`` (any registered method or ``"auto"``) and
    ``attention_precision`` (float32 inputs: ``"ieee"`` or ``"tf32"``).  Fields of fla that name features
    these models do not have (short convolutions, hybrid softmax-attention layers, attention residuals)
    are kept so that fla's config files load, and must hold their "off" values.

    Example (RetNet-1.3B's attention: r = 256, d = 512)::

        >>> config = RetNetConfig(hidden_size=2048, num_heads=8, num_hidden_layers=24, vocab_size=32000)
    """

    model_type = "retnet"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(self, attn_mode: str = "chunk", hidden_size: int = 2048, expand_k: float = 1.0,
                 expand_v: float = 2.0, hidden_ratio: Optional[int] = 2, intermediate_size: Optional[int] = None,
                 num_hidden_layers: int = 24, num_heads: int = 8, num_kv_heads: Optional[int] = None,
                 feature_map: Optional[str] = None, hidden_act: str = "swish", use_short_conv: bool = False,
                 conv_size: int = 4, use_output_gate: bool = True, max_position_embeddings: int = 2048,
                 elementwise_affine: Optional[bool] = True, norm_eps: float = 1e-6, attn: Optional[dict] = None,
                 use_cache: bool = True, pad_token_id: Optional[int] = None, bos_token_id: int = 1,
                 eos_token_id: int = 2, tie_word_embeddings: bool = False, initializer_range: float = 0.02,
                 fuse_norm: bool = True, fuse_swiglu: bool = True, fuse_cross_entropy: bool = True,
                 fuse_linear_cross_entropy: bool = False, use_l2warp: bool = False, vocab_size: int = 32000,
                 attnres_block_size: Optional[int] = None, attention_method: str = "auto",
                 attention_precision: Optional[str] = None, **kwargs) -> None:
        self.attn_mode = attn_mode
        self.hidden_size = hidden_size
        self.expand_k, self.expand_v = expand_k, expand_v
        self.hidden_ratio, self.intermediate_size = hidden_ratio, intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.feature_map = feature_map
        self.hidden_act = hidden_act
        self.use_short_conv, self.conv_size = use_short_conv, conv_size
        self.use_output_gate = use_output_gate
        self.max_position_embeddings = max_position_embeddings
        self.elementwise_affine = elementwise_affine
        self.norm_eps = norm_eps
        self.attn = attn
        self.use_cache = use_cache
        self.initializer_range = initializer_range
        self.fuse_norm, self.fuse_swiglu = fuse_norm, fuse_swiglu
        self.fuse_cross_entropy, self.fuse_linear_cross_entropy = fuse_cross_entropy, fuse_linear_cross_entropy
        self.use_l2warp = use_l2warp
        self.vocab_size = vocab_size
        self.attnres_block_size = attnres_block_size
        self.attention_method = attention_method
        self.attention_precision = attention_precision
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


def _check_supported(config: RetNetConfig) -> None:
    unsupported = {"use_short_conv": (config.use_short_conv, False), "attn": (config.attn, None),
                   "attnres_block_size": (config.attnres_block_size, None), "hidden_act": (config.hidden_act, "swish")}
    for field, (value, off) in unsupported.items():
        if value != off:
            raise NotImplementedError(f"RetNetConfig.{field} = {value!r} is not supported by leettriton's RetNet "
                                      f"(supported: {off!r})")


def intermediate_size(config: RetNetConfig) -> int:
    """The MLP width: ``intermediate_size``, else 2/3 · hidden_ratio · hidden_size rounded up to 256 (fla's rule)."""
    if config.intermediate_size is not None:
        return config.intermediate_size
    ratio = 4 if config.hidden_ratio is None else config.hidden_ratio
    size = int(config.hidden_size * ratio * 2 / 3)
    return 256 * ((size + 255) // 256)


class RetNetBlock(nn.Module):
    """attn_norm → retention → residual, mlp_norm → gated MLP → residual."""

    def __init__(self, config: RetNetConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = MultiScaleRetention(
            config.hidden_size, config.num_heads, config.num_kv_heads, expand_k=config.expand_k,
            expand_v=config.expand_v, use_output_gate=config.use_output_gate, gate_fn=config.hidden_act,
            elementwise_affine=config.elementwise_affine, norm_eps=config.norm_eps, fuse_norm=config.fuse_norm,
            feature_map=config.feature_map, layer_idx=layer_idx, method=config.attention_method,
            precision=config.attention_precision)
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, intermediate_size(config))

    def forward(self, hidden, attention_mask, cache):
        hidden = hidden + self.attn(self.attn_norm(hidden), attention_mask, cache)
        return hidden + self.mlp(self.mlp_norm(hidden))

    def decode_token(self, hidden, state, position):
        """One token ``(batch, hidden_size)`` through a state held by the caller (no host sync)."""
        hidden = hidden + self.attn.decode_token(self.attn_norm(hidden), state, position)
        return hidden + self.mlp(self.mlp_norm(hidden))

    def forward_with(self, hidden, attend):
        """The block with its attention call given: ``attend(self.attn, normed_hidden)`` (the serving paths)."""
        hidden = hidden + attend(self.attn, self.attn_norm(hidden))
        return hidden + self.mlp(self.mlp_norm(hidden))


class RetNetPreTrainedModel(LinearAttentionPreTrainedModel):
    config_class = RetNetConfig
    _no_split_modules = ["RetNetBlock"]


class RetNetModel(RetNetPreTrainedModel):
    """Embeddings, the RetNet blocks and the final norm (``model.*`` of the causal LM)."""

    def __init__(self, config: RetNetConfig) -> None:
        super().__init__(config)
        _check_supported(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(RetNetBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def decoder_parts(self):
        """(embed, blocks, final norm): what the serving paths run around the attention (docs/design.md §13.5)."""
        return self.embeddings, self.layers, self.norm

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, cache=None, use_cache=None,
                output_hidden_states=None, past_key_values=None, return_dict=None):
        cache = cache if cache is not None else past_key_values
        use_cache = self.default_use_cache(use_cache, cache)
        return decoder_forward(self, self.embeddings, self.layers, self.norm, input_ids, attention_mask,
                               inputs_embeds, cache, use_cache,
                               output_hidden_states)

    def decode_token(self, token, states, position):
        """The final hidden state ``(batch, hidden_size)`` of one token per row (:func:`decoder_token`)."""
        return decoder_token(self.embeddings, self.layers, self.norm, token, states, position)


class RetNetForCausalLM(RetNetPreTrainedModel, LinearAttentionGenerationMixin):
    """RetNet with its language-model head, for ``generate()``; loads flash-linear-attention checkpoints.

    Args:
        config: a :class:`RetNetConfig`.
        method: overrides ``config.attention_method`` (so ``from_pretrained(path, method=...)`` works).

    Example::

        >>> model = RetNetForCausalLM.from_pretrained("path/to/fla-retnet", method="auto").cuda().half()
        >>> out = model.generate(input_ids, max_new_tokens=32, do_sample=False)
        >>> model.set_attention_method("lightning_attention")
    """

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: RetNetConfig, method: Optional[str] = None) -> None:
        if method is not None:
            config.attention_method = method
        super().__init__(config)
        self.model = RetNetModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, cache=None, past_key_values=None,
                use_cache=None, output_hidden_states=None, return_dict=None, labels=None, logits_to_keep=0, **unused):
        """``input_ids`` ``(batch, n)`` → ``logits`` ``(batch, n, vocab)`` and the cache (``use_cache``).

        ``unused`` takes what ``generate()`` of some transformers releases adds (positions, ``output_attentions``);
        the model needs none of it.
        """
        return self.causal_lm_forward(input_ids, attention_mask, inputs_embeds, cache, past_key_values, use_cache,
                                      output_hidden_states, return_dict, labels, logits_to_keep)
