"""The models' serving entry points and the continuous-batching generator (docs/design.md §13.5).

The packed prefill and the slotted decode must equal the models' own forward on each sequence; the
generator's greedy tokens must equal each request run alone through ``generate()``; sampling must depend
on the request alone, never on its batch.  Tiny models (hidden 32, 2 heads, vocab 64), float32.
"""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from leettriton.models import ContinuousBatchingGenerator  # noqa: E402
from leettriton.models.serving import counter_uniforms, main, sample_tokens  # noqa: E402
from leettriton.reference import tolerance  # noqa: E402

from helpers import assert_close  # noqa: E402
from test_models import VOCAB, retnet, transnormer  # noqa: E402

MODELS = {"retnet": retnet, "transnormer": transnormer}
TOL = tolerance(torch.float32)


def _model(kind):
    model = MODELS[kind]()
    model.generation_config.eos_token_id = None   # a request stops only at its own stop token
    return model


def _prompt(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _garbage(pools, seed=7):
    """Fill every slot with large random states: a path that read a slot it should not would show."""
    g = torch.Generator().manual_seed(seed)
    for pool in pools:
        pool.copy_(10 * torch.randn(pool.shape, generator=g))


def _alone(model, prompt, max_new_tokens, stop_token=None):
    """The reference: ``generate()`` on this prompt alone, greedy; its new tokens."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=stop_token)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_packed_prefill_and_slotted_decode_equal_the_forward_of_each_sequence(kind):
    """Every token's logits and every final state of a packed prefill (a 1-token sequence, one of exactly one
    interpreter chunk, ...) equal the forward on the sequence alone; a second packed call continuing some
    sequences from their slots (positions going on) and a slotted decode with a padding row equal the forward
    of the whole sequences; slots no call names stay bit-identical."""
    model = _model(kind)
    lens = [1, 7, 16, 3]
    prompts = [_prompt(n, seed=10 + i) for i, n in enumerate(lens)]
    slot_of = [4, 0, 2, 5]
    pools = model.make_state_pools(6)
    _garbage(pools)
    before = [p.clone() for p in pools]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist())
    positions = torch.cat([torch.arange(n) for n in lens])
    logits = model.prefill_packed(torch.tensor(sum(prompts, [])), cu, positions, pools, torch.tensor(slot_of),
                                  torch.zeros(4, dtype=torch.bool), all_tokens=True)
    last = model.prefill_packed(torch.tensor(sum(prompts, [])), cu, positions, [p.clone() for p in pools],
                                torch.tensor(slot_of))
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            out = model(torch.tensor([prompt]), use_cache=True)
            assert_close(logits[cu[i]:cu[i + 1]], out.logits[0], TOL, f"{kind}: packed logits of sequence {i}")
            assert_close(last[i], out.logits[0, -1], TOL, f"{kind}: last-token logits of sequence {i}")
            for layer, pool in enumerate(pools):
                assert_close(pool[slot_of[i]], out.past_key_values.get_state(layer)[0], TOL,
                             f"{kind}: layer {layer} state of sequence {i} in slot {slot_of[i]}")
    for pool, old in zip(pools, before):
        assert torch.equal(pool[[1, 3]], old[[1, 3]]), f"{kind}: a slot no sequence names changed"

    # continue sequences 2 and 0 from their slots by a packed chunk, then all four by one slotted decode
    more = [_prompt(5, seed=20), _prompt(2, seed=21)]
    cont = model.prefill_packed(torch.tensor(sum(more, [])), torch.tensor([0, 5, 7]),
                                torch.cat([torch.arange(lens[2], lens[2] + 5), torch.arange(lens[0], lens[0] + 2)]),
                                pools, torch.tensor([slot_of[2], slot_of[0]]), torch.tensor([True, True]))
    prompts[2] += more[0]
    prompts[0] += more[1]
    nxt = _prompt(4, seed=22)
    rows = [3, -1, 0, 1, 2]                                   # a padding row among them
    dec = model.decode_slotted(torch.tensor([nxt[i] if i >= 0 else 0 for i in rows]),
                               torch.tensor([len(prompts[i]) if i >= 0 else 0 for i in rows]), pools,
                               torch.tensor([slot_of[i] if i >= 0 else -1 for i in rows]))
    with torch.no_grad():
        for j, i in enumerate((2, 0)):
            want = model(torch.tensor([prompts[i]])).logits[0, -1]
            assert_close(cont[j], want, TOL, f"{kind}: sequence {i} continued from its slot")
        for j, i in enumerate(rows):
            if i >= 0:
                want = model(torch.tensor([prompts[i] + [nxt[i]]])).logits[0, -1]
                assert_close(dec[j], want, TOL, f"{kind}: slotted decode of sequence {i}")
    for pool, old in zip(pools, before):
        assert torch.equal(pool[[1, 3]], old[[1, 3]]), f"{kind}: the padding row or a continuation touched a slot"


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_greedy_generator_equals_each_request_alone(kind):
    """Six requests (a 1-token prompt among them, one with a stop token it meets) through 3 slots whose pools
    start full of garbage, two joining mid-stream, a prefill budget of 12 tokens: every request's tokens are
    those of ``generate()`` on it alone, so a reused slot's stale state never leaks into its next request."""
    model = _model(kind)
    lens, new = [1, 6, 11, 3, 9, 2], [5, 1, 4, 6, 3, 4]
    prompts = [_prompt(n, seed=30 + i) for i, n in enumerate(lens)]
    want = [_alone(model, p, m) for p, m in zip(prompts, new)]
    stop = want[3][2]                               # request 3 stops at the first time it generates this token
    want[3] = want[3][:want[3].index(stop) + 1]
    assert len(want[3]) < new[3]

    gen = ContinuousBatchingGenerator(model, slots=3, max_prefill_tokens=12)
    _garbage(gen.pools)
    slots_used = []
    for i in range(4):
        gen.submit(prompts[i], new[i], stop_token=stop if i == 3 else None)
    done = []
    for _ in range(2):
        slots_used += [r.slot for r in gen.running]
        done += gen.step()
    for i in (4, 5):
        gen.submit(prompts[i], new[i])
    while not gen.idle:
        slots_used += [r.slot for r in gen.running]
        done += gen.step()
    got = {c.request_id: c for c in done}
    assert sorted(got) == list(range(6))
    for i in range(6):
        assert got[i].tokens == want[i], f"{kind}: request {i} (prompt {lens[i]}): {got[i].tokens} != {want[i]}"
        assert got[i].finish_reason == ("stop" if i == 3 else "length")
        assert got[i].prompt_length == lens[i] and got[i].arrival <= got[i].first_token_time <= got[i].finish_time
    assert set(slots_used) == {0, 1, 2} and sorted(gen.free_slots) == [0, 1, 2]
    budgeted = [s.prefill_tokens for s in gen.stats if s.prefill_sequences > 1]
    assert budgeted and max(budgeted) <= 12


