"""Serving: packed variable-length prefill into a state pool, slotted decode, the k-token step.

Every packed sequence must equal the float64 oracle run on it alone; slots no call names must stay
bit-identical; padding rows must output zeros and touch no state (docs/design.md §13).
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from conftest import DEVICE
from helpers import assert_close, tolerance

GAMMA = (0.9, 0.995, 1.0)


def packed_inputs(lens, H, r, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    b, c = (torch.randn(T, H, r, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(2))
    v = torch.randn(T, H, d, generator=g).to(device=DEVICE, dtype=dtype)
    cu = torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEVICE)
    return b, c, v, cu


def one_sequence(x, start, end):
    """Rows [start, end) of a packed (T, H, dim) tensor as a (1, H, n, dim) batch of one."""
    return x[start:end].permute(1, 0, 2).unsqueeze(0)


def oracle(b, c, v, cu, gamma, initial):
    """Per sequence: the oracle's (T, H, d) output rows and final state, run on each sequence alone."""
    outs, states = [], []
    bounds = cu.tolist()
    for i in range(len(bounds) - 1):
        s, e = bounds[i], bounds[i + 1]
        o, st = leettriton.reference(one_sequence(b, s, e), one_sequence(c, s, e), one_sequence(v, s, e), gamma,
                                     initial_state=initial[i], return_state=True)
        outs.append(o[0].permute(1, 0, 2))
        states.append(st[0])
    return torch.cat(outs, 0), states


CASES = {
    # lengths: zero-length first, in the middle and last; shorter than one chunk (16 rows under the
    # interpreter) and spanning several; r = 130 takes four key tiles of the walk
    "mixed-f32": dict(lens=[0, 5, 70, 0, 1, 33, 16, 0], r=40, d=36, dtype=torch.float32),
    "mixed-f16": dict(lens=[17, 0, 3, 64], r=24, d=20, dtype=torch.float16),
    "wide-r-bf16": dict(lens=[9, 40, 0], r=130, d=12, dtype=torch.bfloat16),
    # past the walk's 256 keys: three pieces of r chained through float32 partial outputs (kernels/pieces.py)
    "pieces-of-r-f16": dict(lens=[9, 0, 40], r=520, d=12, dtype=torch.float16),
}


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "no-pool"])
@pytest.mark.parametrize("name", list(CASES))
def test_varlen_each_sequence_equals_oracle(name, pool):
    case = CASES[name]
    lens, r, d, dtype = case["lens"], case["r"], case["d"], case["dtype"]
    H, N = 3, len(lens)
    b, c, v, cu = packed_inputs(lens, H, r, d, dtype, seed=len(name))
    gamma = torch.tensor(GAMMA, device=DEVICE)
    tol = tolerance(dtype)
    if not pool:
        out, states = leettriton.linear_attention_varlen(b, c, v, cu, gamma, return_state=True)
        ref, ref_states = oracle(b, c, v, cu, gamma, [None] * N)
        assert_close(out, ref, tol, f"{name}: packed output")
        assert states.shape == (N, H, r, d) and states.dtype == torch.float32
        for i in range(N):
            assert_close(states[i], ref_states[i], tol, f"{name}: final state of sequence {i} (length {lens[i]})")
        return
    slots = 2 * N + 1
    g = torch.Generator().manual_seed(5)
    state_pool = torch.randn(slots, H, r, d, generator=g).to(DEVICE)
    before = state_pool.clone()
    slot_ids = torch.randperm(slots, generator=g)[:N].to(DEVICE)
    has_initial = (torch.arange(N) % 2 == 0).to(DEVICE)  # every other sequence continues from its slot
    out = leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=state_pool, slot_ids=slot_ids,
                                             has_initial_state=has_initial)
    initial = [before[s:s + 1] if bool(f) else None for s, f in zip(slot_ids.tolist(), has_initial.tolist())]
    ref, ref_states = oracle(b, c, v, cu, gamma, initial)
    assert_close(out, ref, tol, f"{name}: packed output from pool states")
    for i, s in enumerate(slot_ids.tolist()):
        assert_close(state_pool[s], ref_states[i], tol, f"{name}: slot {s} after sequence {i} (length {lens[i]})")
    untouched = sorted(set(range(slots)) - set(slot_ids.tolist()))
    assert torch.equal(state_pool[untouched], before[untouched]), "slots no sequence names must stay bit-identical"


