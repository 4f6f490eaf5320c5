"""Hostile input at the layers, models, cache and generator: every case a clear error before any work, or a
defined result that leaves every other request's logits and pool slots bit-identical (docs/design.md §12,
§13.5).  Tiny models (hidden 32, 2 heads, vocab 64), float32 unless a case needs the PyTorch path."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from leettriton.models import ContinuousBatchingGenerator  # noqa: E402
from leettriton.nn import LinearAttentionCache, MultiScaleRetention, NormLinearAttention  # noqa: E402
from leettriton.reference import tolerance  # noqa: E402

from conftest import DEVICE  # noqa: E402
from helpers import assert_close  # noqa: E402
from test_models import VOCAB, retnet, transnormer  # noqa: E402

MODELS = {"retnet": retnet, "transnormer": transnormer}
# the packed prefill's two paths: the kernels (the interpreter on CPU) and a PyTorch twin
PATHS = ["auto", "lightning_attention_torch"]
TOL = tolerance(torch.float32)


def _model(kind, method="auto", dtype=torch.float32):
    model = MODELS[kind](method).to(device=DEVICE, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model


def _t(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _garbage(pools, seed=3):
    g = torch.Generator().manual_seed(seed)
    for pool in pools:
        pool.copy_(torch.randn(pool.shape, generator=g))


def _ids(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _packed(lens, seed=0):
    """input_ids, cu_seqlens and positions of sequences of ``lens`` tokens, packed."""
    ids = _ids(sum(lens), seed)
    cu = _t([0] + torch.tensor(lens).cumsum(0).tolist())
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    return ids, cu, positions


def _assert_bit_equal(out, ref, what):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not torch.equal(out, ref):
        bad = (out != ref).nonzero()[0].tolist()
        raise AssertionError(f"{what}: not bit-identical, first difference at {bad}: {out[tuple(bad)].item()} != "
                             f"{ref[tuple(bad)].item()}")


# ---------------------------------------------------------------------------------------------- zero-length


@pytest.mark.parametrize("method", PATHS)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_zero_length_sequence_in_prefill_packed_changes_no_other_request(kind, method):
    """Empty sequences first, between and last, one continuing its slot and one fresh: every token's logits and
    every other sequence's slot are bit-identical to the call without the empty ones; a continued empty
    sequence leaves its slot as it was, a fresh one leaves a zero state; unnamed slots keep their bytes.  The
    last-token logits: an empty sequence's row is zeros, the others those of the call without the empty ones
    (the head's product over N rows instead of N − 1 may round differently: BLAS blocks by the row count)."""
    model = _model(kind, method)
    lens = [5, 3, 6]
    ids, cu, positions = _packed(lens)
    # the same three sequences with empty ones in slots 0 (first, fresh), 3 (between, continued), 7 (last, fresh)
    cu_e = _t([0, 0, 5, 5, 8, 14, 14])
    slots = _t([0, 1, 3, 4, 6, 7])
    has_state = _t([False, False, True, True, False, False], torch.bool)
    pools = model.make_state_pools(8)
    _garbage(pools)
    before = [p.clone() for p in pools]
    ref_pools = [p.clone() for p in pools]
    ref = model.prefill_packed(ids, cu, positions, ref_pools, _t([1, 4, 6]), _t([False, True, False], torch.bool),
                               all_tokens=True)
    out = model.prefill_packed(ids, cu_e, positions, pools, slots, has_state, all_tokens=True)
    _assert_bit_equal(out, ref, f"{kind}/{method}: every token's logits")
    for layer, (pool, ref_pool, old) in enumerate(zip(pools, ref_pools, before)):
        for slot in (1, 4, 6):
            _assert_bit_equal(pool[slot], ref_pool[slot], f"{kind}/{method}: layer {layer} slot {slot}")
        _assert_bit_equal(pool[3], old[3], f"{kind}/{method}: layer {layer}, continued empty sequence's slot")
        for slot in (0, 7):
            _assert_bit_equal(pool[slot], torch.zeros_like(pool[slot]), f"{kind}/{method}: fresh empty slot {slot}")
        for slot in (2, 5):
            _assert_bit_equal(pool[slot], old[slot], f"{kind}/{method}: layer {layer} unnamed slot {slot}")

    ref = model.prefill_packed(ids, cu, positions, [p.clone() for p in before], _t([1, 4, 6]),
                               _t([False, True, False], torch.bool))
    out = model.prefill_packed(ids, cu_e, positions, [p.clone() for p in before], slots, has_state)
    assert out.shape == (6, VOCAB)
    for row, ref_row in ((1, 0), (3, 1), (4, 2)):
        assert_close(out[row], ref[ref_row], TOL, f"{kind}/{method}: last-token logits of sequence {ref_row}")
    for row in (0, 2, 5):
        _assert_bit_equal(out[row], torch.zeros_like(out[row]), f"{kind}/{method}: logits of empty sequence {row}")


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_prefill_packed_of_only_empty_sequences_gives_zero_logits(kind):
    model = _model(kind)
    pools = model.make_state_pools(3)
    _garbage(pools)
    before = [p.clone() for p in pools]
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    out = model.prefill_packed(empty, _t([0, 0, 0]), empty, pools, _t([2, 0]), _t([True, False], torch.bool))
    _assert_bit_equal(out, torch.zeros(2, VOCAB, device=DEVICE), f"{kind}: logits of two empty sequences")
    for pool, old in zip(pools, before):
        _assert_bit_equal(pool[2], old[2], f"{kind}: continued empty slot")
        _assert_bit_equal(pool[1], old[1], f"{kind}: unnamed slot")
        _assert_bit_equal(pool[0], torch.zeros_like(pool[0]), f"{kind}: fresh empty slot")


# ---------------------------------------------------------------------------------------------- index strides


@pytest.mark.parametrize("method", PATHS)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_strided_index_tensors_are_read_as_they_are(kind, method):
    """cu_seqlens, slot ids, has_initial_state and positions given as every other element of a longer tensor:
    the logits and every pool slot are bit-identical to the call with contiguous copies (packed prefill and
    slotted decode)."""
    model = _model(kind, method)
    lens = [4, 7, 2]
    ids, cu, positions = _packed(lens, seed=5)
    slots, has_state = _t([5, 0, 3]), _t([True, False, True], torch.bool)

    def spread(x, fill):   # x's values at the even places of a tensor twice as long, garbage between
        wide = torch.full((2 * x.shape[0],), fill, dtype=x.dtype, device=DEVICE)
        wide[::2] = x
        return wide[::2]

    pools = model.make_state_pools(6)
    _garbage(pools)
    ref_pools = [p.clone() for p in pools]
    ref = model.prefill_packed(ids, cu, positions, ref_pools, slots, has_state)
    s_cu, s_slots, s_state, s_pos = spread(cu, 99), spread(slots, 1), spread(has_state, False), spread(positions, 77)
    assert not s_cu.is_contiguous() and not s_slots.is_contiguous() and not s_pos.is_contiguous()
    out = model.prefill_packed(ids, s_cu, s_pos, pools, s_slots, s_state)
    _assert_bit_equal(out, ref, f"{kind}/{method}: packed logits with strided indices")
    for layer, (pool, ref_pool) in enumerate(zip(pools, ref_pools)):
        _assert_bit_equal(pool, ref_pool, f"{kind}/{method}: layer {layer}'s pool after the packed prefill")

    tokens, steps, rows = _ids(3, seed=9), _t([4, 7, 2]), _t([5, -1, 3])
    ref = model.decode_slotted(tokens, steps, ref_pools, rows)
    out = model.decode_slotted(tokens, spread(steps, 50), pools, spread(rows, 0))
    _assert_bit_equal(out, ref, f"{kind}/{method}: slotted logits with strided indices")
    for layer, (pool, ref_pool) in enumerate(zip(pools, ref_pools)):
        _assert_bit_equal(pool, ref_pool, f"{kind}/{method}: layer {layer}'s pool after the slotted decode")


# ---------------------------------------------------------------------------------------------- overlapping pools


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_overlapping_state_pools_are_refused_before_any_work(kind):
    """An expanded pool, two layers sharing one pool, two views of one buffer, a later layer's wrong pool: each a
    ValueError naming state_pools, and no pool written."""
    model = _model(kind)
    ids, cu, positions = _packed([3, 2])
    slots = _t([0, 1])
    good = model.make_state_pools(2)
    _garbage(good)
    before = [p.clone() for p in good]
    expanded = good[1][:1].expand(2, *good[1].shape[1:])
    n0, n1 = good[0][0].numel(), good[1][0].numel()
    buffer = torch.zeros(max(2 * n0, n0 + 2 * n1), device=DEVICE)   # layer 1's slot 0 is layer 0's slot 1
    a, b = buffer[:2 * n0].view(good[0].shape), buffer[n0:n0 + 2 * n1].view(good[1].shape)
    cases = {
        "expanded": ([good[0], expanded], "state_pools\\[1\\] must not have elements that share memory"),
        "overlapping views": ([a, b], r"state_pools\[0\] and state_pools\[1\] share memory"),
        "wrong shape": ([good[0], good[1][:, :1]], "state_pools\\[1\\] must have shape"),
        "wrong slot count": ([good[0], good[1][:1]], "same number of slots"),
    }
    for what, (pools, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            model.prefill_packed(ids, cu, positions, pools, slots)
        with pytest.raises(ValueError, match=message):
            model.decode_slotted(ids[:2], positions[:2], pools, slots)
        for layer, (pool, old) in enumerate(zip(good, before)):
            _assert_bit_equal(pool, old, f"{kind}: {what}: layer {layer}'s pool")
    with pytest.raises(TypeError, match="state_pools\\[1\\] must be a float32"):
        model.prefill_packed(ids, cu, positions, [good[0], good[1].double()], slots)


def test_two_layers_sharing_one_pool_are_refused():
    """RetNet's two layers have states of one shape: passing one pool for both is a ValueError."""
    model = _model("retnet")
    pools = model.make_state_pools(2)
    ids, cu, positions = _packed([2])
    with pytest.raises(ValueError, match=r"state_pools\[0\] and state_pools\[1\] share memory"):
        model.prefill_packed(ids, cu, positions, [pools[0], pools[0]], _t([0]))
    halves = torch.zeros((4,) + tuple(pools[0].shape[1:]), device=DEVICE)
    with pytest.raises(ValueError, match="share memory"):
        model.decode_slotted(ids[:1], positions[:1], [halves[:2], halves[1:3]], _t([0]))
    model.decode_slotted(ids[:1], positions[:1], [halves[:2], halves[2:]], _t([0]))   # disjoint halves: fine


# ---------------------------------------------------------------------------------------------- positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["kernels", "torch"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_float_positions_are_refused_on_every_path(kind, dtype):
    """Float positions: the same ValueError naming positions on the fused kernels' path (float32) and the PyTorch
    path (float64), for the packed prefill, the slotted decode, the layers' one-token step and the rotary / LRPE
    helpers."""
    model = _model(kind, dtype=dtype)
    pools = model.make_state_pools(2)
    before = [p.clone() for p in pools]
    ids, cu, positions = _packed([3])
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        model.prefill_packed(ids, cu, positions.to(dtype), pools, _t([0]))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        model.decode_slotted(ids[:1], positions[:1].to(dtype), pools, _t([1]))
    layer = model.attention_layers()[0]
    state = torch.zeros((1,) + tuple(pools[0].shape[1:]), device=DEVICE)
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        layer.decode_token(torch.zeros(1, 32, device=DEVICE, dtype=dtype), state, _t([2]).to(dtype))
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        model.prefill_packed(ids, cu, positions.tolist(), pools, _t([0]))
    rows = torch.zeros(3, 2, layer.head_k_dim if kind == "retnet" else layer.head_dim, device=DEVICE, dtype=dtype)
    helper = layer.rotary.apply_at if kind == "retnet" else layer.lrpe.at
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        helper(rows, positions.to(dtype))
    with pytest.raises(ValueError, match="positions must have shape"):
        model.prefill_packed(ids, cu, positions[:2], pools, _t([0]))
    for pool, old in zip(pools, before):
        _assert_bit_equal(pool, old, f"{kind}: pool after refused positions")


# ---------------------------------------------------------------------------------------------- shapes and masks


def test_hidden_size_mismatch_is_named():
    retention = MultiScaleRetention(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, layer_idx=0)
    lightning = NormLinearAttention(hidden_size=32, num_heads=2, use_lrpe=True)
    for layer in (retention, lightning):
        with pytest.raises(ValueError, match=r"hidden_states must have shape \(batch, n, hidden_size\) with "
                                             r"hidden_size=32, got shape \(1, 4, 31\)"):
            layer(torch.randn(1, 4, 31))
        with pytest.raises(ValueError, match="hidden_states must have shape"):
            layer(torch.randn(4, 32))
        with pytest.raises(TypeError, match="hidden_states must be a floating-point tensor"):
            layer(torch.ones(1, 4, 32, dtype=torch.int64))
        with pytest.raises(ValueError, match=r"hidden_states must have shape \(tokens, hidden_size\)"):
            layer.prefill_packed(torch.randn(4, 30), _t([0, 4]).cpu(), torch.arange(4), torch.zeros(1, 2, 16, 16),
                                 torch.tensor([0]))
        with pytest.raises(ValueError, match=r"x must have shape \(batch, hidden_size\)"):
            layer.decode_token(torch.randn(2, 33), torch.zeros(2, 2, 16, 16), torch.tensor([0]))
    model = _model("retnet")
    with pytest.raises(ValueError, match="inputs_embeds must have shape"):
        model(inputs_embeds=torch.randn(1, 3, 31, device=DEVICE))
    with pytest.raises(ValueError, match="input_ids must be a \\(batch, n\\) integer tensor"):
        model(torch.randn(1, 3, device=DEVICE))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_attention_mask_shorter_than_the_ids_is_named(kind):
    model = _model(kind)
    ids = _ids(6, seed=1)[None]
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch=1, length ≥ 6\).*got shape "
                                         r"\(1, 4\)"):
        model(ids, attention_mask=torch.ones(1, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(ids, attention_mask=torch.ones(2, 6, dtype=torch.long, device=DEVICE))
    layer = model.attention_layers()[0]
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch=1, length ≥ 6\)"):
        layer(torch.randn(1, 6, 32, device=DEVICE), attention_mask=torch.ones(1, 5, device=DEVICE))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_right_padded_attention_mask_is_refused(kind):
    """A right-padded mask (or a hole, or a value other than 0/1) is a ValueError naming attention_mask in the
    forward, generate() and generate_greedy(); the same prompt left-padded is accepted."""
    model = _model(kind)
    ids = torch.stack([_ids(6, seed=2), _ids(6, seed=3)])
    right = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], device=DEVICE)
    with pytest.raises(ValueError, match=r"attention_mask must mark left padding only.*row 1 \(columns 3 and 4\)"):
        model(ids, attention_mask=right)
    with torch.no_grad(), pytest.raises(ValueError, match="attention_mask must mark left padding only"):
        model.generate(ids, attention_mask=right, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match="attention_mask must mark left padding only"):
        model.generate_greedy(ids, 2, attention_mask=right)
    hole = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], device=DEVICE)
    with pytest.raises(ValueError, match="attention_mask must mark left padding only"):
        model(ids, attention_mask=hole)
    with pytest.raises(ValueError, match=r"attention_mask must hold only 0 and 1, got attention_mask\[0, 2\] = 2"):
        model(ids, attention_mask=torch.tensor([[0, 1, 2, 1, 1, 1], [1] * 6], device=DEVICE))
    layer = model.attention_layers()[0]
    with pytest.raises(ValueError, match="attention_mask must mark left padding only"):
        layer(torch.randn(2, 6, 32, device=DEVICE), attention_mask=right)
    left = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], device=DEVICE)
    with torch.no_grad():
        model(ids, attention_mask=left)


