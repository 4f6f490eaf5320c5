"""Hostile inputs to the serving entry points and the γ check (issue 68, items 1, 2, 7 and 8's distributed case).

* Index tensors with strides (``ids[::2]``) are read as they are: every entry point takes them contiguous
  at its boundary, so the pool slots it touches are exactly the intended ones and its results equal the
  contiguous call's bit for bit, on the PyTorch path and on the Triton kernels (docs/design.md §13.3).
* Writable tensors (decode's state, the pools) whose elements overlap, or that share memory with what the
  call reads, are refused with a ValueError naming them, before anything is written.
* A γ rewritten behind its version counter (through NumPy) is refused on every path, the ``_torch``
  methods under the interpreter included; the PyTorch paths' λ is NaN for a γ outside (0, 1], as the
  kernels' is (docs/design.md §2.6).
* ``leettriton.distributed``: an initial state given on a rank other than 0 while rank 0 has none raises on
  every rank.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.multiprocessing as mp

import leettriton
import leettriton.api as api
import leettriton.distributed
from leettriton.plan import clear_plans
from leettriton.problem import make_problem
from leettriton.registry import torch_method
from conftest import DEVICE

H, R, D, SLOTS = 2, 6, 5, 7


def _strided(values, dtype=torch.int64):
    """``values`` as every other entry of a tensor twice as long (stride 2), the others garbage."""
    spread = []
    for x in values:
        spread += [x, 99 if dtype != torch.bool else (not x)]
    return torch.tensor(spread, dtype=dtype, device=DEVICE)[::2]


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


@pytest.fixture(params=["kernel", "torch"])
def decode_path(request, monkeypatch):
    """The decode steps' two CPU paths: the Triton kernels (under the interpreter) and the PyTorch step that
    CPU tensors run outside it.  The signature caches start empty, so no launch of the other path repeats."""
    monkeypatch.setattr(api, "_DECODE_STEPS", {})
    monkeypatch.setattr(api, "_TOKEN_STEPS", {})
    if request.param == "torch":
        if DEVICE != "cpu":
            pytest.skip("the PyTorch decode step is the path of CPU tensors")
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    return request.param


VARLEN_METHODS = ["lightning_attention", "lightning_attention_torch"]


def _varlen_inputs():
    T = 20
    b, c, v = _randn(T, H, R, seed=1), _randn(T, H, R, seed=2), _randn(T, H, D, seed=3)
    return b, c, v, torch.tensor([0, 4, 11, 20], dtype=torch.int32, device=DEVICE)


# --------------------------------------------------------------------------- 1. index tensors with strides

@pytest.mark.parametrize("method", VARLEN_METHODS)
@pytest.mark.parametrize("which", ["slot_ids", "cu_seqlens", "has_initial_state"])
def test_varlen_strided_index_equals_the_contiguous_call(method, which):
    b, c, v, cu = _varlen_inputs()
    pool0 = _randn(SLOTS, H, R, D, seed=4)
    ids, flags = [3, 5, 6], [True, False, True]
    contiguous = dict(cu_seqlens=cu, slot_ids=torch.tensor(ids, device=DEVICE),
                      has_initial_state=torch.tensor(flags, device=DEVICE))
    strided = dict(contiguous)
    strided[which] = (_strided(cu.tolist(), torch.int32) if which == "cu_seqlens" else
                      _strided(ids) if which == "slot_ids" else _strided(flags, torch.bool))
    assert not strided[which].is_contiguous()
    results = []
    for kwargs in (contiguous, strided):
        pool = pool0.clone()
        o = leettriton.linear_attention_varlen(b, c, v, kwargs["cu_seqlens"], 0.9, method=method, state_pool=pool,
                                               slot_ids=kwargs["slot_ids"],
                                               has_initial_state=kwargs["has_initial_state"])
        touched = [k for k in range(SLOTS) if not torch.equal(pool[k], pool0[k])]
        assert touched == ids, f"{which} strided: slots {touched} changed, expected {ids}"
        results.append((o, pool))
    assert torch.equal(results[0][0], results[1][0]), "output differs from the contiguous call"
    assert torch.equal(results[0][1], results[1][1]), "pool differs from the contiguous call"


@pytest.mark.parametrize("method", VARLEN_METHODS)
def test_varlen_expanded_slot_ids_are_checked_as_read(method):
    """An expanded slot_ids names one slot for every sequence: the duplicate check sees what is read."""
    b, c, v, cu = _varlen_inputs()
    pool = _randn(SLOTS, H, R, D, seed=4)
    before = pool.clone()
    ids = torch.tensor([2], device=DEVICE).expand(3)
    with pytest.raises(ValueError, match="slot_ids must not repeat a slot"):
        leettriton.linear_attention_varlen(b, c, v, cu, 0.9, method=method, state_pool=pool, slot_ids=ids)
    assert torch.equal(pool, before)


def _decode_inputs(k=None, B=3, seed=10):
    shape = (B, H) if k is None else (B, H, k)
    return _randn(*shape, R, seed=seed), _randn(*shape, R, seed=seed + 1), _randn(*shape, D, seed=seed + 2)


@pytest.mark.parametrize("entry", ["decode_step", "decode_tokens"])
def test_decode_strided_slot_ids_touch_exactly_the_named_slots(entry, decode_path):
    b, c, v = _decode_inputs(None if entry == "decode_step" else 2)
    pool0 = _randn(SLOTS, H, R, D, seed=20)
    ids = [3, 5, 6]
    gamma = torch.tensor([0.9, 0.7], device=DEVICE)
    fn = getattr(leettriton, entry)
    results = []
    # the strided call twice: the second one through the signature's repeated launch
    for slot_ids in (torch.tensor(ids, device=DEVICE), _strided(ids), _strided(ids)):
        pool = pool0.clone()
        o = fn(b, c, v, pool, gamma, slot_ids=slot_ids)[0]
        touched = [k for k in range(SLOTS) if not torch.equal(pool[k], pool0[k])]
        assert touched == ids, f"slots {touched} changed, expected {ids}"
        results.append((o, pool))
    for o, pool in results[1:]:
        assert torch.equal(o, results[0][0]), "output differs from the contiguous call"
        assert torch.equal(pool, results[0][1]), "pool differs from the contiguous call"


def test_decode_strided_slot_ids_after_a_contiguous_call_of_the_signature(decode_path):
    """A contiguous call stores the signature's launch first; a strided call then must not reuse it raw."""
    b, c, v = _decode_inputs()
    pool0 = _randn(SLOTS, H, R, D, seed=21)
    pool = pool0.clone()
    leettriton.decode_step(b, c, v, pool, 0.8, slot_ids=torch.tensor([0, 1, 2], device=DEVICE))
    pool = pool0.clone()
    leettriton.decode_step(b, c, v, pool, 0.8, slot_ids=_strided([6, 4, 2]))
    touched = [k for k in range(SLOTS) if not torch.equal(pool[k], pool0[k])]
    assert touched == [2, 4, 6]