def test_varlen_float16_pool_state_out_of_float16_range():
    """A packed float16 walk whose first sequence's state leaves float16's range walks that sequence again,
    scaled (docs/design.md §2.3), from the same slot: the pool is written only by the walk that holds, so
    the second walk starts from the state the sequence started from, not the first walk's final one."""
    H, r, d = 2, 96, 24  # r > 64: the checked walk (docs/design.md §2.3)
    lens = [130, 70, 0, 41]
    b, c, v, cu = packed_inputs(lens, H, r, d, torch.float16, seed=11)
    first = slice(0, lens[0])
    b[first] = b[first] * 1e-3   # the first sequence: a state past 65 504 from large c and v ...
    c[first] = (c[first].float().abs() * 40).to(torch.float16)
    v[first] = (v[first].float().abs() * 40).to(torch.float16)
    gamma = torch.tensor([1.0, 0.999], device=DEVICE)
    slot_ids = torch.tensor([2, 0, 1, 3], device=DEVICE)
    state_pool = torch.randn(4, H, r, d, generator=torch.Generator().manual_seed(2)).to(DEVICE) * 1e3
    has_initial = torch.tensor([True, True, False, True], device=DEVICE)
    before = state_pool.clone()
    out = leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=state_pool, slot_ids=slot_ids,
                                             has_initial_state=has_initial)
    initial = [before[s:s + 1] if bool(f) else None for s, f in zip(slot_ids.tolist(), has_initial.tolist())]
    ref, ref_states = oracle(b, c, v, cu, gamma, initial)
    assert ref_states[0].abs().max() > 65504 and ref.abs().max() < 6e4  # the state, not the output, is out of range
    tol = tolerance(torch.float16)
    assert_close(out, ref, tol, "packed float16 output, one sequence's state past float16's range")
    for i, s in enumerate(slot_ids.tolist()):
        assert_close(state_pool[s], ref_states[i], tol, f"slot {s} after sequence {i}")