# ---------------------------------------------------------------------------------------------- the cache


def test_past_recording_on_a_cache_built_without_a_layer_count():
    """activate_past_recording() on LinearAttentionCache() (layers added on first use) records, so crop goes back
    to the state after the first piece."""
    torch.manual_seed(0)
    layer = MultiScaleRetention(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, layer_idx=0)
    x = torch.randn(1, 7, 32)
    cache = LinearAttentionCache()
    cache.activate_past_recording()
    assert cache.is_croppable
    with torch.no_grad():
        layer(x[:, :4], cache=cache)
        after_four = cache.get_state(0).clone()
        layer(x[:, 4:6], cache=cache)
        layer(x[:, 6:], cache=cache)
    cache.crop(4)
    assert cache.get_seq_length() == 4
    _assert_bit_equal(cache.get_state(0), after_four, "state after crop(4)")
    unrecorded = LinearAttentionCache()
    with torch.no_grad():
        layer(x[:, :4], cache=unrecorded)
        layer(x[:, 4:], cache=unrecorded)
    assert not unrecorded.is_croppable
    with pytest.raises(ValueError, match="activate_past_recording"):
        unrecorded.crop(4)
    with pytest.raises(TypeError, match="max_length must be an int"):
        cache.crop(2.0)


def test_reorder_cache_refuses_rows_out_of_range():
    model = _model("transnormer")
    with torch.no_grad():
        cache = model(torch.stack([_ids(4, seed=1), _ids(4, seed=2)]), use_cache=True).past_key_values
    states = [cache.get_state(i).clone() for i in range(len(cache))]
    with pytest.raises(ValueError, match=r"beam_idx must hold rows in \[0, 2\) \(the cache's batch\), got 2"):
        cache.reorder_cache(torch.tensor([0, 2], device=DEVICE))
    with pytest.raises(ValueError, match="beam_idx must hold rows in .*got -1"):
        cache.reorder_cache(torch.tensor([-1, 0], device=DEVICE))
    with pytest.raises(TypeError, match="beam_idx must be a 1-D integer tensor"):
        cache.reorder_cache(torch.tensor([0.0, 1.0], device=DEVICE))
    with pytest.raises(ValueError, match="indices must hold rows"):
        cache.batch_select_indices(torch.tensor([3], device=DEVICE))
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        cache.batch_repeat_interleave(0)
    for i, state in enumerate(states):
        _assert_bit_equal(cache.get_state(i), state, f"layer {i}'s state after refused reorders")
    cache.reorder_cache(torch.tensor([1, 1, 0], device=DEVICE))
    _assert_bit_equal(cache.get_state(0), states[0][[1, 1, 0]], "reordered state")


