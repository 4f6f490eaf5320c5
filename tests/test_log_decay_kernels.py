"""The per-token decay (``log_decay``, docs/design.md §1.6) in the vanilla, recursion and fleet_attention kernels.

Each against the float64 oracle over decays from 0 to −20 per token, both layouts, a strided decay, an
initial state and the final state, at lengths spanning several tiles, leaves and levels of the tree, and
segments (the interpreter's tiles are 32-64 rows); 16-bit inputs at their tolerance; a decay that is strong
and then near zero (exponents from sums of nearby terms, never differences of long sums); the constant case
against the γ path; a decay > 0 or NaN at row k leaving every row before k bit for bit as a call without it
and every row from k on NaN; a non-finite value with a decay; gradients against float64 autograd.  Small
shapes: the whole file runs in well under a minute on one core.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import leettriton
from leettriton import reference
from leettriton.reference import tolerance

from conftest import DEVICE, HAS_GPU
from helpers import assert_close

METHODS = ["vanilla", "recursion", "fleet_attention"]


def _inputs(B, H, n, r, d, layout, dtype=torch.float32, seed=0, strength=20.0, strided=False):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda k: (B, H, n, k)) if layout == "bhnd" else (lambda k: (B, n, H, k))
    b, c, v = (torch.randn(*shape(k), generator=g).to(DEVICE, dtype) for k in (r, r, d))
    # per head a scale in [0, 1] times strength: heads from a ≈ 0 to −strength per token
    a = -torch.rand(B, H, n, generator=g) * torch.rand(B, H, 1, generator=g) * strength
    a[..., n // 3] = 0.0
    if strided:   # every other element of a wider tensor
        wide = torch.zeros(B, H, n, 2)
        wide[..., 0] = a
        a = wide[..., 0]
    a = a.to(DEVICE)
    if layout == "bnhd":
        a = a.transpose(1, 2)   # (B, n, H): a transposed view
    return b, c, v, a


def test_the_methods_take_a_per_token_decay():
    for method in METHODS:
        assert method in leettriton.registry.per_token_methods()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_methods_match_the_oracle(method, layout):
    """n = 150: three vanilla tiles, five recursion leaves (three levels), two fleet_attention segments."""
    B, H, n, r, d = 1, 3, 150, 5, 6
    b, c, v, a = _inputs(B, H, n, r, d, layout, strided=True, seed=1)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                             return_state=True)
    ref, ref_state = reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), f"{method} output")
    assert_close(state, ref_state, tolerance(torch.float32), f"{method} state")
    # without the initial and the final state
    out = leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout)
    assert_close(out, reference(b, c, v, log_decay=a, layout=layout), tolerance(torch.float32), f"{method} alone")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_inputs_within_their_tolerance(method, dtype):
    B, H, n, r, d = 1, 2, 100, 8, 8
    b, c, v, a = _inputs(B, H, n, r, d, "bhnd", dtype, seed=3, strength=4.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0,
                                             return_state=True)
    assert out.dtype == dtype and state.dtype == torch.float32
    f = [x.float() for x in (b, c, v)]
    m = [x.abs() for x in f]
    ref, ref_state = reference(*f, log_decay=a, initial_state=s0, return_state=True)
    terms, terms_state = reference(*m, log_decay=a, initial_state=s0.abs(), return_state=True)
    assert_close(out, ref, tolerance(dtype), f"{method} {dtype}", terms=terms)
    assert_close(state, ref_state, tolerance(dtype), f"{method} {dtype} state", terms=terms_state)


@settings(max_examples=6, deadline=None)
@given(method=st.sampled_from(METHODS), n=st.integers(1, 140), r=st.integers(1, 9), d=st.integers(1, 9),
       strength=st.sampled_from([0.0, 0.5, 20.0]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), initial=st.booleans(),
       seed=st.integers(0, 1000))
def test_kernels_match_the_oracle_over_shapes(method, n, r, d, strength, dtype, initial, seed):
    b, c, v, a = _inputs(1, 2, n, r, d, "bhnd", dtype, seed, strength)
    s0 = torch.randn(1, 2, r, d, generator=torch.Generator().manual_seed(seed)).to(DEVICE) if initial else None
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0,
                                             return_state=True)
    f = [x.float() for x in (b, c, v)]
    m = [x.abs() for x in f]
    ref, ref_state = reference(*f, log_decay=a, initial_state=s0, return_state=True)
    terms, terms_state = reference(*m, log_decay=a, initial_state=None if s0 is None else s0.abs(), return_state=True)
    assert out.dtype == dtype
    assert_close(out, ref, tolerance(dtype), method, terms=terms)
    assert_close(state, ref_state, tolerance(dtype), f"{method} state", terms=terms_state)


@pytest.mark.parametrize("method", METHODS)
def test_strong_then_weak_decay_keeps_float32_accuracy(method):
    """−20 per token for 40 rows, then −10⁻³: a prefix sum over the sequence would reach −800 and leave
    about four significant digits to the later rows' decays; tile-local sums keep float32's."""
    B, H, n, r, d = 1, 1, 150, 4, 4
    b, c, v, _ = _inputs(B, H, n, r, d, "bhnd", seed=5)
    a = torch.full((B, H, n), -1e-3)
    a[..., :40] = -20.0
    a[..., 70:75] = -3.0
    a = a.to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, return_state=True)
    ref, ref_state = reference(b, c, v, log_decay=a, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), f"{method} output")
    assert_close(state, ref_state, tolerance(torch.float32), f"{method} state")


@pytest.mark.parametrize("method", METHODS)
def test_the_constant_case_is_the_gamma_path(method):
    b, c, v, _ = _inputs(1, 3, 90, 4, 5, "bhnd", seed=6)
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    a = torch.log(gamma).view(1, 3, 1).expand(1, 3, 90)   # stride 0 along n and batch
    per_token, s1 = leettriton.linear_attention(b, c, v, log_decay=a, method=method, return_state=True)
    constant, s2 = leettriton.linear_attention(b, c, v, gamma, method=method, return_state=True)
    assert_close(per_token, constant.double(), 1e-5, method)
    assert_close(s1, s2.double(), 1e-5, f"{method} state")


@pytest.mark.parametrize("method", METHODS)
def test_a_positive_or_nan_decay_spoils_its_rows_from_k_only(method):
    """The kernels do not read a's values on the host: a > 0 or NaN at row k makes rows ≥ k of its head NaN
    (and its final state), and leaves every row before k, and every other head, as a call without it."""
    B, H, n, r, d = 1, 2, 130, 4, 4   # three vanilla tiles, five leaves, two fleet_attention segments
    b, c, v, a = _inputs(B, H, n, r, d, "bhnd", seed=7, strength=1.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    clean, clean_state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, return_state=True)
    for bad, k in ((0.5, 70), (float("nan"), 45), (float("nan"), 0)):
        a2 = a.clone()
        a2[0, 1, k] = bad
        out, state = leettriton.linear_attention(b, c, v, log_decay=a2, method=method, return_state=True)
        assert torch.equal(out[:, 0], clean[:, 0]), f"{method}: the other head changed ({bad} at {k})"
        assert torch.equal(state[:, 0], clean_state[:, 0]), f"{method}: the other head's state changed"
        assert torch.equal(out[0, 1, :k], clean[0, 1, :k]), f"{method}: rows before {k} changed ({bad})"
        assert torch.isnan(out[0, 1, k:]).all(), f"{method}: a row from {k} on is not NaN ({bad})"
        assert torch.isnan(state[0, 1]).all(), f"{method}: the final state is not NaN ({bad} at {k})"
    # with an initial state every row from k on still is NaN, and rows before it as they were
    clean = leettriton.linear_attention(b, c, v, log_decay=a, method=method, initial_state=s0)
    a2 = a.clone()
    a2[0, 1, 80] = float("nan")
    out = leettriton.linear_attention(b, c, v, log_decay=a2, method=method, initial_state=s0)
    assert torch.equal(out[0, 1, :80], clean[0, 1, :80]) and torch.isnan(out[0, 1, 80:]).all()


@pytest.mark.parametrize("method", METHODS)
def test_a_non_finite_value_reaches_later_rows_only(method):
    """docs/nonfinite.md with a per-token decay: an infinite v at row k (the tile's causal form)."""
    B, H, n, r, d = 1, 1, 130, 4, 4
    b, c, v, a = _inputs(B, H, n, r, d, "bhnd", seed=9, strength=0.5)
    clean = leettriton.linear_attention(b, c, v, log_decay=a, method=method)
    v2 = v.clone()
    v2[0, 0, 80, 1] = float("inf")
    out = leettriton.linear_attention(b, c, v2, log_decay=a, method=method)
    assert torch.equal(out[0, 0, :80], clean[0, 0, :80])
    assert not torch.isfinite(out[0, 0, 80:, 1]).all()
    assert torch.equal(out[0, 0, :, 0], clean[0, 0, :, 0])   # another value column


def _grads(fn, inputs, seed=10):
    out, state = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g).to(out.device, torch.float64)
    gs = torch.randn(state.shape, generator=g).to(state.device, torch.float64)
    loss = (out.double() * go).sum() + (state.double() * gs).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("method, layout", [("vanilla", "bhnd"), ("recursion", "bnhd"), ("fleet_attention", "bhnd")])
