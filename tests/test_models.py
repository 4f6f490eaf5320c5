"""RetNetForCausalLM and TransNormerForCausalLM: methods against the float64 oracle path, the cache in
``generate()``, save/load, and bad inputs.  Tiny configurations (r = 8, d = 16 and r = d = 16)."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import leettriton  # noqa: E402
from leettriton.methods import BUILTIN_METHODS  # noqa: E402
from leettriton.models import (RetNetConfig, RetNetForCausalLM, TransNormerConfig,  # noqa: E402
                               TransNormerForCausalLM)
from leettriton.nn import LinearAttentionCache  # noqa: E402
from leettriton.reference import tolerance  # noqa: E402

from helpers import assert_close  # noqa: E402

METHODS = ["auto"] + list(BUILTIN_METHODS) + [f"{m}_torch" for m in BUILTIN_METHODS]
VOCAB = 64


def retnet(method="auto", **kw):
    torch.manual_seed(0)
    config = RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, num_hidden_layers=2,
                          vocab_size=VOCAB, intermediate_size=48, initializer_range=0.2, attention_method=method, **kw)
    return _randomise_norms(RetNetForCausalLM(config).eval())


def transnormer(method="auto", **kw):
    torch.manual_seed(0)
    config = TransNormerConfig(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=VOCAB, glu_dim=48,
                               linear_use_lrpe_list=[1, 0], init_std=0.2, attention_method=method, **kw)
    return TransNormerForCausalLM(config).eval()


def _randomise_norms(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


MODELS = {"retnet": retnet, "transnormer": transnormer}


def _ids(B=2, n=10, seed=1):
    return torch.randint(0, VOCAB, (B, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def oracle():
    """A user method that runs the float64 oracle (its output is rounded to the inputs' float32)."""
    def oracle64(b, c, v, gamma, *, initial_state=None, return_state=False):
        out = leettriton.reference(b, c, v, gamma, initial_state=initial_state, return_state=return_state)
        return (out[0], out[1].float()) if return_state else out

    leettriton.register_method("oracle64", oracle64)
    yield "oracle64"
    leettriton.unregister_method("oracle64")


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_method_gives_the_oracle_logits_and_decodes_like_a_prefill(kind, oracle):
    """Per method: logits of a prompt = the oracle path's; prefill + a decode step = one prefill."""
    model = MODELS[kind](oracle)
    ids = _ids(n=9)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        for method in METHODS:
            model.set_attention_method(method)
            assert_close(model(ids, use_cache=False).logits, want, tolerance(torch.float32), f"{kind} {method}")
            out = model(ids[:, :8], use_cache=True)
            step = model(ids[:, 8:], cache=out.past_key_values).logits
            assert_close(torch.cat([out.logits, step], 1), want, tolerance(torch.float32),
                         f"{kind} {method} prefill + decode")


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_chunked_prefill_equals_one_prefill(kind):
    model = MODELS[kind]()
    ids = _ids(n=14)
    cache = model.make_cache()
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        got = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in ((0, 5), (5, 6), (6, 13), (13, 14))], 1)
    assert_close(got, want, tolerance(torch.float32), kind)
    assert cache.get_seq_length() == 14 and len(cache) == 2


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_generate_with_cache_equals_without_and_across_methods(kind):
    model = MODELS[kind]()
    ids = _ids(n=8)
    greedy = dict(attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, use_cache=False, **greedy)
        for method in ("auto", "causal_dot_product", "block_based_torch"):
            model.set_attention_method(method)
            assert torch.equal(model.generate(ids, use_cache=True, **greedy), want), method
        beams = dict(greedy, num_beams=2)
        assert torch.equal(model.generate(ids, use_cache=True, **beams), model.generate(ids, use_cache=False, **beams))


