"""State checkpoints in the packed prefill (docs/design.md §13.9): ``linear_attention_varlen(...,
checkpoint_every=K, checkpoint_slots=S)`` writes sequence i's state after each K-th of its rows to pool slot
S[i, j].

Each checkpoint must equal the float64 oracle's final state of that prefix from the sequence's start state;
continuing from a checkpoint must equal the one long call; slots −1, checkpoints past a sequence's end and
slots no call names must stay bit-identical; the walk's outputs and final states must be those of the call
without checkpoints bit for bit; bad arguments are refused before any work.
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from leettriton.kernels import walk_space
from leettriton.problem import CHECKPOINT_ALIGN
from conftest import DEVICE
from helpers import assert_close, tolerance

K = 64
H, R, D = 2, 16, 8
LENS = [40, 2 * K, 0, 2 * K + 22]       # shorter than K, exactly 2K, empty, 2K and a remainder
SLOTS = 16
TOL = tolerance(torch.float32)


def packed_inputs(seed, per_token, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    T = sum(LENS)
    b, c = (torch.randn(T, H, R, generator=g).to(DEVICE, dtype) for _ in range(2))
    v = torch.randn(T, H, D, generator=g).to(DEVICE, dtype)
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist(), device=DEVICE)
    # per-token decays a ≤ 0, sized so that 150 rows keep the state well away from zero
    a = (-0.05 * torch.rand(T, H, generator=g)).to(DEVICE) if per_token else None
    gamma = None if per_token else torch.tensor([0.97, 1.0], device=DEVICE)
    pool = torch.randn(SLOTS, H, R, D, generator=g).to(DEVICE)
    return b, c, v, cu, gamma, a, pool


def rows(x, start, stop):
    """Rows [start, stop) of a packed (T, H, dim) tensor as a (1, H, n, dim) batch of one."""
    return x[start:stop].permute(1, 0, 2).unsqueeze(0)


def decay_rows(a, start, stop):
    return None if a is None else a[start:stop].transpose(0, 1).unsqueeze(0)


SLOT_IDS = [0, 1, 2, 3]
# sequence 0 (40 rows) names a slot for a checkpoint it never reaches; −1 skips sequence 3's first one
TABLE = [[4, 5, -1], [6, 7, 8], [9, -1, -1], [-1, 10, 11]]


def run(method, per_token, starts, seed=0, table=TABLE):
    b, c, v, cu, gamma, a, pool = packed_inputs(seed, per_token)
    before = pool.clone()
    slot_ids = torch.tensor(SLOT_IDS, device=DEVICE)
    has_initial = torch.tensor([starts, starts, False, starts], device=DEVICE)
    S = torch.as_tensor(table, device=DEVICE)
    out = leettriton.linear_attention_varlen(b, c, v, cu, gamma, method=method, state_pool=pool, slot_ids=slot_ids,
                                             has_initial_state=has_initial, log_decay=a, checkpoint_every=K,
                                             checkpoint_slots=S)
    return dict(b=b, c=c, v=v, cu=cu, gamma=gamma, a=a, pool=pool, before=before, slot_ids=slot_ids,
                has_initial=has_initial, out=out)


def start_state(x, i):
    return x["before"][SLOT_IDS[i]:SLOT_IDS[i] + 1] if bool(x["has_initial"][i]) else None


@pytest.mark.parametrize("method", ["auto", "lightning_attention_torch"])
@pytest.mark.parametrize("per_token", [False, True], ids=["gamma", "log_decay"])
@pytest.mark.parametrize("starts", [False, True], ids=["from-zero", "from-slot"])
def test_each_checkpoint_equals_the_oracle_of_its_prefix(method, per_token, starts):
    x = run(method, per_token, starts)
    bounds = x["cu"].tolist()
    written = set()
    for i, row in enumerate(TABLE):
        s = bounds[i]
        for j, slot in enumerate(row):
            n = (j + 1) * K
            if slot < 0 or n > LENS[i]:
                continue
            written.add(slot)
            _, want = leettriton.reference(rows(x["b"], s, s + n), rows(x["c"], s, s + n), rows(x["v"], s, s + n),
                                           x["gamma"], initial_state=start_state(x, i), return_state=True,
                                           log_decay=decay_rows(x["a"], s, s + n))
            assert_close(x["pool"][slot], want[0], TOL, f"{method}: sequence {i}'s checkpoint {j} (row {n})")
    assert written == {6, 7, 10}
    # the final states in their slots as without checkpoints; every other slot (a −1, a checkpoint past the
    # sequence's end: 4, 5, 8, 9, 11; no one's) as it was, bit for bit
    for i in range(len(LENS)):
        s, e = bounds[i], bounds[i + 1]
        o, want = leettriton.reference(rows(x["b"], s, e), rows(x["c"], s, e), rows(x["v"], s, e), x["gamma"],
                                       initial_state=start_state(x, i), return_state=True,
                                       log_decay=decay_rows(x["a"], s, e))
        assert_close(x["pool"][SLOT_IDS[i]], want[0], TOL, f"{method}: sequence {i}'s final state")
        assert_close(x["out"][s:e], o[0].permute(1, 0, 2), TOL, f"{method}: sequence {i}'s output")
    untouched = [k for k in range(SLOTS) if k not in written and k not in SLOT_IDS]
    assert torch.equal(x["pool"][untouched], x["before"][untouched])


@pytest.mark.parametrize("per_token", [False, True], ids=["gamma", "log_decay"])
def test_the_walk_with_checkpoints_is_the_walk_without_them(per_token):
    """The checkpoints add stores and nothing else: outputs and final states bit for bit those of the plain call."""
    x = run("auto", per_token, True)
    pool = x["before"].clone()
    out = leettriton.linear_attention_varlen(x["b"], x["c"], x["v"], x["cu"], x["gamma"], state_pool=pool,
                                             slot_ids=x["slot_ids"], has_initial_state=x["has_initial"],
                                             log_decay=x["a"])
    assert torch.equal(out, x["out"])
    assert torch.equal(pool[SLOT_IDS], x["pool"][SLOT_IDS])


@pytest.mark.parametrize("method", ["auto", "lightning_attention_torch"])
@pytest.mark.parametrize("per_token", [False, True], ids=["gamma", "log_decay"])
def test_continuing_from_a_checkpoint_equals_the_long_call(method, per_token):
    x = run(method, per_token, True, seed=3)
    s, e = x["cu"].tolist()[3:5]   # sequence 3: 2K + 22 rows, its checkpoint after 2K rows in slot 11
    slot = TABLE[3][1]
    rest = slice(s + 2 * K, e)
    o, state = leettriton.linear_attention(rows(x["b"], rest.start, e), rows(x["c"], rest.start, e),
                                           rows(x["v"], rest.start, e), x["gamma"], method=method,
                                           initial_state=x["pool"][slot:slot + 1], return_state=True,
                                           log_decay=decay_rows(x["a"], rest.start, e))
    assert_close(o[0].permute(1, 0, 2), x["out"][rest], TOL, f"{method}: rows after the checkpoint")
    assert_close(state[0], x["pool"][SLOT_IDS[3]], TOL, f"{method}: final state after the checkpoint")
    # and as a server does: the rest as a packed sequence that starts from the checkpoint's slot
    pool = x["pool"].clone()
    n = e - rest.start
    o2 = leettriton.linear_attention_varlen(
        x["b"][rest], x["c"][rest], x["v"][rest], torch.tensor([0, n], device=DEVICE), x["gamma"], method=method,
        state_pool=pool, slot_ids=torch.tensor([slot], device=DEVICE),
        has_initial_state=torch.tensor([True], device=DEVICE),
        log_decay=None if x["a"] is None else x["a"][rest])
    assert_close(o2, x["out"][rest], TOL, f"{method}: packed rows after the checkpoint")
    assert_close(pool[slot], x["pool"][SLOT_IDS[3]], TOL, f"{method}: packed final state after the checkpoint")


def test_a_strided_table_and_one_checkpoint_per_sequence():
    """The table is read through its strides (a transposed one is copied once); M = 1 writes the first
    checkpoint of each sequence alone."""
    table = torch.tensor([[4, 6, 9, 10], [5, 7, -1, 11]], device=DEVICE).t()   # (4, 2), not contiguous
    assert not table.is_contiguous()
    x = run("auto", False, True, table=table)
    y = run("auto", False, True, table=[[4, 5], [6, 7], [9, -1], [10, 11]])
    assert torch.equal(x["pool"], y["pool"])
    z = run("auto", False, True, table=[[4], [6], [9], [10]])
    assert torch.equal(z["pool"][[6, 10]], y["pool"][[6, 10]])
    assert torch.equal(z["pool"][[5, 7, 11]], z["before"][[5, 7, 11]])


@pytest.mark.parametrize("method", ["auto", "lightning_attention_torch"])
def test_unchecked_slots_out_of_range_write_nothing(method):
    """With check_indices=False only slots in [0, slots) are written: −2, the pool's size and past it are not."""
    b, c, v, cu, gamma, _, pool = packed_inputs(0, False)
    before = pool.clone()
    slot_ids = torch.tensor(SLOT_IDS, device=DEVICE)
    table = torch.tensor([[-2, SLOTS], [SLOTS, -2], [-1, -1], [10 ** 6, SLOTS + 1]], device=DEVICE)
    out = leettriton.linear_attention_varlen(b, c, v, cu, gamma, method=method, state_pool=pool, slot_ids=slot_ids,
                                             check_indices=False, checkpoint_every=K, checkpoint_slots=table)
    plain = before.clone()
    want = leettriton.linear_attention_varlen(b, c, v, cu, gamma, method=method, state_pool=plain, slot_ids=slot_ids)
    assert_close(out, want, TOL, f"{method}: output")
    assert_close(pool, plain, TOL, f"{method}: pool")
    untouched = [k for k in range(SLOTS) if k not in SLOT_IDS]
    assert torch.equal(pool[untouched], before[untouched])


