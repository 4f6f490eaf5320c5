"""A serving engine's mixed batch in one call (docs/serving.md §13.8): prefills and one-token decodes packed in
fixed-size buffers (padding tokens past ``cu_seqlens[-1]``, padding sequences with slot −1), a preallocated
``out=``, no index check (nothing read on the host), against the separate calls; and the ``out=`` argument's
checks."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import leettriton

from conftest import DEVICE
from helpers import assert_close, tolerance

H, R, D, SLOTS = 2, 8, 8, 9
MAX_TOKENS, MAX_SEQS = 64, 8
GAMMA = (0.9, 0.99)


def _batch(seed: int = 0):
    """Two prefills (lengths 13 and 20, one from its slot's state) and three decodes, then padding: the tokens
    in a (MAX_TOKENS, …) buffer, the offsets in a (MAX_SEQS + 1,) one; every padding value a huge number."""
    g = torch.Generator().manual_seed(seed)
    lengths, slots, initial = [13, 20, 1, 1, 1], [4, 0, 7, 2, 5], [False, True, True, True, True]
    used = sum(lengths)
    b, c, v = (torch.full((MAX_TOKENS, H, w), 1e30) for w in (R, R, D))
    for x in (b, c, v):
        x[:used] = torch.randn(used, H, x.shape[-1], generator=g)
    cu = torch.full((MAX_SEQS + 1,), used, dtype=torch.int32)
    cu[:len(lengths) + 1] = torch.tensor([0] + lengths).cumsum(0)
    slot_ids = torch.full((MAX_SEQS,), -1, dtype=torch.int64)
    slot_ids[:len(slots)] = torch.tensor(slots)
    flags = torch.zeros(MAX_SEQS, dtype=torch.bool)
    flags[:len(initial)] = torch.tensor(initial)
    pool = torch.randn(SLOTS, H, R, D, generator=g)
    to = (lambda x: x.to(DEVICE))
    return (to(b), to(c), to(v), to(cu), to(slot_ids), to(flags), to(pool), torch.tensor(GAMMA, device=DEVICE),
            lengths, slots, initial)


def test_one_call_equals_the_separate_prefills_and_decodes():
    b, c, v, cu, slot_ids, flags, pool, gamma, lengths, slots, initial = _batch()
    out = torch.full((MAX_TOKENS, H, D), 7.0, device=DEVICE)
    got_pool = pool.clone()
    res = leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=got_pool, slot_ids=slot_ids,
                                             has_initial_state=flags, check_indices=False, out=out)
    assert res is out
    used = sum(lengths)
    assert torch.equal(out[used:], torch.full_like(out[used:], 7.0)), "padding rows of out were written"

    # the separate calls: each prefill alone from its slot (or zero), then the decodes in one decode_step
    want_pool = pool.clone()
    start = 0
    for n, slot, init in zip(lengths[:2], slots[:2], initial[:2]):
        rows = slice(start, start + n)
        s0 = want_pool[slot:slot + 1].clone() if init else None
        o, s = leettriton.linear_attention(*(x[rows].transpose(0, 1).unsqueeze(0) for x in (b, c, v)), gamma,
                                           initial_state=s0, return_state=True)
        assert_close(out[rows], o[0].transpose(0, 1), tolerance(torch.float32), f"prefill of slot {slot}")
        want_pool[slot] = s[0]
        start += n
    dec = slice(start, start + 3)
    o_t, _ = leettriton.decode_step(b[dec], c[dec], v[dec], want_pool, gamma,
                                    slot_ids=torch.tensor(slots[2:], device=DEVICE))
    assert_close(out[dec], o_t, tolerance(torch.float32), "the decodes")
    assert_close(got_pool, want_pool, tolerance(torch.float32), "the pool")
    untouched = [k for k in range(SLOTS) if k not in slots]
    assert torch.equal(got_pool[untouched], pool[untouched]), "a slot no sequence names changed"


def test_out_is_checked_before_any_work():
    b, c, v, cu, slot_ids, flags, pool, gamma, *_ = _batch()
    before = pool.clone()
    kw = dict(state_pool=pool, slot_ids=slot_ids, has_initial_state=flags, check_indices=False)
    with pytest.raises(ValueError, match=r"out must be a torch.float32 tensor of shape \(T, heads, d\)"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, out=torch.empty(MAX_TOKENS, H, D + 1, device=DEVICE),
                                           **kw)
    with pytest.raises(ValueError, match=r"out is written in place, so its elements must not overlap"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, out=torch.empty(1, H, D, device=DEVICE).expand(
            MAX_TOKENS, H, D), **kw)
    with pytest.raises(ValueError, match=r"out is written in place, so it must not share memory with v"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, out=v, **kw)
    with pytest.raises(TypeError, match=r"out must be None or a tensor"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, out=[0.0], **kw)
    assert torch.equal(pool, before)


def test_offsets_past_the_tokens_are_refused_when_checked():
    b, c, v, cu, slot_ids, flags, pool, gamma, *_ = _batch()
    cu = cu.clone()
    cu[-1] = MAX_TOKENS + 1
    with pytest.raises(ValueError, match=r"cu_seqlens must end at most at the number of packed tokens T = 64"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slot_ids,
                                           has_initial_state=flags)


def test_the_compiled_call_writes_out_in_place():
    b, c, v, cu, slot_ids, flags, pool, gamma, *_ = _batch()

    def step(b, c, v, pool, out):
        return leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slot_ids,
                                                  has_initial_state=flags, check_indices=False, out=out)

    torch._dynamo.reset()
    pool_e, out_e = pool.clone(), torch.zeros(MAX_TOKENS, H, D, device=DEVICE)
    pool_c, out_c = pool.clone(), torch.zeros(MAX_TOKENS, H, D, device=DEVICE)
    step(b, c, v, pool_e, out_e)
    res = torch.compile(step, fullgraph=True, backend="aot_eager")(b, c, v, pool_c, out_c)
    torch._dynamo.reset()
    assert res is out_c or torch.equal(res, out_c)
    assert torch.equal(out_c, out_e) and torch.equal(pool_c, pool_e)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_the_mixed_batch_is_captured_in_a_cuda_graph():
    b, c, v, cu, slot_ids, flags, pool, gamma, *_ = _batch()
    out, graph_pool = torch.zeros(MAX_TOKENS, H, D, device=DEVICE), pool.clone()

    def step():
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=graph_pool, slot_ids=slot_ids,
                                           has_initial_state=flags, check_indices=False, out=out)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):   # warm-up off the capture (compiles, tunes)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    graph_pool.copy_(pool)
    with torch.cuda.graph(graph):
        step()
    graph_pool.copy_(pool)
    out.zero_()
    graph.replay()
    want_pool, want = pool.clone(), torch.zeros_like(out)
    leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=want_pool, slot_ids=slot_ids,
                                       has_initial_state=flags, check_indices=False, out=want)
    assert torch.equal(out, want) and torch.equal(graph_pool, want_pool)
