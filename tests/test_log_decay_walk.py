"""The per-token decay (``log_decay``, docs/design.md §1.6) in the chunk walk: lightning_attention and block_based.

Against the float64 oracle: both layouts, an initial state and the final state, sequences over several chunks
and segments (the interpreter's 16-row chunks and 40-row segments: the walk summing its start states itself, and
the state pass in pieces joined by the scan), decays from 0 to −20 per token, float32, float16 and bfloat16 at
the suite's tolerances; the walk's modes (float16's checked walk and its redo, tensor descriptors with segments
cut inside a chunk, pieces of a wider r, the backward's two-part bfloat16 operands); causality for any values
(a decay > 0 or NaN, an infinite value: the rows before it bit for bit); the gradients of b, c, v, a and the
initial state against float64 autograd; the packed prefill with a state pool.  Small shapes: the whole file runs
in well under a minute on one core.
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from leettriton import reference
from leettriton.plan import run_problem
from leettriton.problem import make_problem
from leettriton.reference import tolerance

from conftest import DEVICE, HAS_GPU
from helpers import assert_close

WALKS = ["lightning_attention", "block_based"]
# the interpreter's block_based segments are 40 rows (3 segments or fewer: the walk sums its start states; more:
# the state pass in pieces and the scan); a GPU's are 1024 rows at least
N_PREFIX, N_SCAN = (100, 150) if not HAS_GPU else (3000, 12000)


def _inputs(B, H, n, r, d, layout="bhnd", dtype=torch.float32, seed=0, strength=20.0):
    """b, c, v in ``layout`` and a (B, H, n) decay from 0 to −strength (each head its own scale, a ≈ 0 rows too)."""
    g = torch.Generator().manual_seed(seed)
    shape = (lambda k: (B, H, n, k)) if layout == "bhnd" else (lambda k: (B, n, H, k))
    b, c, v = (torch.randn(*shape(k), generator=g).to(DEVICE, dtype) for k in (r, r, d))
    scale = torch.rand(B, H, 1, generator=g) * strength
    scale[:, 0] = strength   # one head at the full strength
    a = -torch.rand(B, H, n, generator=g) * scale
    a[..., n // 3: n // 3 + 5] = 0.0
    a = a.to(DEVICE)
    return b, c, v, (a if layout == "bhnd" else a.transpose(1, 2))


def _terms(b, c, v, a, layout="bhnd", initial_state=None):
    """The oracle on the inputs' magnitudes (docs/design.md §2.5): the output and the state."""
    return reference(b.float().abs(), c.float().abs(), v.float().abs(), log_decay=a, layout=layout,
                     initial_state=None if initial_state is None else initial_state.abs(), return_state=True)


@pytest.mark.parametrize("method,layout,n", [("lightning_attention", "bhnd", N_PREFIX),
                                             ("lightning_attention", "bnhd", N_SCAN),
                                             ("block_based", "bnhd", N_PREFIX), ("block_based", "bhnd", N_SCAN)])
def test_the_walks_match_the_oracle(method, layout, n):
    B, H, r, d = 1, 2, 8, 12
    b, c, v, a = _inputs(B, H, n, r, d, layout, seed=n)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                             return_state=True)
    ref, ref_state = reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), f"{method} output")
    assert_close(state, ref_state, tolerance(torch.float32), f"{method} state")
    if n == N_PREFIX:   # without the states: the walk starts from zero and stores none
        assert_close(leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout),
                     reference(b, c, v, log_decay=a, layout=layout), tolerance(torch.float32), f"{method} from zero")


@pytest.mark.parametrize("method,dtype,strength", [("lightning_attention", torch.float16, 20.0),
                                                   ("lightning_attention", torch.bfloat16, 0.05),
                                                   ("block_based", torch.float16, 0.05),
                                                   ("block_based", torch.bfloat16, 20.0)])
def test_16_bit_inputs(method, dtype, strength):
    B, H, n, r, d = 1, 2, N_SCAN, 16, 16
    b, c, v, a = _inputs(B, H, n, r, d, dtype=dtype, seed=3, strength=strength)
    a = a.to(dtype)   # the decay in the inputs' dtype
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0,
                                             return_state=True)
    ref, ref_state = reference(b.float(), c.float(), v.float(), log_decay=a.float(), initial_state=s0,
                               return_state=True)
    terms, terms_state = _terms(b, c, v, a.float(), initial_state=s0)
    assert out.dtype == dtype
    assert_close(out, ref, tolerance(dtype), f"{method} {dtype} output", terms=terms)
    assert_close(state, ref_state, tolerance(dtype), f"{method} {dtype} state", terms=terms_state)