def test_decode_expanded_slot_ids_are_refused_as_repeated(decode_path):
    b, c, v = _decode_inputs()
    pool = _randn(SLOTS, H, R, D, seed=22)
    before = pool.clone()
    with pytest.raises(ValueError, match="slot_ids must not repeat a slot"):
        leettriton.decode_step(b, c, v, pool, 0.8, slot_ids=torch.tensor([4], device=DEVICE).expand(3))
    assert torch.equal(pool, before)


# --------------------------------------------------------------------------- 2. writable tensors that overlap

def test_decode_step_expanded_state_is_refused(decode_path):
    b, c, v = _decode_inputs()
    base = _randn(1, H, R, D, seed=30)
    before = base.clone()
    with pytest.raises(ValueError, match=r"state is written in place, so its elements must not overlap.*stride 0"):
        leettriton.decode_step(b, c, v, base.expand(3, H, R, D), 0.9)
    assert torch.equal(base, before)


@pytest.mark.parametrize("entry", ["decode_step", "decode_tokens"])
def test_decode_expanded_pool_is_refused(entry, decode_path):
    b, c, v = _decode_inputs(None if entry == "decode_step" else 2)
    base = _randn(1, H, R, D, seed=31)
    before = base.clone()
    with pytest.raises(ValueError, match="state is written in place, so its elements must not overlap"):
        getattr(leettriton, entry)(b, c, v, base.expand(SLOTS, H, R, D), 0.9,
                                   slot_ids=torch.tensor([0, 1, 2], device=DEVICE))
    assert torch.equal(base, before)


