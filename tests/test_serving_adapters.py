"""Engine adapters (leettriton.serving): vLLM's and SGLang's metadata run through the serving calls.

The stand-ins below carry the engines' field names as their source defines them (no engine is imported).
Every adapter's output and pool must equal running each request alone through leettriton's own calls
(the same kernels, so bit-equal); padding rows output zeros and touch no state; slots no request names
stay bit-identical (docs/design.md §13.6).  Both CPU paths run: the interpreter (the Triton kernels) and
the PyTorch reference path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import leettriton
import leettriton.serving as serving
from conftest import DEVICE
from helpers import assert_close, tolerance

GAMMA = 0.95
SLOTS = 12


@dataclass
class VllmLinearAttentionMetadata:
    """vllm/v1/attention/backends/linear_attn.py LinearAttentionMetadata."""
    num_prefills: int
    num_prefill_tokens: int
    num_decodes: int
    num_decode_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    state_indices_tensor: torch.Tensor


@dataclass
class VllmGDNSpecMetadata:
    """The speculative fields of vllm/v1/attention/backends/gdn_attn.py GDNAttentionMetadata."""
    num_prefills: int
    num_prefill_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_spec_decodes: int
    num_spec_decode_tokens: int
    num_actual_tokens: int
    has_initial_state: Optional[torch.Tensor] = None
    spec_state_indices_tensor: Optional[torch.Tensor] = None
    num_accepted_tokens: Optional[torch.Tensor] = None


@dataclass
class VllmMambaPrefixMetadata(VllmLinearAttentionMetadata):
    """With the prefix-caching fields of vllm/v1/attention/backends/mamba_attn.py (mamba_cache_mode "all")."""
    block_idx_last_scheduled_token: Optional[torch.Tensor] = None
    block_idx_first_scheduled_token_p: Optional[torch.Tensor] = None


@dataclass(kw_only=True)
class SglangBailingLinearMetadata:
    """python/sglang/srt/layers/attention/linear/linear_metadata.py BailingLinearMetadata (with its
    ForwardMetadata base's fields)."""
    query_start_loc: torch.Tensor
    mamba_cache_indices: torch.Tensor
    num_prefills: int
    num_prefill_tokens: int
    num_decodes: int
    batch_size: int
    has_initial_states: torch.Tensor
    q_lengths: torch.Tensor
    track_ssm_h_src: Optional[torch.Tensor] = None
    track_ssm_h_dst: Optional[torch.Tensor] = None
    track_ssm_final_src: Optional[torch.Tensor] = None
    track_ssm_final_dst: Optional[torch.Tensor] = None


@pytest.fixture(params=["kernels"] + (["torch"] if DEVICE == "cpu" else []))
def dims(request, monkeypatch):
    """(heads, r, d) per path: the Triton kernels (the interpreter on CPU), and on CPU also the PyTorch
    reference path.  The paths use different shapes so that no validated launch of one is repeated by the
    other."""
    if request.param == "torch":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        return 2, 8, 8
    return 2, 16, 16


def tokens(T, H, r, d, seed):
    g = torch.Generator().manual_seed(seed)
    b, c = (torch.randn(T, H, r, generator=g).to(DEVICE) for _ in range(2))
    return b, c, torch.randn(T, H, d, generator=g).to(DEVICE)


def pool_of(H, r, d, seed, transposed=False):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # stored [V, K]: passed as the (slots, H, r, d) view
        return torch.randn(SLOTS, H, d, r, generator=g).to(DEVICE).transpose(-1, -2)
    return torch.randn(SLOTS, H, r, d, generator=g).to(DEVICE)


def ids(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def alone_prefill(b, c, v, pool, slot, initial):
    """One request through linear_attention_varlen alone."""
    return leettriton.linear_attention_varlen(b, c, v, ids([0, b.shape[0]]), GAMMA, state_pool=pool,
                                              slot_ids=ids([slot]), has_initial_state=torch.tensor([initial],
                                              device=DEVICE))


def alone_decode(b, c, v, pool, slot):
    """One decode row through decode_step alone."""
    return leettriton.decode_step(b, c, v, pool, GAMMA, slot_ids=ids([slot]))[0]

def same_layout_as(pool, before, out, expected):
    """The adapter's output and pool against the library's own calls, ``expected(ref_pool)`` (which updates
    ``ref_pool`` as the adapter updates its pool, from ``before``): bit for bit on a pool of the adapter's
    layout; where that is [V, K], also within float32's rounding on a [K, V] copy.  (A GPU's kernels lay a
    tile's threads out by the memory's order, so the sums of the two layouts may round differently.)"""
    ref_pool = before.clone()  # the same strides
    assert ref_pool.stride() == pool.stride()
    assert torch.equal(out, expected(ref_pool))
    assert torch.equal(pool, ref_pool)
    if not before.is_contiguous():
        kv_pool = before.clone(memory_format=torch.contiguous_format)
        assert_close(out, expected(kv_pool).double(), 1e-5, "output against a [K, V] pool")
        assert_close(pool, kv_pool.double(), 1e-5, "pool against a [K, V] pool")



def one_row(x):
    """A row's k consecutive tokens (k, H, dim) as decode_tokens' (1, H, k, dim)."""
    return x.transpose(0, 1).unsqueeze(0)


# --------------------------------------------------------------------------- vLLM


@pytest.mark.parametrize("transposed", [False, True])
def test_vllm_mixed_batch_decodes_first(dims, transposed):
    H, r, d = dims
    decode_slots, prefill_slots = [5, 2, 9], [7, 0]
    prefill_lens, computed = [6, 3], [4, 0]  # the first prefill continues its slot, the second is new
    nd, npf = len(decode_slots), len(prefill_lens)
    T = nd + sum(prefill_lens)
    b, c, v = tokens(T, H, r, d, seed=1)
    # state_indices_tensor as vLLM slices it: column 0 of a block table, a strided view
    table = torch.full((nd + npf, 3), 99, dtype=torch.int32, device=DEVICE)
    table[:, 0] = ids(decode_slots + prefill_slots)
    qsl = ids([0, 1, 2, 3, 9, 12])
    seq_lens = ids([10, 4, 7] + [n + k for n, k in zip(prefill_lens, computed)])
    meta = VllmLinearAttentionMetadata(npf, sum(prefill_lens), nd, nd, qsl, seq_lens, table[:, 0])
    assert not meta.state_indices_tensor.is_contiguous()
    pool = pool_of(H, r, d, seed=2, transposed=transposed)
    assert transposed == (not pool.is_contiguous())
    before = pool.clone()

    out = serving.vllm_forward(b, c, v, pool, meta, GAMMA)

    def expected(ref_pool):
        expect = torch.empty_like(out)
        for i, slot in enumerate(decode_slots):
            expect[i:i + 1] = alone_decode(b[i:i + 1], c[i:i + 1], v[i:i + 1], ref_pool, slot)
        start = nd
        for slot, n, k in zip(prefill_slots, prefill_lens, computed):
            rows = slice(start, start + n)
            expect[rows] = alone_prefill(b[rows], c[rows], v[rows], ref_pool, slot, k > 0)
            start += n
        return expect

    same_layout_as(pool, before, out, expected)
    untouched = [s for s in range(SLOTS) if s not in decode_slots + prefill_slots]
    assert torch.equal(pool[untouched], before[untouched])
    # the new prefill ignored what its slot held: it equals a run from zero
    o0 = leettriton.linear_attention_varlen(b[9:12], c[9:12], v[9:12], ids([0, 3]), GAMMA)
    assert torch.equal(out[9:12], o0)


def test_vllm_padded_decode_batch(dims):
    """A captured decode-only batch: rows past num_decodes carry PAD_SLOT_ID; zeros out, no state touched."""
    H, r, d = dims
    b, c, v = tokens(4, H, r, d, seed=3)
    meta = VllmLinearAttentionMetadata(0, 0, 2, 2, ids([0, 1, 2]), ids([3, 5]), ids([4, 1, -1, -1]))
    pool = pool_of(H, r, d, seed=4)
    ref_pool, before = pool.clone(), pool.clone()
    out = serving.vllm_forward(b, c, v, pool, meta, GAMMA, out=torch.full((4, H, d), float("nan"), device=DEVICE))
    for i, slot in enumerate([4, 1]):
        assert torch.equal(out[i:i + 1], alone_decode(b[i:i + 1], c[i:i + 1], v[i:i + 1], ref_pool, slot))
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    assert torch.equal(pool, ref_pool)
    assert torch.equal(pool[[0, 2, 3] + list(range(5, SLOTS))], before[[0, 2, 3] + list(range(5, SLOTS))])


@pytest.mark.parametrize("transposed", [False, True])
def test_vllm_spec_decode_commit(dims, transposed):
    """vLLM's spec rows: start from slot [i, accepted − 1], leave the state after token j in slot [i, j]."""
    H, r, d = dims
    K = 3
    spec = ids([[0, 1, 2], [5, 6, 7], [-1, -1, -1]])  # the last row: padding of a captured batch
    accepted = ids([2, 3, 1])
    b, c, v = tokens(3 * K, H, r, d, seed=5)
    meta = VllmGDNSpecMetadata(0, 0, 0, 0, 3, 3 * K, 3 * K, spec_state_indices_tensor=spec,
                               num_accepted_tokens=accepted)
    pool = pool_of(H, r, d, seed=6, transposed=transposed)
    before = pool.clone()

    out = serving.vllm_spec_decode(b, c, v, pool, meta, GAMMA)

    for i, a in enumerate([2, 3]):  # each row alone, from its start slot's state, keeping every state
        t = slice(i * K, (i + 1) * K)
        state = before[spec[i, a - 1].item()].clone().unsqueeze(0)
        o, _, kept = leettriton.decode_tokens(one_row(b[t]), one_row(c[t]), one_row(v[t]), state, GAMMA,
                                              keep_states=True)
        assert torch.equal(out[t], o[0].transpose(0, 1))
        for j in range(K):
            assert torch.equal(pool[spec[i, j].item()], kept[0, :, j + 1])
    assert torch.equal(out[2 * K:], torch.zeros_like(out[2 * K:]))
    untouched = [3, 4] + list(range(8, SLOTS))
    assert torch.equal(pool[untouched], before[untouched])


def test_commit_accepted_rolls_back_with_padding(dims):
    H, r, d = dims
    K = 2
    slots = ids([3, -1, 0])
    b, c, v = tokens(3 * K, H, r, d, seed=7)
    pool = pool_of(H, r, d, seed=8)
    before = pool.clone()
    rows = lambda x: x.unflatten(0, (3, K)).transpose(1, 2)  # noqa: E731
    _, _, kept = leettriton.decode_tokens(rows(b), rows(c), rows(v), pool, GAMMA, slot_ids=slots, keep_states=True)
    serving.commit_accepted(pool, slots, kept, ids([1, 2, 0]))
    assert torch.equal(pool[3], kept[0, :, 1])
    assert torch.equal(pool[0], before[0])  # none accepted: back to the state before the call
    assert torch.equal(pool[[1, 2] + list(range(4, SLOTS))], before[[1, 2] + list(range(4, SLOTS))])


def test_vllm_prefix_caching_is_refused():
    H, r, d = 2, 16, 16
    b, c, v = tokens(4, H, r, d, seed=9)
    meta = VllmMambaPrefixMetadata(1, 4, 0, 0, ids([0, 4]), ids([4]), ids([1]),
                                   block_idx_last_scheduled_token=ids([0]), block_idx_first_scheduled_token_p=ids([0]))
    pool = pool_of(H, r, d, seed=10)
    before = pool.clone()
    with pytest.raises(NotImplementedError, match=r"mamba_cache_mode 'all'.*block_idx_first_scheduled_token_p is "
                                                  r"set: a \(1,\) tensor.*num_computed_tokens_p"):
        serving.vllm_forward(b, c, v, pool, meta, GAMMA)
    meta.block_idx_first_scheduled_token_p = None
    with pytest.raises(NotImplementedError, match=r"block_idx_last_scheduled_token is set.*mamba_cache_mode 'align'"):
        serving.vllm_forward(b, c, v, pool, meta, GAMMA)
    assert torch.equal(pool, before)


def test_vllm_metadata_errors():
    H, r, d = 2, 16, 16
    b, c, v = tokens(3, H, r, d, seed=11)
    pool = pool_of(H, r, d, seed=12)
    with pytest.raises(ValueError, match="num_decode_tokens must equal num_decodes"):
        serving.vllm_forward(b, c, v, pool, VllmLinearAttentionMetadata(0, 0, 1, 3, ids([0, 3]), ids([3]),
                                                                         ids([0])), GAMMA)
    with pytest.raises(TypeError, match="num_prefills"):
        serving.vllm_forward(b, c, v, pool, VllmLinearAttentionMetadata(ids(1), 0, 3, 3, ids([0, 1, 2, 3]),
                                                                         ids([1, 1, 1]), ids([0, 1, 2])), GAMMA)
    with pytest.raises(ValueError, match="state_indices_tensor must have at least 3"):
        serving.vllm_forward(b, c, v, pool, VllmLinearAttentionMetadata(0, 0, 3, 3, ids([0, 1, 2, 3]),
                                                                         ids([1, 1, 1]), ids([0, 1])), GAMMA)


# --------------------------------------------------------------------------- SGLang


@pytest.mark.parametrize("transposed", [False, True])
def test_sglang_mixed_batch_prefills_first(dims, transposed):
    H, r, d = dims
    prefill_slots, prefill_lens, has_initial = [3, 8], [5, 2], [True, False]
    decode_slots = [1, -1, 6]  # a padding row among the decodes
    T = sum(prefill_lens) + len(decode_slots)
    b, c, v = tokens(T, H, r, d, seed=13)
    qsl = ids([0, 5, 7])
    meta = SglangBailingLinearMetadata(query_start_loc=qsl, mamba_cache_indices=ids(prefill_slots + decode_slots),
                                       num_prefills=2, num_prefill_tokens=7, num_decodes=3, batch_size=5,
                                       has_initial_states=torch.tensor(has_initial + [True] * 3, device=DEVICE),
                                       q_lengths=qsl.diff(), track_ssm_final_src=ids([3]),
                                       track_ssm_final_dst=ids([10]))
    pool = pool_of(H, r, d, seed=14, transposed=transposed)
    before = pool.clone()

    out = serving.sglang_forward(b, c, v, pool, meta, GAMMA)

    def expected(ref_pool):
        expect = torch.zeros_like(out)
        start = 0
        for slot, n, init in zip(prefill_slots, prefill_lens, has_initial):
            rows = slice(start, start + n)
            expect[rows] = alone_prefill(b[rows], c[rows], v[rows], ref_pool, slot, init)
            start += n
        for i, slot in enumerate(decode_slots):
            t = slice(7 + i, 8 + i)
            if slot >= 0:
                expect[t] = alone_decode(b[t], c[t], v[t], ref_pool, slot)
        ref_pool[10] = ref_pool[3]  # track_ssm_final_src -> dst
        return expect

    same_layout_as(pool, before, out, expected)
    untouched = [0, 2, 4, 5, 7, 9, 11]
    assert torch.equal(pool[untouched], before[untouched])


def test_sglang_target_verify_then_commit(dims):
    H, r, d = dims
    K = 2
    slots = ids([4, -1, 2])
    b, c, v = tokens(3 * K, H, r, d, seed=15)
    meta = SglangBailingLinearMetadata(query_start_loc=ids([0, 2, 4, 6]), mamba_cache_indices=slots,
                                       num_prefills=0, num_prefill_tokens=0, num_decodes=3, batch_size=3,
                                       has_initial_states=torch.ones(3, device=DEVICE), q_lengths=ids([2, 2, 2]))
    pool = pool_of(H, r, d, seed=16)
    before = pool.clone()
    out, kept = serving.sglang_target_verify(b, c, v, pool, meta, GAMMA, draft_token_num=K)
    serving.commit_accepted(pool, slots, kept, ids([1, 0, 2]))
    for row, slot, a in [(0, 4, 1), (2, 2, 2)]:  # each row alone, from its slot's state
        t = slice(row * K, (row + 1) * K)
        state = before[slot].clone().unsqueeze(0)
        o, _, states = leettriton.decode_tokens(one_row(b[t]), one_row(c[t]), one_row(v[t]), state, GAMMA,
                                                keep_states=True)
        assert torch.equal(out[t], o[0].transpose(0, 1))
        assert torch.equal(kept[row], states[0])
        assert torch.equal(pool[slot], states[0, :, a])
    assert torch.equal(out[K:2 * K], torch.zeros_like(out[K:2 * K]))
    assert torch.equal(pool[[0, 1, 3] + list(range(5, SLOTS))], before[[0, 1, 3] + list(range(5, SLOTS))])


def test_sglang_tracked_states_are_checkpoints(dims):
    """track_ssm_h_src / _dst (hybrid_linear_attn_backend.py _init_track_ssm_indices): entry e wants its row's
    state after (h_src[e] − the row's first state index)·C tokens of this extend in slot h_dst[e]."""
    H, r, d = dims
    C = 64
    lens, slots, initial = [150, 70, 100], [3, 8, 5], [True, True, False]
    # per-extend state counts ceil(len / C): 3, 2, 2 -> first state indices 0, 3, 5
    h_src, h_dst = ids([6, 2, 3]), ids([9, 10, 11])  # row 2 state 1, row 0 state 2, row 1 state 0 (its start)
    T = sum(lens) + 1
    b, c, v = tokens(T, H, r, d, seed=17)
    qsl = ids([0, 150, 220, 320])
    meta = SglangBailingLinearMetadata(query_start_loc=qsl, mamba_cache_indices=ids(slots + [1]), num_prefills=3,
                                       num_prefill_tokens=320, num_decodes=1, batch_size=4,
                                       has_initial_states=torch.tensor(initial + [True], device=DEVICE),
                                       q_lengths=qsl.diff(), track_ssm_h_src=h_src, track_ssm_h_dst=h_dst)
    pool = pool_of(H, r, d, seed=18)
    before = pool.clone()

    out = serving.sglang_forward(b, c, v, pool, meta, GAMMA, mamba_chunk_size=C)

    # the library's own calls, bit for bit: the start state copied, then one prefill with checkpoints every C
    ref_pool = before.clone()
    ref_pool[11] = before[8]
    table = torch.full((3, 319 // C), -1, dtype=torch.int64, device=DEVICE)
    table[0, 1], table[2, 0] = 10, 9
    expect = torch.empty_like(out)
    expect[:320] = leettriton.linear_attention_varlen(
        b[:320], c[:320], v[:320], qsl, GAMMA, state_pool=ref_pool, slot_ids=ids(slots),
        has_initial_state=torch.tensor(initial, device=DEVICE), checkpoint_every=C, checkpoint_slots=table)
    expect[320:] = alone_decode(b[320:], c[320:], v[320:], ref_pool, 1)
    assert torch.equal(out, expect)
    assert torch.equal(pool, ref_pool)
    # and what SGLang asks for: each tracked state is that of the row's first j·C tokens run alone
    tol = tolerance(torch.float32)
    for slot, start, n, from_slot, init in [(10, 0, 2 * C, 3, True), (9, 220, C, 5, False)]:
        alone = before.clone()
        rows = slice(start, start + n)
        alone_prefill(b[rows], c[rows], v[rows], alone, from_slot, init)
        assert_close(pool[slot], alone[from_slot], tol, f"tracked state in slot {slot}")
    assert torch.equal(pool[11], before[8])  # state 0: the extend's initial state
    untouched = [0, 2, 4, 6, 7]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("change, error, match", [
    (dict(chunk=None), TypeError, "mamba_chunk_size must be an int"),
    (dict(chunk=96), ValueError, "mamba_chunk_size must be a positive multiple of 64.*got 96"),
    (dict(chunk=0), ValueError, "mamba_chunk_size must be a positive multiple of 64.*got 0"),
    (dict(src=[1, 2]), ValueError, "track_ssm_h_src and track_ssm_h_dst must have one length"),
    (dict(src=None), ValueError, "track_ssm_h_src must be a 1-D int32/int64 tensor"),
    (dict(prefills=0), ValueError, "track_ssm_h_dst has 1 entries but num_prefills is 0"),
    (dict(src=[1], check=True), ValueError, "track_ssm_h_src must name states of the 1 prefills"),
])
def test_sglang_tracking_refusals(change, error, match):
    """Refused before any work: the pool is untouched."""
    H, r, d = 2, 16, 16
    b, c, v = tokens(4, H, r, d, seed=23)
    if change.get("prefills", 1):
        meta = SglangBailingLinearMetadata(query_start_loc=ids([0, 4]), mamba_cache_indices=ids([1]), num_prefills=1,
                                           num_prefill_tokens=4, num_decodes=0, batch_size=1,
                                           has_initial_states=torch.ones(1, dtype=torch.bool, device=DEVICE),
                                           q_lengths=ids([4]))
    else:  # four decodes
        meta = SglangBailingLinearMetadata(query_start_loc=ids([0, 1, 2, 3, 4]), mamba_cache_indices=ids([1, 2, 3, 4]),
                                           num_prefills=0, num_prefill_tokens=0, num_decodes=4, batch_size=4,
                                           has_initial_states=torch.ones(4, dtype=torch.bool, device=DEVICE),
                                           q_lengths=ids([1, 1, 1, 1]))
    meta.track_ssm_h_dst = ids([5])
    meta.track_ssm_h_src = None if change.get("src", 0) is None else ids(change.get("src", [0]))
    pool = pool_of(H, r, d, seed=24)
    before = pool.clone()
    with pytest.raises(error, match=match):
        serving.sglang_forward(b, c, v, pool, meta, GAMMA, mamba_chunk_size=change.get("chunk", 64),
                               check_indices=change.get("check", False))
    assert torch.equal(pool, before)


# --------------------------------------------------------------------------- rules


def test_adapters_read_no_tensor_value_on_the_host(monkeypatch):
    """No device sync: with the default check_indices=False nothing reads a tensor's value on the host
    (item, tolist, bool, int, float), from the first call on, on the kernel path (run here by the interpreter)."""
    H, r, d = 2, 16, 16
    b, c, v = tokens(9, H, r, d, seed=19)
    table = torch.full((4, 2), 99, dtype=torch.int32, device=DEVICE)
    table[:, 0] = ids([3, 1, 6, 8])
    meta = VllmLinearAttentionMetadata(2, 7, 2, 2, ids([0, 1, 2, 5, 9]), ids([4, 2, 3, 6]), table[:, 0])
    spec = VllmGDNSpecMetadata(0, 0, 0, 0, 3, 9, 9, num_accepted_tokens=ids([3, 1, 1]),
                               spec_state_indices_tensor=ids([[0, 1, 2], [4, 5, 7], [-1, -1, -1]]))
    sg = SglangBailingLinearMetadata(query_start_loc=ids([0, 7]), mamba_cache_indices=ids([2, 9, -1]), num_prefills=1,
                                     num_prefill_tokens=7, num_decodes=2, batch_size=3,
                                     has_initial_states=torch.tensor([True, True, True], device=DEVICE),
                                     q_lengths=ids([7]), track_ssm_final_src=ids([2]), track_ssm_final_dst=ids([10]))
    pool = pool_of(H, r, d, seed=20)
    tracked = SglangBailingLinearMetadata(query_start_loc=ids([0, 70, 75]), mamba_cache_indices=ids([2, 4]),
                                          num_prefills=2, num_prefill_tokens=75, num_decodes=0, batch_size=2,
                                          has_initial_states=torch.tensor([True, True], device=DEVICE),
                                          q_lengths=ids([70, 5]), track_ssm_h_src=ids([1, 2]),
                                          track_ssm_h_dst=ids([11, 10]))  # a checkpoint, and a start state
    long = tokens(75, H, r, d, seed=25)
    chunk = functools.partial(serving.sglang_forward, mamba_chunk_size=64)
    runs = ((meta, serving.vllm_forward, (b, c, v)), (spec, serving.vllm_spec_decode, (b, c, v)),
            (sg, serving.sglang_forward, (b, c, v)), (tracked, chunk, long))

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    for meta_, run, inputs in runs:
        run(*inputs, pool, meta_, GAMMA)
        with pytest.raises(AssertionError, match="on the host"):  # the value checks do read: the guard works
            run(*inputs, pool, meta_, GAMMA, check_indices=True)


def test_bad_arguments_are_named():
    H, r, d = 2, 16, 16
    b, c, v = tokens(3, H, r, d, seed=21)
    pool = pool_of(H, r, d, seed=22)
    meta = SglangBailingLinearMetadata(query_start_loc=ids([0, 2]), mamba_cache_indices=ids([1]), num_prefills=1,
                                       num_prefill_tokens=2, num_decodes=1, batch_size=2,
                                       has_initial_states=torch.ones(2, dtype=torch.bool, device=DEVICE),
                                       q_lengths=ids([2]))
    with pytest.raises(ValueError, match="mamba_cache_indices must have at least 2"):
        serving.sglang_forward(b, c, v, pool, meta, GAMMA)
    meta.mamba_cache_indices = ids([1, 4])
    with pytest.raises(ValueError, match=r"out must be \(3, 2, 16\)"):
        serving.sglang_forward(b, c, v, pool, meta, GAMMA, out=torch.empty(3, H, d + 1, device=DEVICE))
    with pytest.raises(ValueError, match="num_prefills must be ≥ 0"):
        serving.vllm_forward(b, c, v, pool, VllmLinearAttentionMetadata(-1, 0, 3, 3, ids([0, 1, 2, 3]), ids([1] * 3),
                                                                         ids([0, 1, 2])), GAMMA)
    with pytest.raises(TypeError, match="num_accepted_tokens must be a torch.Tensor"):
        serving.commit_accepted(pool, ids([0]), torch.zeros(1, H, 2, r, d, device=DEVICE), [1])
    with pytest.raises(ValueError, match="spec_state_indices_tensor must be a 2-D tensor"):
        serving.vllm_spec_decode(b, c, v, pool, VllmGDNSpecMetadata(0, 0, 0, 0, 3, 3, 3, num_accepted_tokens=ids([1]),
                                                                    spec_state_indices_tensor=ids([0, 1, 2])), GAMMA)