# ---------------------------------------------------------------------------------------------- the generator


def test_submit_refuses_a_bool_stop_token():
    gen = ContinuousBatchingGenerator(_model("retnet"), slots=2)
    for bad in (True, False):
        with pytest.raises(ValueError, match=f"stop_token must be None or an int in \\[0, vocab_size=64\\), got {bad}"):
            gen.submit([1, 2], 3, stop_token=bad)
    with pytest.raises(TypeError, match="request_id must be hashable"):
        gen.submit([1, 2], 3, request_id=["a"])
    with pytest.raises(ValueError, match="arrival must be None or a finite time"):
        gen.submit([1, 2], 3, arrival="now")
    assert gen.idle


def test_a_layer_without_a_packed_path_is_refused_before_any_pool_is_written():
    """A model whose second layer runs a method with no packed path: NotImplementedError naming the layer and the
    method before the first layer writes its pool."""
    model = _model("retnet")
    model.attention_layers()[1].set_method("causal_dot_product")
    pools = model.make_state_pools(2)
    _garbage(pools)
    before = [p.clone() for p in pools]
    ids, cu, positions = _packed([3])
    with pytest.raises(NotImplementedError, match="layer 1 would run method 'causal_dot_product'"):
        model.prefill_packed(ids, cu, positions, pools, _t([0]))
    for layer, (pool, old) in enumerate(zip(pools, before)):
        _assert_bit_equal(pool, old, f"layer {layer}'s pool")


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_token_ids_outside_the_vocabulary_are_named(kind):
    model = _model(kind)
    pools = model.make_state_pools(2)
    _garbage(pools)
    before = [p.clone() for p in pools]
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, vocab_size=64\), got 64"):
        model.prefill_packed(_t([1, 64]), _t([0, 2]), _t([0, 1]), pools, _t([0]))
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, vocab_size=64\), got -3"):
        model.decode_slotted(_t([-3, 5]), _t([4, 2]), pools, _t([0, 1]))
    for pool, old in zip(pools, before):
        _assert_bit_equal(pool, old, f"{kind}: pool after refused token ids")