def test_decode_tokens_expanded_state_is_refused(decode_path):
    b, c, v = _decode_inputs(2)
    base = _randn(3, H, R, 1, seed=32)
    before = base.clone()
    with pytest.raises(ValueError, match="state is written in place, so its elements must not overlap"):
        leettriton.decode_tokens(b, c, v, base.expand(3, H, R, D), 0.9)
    assert torch.equal(base, before)


@pytest.mark.parametrize("method", VARLEN_METHODS)
def test_varlen_expanded_pool_is_refused(method):
    b, c, v, cu = _varlen_inputs()
    base = _randn(1, H, R, D, seed=33)
    before = base.clone()
    with pytest.raises(ValueError, match="state_pool is written in place, so its elements must not overlap"):
        leettriton.linear_attention_varlen(b, c, v, cu, 0.9, method=method, state_pool=base.expand(SLOTS, H, R, D),
                                           slot_ids=torch.tensor([0, 1, 2], device=DEVICE),
                                           has_initial_state=torch.ones(3, dtype=torch.bool, device=DEVICE))
    assert torch.equal(base, before)


def test_decode_state_sharing_memory_with_an_input_is_refused(decode_path):
    """v_t a view of the state's own memory, with v_t's ordinary strides: refused on the first call and on a
    repeated call of a signature that a call with separate tensors stored."""
    b, c, v = _decode_inputs()
    state = _randn(3, H, R, D, seed=34)
    leettriton.decode_step(b, c, v, state.clone(), 0.9)          # the signature, with separate tensors
    aliased = state.view(-1)[:v.numel()].view(v.shape)
    assert aliased.stride() == v.stride()
    before = state.clone()
    for _ in range(2):
        with pytest.raises(ValueError, match="state is written in place, so it must not share memory with v_t"):
            leettriton.decode_step(b, c, aliased, state, 0.9)
        assert torch.equal(state, before)


def test_decode_pool_sharing_memory_with_gamma_is_refused(decode_path):
    b, c, v = _decode_inputs(2)
    pool = _randn(SLOTS, H, R, D, seed=35).abs().clamp(0.1, 0.9)
    before = pool.clone()
    gamma = pool.view(-1)[:H]
    with pytest.raises(ValueError, match="state is written in place, so it must not share memory with gamma"):
        leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=torch.tensor([4, 5, 6], device=DEVICE))
    assert torch.equal(pool, before)


@pytest.mark.parametrize("method", VARLEN_METHODS)
def test_varlen_pool_sharing_memory_with_v_is_refused(method):
    b, c, _, cu = _varlen_inputs()
    pool = _randn(SLOTS, H, R, D, seed=36)
    before = pool.clone()
    v = pool.view(-1)[:20 * H * D].view(20, H, D)
    with pytest.raises(ValueError, match="state_pool is written in place, so it must not share memory with v"):
        leettriton.linear_attention_varlen(b, c, v, cu, 0.9, method=method, state_pool=pool,
                                           slot_ids=torch.tensor([4, 5, 6], device=DEVICE))
    assert torch.equal(pool, before)


def test_a_permuted_pool_and_expanded_inputs_are_accepted(decode_path):
    """Not every non-contiguous tensor overlaps: a permuted pool is written correctly, and read-only inputs
    may be expanded."""
    b, c, v = _decode_inputs()
    b_exp = b[:1].expand(3, H, R)
    pool0 = _randn(H, SLOTS, R, D, seed=37).transpose(0, 1)
    ids = torch.tensor([6, 0, 3], device=DEVICE)
    outs = []
    for pool, bb in ((pool0.clone(), b_exp.contiguous()), (pool0.clone().transpose(0, 1).contiguous()
                                                           .transpose(0, 1), b_exp)):
        assert not pool.is_contiguous()
        o, _ = leettriton.decode_step(bb, c, v, pool, 0.9, slot_ids=ids)
        outs.append((o, pool))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    expect = pool0[[6, 0, 3]] * 0.9 + c.unsqueeze(-1) * v.unsqueeze(-2)
    assert (outs[0][1][[6, 0, 3]] - expect).abs().max() < 1e-5


# --------------------------------------------------------------------------- 7. γ rewritten behind its version

TORCH_METHODS = [m for m in leettriton.METHODS if m.endswith("_torch")]


