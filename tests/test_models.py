"""RetNetForCausalLM and TransNormerForCausalLM: methods against the float64 oracle path, the cache in
``generate()``, the fixed-buffer decoder (``StaticDecoder``, ``generate_greedy``; its CUDA graph on a GPU only),
save/load, and bad inputs.  Tiny configurations (r = 8, d = 16 and r = d = 16)."""
from __future__ import annotations

import copy

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import leettriton  # noqa: E402
from leettriton.methods import BUILTIN_METHODS  # noqa: E402
from leettriton.models import (RetNetConfig, RetNetForCausalLM, StaticDecoder, TransNormerConfig,  # noqa: E402
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


def _greedy(model, ids, new, mask=None, **kw):
    mask = torch.ones_like(ids) if mask is None else mask
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_static_decoder_gives_the_cache_path_and_one_prefill(kind):
    """StaticDecoder (state buffers, the position on the device): each step's logits are those of the one-token
    forward through a cache and of one prefill over the whole sequence; generate_greedy gives generate()'s tokens,
    with left padding too."""
    model = MODELS[kind]("block_based")
    ids = _ids(B=2, n=7)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0                       # row 1 left-padded
    with torch.no_grad():
        want = _greedy(model, ids, 6, mask, min_new_tokens=6)
        assert torch.equal(model.generate_greedy(ids, max_new_tokens=6, attention_mask=mask), want)
        decoder = StaticDecoder(model, batch_size=2, max_length=16)
        cache = model.make_cache()
        logits = [decoder.prefill(ids, mask)]
        cached = [model(ids, attention_mask=mask, cache=cache).logits[:, -1]]
        for t in range(7, 13):
            logits.append(decoder.step(want[:, t]).clone())
            cached.append(model(want[:, t:t + 1], attention_mask=torch.ones(2, t + 1), cache=cache).logits[:, 0])
        full = model(want[1:, 3:13], use_cache=False).logits           # row 1 without its padding, one prefill
    assert_close(torch.stack(logits, 1), torch.stack(cached, 1), tolerance(torch.float32), f"{kind}: steps vs cache")
    assert_close(torch.stack(logits, 1)[1], full[0, 3:], tolerance(torch.float32), f"{kind}: steps vs one prefill")
    assert decoder.length == 13 and int(decoder.position) == 13
    twin = copy.deepcopy(model)                        # the kept decoders are not copied: the twin builds its own
    with torch.no_grad():
        assert torch.equal(twin.generate_greedy(ids, max_new_tokens=6, attention_mask=mask), want)


def test_generate_greedy_stops_at_eos_as_generate_does():
    """With an EOS id: finished rows continue with the pad id, and the output ends when every row has finished."""
    model = retnet()
    one, two = _ids(B=1, n=6, seed=5), _ids(B=2, n=6, seed=6)
    with torch.no_grad():
        free = _greedy(model, one, 8, min_new_tokens=8)
        eos = int(free[0, 9])                                            # row 0 meets it by its 4th new token
        trimmed = model.generate_greedy(one, max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
        assert trimmed.shape[1] < one.shape[1] + 8
        assert torch.equal(trimmed, _greedy(model, one, 8, eos_token_id=eos))
        eos2 = [int(_greedy(model, two, 8, min_new_tokens=8)[0, 8]), 63]
        padded = model.generate_greedy(two, max_new_tokens=8, eos_token_id=eos2, pad_token_id=0)
        assert torch.equal(padded, _greedy(model, two, 8, eos_token_id=eos2))


def test_static_decoder_refuses_bad_inputs():
    model = transnormer()
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        StaticDecoder(model, 0, 8)
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        StaticDecoder(model, 1, 8, cuda_graph=True)
    with pytest.raises(TypeError, match="causal LM of leettriton.models"):
        StaticDecoder(torch.nn.Linear(2, 2), 1, 8)
    decoder = StaticDecoder(model, 2, 8)
    with pytest.raises(RuntimeError, match="prefill a prompt"):
        decoder.step(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size=2"):
        decoder.prefill(_ids(B=3, n=4))
    with pytest.raises(ValueError, match="max_length - 1 = 7"):
        decoder.prefill(_ids(B=2, n=8))
    with pytest.raises(ValueError, match="exceed this decoder's max_length=8"):
        decoder.generate(_ids(B=2, n=4), max_new_tokens=5)
    model.to(torch.float64)                                   # new parameter tensors: the decoder cannot follow
    with pytest.raises(RuntimeError, match="build a new StaticDecoder"):
        decoder.prefill(_ids(B=2, n=4))
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        model.generate_greedy(_ids(B=2, n=4), max_new_tokens=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_cuda_graph_decoding_equals_the_eager_path(kind):
    """On a GPU: the graph-replayed step gives the eager step's logits and generate()'s tokens, and a second
    prompt through the same captured graph does too (the graph reads the buffers' new values)."""
    model = MODELS[kind]("auto").cuda()
    with torch.no_grad():
        for seed in (1, 2):
            ids = _ids(B=3, n=11, seed=seed).cuda()
            want = _greedy(model, ids, 9, min_new_tokens=9)
            assert torch.equal(model.generate_greedy(ids, max_new_tokens=9), want), seed
            graphed, eager = StaticDecoder(model, 3, 32), StaticDecoder(model, 3, 32, cuda_graph=False)
            assert graphed.graph is not None and eager.graph is None
            steps = [(graphed.prefill(ids), eager.prefill(ids))]
            for t in range(11, 19):
                steps.append((graphed.step(want[:, t]).clone(), eager.step(want[:, t]).clone()))
            assert_close(torch.stack([g for g, _ in steps]), torch.stack([e for _, e in steps]),
                         tolerance(torch.float32), f"{kind}: graph vs eager, prompt {seed}")
            for i, (g, e) in enumerate(zip(graphed.states, eager.states)):
                assert_close(g, e, tolerance(torch.float32), f"{kind}: layer {i}'s state after the steps")


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