def test_sampling_depends_on_the_request_alone():
    """A sampled request gives the same tokens alone and in a batch with others (joining mid-stream, another
    slot, other requests sampling with other seeds), and again on a second run; its tokens are not greedy."""
    model = _model("retnet")
    prompt = _prompt(5, seed=40)
    spec = dict(temperature=0.9, top_k=20, seed=1234)

    alone = ContinuousBatchingGenerator(model, slots=4)
    alone.submit(prompt, 8, **spec)
    first = alone.run()[0].tokens

    crowd = ContinuousBatchingGenerator(model, slots=4)
    crowd.submit(_prompt(9, seed=41), 10, temperature=1.0, seed=5)
    crowd.submit(_prompt(2, seed=42), 3)
    crowd.step()
    crowd.submit(_prompt(4, seed=43), 9, temperature=0.7, top_k=3, seed=6)
    crowd.submit(prompt, 8, request_id="x", **spec)
    crowd.submit(_prompt(1, seed=44), 6, temperature=1.5, seed=1234)
    got = {c.request_id: c.tokens for c in crowd.run()}

    again = ContinuousBatchingGenerator(model, slots=2)
    again.submit(prompt, 8, **spec)
    assert got["x"] == first == again.run()[0].tokens
    assert first != _alone(model, prompt, 8), "temperature 0.9 gave the greedy tokens: sampling is not applied"