def _outside_interpreter(monkeypatch):
    """CPU tensors run the PyTorch code from here on (the plans and repeated calls start afresh)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    clear_plans()
    monkeypatch.setattr(api, "_DECODE_STEPS", {})
    monkeypatch.setattr(api, "_TOKEN_STEPS", {})


def _nan_in_head_1_only(out, first):
    """Head 1's γ is out of range: all of its outputs NaN; head 0 as the call before the rewrite gave it."""
    assert torch.isnan(out[:, 1]).all(), "the head with γ = 1.5 gave non-NaN outputs"
    assert torch.equal(out[:, 0], first[:, 0])


# outside the interpreter a CPU call of a kernel method runs its _torch twin: the twins stand for both
GAMMA_PATHS = ([(m, True) for m in TORCH_METHODS + ["vanilla", "lightning_attention"]] +
               [(m, False) for m in TORCH_METHODS])


@pytest.mark.parametrize("method, interpreted", GAMMA_PATHS,
                         ids=[f"{m}-{'interpreter' if i else 'pytorch'}" for m, i in GAMMA_PATHS])
def test_gamma_rewritten_through_numpy_gives_nan_or_an_error(method, interpreted, monkeypatch):
    """Under the interpreter the check is remembered, and the kernels and the PyTorch methods alike turn the
    rewritten γ into NaN outputs; outside it (CPU tensors, PyTorch code) the values are read on every call."""
    if DEVICE != "cpu":
        pytest.skip("a NumPy view needs a CPU tensor")
    if not interpreted:
        _outside_interpreter(monkeypatch)
    b, c, v = _randn(1, H, 8, R, seed=40), _randn(1, H, 8, R, seed=41), _randn(1, H, 8, D, seed=42)
    s0 = _randn(1, H, R, D, seed=49)   # every row then depends on γ
    gamma = torch.tensor([0.9, 0.8])
    first = leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0)
    leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0)   # the signature's repeated call
    gamma.numpy()[1] = 1.5
    if not interpreted:
        with pytest.raises(ValueError, match="gamma must hold values in"):
            leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0)
        return
    _nan_in_head_1_only(leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0), first)


KERNEL_METHODS = [m[:-len("_torch")] for m in TORCH_METHODS]


@pytest.mark.parametrize("method", KERNEL_METHODS + TORCH_METHODS)
def test_gamma_rewritten_through_numpy_gives_nan_without_an_initial_state(method):
    """Without an initial state only the decays carry γ: a NaN λ must reach the outputs through them (a slow
    causal form that selected a NaN decay out, as it selects out masked ones, gave zeros: silently wrong)."""
    if DEVICE != "cpu":
        pytest.skip("a NumPy view needs a CPU tensor")
    b, c, v = _randn(1, H, 8, R, seed=43), _randn(1, H, 8, R, seed=44), _randn(1, H, 8, D, seed=45)
    gamma = torch.tensor([0.9, 0.8])
    first = leettriton.linear_attention(b, c, v, gamma, method=method)
    gamma.numpy()[1] = 1.5
    out = leettriton.linear_attention(b, c, v, gamma, method=method)
    # row 0 of a head has no decayed term (γ^0 = 1 is no product with λ): the rows after it are NaN
    assert torch.isnan(out[:, 1, 1:]).all(), "the head with γ = 1.5 gave non-NaN outputs"
    assert torch.equal(out[:, 0], first[:, 0])


def _gamma_rewrite_case(call, torch_path: bool, split_heads=lambda out: out) -> None:
    """Call twice with γ = (0.9, 0.8), rewrite γ[1] = 1.5 through NumPy, call again: a ValueError on the
    PyTorch path of CPU tensors (read on every call), NaN outputs of head 1 only under the interpreter.
    ``split_heads`` puts the heads second."""
    gamma = torch.tensor([0.9, 0.8])
    first = call(gamma)
    call(gamma)
    gamma.numpy()[1] = 1.5
    if torch_path:
        with pytest.raises(ValueError, match="gamma must hold values in"):
            call(gamma)
        return
    _nan_in_head_1_only(split_heads(call(gamma)), split_heads(first))


@pytest.mark.parametrize("entry", ["decode_step", "decode_tokens"])
def test_gamma_rewritten_through_numpy_in_the_decode_steps(entry, decode_path):
    if DEVICE != "cpu":
        pytest.skip("a NumPy view needs a CPU tensor")
    b, c, v = _decode_inputs(None if entry == "decode_step" else 2)
    state = _randn(3, H, R, D, seed=43)
    _gamma_rewrite_case(lambda gamma: getattr(leettriton, entry)(b, c, v, state.clone(), gamma)[0],
                        decode_path == "torch")