@pytest.mark.parametrize("method", WALKS)
def test_float16_checked_walk_by_descriptor_in_segments(method):
    """r = 136, float16: the checked walk (and its redo, for the programs whose state copy leaves float16's range)
    reading b, c, v through tensor descriptors where this Triton and device build them, segments ending inside a
    chunk (CUT)."""
    from leettriton.kernels.walk import reads_by_descriptor

    B, H, n, r, d = 1, 2, N_PREFIX, 136, 16
    b, c, v, a = _inputs(B, H, n, r, d, dtype=torch.float16, seed=5, strength=2.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    s0[:, 1] *= 1e6   # the second head's state copy overflows float16: its programs walk again, scaled
    b[:, 1] *= 1e-4   # (its outputs within float16's range)
    if not HAS_GPU:   # (a GPU reads by descriptor only where the programs fill it)
        p, _ = make_problem(b, c, v, None, log_decay=a)
        assert reads_by_descriptor(p, 3) == leettriton.kernels.walk.DESCRIPTORS
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0,
                                             return_state=True)
    ref, ref_state = reference(b.float(), c.float(), v.float(), log_decay=a, initial_state=s0, return_state=True)
    terms, terms_state = _terms(b, c, v, a, initial_state=s0)
    assert_close(out, ref, tolerance(torch.float16), f"{method} output", terms=terms)
    assert_close(state, ref_state, tolerance(torch.float16), f"{method} state", terms=terms_state)


def test_pieces_of_a_wider_r():
    """r = 264 > 256: two pieces of r chained through a float32 partial sum (PIECE, ACC), in bfloat16."""
    B, H, n, r, d = 1, 1, 40, 264, 8
    b, c, v, a = _inputs(B, H, n, r, d, dtype=torch.bfloat16, seed=7, strength=1.0)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method="lightning_attention", return_state=True)
    ref, ref_state = reference(b.float(), c.float(), v.float(), log_decay=a, return_state=True)
    terms, terms_state = _terms(b, c, v, a)
    assert_close(out, ref, tolerance(torch.bfloat16), "output", terms=terms)
    assert_close(state, ref_state, tolerance(torch.bfloat16), "state", terms=terms_state)


@pytest.mark.parametrize("method", ["block_based"])
def test_two_part_bfloat16_operands(method):
    """The backward's db call (``two_part``, docs/design.md §10.4) with a per-token decay: the state operand and the
    decayed values in two bfloat16 parts bring the output and the state closer to the oracle (the segment states
    too).  The state (float32) must gain tenfold; the output, rounded to bfloat16 at the end (a floor both calls
    share) and carrying the rounded scores of its own chunk (which two parts leave as they are), must gain."""
    B, H, n, r, d = 1, 2, N_PREFIX, 16, 16
    b, c, v, a = _inputs(B, H, n, r, d, dtype=torch.bfloat16, seed=8, strength=0.05)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    ref, ref_state = reference(b.float(), c.float(), v.float(), log_decay=a, initial_state=s0, return_state=True)
    err = []
    for two_part in (False, True):
        p, out = make_problem(b, c, v, None, initial_state=s0, return_state=True, two_part=two_part, log_decay=a)
        run_problem(p, method)
        err.append([float((x.double() - y).norm() / y.norm()) for x, y in ((out, ref), (p.state, ref_state))])
    assert err[1][0] < err[0][0], f"output: two parts {err[1][0]:.2e}, one rounding {err[0][0]:.2e}"
    assert err[1][1] < 0.1 * err[0][1], f"state: two parts {err[1][1]:.2e}, one rounding {err[0][1]:.2e}"
    assert err[1][0] < tolerance(torch.bfloat16)


@pytest.mark.parametrize("method,dtype,bad", [("lightning_attention", torch.float32, float("nan")),
                                              ("block_based", torch.bfloat16, 0.5),
                                              ("block_based", torch.float32, float("nan"))])