def test_batch_of_left_padded_prompts_generates_each_prompt_alone():
    model = retnet()
    short, long = _ids(B=1, n=5, seed=2), _ids(B=1, n=9, seed=3)
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(batch)
    mask[0, :4] = 0
    greedy = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, **greedy)
        alone = [model.generate(x, attention_mask=torch.ones_like(x), **greedy) for x in (short, long)]
    assert torch.equal(both[0, 9:], alone[0][0, 5:]) and torch.equal(both[1], alone[1][0])


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_save_and_load_round_trip(kind, tmp_path):
    model = MODELS[kind]("lightning_attention")
    model.save_pretrained(tmp_path)
    cls = type(model)
    loaded, info = cls.from_pretrained(tmp_path, method="causal_dot_product", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.attention_method == "causal_dot_product"
    assert all(layer.method == "causal_dot_product" for layer in loaded.attention_layers())
    ids = _ids()
    with torch.no_grad():
        assert_close(loaded.eval()(ids).logits, model(ids).logits, tolerance(torch.float32), kind)


def _train(model, ids, steps):
    """``steps`` AdamW steps on the language-model loss of ``ids``: the losses, and the first step's gradients."""
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, first = [], None
    for _ in range(steps):
        out = model(ids, labels=ids)
        assert out.past_key_values is None                  # training mode keeps no cache unless asked
        optimiser.zero_grad(set_to_none=True)
        out.loss.backward()
        if first is None:
            first = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimiser.step()
        losses.append(out.loss.item())
    return losses, first


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_training_lowers_the_loss_with_the_torch_path_and_the_kernels(kind):
    """AdamW on one fixed batch: the loss falls; the kernels (interpreter on CPU) give the torch path's gradients
    at the first step (every parameter) and its losses after that, step for step.  The layers' gradients against
    the float64 oracle: tests/test_nn.py."""
    ids = _ids(B=1, n=24, seed=4)   # batch 1: the interpreter's time grows with batch × heads
    torch_losses, torch_grads = _train(MODELS[kind]("block_based_torch"), ids, 12)
    assert torch_losses[-1] < 0.2 * torch_losses[0], torch_losses
    kernel_losses, kernel_grads = _train(MODELS[kind]("lightning_attention"), ids, 5)
    assert kernel_losses[-1] < 0.5 * kernel_losses[0], kernel_losses
    for name, grad in torch_grads.items():
        assert_close(kernel_grads[name], grad, tolerance(torch.float32), f"{kind}: first step, d loss / d {name}")
    assert_close(torch.tensor(kernel_losses), torch.tensor(torch_losses[:5]), tolerance(torch.float32),
                 f"{kind}: losses of the kernels' steps")


def test_configs_take_the_common_names():
    config = TransNormerConfig(hidden_size=64, num_heads=4, num_hidden_layers=3, vocab_size=100)
    assert (config.decoder_embed_dim, config.decoder_attention_heads, config.decoder_layers) == (64, 4, 3)
    assert (config.hidden_size, config.num_heads, config.num_hidden_layers) == (64, 4, 3)
    retnet_config = RetNetConfig(hidden_size=2048, num_heads=8, num_hidden_layers=1, vocab_size=10)
    with torch.device("meta"):
        attn = RetNetForCausalLM(retnet_config).model.layers[0].attn
    assert (attn.head_k_dim, attn.head_v_dim) == (256, 512)   # RetNet-1.3B's heads


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="unknown method"):
        retnet("flash")
    with pytest.raises(ValueError, match="unknown method"):
        transnormer().set_attention_method("nope")
    with pytest.raises(ValueError, match="split into"):
        RetNetForCausalLM(RetNetConfig(hidden_size=30, num_heads=4, num_hidden_layers=1, vocab_size=10))
    with pytest.raises(ValueError, match="split into"):
        TransNormerForCausalLM(TransNormerConfig(hidden_size=30, num_heads=4, num_hidden_layers=1, vocab_size=10))
    with pytest.raises(NotImplementedError, match="use_short_conv"):
        RetNetForCausalLM(RetNetConfig(hidden_size=32, num_heads=2, num_hidden_layers=1, vocab_size=10,
                                       use_short_conv=True))
    ids = _ids(n=4)
    with torch.no_grad():
        cache = transnormer()(ids).past_key_values
        with pytest.raises(ValueError, match="another model"):
            retnet()(ids, cache=cache)
        with pytest.raises(TypeError, match="LinearAttentionCache"):
            retnet()(ids, cache=object())
    assert isinstance(cache, LinearAttentionCache)