@pytest.mark.parametrize("method", VARLEN_METHODS)
def test_gamma_rewritten_through_numpy_in_the_packed_prefill(method):
    if DEVICE != "cpu":
        pytest.skip("a NumPy view needs a CPU tensor")
    b, c, v, cu = _varlen_inputs()
    pool = _randn(SLOTS, H, R, D, seed=44)
    _gamma_rewrite_case(lambda gamma: leettriton.linear_attention_varlen(
        b, c, v, cu, gamma, method=method, state_pool=pool.clone(), slot_ids=torch.tensor([0, 1, 2]),
        has_initial_state=torch.ones(3, dtype=torch.bool)), False, lambda out: out.transpose(0, 1).unsqueeze(0))


@pytest.mark.parametrize("method", TORCH_METHODS)
def test_torch_methods_give_nan_for_a_gamma_past_the_check(method):
    """The PyTorch twins' own guard (what a CUDA γ rewritten through .data meets): λ is NaN outside (0, 1], so
    every output of that head is NaN (with an initial state, every row depends on γ)."""
    b, c, v = _randn(1, H, 8, R, seed=44), _randn(1, H, 8, R, seed=45), _randn(1, H, 8, D, seed=46)
    p, out = make_problem(b, c, v, torch.tensor([0.9, 0.8], device=DEVICE), return_state=True,
                          initial_state=_randn(1, H, R, D, seed=48))
    p.gamma = torch.tensor([0.9, 1.5], device=DEVICE)
    torch_method(method)(p)
    assert torch.isnan(out[:, 1]).all() and torch.isnan(p.state[:, 1]).all()
    assert torch.isfinite(out[:, 0]).all()


def test_distributed_state_combination_gives_nan_for_a_gamma_past_the_check():
    states = _randn(2, 1, H, R, D, seed=47)
    got = leettriton.distributed.combine_states(states, [3, 4], torch.tensor([0.5, 1.5], device=DEVICE), 2)
    assert torch.isfinite(got[:, 0]).all() and torch.isnan(got[:, 1]).all()


# --------------------------------------------------------------------------- 8. distributed initial_state

def _initial_state_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    g = torch.Generator().manual_seed(0)
    b, c, v = (torch.randn(1, 2, 6, w, generator=g) for w in (3, 3, 4))
    s0 = torch.randn(1, 2, 3, 4, generator=g)
    rows = slice(3 * rank, 3 * rank + 3)
    results = {}
    for name, given in (("rank-1-only", rank == 1), ("rank-0-only", rank == 0)):
        try:
            out, state = leettriton.distributed.linear_attention(
                b[:, :, rows], c[:, :, rows], v[:, :, rows], 0.9, method="lightning_attention_torch",
                initial_state=s0 if given else None, return_state=True)
            results[name] = ("ok", out, state)
        except Exception as exc:  # recorded for the test to judge
            results[name] = ("raised", type(exc).__name__, str(exc))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_distributed_initial_state_on_a_later_rank_only_raises_on_every_rank():
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_initial_state_worker, args=(world, os.path.join(tmp, "store"), tmp), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail("the gloo processes did not finish within 120 s (a hang?)")
        results = [torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False) for k in range(world)]
    messages = set()
    for rank, got in enumerate(r["rank-1-only"] for r in results):
        assert got[0] == "raised" and got[1] == "ValueError", f"rank {rank}: {got}"
        assert "rank 1 passed an initial_state but rank 0 did not" in got[2], got[2]
        messages.add(got[2])
    assert len(messages) == 1
    # the documented use, initial_state on rank 0 only, still runs and reads it
    g = torch.Generator().manual_seed(0)
    b, c, v = (torch.randn(1, 2, 6, w, generator=g) for w in (3, 3, 4))
    s0 = torch.randn(1, 2, 3, 4, generator=g)
    ref, ref_state = leettriton.reference(b, c, v, 0.9, initial_state=s0, return_state=True)
    for rank, got in enumerate(r["rank-0-only"] for r in results):
        assert got[0] == "ok", f"rank {rank}: {got}"
        assert (got[1].double() - ref[:, :, 3 * rank:3 * rank + 3]).abs().max() < 1e-5
        assert (got[2].double() - ref_state).abs().max() < 1e-5