def test_checkpoints_fall_at_chunk_ends():
    """Every chunk length of the packed walk's configs, on every family, divides the checkpoints' step."""
    lengths = {cfg["BT"] for cfg in walk_space.VARLEN.all_configs()} | {walk_space.VARLEN.cpu["BT"]}
    assert lengths and all(CHECKPOINT_ALIGN % bt == 0 for bt in lengths), lengths


def bad_call(**overrides):
    b, c, v, cu, gamma, _, pool = packed_inputs(0, False)
    kw = dict(state_pool=pool, slot_ids=torch.tensor(SLOT_IDS, device=DEVICE), checkpoint_every=K,
              checkpoint_slots=torch.tensor(TABLE, device=DEVICE))
    kw.update(overrides)
    before = pool.clone()
    return (lambda: leettriton.linear_attention_varlen(b, c, v, cu, gamma, **kw)), pool, before


@pytest.mark.parametrize("overrides, error, match", [
    (dict(checkpoint_slots=None), ValueError, "checkpoint_every needs checkpoint_slots"),
    (dict(checkpoint_every=None), ValueError, "checkpoint_slots needs checkpoint_every"),
    (dict(checkpoint_every=32), ValueError, "positive multiple of 64.*got 32"),
    (dict(checkpoint_every=0), ValueError, "positive multiple of 64.*got 0"),
    (dict(checkpoint_every=-64), ValueError, "positive multiple of 64.*got -64"),
    (dict(checkpoint_every=64.0), TypeError, "checkpoint_every must be an int"),
    (dict(checkpoint_every=True), TypeError, "checkpoint_every must be an int"),
    (dict(checkpoint_slots=[[4]] * 4), TypeError, "checkpoint_slots must be an int32 or int64 tensor"),
    (dict(checkpoint_slots=torch.zeros(4, 1)), TypeError, "int32 or int64.*float32"),
    (dict(checkpoint_slots=torch.tensor([4, 5, 6, 7])), ValueError, r"shape \(4, M\).*got shape \(4,\)"),
    (dict(checkpoint_slots=torch.tensor([[4], [5], [6]])), ValueError, r"shape \(4, M\).*got shape \(3, 1\)"),
    (dict(checkpoint_slots=torch.tensor([[4], [5], [-2], [7]])), ValueError, r"\[-1, 16\).*\[2, 0\] = -2"),
    (dict(checkpoint_slots=torch.tensor([[4], [5], [SLOTS], [7]])), ValueError, r"\[-1, 16\).*\[2, 0\] = 16"),
    (dict(checkpoint_slots=torch.tensor([[4, 9], [5, -1], [-1, -1], [9, 7]])), ValueError, "slot 9 more than once"),
    (dict(checkpoint_slots=torch.tensor([[4, 5], [6, 2], [-1, -1], [8, 9]])), ValueError,
     r"checkpoint_slots and slot_ids.*checkpoint_slots\[1, 1\] = slot_ids\[2\] = 2"),
])
def test_bad_checkpoint_arguments_are_refused_before_any_work(overrides, error, match):
    if isinstance(overrides.get("checkpoint_slots"), torch.Tensor):
        overrides = dict(overrides, checkpoint_slots=overrides["checkpoint_slots"].to(DEVICE))
    call, pool, before = bad_call(**overrides)
    with pytest.raises(error, match=match):
        call()
    assert torch.equal(pool, before)