def test_gradients_match_float64_autograd_through_the_oracle(method, layout):
    """The backward's forward calls (docs/design.md §10.6) run the method's kernel with the reversed decays."""
    B, H, n, r, d = 1, 2, 50, 3, 4
    b, c, v, a = _inputs(B, H, n, r, d, layout, seed=11, strength=3.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    inputs = [x.clone().requires_grad_() for x in (b, c, v, s0, a)]

    def ours(b, c, v, s0, a):
        return leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                           return_state=True)

    def oracle(b, c, v, s0, a):
        return reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)

    for name, x, y in zip(("b", "c", "v", "initial_state", "log_decay"), _grads(ours, inputs), _grads(oracle, inputs)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert_close(x, y.double(), 1e-5, f"{method} d{name}")


def test_recursion_with_key_tiles_narrower_than_its_output_tiles():
    """The GPU's recursion tiles (BT 128 rows, key tiles BJ of 64): the key tiles inside an output tile take
    their prefix sums out of the tile's own; 300 rows are three leaves of 128 (two levels)."""
    from leettriton.plan import run_problem
    from leettriton.problem import make_problem

    B, H, n, r, d = 1, 2, 300, 6, 5
    b, c, v, a = _inputs(B, H, n, r, d, "bhnd", seed=13, strength=20.0)
    a[0, 0, 100:] = -1e-3   # strong, then weak: inside one output tile
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(14)).to(DEVICE)
    p, out = make_problem(b, c, v, None, initial_state=s0, return_state=True, log_decay=a)
    run_problem(p, "recursion", {"recursion.fwd": dict(BT=128, BJ=64, BK=32, BV=64, num_warps=8, num_stages=2)})
    ref, ref_state = reference(b, c, v, log_decay=a, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), "recursion output")
    assert_close(p.state, ref_state, tolerance(torch.float32), "recursion state")


@pytest.mark.skipif(not HAS_GPU, reason="a sequence of 10⁵ tokens runs on the GPU only")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("strength", [20.0, 1e-6])
def test_long_sequences_stay_finite_and_within_tolerance(method, strength):
    """n = 100 000 with strong decay and with a ≈ 0: finite, within float16's tolerance, the state in float32."""
    b, c, v, a = _inputs(1, 2, 100_000, 16, 16, "bhnd", torch.float16, seed=15, strength=strength)
    b, c = b * 0.1, c * 0.1
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, return_state=True)
    f = [x.float() for x in (b, c, v)]
    ref, ref_state = reference(*f, log_decay=a, return_state=True)
    terms, terms_state = reference(*[x.abs() for x in f], log_decay=a, return_state=True)
    assert_close(out, ref, tolerance(torch.float16), f"{method} output", terms=terms)
    assert_close(state, ref_state, tolerance(torch.float16), f"{method} state", terms=terms_state)