def test_varlen_negative_slot_and_twin_path():
    """A negative slot starts from zero and keeps no state; the '_torch' twin path gives the same answer."""
    lens = [6, 0, 21, 2]
    H, r, d, N = 2, 16, 8, 4
    b, c, v, cu = packed_inputs(lens, H, r, d, torch.float32, seed=3)
    state_pool = torch.randn(5, H, r, d, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    before = state_pool.clone()
    slot_ids = torch.tensor([3, 0, -1, 4], device=DEVICE)
    flags = torch.tensor([1, 1, 1, 0], dtype=torch.int32, device=DEVICE)  # integer flags work too
    pools = {}
    for method in ("auto", "lightning_attention_torch"):
        pools[method] = before.clone()
        out = leettriton.linear_attention_varlen(b, c, v, cu, 0.9, method=method, state_pool=pools[method],
                                                 slot_ids=slot_ids, has_initial_state=flags)
        initial = [before[3:4], before[0:1], None, None]
        ref, ref_states = oracle(b, c, v, cu, 0.9, initial)
        assert_close(out, ref, 1e-5, f"{method}: output with a negative slot")
        for i, s in enumerate(slot_ids.tolist()):
            if s >= 0:
                assert_close(pools[method][s], ref_states[i], 1e-5, f"{method}: slot {s}")
        assert torch.equal(pools[method][[1, 2]], before[[1, 2]]), f"{method}: slots 1, 2 must be untouched"
    assert_close(pools["auto"], pools["lightning_attention_torch"], 1e-5, "kernel pool vs twin pool")


def test_varlen_zero_length_writes_initial_or_zero():
    """An empty sequence's final state is its initial state (or zero): §1.4, per sequence."""
    H, r, d = 1, 8, 8
    b, c, v, cu = packed_inputs([0, 0, 4], H, r, d, torch.float32, seed=4)
    state_pool = torch.full((3, H, r, d), 7.0, device=DEVICE)
    leettriton.linear_attention_varlen(b, c, v, cu, state_pool=state_pool, slot_ids=torch.tensor([2, 0, 1],
                                       device=DEVICE), has_initial_state=torch.tensor([True, False, False],
                                                                                      device=DEVICE))
    assert torch.equal(state_pool[2], torch.full((H, r, d), 7.0, device=DEVICE)), "continued, empty: unchanged"
    assert torch.equal(state_pool[0], torch.zeros(H, r, d, device=DEVICE)), "fresh, empty: zero"


# --------------------------------------------------------------------------- decode


def decode_inputs(B, H, k, r, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    b, c = (torch.randn(B, H, k, r, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, k, d, generator=g).to(device=DEVICE, dtype=dtype)
    return b, c, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_slotted_decode_equals_per_sequence_decode(dtype):
    B, H, r, d, slots = 5, 2, 40, 36, 9
    b, c, v = decode_inputs(B, H, 1, r, d, dtype, seed=7)
    gamma = torch.tensor([0.9, 1.0], device=DEVICE)
    state_pool = torch.randn(slots, H, r, d, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    before = state_pool.clone()
    slot_ids = torch.tensor([6, -1, 0, 3, -5], dtype=torch.int32, device=DEVICE)
    o_t, same = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state_pool, gamma, slot_ids=slot_ids)
    assert same is state_pool and o_t.shape == (B, H, d) and o_t.dtype == dtype
    for i, s in enumerate(slot_ids.tolist()):
        if s < 0:
            assert torch.equal(o_t[i], torch.zeros_like(o_t[i])), f"padding row {i} must output zeros"
            continue
        state = before[s:s + 1].clone()
        o_one, _ = leettriton.decode_step(b[i:i + 1, :, 0], c[i:i + 1, :, 0], v[i:i + 1, :, 0], state, gamma)
        assert_close(o_t[i:i + 1], o_one.float(), 1e-6, f"row {i} (slot {s}) vs its own decode_step")
        assert_close(state_pool[s:s + 1], state, 1e-6, f"slot {s} vs its own decode_step")
    untouched = [1, 2, 4, 5, 7, 8]
    assert torch.equal(state_pool[untouched], before[untouched]), "padding rows and unnamed slots: untouched"


def test_decode_tokens_keep_states_and_rollback():
    """k tokens in one call equal k single steps; rolling back to an accepted prefix and going on equals
    the oracle over the accepted tokens alone."""
    B, H, k, r, d, slots = 3, 2, 4, 24, 20, 6
    b, c, v = decode_inputs(B, H, k, r, d, torch.float32, seed=8)
    gamma = torch.tensor([0.95, 0.8], device=DEVICE)
    state_pool = torch.randn(slots, H, r, d, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    before = state_pool.clone()
    slot_ids = torch.tensor([4, -1, 1], device=DEVICE)
    o, same, states = leettriton.decode_tokens(b, c, v, state_pool, gamma, slot_ids=slot_ids, keep_states=True)
    assert same is state_pool and o.shape == (B, H, k, d) and states.shape == (B, H, k + 1, r, d)
    for i, s in ((0, 4), (2, 1)):
        state = before[s:s + 1].clone()
        assert torch.equal(states[i, :, 0], before[s]), "states[:, :, 0] is the state before the call"
        for t in range(k):
            o_one, _ = leettriton.decode_step(b[i:i + 1, :, t], c[i:i + 1, :, t], v[i:i + 1, :, t], state, gamma)
            assert_close(o[i:i + 1, :, t], o_one, 1e-6, f"row {i} token {t} vs single steps")
            assert_close(states[i:i + 1, :, t + 1], state, 1e-6, f"row {i} kept state after token {t}")
        assert_close(state_pool[s:s + 1], state, 1e-6, f"slot {s} after k tokens")
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.equal(states[1], torch.zeros_like(states[1]))
    assert torch.equal(state_pool[[0, 2, 3, 5]], before[[0, 2, 3, 5]])

    # roll back: row 0 accepts 2 tokens, row 2 accepts none; then one more token each
    accepted = torch.tensor([2, 0, 0], device=DEVICE)
    live = slot_ids >= 0
    state_pool[slot_ids[live]] = states[torch.arange(B, device=DEVICE)[live], :, accepted[live]]
    nb, nc, nv = decode_inputs(B, H, 1, r, d, torch.float32, seed=9)
    o_next, _ = leettriton.decode_step(nb[:, :, 0], nc[:, :, 0], nv[:, :, 0], state_pool, gamma, slot_ids=slot_ids)
    for i, s, a in ((0, 4, 2), (2, 1, 0)):
        tokens = [torch.cat([x[i:i + 1, :, :a], y[i:i + 1]], 2) for x, y in ((b, nb), (c, nc), (v, nv))]
        ref, ref_state = leettriton.reference(*tokens, gamma, initial_state=before[s:s + 1], return_state=True)
        assert_close(o_next[i:i + 1], ref[:, :, -1], 1e-5, f"row {i}: next token after accepting {a}")
        assert_close(state_pool[s:s + 1], ref_state, 1e-5, f"slot {s} after rollback to {a} and one token")


def test_decode_tokens_without_slots_and_unchecked_out_of_range():
    """A rectangular k-token step; an id past the pool with checks skipped gives NaN rows and no write."""
    B, H, k, r, d = 2, 1, 3, 8, 8
    b, c, v = decode_inputs(B, H, k, r, d, torch.float32, seed=10)
    state = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    s0 = state.clone()
    o, _ = leettriton.decode_tokens(b, c, v, state, 0.9)
    ref, ref_state = leettriton.reference(b, c, v, 0.9, initial_state=s0, return_state=True)
    assert_close(o, ref, 1e-5, "rectangular k-token step")
    assert_close(state, ref_state, 1e-5, "rectangular k-token state")
    pool = s0.clone()
    o_bad, _ = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], pool, 0.9,
                                      slot_ids=torch.tensor([0, 9], device=DEVICE), check_slots=False)
    assert torch.isnan(o_bad[1]).all() and torch.isfinite(o_bad[0]).all()
    assert torch.equal(pool[1], s0[1]), "an out-of-range id touches no state"


def test_varlen_prefill_then_slotted_decode():
    """Prefill prompts of different lengths into their slots, then decode them all in one slotted step."""
    lens, H, r, d = [11, 0, 30], 2, 16, 24
    b, c, v, cu = packed_inputs(lens, H, r, d, torch.float32, seed=12)
    gamma = torch.tensor([0.97, 1.0], device=DEVICE)
    state_pool = torch.zeros(4, H, r, d, device=DEVICE)
    slot_ids = torch.tensor([2, 0, 3], device=DEVICE)
    leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=state_pool, slot_ids=slot_ids)
    nb, nc, nv = decode_inputs(3, H, 1, r, d, torch.float32, seed=13)
    o_t, _ = leettriton.decode_step(nb[:, :, 0], nc[:, :, 0], nv[:, :, 0], state_pool, gamma, slot_ids=slot_ids)
    bounds = cu.tolist()
    for i in range(3):
        s, e = bounds[i], bounds[i + 1]
        seq = [torch.cat([one_sequence(x, s, e), y[i:i + 1]], 2) for x, y in ((b, nb), (c, nc), (v, nv))]
        ref, ref_state = leettriton.reference(*seq, gamma, return_state=True)
        assert_close(o_t[i:i + 1], ref[:, :, -1], 1e-5, f"sequence {i}: first decoded token")
        assert_close(state_pool[slot_ids[i]][None], ref_state, 1e-5, f"sequence {i}: state after decode")


# --------------------------------------------------------------------------- validation


def _varlen_call(**change):
    H, r, d = 2, 8, 8
    b, c, v, cu = packed_inputs([3, 0, 5], H, r, d, torch.float32, seed=0)
    args = dict(b=b, c=c, v=v, cu_seqlens=cu, state_pool=torch.zeros(4, H, r, d, device=DEVICE),
                slot_ids=torch.tensor([0, 1, 2], device=DEVICE), has_initial_state=None)
    args.update(change)
    return lambda: leettriton.linear_attention_varlen(args.pop("b"), args.pop("c"), args.pop("v"),
                                                      args.pop("cu_seqlens"), **args)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


VARLEN_ERRORS = {
    "cu-not-from-0": (dict(cu_seqlens=_i32(1, 3, 3, 8)), ValueError, r"cu_seqlens must start at 0"),
    "cu-decreasing": (dict(cu_seqlens=_i32(0, 5, 3, 8)), ValueError, r"non-decreasing.*cu_seqlens\[1\] = 5"),
    "cu-past-T": (dict(cu_seqlens=_i32(0, 3, 3, 9)), ValueError, r"end at most at .* T = 8"),   # rows past it: padding
    "cu-float": (dict(cu_seqlens=torch.tensor([0.0, 3.0, 3.0, 8.0])), TypeError, r"cu_seqlens must be int32 or int64"),
    "cu-2d": (dict(cu_seqlens=_i32(0, 3, 3, 8)[None]), ValueError, r"cu_seqlens must have shape 1-D"),
    "cu-device": (dict(cu_seqlens=torch.tensor([0, 3, 3, 8], device="meta")), ValueError,
                  r"cu_seqlens must be on the inputs' device"),
    "slot-out-of-range": (dict(slot_ids=_i32(0, 4, 2)), ValueError, r"below the pool's 4 slots.*slot_ids\[1\] = 4"),
    "slot-repeated": (dict(slot_ids=_i32(2, 1, 2)), ValueError, r"must not repeat a slot.*slot 2"),
    "slot-length": (dict(slot_ids=_i32(0, 1)), ValueError, r"slot_ids must have shape \(3,\)"),
    "slot-missing": (dict(slot_ids=None), ValueError, r"state_pool needs slot_ids"),
    "pool-dtype": (dict(state_pool=torch.zeros(4, 2, 8, 8, dtype=torch.float16, device=DEVICE)), TypeError,
                   r"state_pool must be float32"),
    "pool-shape": (dict(state_pool=torch.zeros(4, 2, 8, 9, device=DEVICE)), ValueError,
                   r"state_pool must have shape \(slots, heads, r, d\) = \(slots, 2, 8, 8\)"),
    "initial-length": (dict(has_initial_state=torch.tensor([True, False], device=DEVICE)), ValueError,
                       r"has_initial_state must have shape \(3,\)"),
    "initial-float": (dict(has_initial_state=torch.ones(3, device=DEVICE)), TypeError,
                      r"has_initial_state must be a bool"),
    "initial-without-pool": (dict(state_pool=None, slot_ids=None, has_initial_state=torch.ones(3, dtype=torch.bool)),
                             ValueError, r"has_initial_state needs a state_pool"),
    "b-4d": (dict(b=torch.zeros(1, 8, 2, 8)), ValueError, r"b must be 3-D \(T, heads, dim\)"),
}


@pytest.mark.parametrize("name", list(VARLEN_ERRORS))
def test_varlen_validation(name, monkeypatch):
    change, error, message = VARLEN_ERRORS[name]
    from leettriton.kernels import walk

    def no_launch(*args, **kwargs):
        raise AssertionError("launched before the arguments were checked")

    monkeypatch.setattr(walk, "_launch_varlen_walk", no_launch)
    with pytest.raises(error, match=message):
        _varlen_call(**change)()


def test_varlen_unknown_native_path():
    with pytest.raises(NotImplementedError, match="no packed .* path"):
        _varlen_call(method="vanilla")()


DECODE_ERRORS = {
    "slot-out-of-range": (dict(slot_ids=_i32(0, 3)), ValueError, r"below the pool's 3 slots"),
    "slot-repeated": (dict(slot_ids=_i32(1, 1)), ValueError, r"must not repeat a slot"),
    "slot-float": (dict(slot_ids=torch.tensor([0.0, 1.0])), TypeError, r"slot_ids must be int32 or int64"),
    "slot-length": (dict(slot_ids=_i32(0, 1, 2)), ValueError, r"slot_ids must have shape \(2,\)"),
    "pool-shape": (dict(state=torch.zeros(3, 2, 8)), ValueError, r"state must have shape \(slots, heads, r, d\)"),
}


@pytest.mark.parametrize("name", list(DECODE_ERRORS))
def test_slotted_decode_validation(name):
    change, error, message = DECODE_ERRORS[name]
    b, c, v = decode_inputs(2, 1, 1, 8, 8, torch.float32, seed=0)
    args = dict(state=torch.zeros(3, 1, 8, 8, device=DEVICE), slot_ids=_i32(0, 2))
    args.update(change)
    with pytest.raises(error, match=message):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], args["state"], 0.9, slot_ids=args["slot_ids"])


def test_decode_tokens_validation():
    b, c, v = decode_inputs(2, 1, 3, 8, 8, torch.float32, seed=0)
    state = torch.zeros(2, 1, 8, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"v must match b in batch, heads and k"):
        leettriton.decode_tokens(b, c, v[:, :, :2], state)
    with pytest.raises(ValueError, match=r"k ≥ 1"):
        leettriton.decode_tokens(b[:, :, :0], c[:, :, :0], v[:, :, :0], state)
    with pytest.raises(TypeError, match=r"keep_states must be a bool"):
        leettriton.decode_tokens(b, c, v, state, keep_states=1)