def test_checkpoints_need_a_pool():
    b, c, v, cu, gamma, _, _ = packed_inputs(0, False)
    with pytest.raises(ValueError, match="checkpoint_slots needs a state_pool"):
        leettriton.linear_attention_varlen(b, c, v, cu, gamma, checkpoint_every=K,
                                           checkpoint_slots=torch.tensor(TABLE, device=DEVICE))


def test_the_table_must_not_share_the_pools_memory():
    pool = packed_inputs(0, False)[-1]
    table = pool.view(-1).view(torch.int32)[:8].view(4, 2)   # the pool's own bytes, read as a contiguous table
    call, _, before = bad_call(state_pool=pool, checkpoint_slots=table)
    with pytest.raises(ValueError, match="state_pool is written in place.*checkpoint_slots"):
        call()
    assert torch.equal(pool, before)


def test_compiled_call_with_checkpoints():
    torch._dynamo.reset()
    b, c, v, cu, gamma, _, pool = packed_inputs(1, False)
    ref_pool = pool.clone()
    slot_ids, S = torch.tensor(SLOT_IDS, device=DEVICE), torch.tensor(TABLE, device=DEVICE)

    def f(b, c, v, pool):
        return leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slot_ids,
                                                  checkpoint_every=K, checkpoint_slots=S)

    counters = torch._dynamo.utils.counters
    counters.clear()
    o = torch.compile(f, fullgraph=True, backend="aot_eager")(b, c, v, pool)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(o, f(b, c, v, ref_pool)) and torch.equal(pool, ref_pool)
    assert not torch.equal(pool[[6, 7, 10]], packed_inputs(1, False)[-1][[6, 7, 10]])
    torch._dynamo.reset()