def test_a_bad_decay_leaves_the_rows_before_it_bit_for_bit(method, dtype, bad):
    """a > 0 or NaN at row k: that row, the rows after it and the final state of its head are NaN; the rows before
    it, and the other head, are those of the call without it, bit for bit (k in a later segment, and in the
    first, whose state reaches the others)."""
    B, H, n, r, d = 1, 2, N_PREFIX, 8, 8
    b, c, v, a = _inputs(B, H, n, r, d, dtype=dtype, seed=10, strength=3.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    clean, clean_state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0,
                                                     return_state=True)
    for k in (n - 27, 13):
        a2 = a.clone()
        a2[0, 1, k] = bad
        out, state = leettriton.linear_attention(b, c, v, log_decay=a2, method=method, initial_state=s0,
                                                 return_state=True)
        assert torch.equal(out[:, 0], clean[:, 0]) and torch.equal(state[:, 0], clean_state[:, 0]), "the other head"
        assert torch.equal(out[0, 1, :k], clean[0, 1, :k]), f"the rows before {k}"
        assert torch.isnan(out[0, 1, k:]).all() and torch.isnan(state[0, 1]).all(), f"rows from {k}"


@pytest.mark.parametrize("method", WALKS)
def test_an_infinite_value_reaches_later_rows_only(method):
    """An infinite v_k under decays that underflow to zero (0 · inf): the rows before k are those of the call
    without it, bit for bit (the walk's causal form with the per-token mask, docs/nonfinite.md)."""
    B, H, n, r, d = 1, 1, N_PREFIX, 8, 8
    b, c, v, a = _inputs(B, H, n, r, d, seed=12, strength=20.0)
    clean = leettriton.linear_attention(b, c, v, log_decay=a, method=method)
    k = n - 30
    v2 = v.clone()
    v2[0, 0, k, 3] = float("inf")
    out = leettriton.linear_attention(b, c, v2, log_decay=a, method=method)
    assert torch.equal(out[0, 0, :k], clean[0, 0, :k])
    assert not torch.isfinite(out[0, 0, k:, 3]).all()


def _grads(fn, inputs, seed=13):
    out, state = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g).to(out.device, torch.float64)
    gs = torch.randn(state.shape, generator=g).to(state.device, torch.float64)
    loss = (out.double() * go).sum() + (state.double() * gs).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("method,layout", [("lightning_attention", "bnhd"), ("block_based", "bhnd")])
def test_gradients_match_float64_autograd_through_the_oracle(method, layout):
    B, H, n, r, d = 1, 2, 70 if not HAS_GPU else 3000, 4, 5
    b, c, v, a = _inputs(B, H, n, r, d, layout, seed=14, strength=3.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(15)).to(DEVICE)
    inputs = [x.clone().requires_grad_() for x in (b, c, v, s0, a)]

    def ours(b, c, v, s0, a):
        return leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                           return_state=True)

    def oracle(b, c, v, s0, a):
        return reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)

    ref_grads = _grads(oracle, inputs)
    # ∂L/∂a_t = Σ_{i ≥ t} (b_i · db_i − c_i · dc_i) (+ dS ⊙ S at the last row, docs/design.md §10.6): a sum of n
    # float32 terms that cancel to far below them, so its error is measured against their magnitudes
    terms = _decay_grad_terms(*(x.detach().double() for x in inputs[:2]), *ref_grads[:2], layout, oracle(*inputs),
                              seed=13)
    for name, x, y in zip(("b", "c", "v", "initial_state", "log_decay"), _grads(ours, inputs), ref_grads):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert_close(x, y.double(), tolerance(torch.float32), f"{method} d{name}",
                     terms=terms if name == "log_decay" else None)


def _decay_grad_terms(b, c, db, dc, layout, result, seed):
    """Σ_{i ≥ t} (|b_i ⊙ db_i| + |c_i ⊙ dc_i|) summed over r (+ |dS ⊙ S| at the last row), in ``layout``'s
    (B, H, n) or (B, n, H): the magnitudes of the terms ∂L/∂a_t sums (dS drawn as :func:`_grads` draws it)."""
    out, state = result
    g = torch.Generator().manual_seed(seed)
    torch.randn(out.shape, generator=g)   # the output's weights come first
    gs = torch.randn(state.shape, generator=g).to(state.device, torch.float64)
    t = (lambda x: x) if layout == "bhnd" else (lambda x: x.transpose(1, 2))
    dG = (t(b) * t(db)).abs().sum(-1) + (t(c) * t(dc)).abs().sum(-1)
    dG[..., -1] += (gs * state.detach().double()).abs().sum(dim=(-1, -2))
    return t(torch.flip(torch.cumsum(torch.flip(dG, [-1]), -1), [-1]))