def test_sample_tokens_follows_the_softmax_and_top_k():
    """Gumbel-max with the counter noise: over 6000 seeds the frequencies of each token match softmax(l / T)
    (within 5 standard deviations), top-k keeps only the k largest, temperature 0 is argmax; a row's noise is
    the same alone and in a batch."""
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, 1.5])
    R, V = 6000, logits.numel()
    seeds, counters = torch.arange(R) * 7919 + 3, torch.full((R,), 11)
    for temperature, k in ((1.0, 0), (0.5, 0), (2.0, 3)):
        tokens = sample_tokens(logits.expand(R, V), torch.full((R,), temperature), torch.full((R,), k), seeds,
                               counters)
        scaled = logits / temperature
        if k:
            scaled = scaled.masked_fill(scaled < scaled.topk(k).values[-1], -float("inf"))
        p = torch.softmax(scaled.double(), 0)
        freq = torch.bincount(tokens, minlength=V).double() / R
        sigma = (p * (1 - p) / R).sqrt()
        assert ((freq - p).abs() <= 5 * sigma + 1e-12).all(), f"T={temperature} k={k}: {freq} vs {p}"
    greedy = sample_tokens(logits.expand(3, V), torch.zeros(3), torch.tensor([0, 2, 5]), seeds[:3], counters[:3])
    assert greedy.tolist() == [3, 3, 3]
    u = counter_uniforms(seeds[:50], counters[:50], 1000)
    assert ((u > 0) & (u < 1)).all() and abs(u.mean().item() - 0.5) < 0.01
    assert torch.equal(counter_uniforms(seeds[17:18], counters[17:18], 1000), u[17:18])
    assert not torch.equal(counter_uniforms(seeds[17:18], counters[17:18] + 1, 1000), u[17:18])


def test_bad_input_is_named():
    model = _model("transnormer")
    gen = ContinuousBatchingGenerator(model, slots=2)
    with pytest.raises(ValueError, match="at least one token"):
        gen.submit([], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.submit([1, 2], 0)
    with pytest.raises(ValueError, match=r"vocab_size=64\), got 64"):
        gen.submit([1, 64], 3)
    with pytest.raises(ValueError, match="stop_token"):
        gen.submit([1], 3, stop_token=-1)
    with pytest.raises(ValueError, match="temperature"):
        gen.submit([1], 3, temperature=-0.5)
    with pytest.raises(ValueError, match="top_k"):
        gen.submit([1], 3, top_k=-1)
    with pytest.raises(ValueError, match="seed"):
        gen.submit([1], 3, seed=-2)
    gen.submit([1], 3, request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        gen.submit([2], 3, request_id="a")
    with pytest.raises(TypeError, match="serving entry points"):
        ContinuousBatchingGenerator(nn.Linear(2, 2), slots=2)
    with pytest.raises(ValueError, match="slots must be a positive int"):
        ContinuousBatchingGenerator(model, slots=0)
    with pytest.raises(ValueError, match="GiB free: use fewer slots"):
        ContinuousBatchingGenerator(model, slots=10 ** 15)
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        ContinuousBatchingGenerator(model, slots=2, max_prefill_tokens=0)
    with pytest.raises(ValueError, match="packed path"):
        ContinuousBatchingGenerator(model, slots=2, prefill_method="causal_dot_product")
    pools = model.make_state_pools(2)
    with pytest.raises(ValueError, match="one per layer"):
        model.decode_slotted(torch.tensor([1]), torch.tensor([0]), pools[:1], torch.tensor([0]))
    with pytest.raises(ValueError, match="positions"):
        model.prefill_packed(torch.tensor([1, 2]), torch.tensor([0, 2]), torch.tensor([0]), pools, torch.tensor([0]))


def test_command_serves_a_stream(tmp_path):
    """The command on CPU (tiny model): every request finishes with its tokens; the JSON holds the summary."""
    path = tmp_path / "serving.json"
    result = main(["--model", "transnormer", "--requests", "5", "--prompt-min", "1", "--prompt-max", "6",
                   "--new-tokens", "3", "--slots", "2", "--rate", "200", "--no-warmup", "--json", str(path)])
    saved = json.loads(path.read_text())
    s = saved["summary"]
    assert s["requests"] == 5 and s["generated_tokens"] == 15 and s["prompt_tokens"] == sum(
        r["prompt_length"] for r in saved["requests"])
    assert 0 < s["ttft_p50_ms"] <= s["ttft_p99_ms"] and s["ttft_p50_ms"] <= s["e2e_p50_ms"] <= s["e2e_p99_ms"]
    assert result["summary"] == s and (tmp_path / "serving.md").exists()