def test_a_non_finite_value_keeps_the_checkpoints_before_it():
    """A value of +inf in v at row 70 of sequence 3 (after its first checkpoint): the program walks again in the
    causal form (docs/nonfinite.md), and its checkpoint at row 64 is still the oracle's; the one at row 128 is
    not finite."""
    b, c, v, cu, gamma, _, pool = packed_inputs(5, False)
    s = int(cu[3])
    v[s + 70, 0, 1] = float("inf")
    slot_ids = torch.tensor(SLOT_IDS, device=DEVICE)
    table = torch.tensor([[-1, -1], [-1, -1], [-1, -1], [12, 13]], device=DEVICE)
    leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slot_ids, checkpoint_every=K,
                                       checkpoint_slots=table)
    _, want = leettriton.reference(rows(b, s, s + K), rows(c, s, s + K), rows(v, s, s + K), gamma, return_state=True)
    assert_close(pool[12], want[0], TOL, "the checkpoint before the non-finite value")
    assert not bool(torch.isfinite(pool[13][0]).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_inputs(dtype):
    """16-bit inputs (float16's walk scales its state operand): the checkpoints from the float32 state."""
    b, c, v, cu, gamma, a, pool = packed_inputs(7, True, dtype)
    before = pool.clone()
    slot_ids = torch.tensor(SLOT_IDS, device=DEVICE)
    has_initial = torch.tensor([True, True, False, True], device=DEVICE)
    leettriton.linear_attention_varlen(b, c, v, cu, state_pool=pool, slot_ids=slot_ids, has_initial_state=has_initial,
                                       log_decay=a, checkpoint_every=K, checkpoint_slots=torch.tensor(TABLE,
                                                                                                      device=DEVICE))
    bounds = cu.tolist()
    for i, j, slot in ((1, 0, 6), (1, 1, 7), (3, 1, 10)):
        s, n = bounds[i], (j + 1) * K
        one = [rows(x, s, s + n).float() for x in (b, c, v)]
        _, want = leettriton.reference(*one, initial_state=before[SLOT_IDS[i]:SLOT_IDS[i] + 1], return_state=True,
                                       log_decay=decay_rows(a, s, s + n))
        assert_close(pool[slot], want[0], tolerance(dtype), f"{dtype}: sequence {i}'s checkpoint {j}")


def test_pieces_of_r():
    """r = 260, past the walk's 256 keys: each piece of r writes its rows of every checkpoint (kernels/pieces.py)."""
    g = torch.Generator().manual_seed(11)
    r, lens = 260, [2 * K + 2, K + 6]
    T = sum(lens)
    b, c = ((torch.randn(T, 1, r, generator=g) / 16).to(DEVICE) for _ in range(2))
    v = torch.randn(T, 1, D, generator=g).to(DEVICE)
    cu = torch.tensor([0, lens[0], T], device=DEVICE)
    pool = torch.randn(6, 1, r, D, generator=g).to(DEVICE)
    before = pool.clone()
    leettriton.linear_attention_varlen(b, c, v, cu, 0.97, state_pool=pool, slot_ids=torch.tensor([0, 1], device=DEVICE),
                                       has_initial_state=torch.tensor([True, False], device=DEVICE), checkpoint_every=K,
                                       checkpoint_slots=torch.tensor([[2, 3], [4, 5]], device=DEVICE))
    for slot, s, n, initial in ((2, 0, K, before[0:1]), (3, 0, 2 * K, before[0:1]), (4, lens[0], K, None)):
        _, want = leettriton.reference(rows(b, s, s + n), rows(c, s, s + n), rows(v, s, s + n), 0.97,
                                       initial_state=initial, return_state=True)
        assert_close(pool[slot], want[0], TOL, f"checkpoint in slot {slot}")
    assert torch.equal(pool[5], before[5])