@pytest.mark.parametrize("method,dtype", [("auto", torch.float32), ("block_based", torch.bfloat16)])
def test_packed_prefill_with_a_state_pool(method, dtype):
    """linear_attention_varlen with a (T, heads) decay runs the packed walk: each sequence as linear_attention on
    it alone from its slot's state (or zero), its final state written to its slot; an empty sequence, a sequence
    without a slot, slots no sequence names untouched."""
    H, r, d = 2, 8, 8
    lengths = [37, 0, 50, 21]
    slots = torch.tensor([3, 0, -1, 1], device=DEVICE)
    starts = torch.tensor([True, True, False, False], device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=DEVICE, dtype=torch.int32)
    T = int(cu[-1])
    g = torch.Generator().manual_seed(16)
    b, c, v = (torch.randn(T, H, k, generator=g).to(DEVICE, dtype) for k in (r, r, d))
    a = (-torch.rand(H, T, generator=g) * 4).to(DEVICE).t()   # (T, H), a transposed view
    pool = torch.randn(5, H, r, d, generator=g).to(DEVICE)
    before = pool.clone()
    out, same = leettriton.linear_attention_varlen(b, c, v, cu, log_decay=a, method=method, state_pool=pool,
                                                   slot_ids=slots, has_initial_state=starts, return_state=True)
    assert same is pool
    tol = tolerance(dtype)
    for i, (s, e) in enumerate(zip(cu.tolist()[:-1], cu.tolist()[1:])):
        slot = int(slots[i])
        s0 = before[slot:slot + 1] if bool(starts[i]) and slot >= 0 else None
        if s == e:
            assert torch.equal(pool[slot], before[slot]), "an empty sequence keeps its slot's start state"
            continue
        x = [t[s:e].unsqueeze(0).float() for t in (b, c, v)]
        ref, ref_state = reference(*x, log_decay=a[s:e].unsqueeze(0), layout="bnhd", initial_state=s0,
                                   return_state=True)
        terms, terms_state = _terms(*x, a[s:e].unsqueeze(0), layout="bnhd", initial_state=s0)
        assert_close(out[s:e], ref[0], tol, f"sequence {i}", terms=terms[0])
        if slot >= 0:
            assert_close(pool[slot], ref_state[0], tol, f"sequence {i}'s slot", terms=terms_state[0])
    for untouched in (2, 4):
        assert torch.equal(pool[untouched], before[untouched])


def test_auto_chooses_a_method_that_takes_the_decay(monkeypatch):
    """``auto`` with a per-token decay chooses among the methods that take one: the heuristic file's where it
    takes one (its configs, measured with a constant decay, left to the autotuner), else the fallback's walk past
    64 rows and the recurrence below."""
    from leettriton import plan

    b, c, v, a = _inputs(1, 2, 100, 4, 4)
    long, _ = make_problem(b, c, v, None, log_decay=a)
    short, _ = make_problem(b[:, :, :40], c[:, :, :40], v[:, :, :40], None, log_decay=a[:, :, :40])
    monkeypatch.setattr(plan, "choose", lambda p: ("block_based", {"block_based.fwd": {"BT": 16}}))
    assert plan.choose_per_token(long) == ("block_based", None)
    monkeypatch.setattr(plan, "choose", lambda p: ("vanilla", {"vanilla.fwd": {"BT": 16}}))
    assert plan.choose_per_token(long) == ("vanilla", None)            # every built-in method takes one
    # were the file's method one without it, the fallback's (every built-in takes one: vanilla stands in)
    takes = leettriton.registry.supports_per_token
    monkeypatch.setattr(plan.registry, "supports_per_token", lambda name: name != "vanilla" and takes(name))
    assert plan.choose_per_token(long)[0] == plan.fallback(long, plan.current_family(long.v.device)) in WALKS
    assert plan.choose_per_token(short) == (plan.PER_TOKEN_AUTO, None)
    monkeypatch.undo()
    method = plan.resolve(long, "auto").method
    assert leettriton.registry.supports_per_token(method)
