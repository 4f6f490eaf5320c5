"""The per-token decay (``log_decay``, docs/design.md §1.6) and the learnable constant decay (docs/gradients.md).

Every method that takes it -- the PyTorch twins and the causal_dot_product kernel (under the interpreter on
CPU) -- against the float64 oracle over decays from 0 to −20 per token, both layouts, strided decays, an
initial state and chained pieces; decode_step / decode_tokens against prefill; the constant case against
the gamma path; the errors; the gradients of b, c, v, the initial state and a (and of a learnable γ) against
float64 autograd through the oracle.  Small shapes: the whole file runs in well under a minute on one core.
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

TWINS = ["vanilla_torch", "causal_dot_product_torch", "lightning_attention_torch", "block_based_torch",
         "recursion_torch", "fleet_attention_torch"]
KERNELS = ["causal_dot_product", "auto"]


def _inputs(B, H, n, r, d, layout, dtype=torch.float32, seed=0, strength=20.0, strided=False):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda k: (B, H, n, k)) if layout == "bhnd" else (lambda k: (B, n, H, k))
    b, c, v = (torch.randn(*shape(k), generator=g).to(DEVICE, dtype) for k in (r, r, d))
    a = -torch.rand(B, H, n, generator=g) * torch.rand(B, H, 1, generator=g) * strength   # 0 … −strength
    a[..., n // 3] = 0.0                                                                   # a ≈ 0 rows too
    if strided:   # a view with strides of its own: every other element of a wider tensor
        wide = torch.zeros(B, H, n, 2)
        wide[..., 0] = a
        a = wide[..., 0]
    a = a.to(DEVICE)
    if layout == "bnhd":
        a = a.transpose(1, 2)   # (B, n, H): a transposed view, read as it is
    return b, c, v, a


@pytest.mark.parametrize("method", TWINS + KERNELS)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_methods_match_the_oracle(method, layout):
    B, H, n, r, d = 2, 2, 37, 5, 6
    b, c, v, a = _inputs(B, H, n, r, d, layout, strided=True)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                             return_state=True)
    ref, ref_state = reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), f"{method} output")
    assert_close(state, ref_state, tolerance(torch.float32), f"{method} state")


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 40), r=st.integers(1, 9), d=st.integers(1, 9), strength=st.sampled_from([0.0, 0.5, 20.0]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), seed=st.integers(0, 1000))
def test_kernel_matches_the_oracle_over_shapes(n, r, d, strength, dtype, seed):
    b, c, v, a = _inputs(1, 2, n, r, d, "bhnd", dtype, seed, strength)
    out = leettriton.linear_attention(b, c, v, log_decay=a, method="causal_dot_product")
    ref = reference(b.float(), c.float(), v.float(), log_decay=a)
    assert out.dtype == dtype
    assert_close(out, ref, tolerance(dtype), "causal_dot_product", terms=reference(
        b.float().abs(), c.float().abs(), v.float().abs(), log_decay=a))


@pytest.mark.parametrize("method", ["causal_dot_product_torch", "causal_dot_product"])
def test_two_pieces_chained_through_the_state_are_one_call(method):
    b, c, v, a = _inputs(1, 2, 30, 4, 3, "bhnd", seed=3, strength=2.0)
    whole, s_whole = leettriton.linear_attention(b, c, v, log_decay=a, method=method, return_state=True)
    o1, s1 = leettriton.linear_attention(b[:, :, :11], c[:, :, :11], v[:, :, :11], log_decay=a[:, :, :11],
                                         method=method, return_state=True)
    o2, s2 = leettriton.linear_attention(b[:, :, 11:], c[:, :, 11:], v[:, :, 11:], log_decay=a[:, :, 11:],
                                         method=method, initial_state=s1, return_state=True)
    assert_close(torch.cat([o1, o2], 2), whole.double(), 1e-6, "chained output")
    assert_close(s2, s_whole.double(), 1e-6, "chained state")


def test_the_constant_case_is_the_gamma_path():
    b, c, v, _ = _inputs(2, 3, 20, 4, 5, "bhnd", seed=4)
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    a = torch.log(gamma).view(1, 3, 1).expand(2, 3, 20)   # stride 0 along n and batch
    for method in ("causal_dot_product", "causal_dot_product_torch"):
        per_token = leettriton.linear_attention(b, c, v, log_decay=a, method=method)
        constant = leettriton.linear_attention(b, c, v, gamma, method=method)
        assert_close(per_token, constant.double(), 1e-5, method)


def test_decode_steps_and_tokens_equal_prefill():
    B, H, n, r, d = 3, 2, 7, 4, 5
    b, c, v, a = _inputs(B, H, n, r, d, "bhnd", seed=5, strength=3.0, strided=True)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    ref, ref_state = reference(b, c, v, log_decay=a, initial_state=s0, return_state=True)
    state = s0.clone()
    outs = []
    for t in range(n):
        o, state = leettriton.decode_step(b[:, :, t], c[:, :, t], v[:, :, t], state, log_decay=a[:, :, t])
        outs.append(o)
    assert_close(torch.stack(outs, 2), ref, 1e-5, "decode_step × n")
    assert_close(state, ref_state, 1e-5, "decode_step's state")
    state = s0.clone()
    o, state, kept = leettriton.decode_tokens(b, c, v, state, log_decay=a, keep_states=True)
    assert_close(o, ref, 1e-5, "decode_tokens")
    assert_close(state, ref_state, 1e-5, "decode_tokens' state")
    assert torch.equal(kept[:, :, 0], s0) and torch.equal(kept[:, :, -1], state)
    # slotted: row 1 is padding, rows 0 and 2 use slots 4 and 0 of a pool
    pool = torch.zeros(5, H, r, d, device=DEVICE)
    pool[4], pool[0] = s0[0], s0[2]
    untouched = pool[1:4].clone()
    slots = torch.tensor([4, -1, 0], device=DEVICE)
    o, pool = leettriton.decode_tokens(b, c, v, pool, log_decay=a, slot_ids=slots)
    assert_close(o[[0, 2]], ref[[0, 2]], 1e-5, "slotted decode_tokens")
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert_close(pool[[4, 0]], ref_state[[0, 2]], 1e-5, "slotted states")
    assert torch.equal(pool[1:4], untouched)


def test_varlen_twin_matches_each_sequence():
    H, r, d = 2, 3, 4
    cu = torch.tensor([0, 5, 5, 12], device=DEVICE)
    g = torch.Generator().manual_seed(7)
    b, c, v = (torch.randn(12, H, k, generator=g).to(DEVICE) for k in (r, r, d))
    a = (-torch.rand(H, 12, generator=g) * 4).to(DEVICE).t()   # (T, H), strided
    o, states = leettriton.linear_attention_varlen(b, c, v, cu, log_decay=a, method="lightning_attention_torch",
                                                   return_state=True)
    for i, (s, e) in enumerate([(0, 5), (5, 5), (5, 12)]):
        if s == e:
            assert torch.equal(states[i], torch.zeros_like(states[i]))
            continue
        ref, ref_state = reference(b[s:e].unsqueeze(0), c[s:e].unsqueeze(0), v[s:e].unsqueeze(0),
                                   log_decay=a[s:e].unsqueeze(0), layout="bnhd", return_state=True)
        assert_close(o[s:e], ref[0], 1e-5, f"sequence {i}")
        assert_close(states[i], ref_state[0], 1e-5, f"sequence {i}'s state")
    with pytest.raises(NotImplementedError, match="method 'vanilla' does not take a per-token decay"):
        leettriton.linear_attention_varlen(b, c, v, cu, log_decay=a, method="vanilla")


def test_a_positive_or_nan_decay_gives_nan_rows_of_its_head_only():
    """The kernels do not read a's values on the host: a > 0 or NaN makes the rows it decays NaN."""
    b, c, v, a = _inputs(1, 2, 20, 4, 4, "bhnd", seed=8, strength=1.0)
    for bad in (0.5, float("nan")):
        a2 = a.clone()
        a2[0, 1, 7] = bad
        for method in ("causal_dot_product", "causal_dot_product_torch"):
            out = leettriton.linear_attention(b, c, v, log_decay=a2, method=method)
            ref = reference(b, c, v, log_decay=a)
            assert_close(out[:, 0], ref[:, 0], 1e-5, "the other head")
            assert_close(out[:, 1, :7], ref[:, 1, :7], 1e-5, "the rows before")
            assert torch.isnan(out[0, 1, 7:]).all()


def test_errors():
    b, c, v, a = _inputs(1, 2, 6, 3, 3, "bhnd")
    with pytest.raises(ValueError, match="give gamma or log_decay, not both"):
        leettriton.linear_attention(b, c, v, 0.9, log_decay=a)
    with pytest.raises(ValueError, match=r"log_decay must have shape \(batch, heads, n\) = \(1, 2, 6\) for layout "
                                         r"'bhnd', got shape \(1, 6, 2\)"):
        leettriton.linear_attention(b, c, v, log_decay=a.transpose(1, 2))
    with pytest.raises(TypeError, match="log_decay must be float32 or the inputs' dtype"):
        leettriton.linear_attention(b, c, v, log_decay=a.double())
    with pytest.raises(TypeError, match="log_decay must be None or a torch.Tensor"):
        leettriton.linear_attention(b, c, v, log_decay=-0.1)
    # every built-in method takes it; a user method (whose contract has no such argument) is refused
    assert set(leettriton.registry.BUILTIN_METHODS) <= set(leettriton.registry.per_token_methods())
    leettriton.register_method("plain_user_method", lambda b, c, v, gamma: None)
    try:
        with pytest.raises(NotImplementedError, match=r"method 'plain_user_method' does not support a per-token "
                                                      r"decay.*'causal_dot_product'.*'vanilla_torch'"):
            leettriton.linear_attention(b, c, v, log_decay=a, method="plain_user_method")
    finally:
        leettriton.registry.unregister_method("plain_user_method")
    with pytest.raises(ValueError, match=r"log_decay must have shape \(batch, heads\) = \(1, 2\), got shape"):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], torch.zeros(1, 2, 3, 3, device=DEVICE),
                               log_decay=a)


def test_values_are_checked_on_the_cpu_outside_the_interpreter(monkeypatch):
    b, c, v, a = _inputs(1, 2, 6, 3, 3, "bhnd")
    a = a.cpu().clone()
    a[0, 1, 4] = 0.25
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"log_decay must be ≤ 0 .*got log_decay\[0, 1, 4\] = 0.25"):
        leettriton.linear_attention(b.cpu(), c.cpu(), v.cpu(), log_decay=a, method="causal_dot_product_torch")


def _grads(fn, inputs, seed=9):
    out, state = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g).to(out.device, torch.float64)
    gs = torch.randn(state.shape, generator=g).to(state.device, torch.float64)
    loss = (out.double() * go).sum() + (state.double() * gs).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("method", ["causal_dot_product", "causal_dot_product_torch", "lightning_attention_torch"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_gradients_match_float64_autograd_through_the_oracle(method, layout):
    B, H, n, r, d = 2, 2, 13, 3, 4
    b, c, v, a = _inputs(B, H, n, r, d, layout, seed=10, strength=3.0)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    inputs = [x.clone().requires_grad_() for x in (b, c, v, s0, a)]

    def ours(b, c, v, s0, a):
        return leettriton.linear_attention(b, c, v, log_decay=a, method=method, layout=layout, initial_state=s0,
                                           return_state=True)

    def oracle(b, c, v, s0, a):
        return reference(b, c, v, log_decay=a, layout=layout, initial_state=s0, return_state=True)

    for name, x, y in zip(("b", "c", "v", "initial_state", "log_decay"), _grads(ours, inputs), _grads(oracle, inputs)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert_close(x, y.double(), 1e-5, f"d{name}")


def test_the_gradient_of_a_alone_and_without_the_state():
    """Only a requires grad, and only the output is used: the backward still forms db and dc for it."""
    b, c, v, a = _inputs(1, 2, 11, 3, 3, "bhnd", seed=12, strength=2.0)
    a = a.clone().requires_grad_()
    out = leettriton.linear_attention(b, c, v, log_decay=a, method="causal_dot_product")
    (da,) = torch.autograd.grad(out.sum(), a)
    (ref,) = torch.autograd.grad(reference(b, c, v, log_decay=a).sum(), a)
    assert_close(da, ref.double(), 1e-5, "da")


def test_gradcheck_of_the_twin_in_float64():
    """The twin's float64 computation (what autograd differentiates) against finite differences."""
    from leettriton.problem import Problem
    from leettriton.torch_methods import causal_dot_product_torch

    g = torch.Generator().manual_seed(13)
    B, H, n, r, d = 1, 2, 6, 2, 3
    b, c, v = (torch.randn(B, H, n, k, generator=g, dtype=torch.float64, requires_grad=True) for k in (r, r, d))
    s0 = torch.randn(B, H, r, d, generator=g, dtype=torch.float64, requires_grad=True)
    a = (-torch.rand(B, H, n, generator=g, dtype=torch.float64) * 2 - 0.1).requires_grad_()

    def fn(b, c, v, s0, a):
        out = torch.empty(B, H, n, d, dtype=torch.float64)
        state = torch.empty(B, H, r, d, dtype=torch.float64)
        causal_dot_product_torch(Problem(b, c, v, None, s0, out, state, "ieee", log_decay=a))
        return out, state

    assert torch.autograd.gradcheck(fn, (b, c, v, s0, a))


@pytest.mark.parametrize("method", ["causal_dot_product", "lightning_attention", "vanilla_torch"])
def test_learnable_gamma_gets_its_gradient(method):
    B, H, n, r, d = 2, 2, 9, 3, 4
    b, c, v, _ = _inputs(B, H, n, r, d, "bhnd", seed=14)
    gamma = torch.tensor([0.9, 0.6], device=DEVICE, requires_grad=True)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(15)).to(DEVICE).requires_grad_()
    (dg, ds0) = _grads(lambda g, s: leettriton.linear_attention(b, c, v, g, method=method, initial_state=s,
                                                                return_state=True), [gamma, s0])
    (rg, rs0) = _grads(lambda g, s: reference(b, c, v, log_decay=torch.log(g).view(1, H, 1).expand(B, H, n),
                                              initial_state=s, return_state=True), [gamma, s0])
    assert_close(dg, rg.double(), 1e-5, "dγ")
    assert_close(ds0, rs0.double(), 1e-5, "dS₀")


@pytest.mark.skipif(not HAS_GPU, reason="a sequence of 10⁵ tokens runs on the GPU only")
@pytest.mark.parametrize("strength", [20.0, 1e-6])
def test_long_sequences_stay_finite_and_within_tolerance(strength):
    """n = 100 000 with strong decay and with a ≈ 0: finite, within float16's tolerance (the state in float32)."""
    b, c, v, a = _inputs(1, 2, 100_000, 16, 16, "bhnd", torch.float16, seed=16, strength=strength)
    b, c, v = b * 0.1, c * 0.1, v
    out, state = leettriton.linear_attention(b, c, v, log_decay=a, return_state=True)
    ref, ref_state = reference(b.float(), c.float(), v.float(), log_decay=a, return_state=True)
    terms = reference(b.float().abs(), c.float().abs(), v.float().abs(), log_decay=a)
    assert_close(out, ref, tolerance(torch.float16), "output", terms=terms)
    assert_close(state, ref_state, tolerance(torch.float16), "state",
                 terms=reference(b.float().abs(), c.float().abs(), v.float().abs(), log_decay=a, return_state=True)[1])


def test_compiled_calls_trace_whole_with_their_gradients():
    """torch.compile(fullgraph=True) traces linear_attention with log_decay (and a learnable γ) and the decode
    steps as the registered operators, the backward operator giving da and dγ (docs/design.md §4.6)."""
    b, c, v, a = _inputs(1, 2, 9, 3, 4, "bhnd", seed=17, strength=2.0)
    b, a = b.clone().requires_grad_(), a.clone().requires_grad_()
    gamma = torch.tensor([0.9, 0.7], device=DEVICE, requires_grad=True)
    fn = torch.compile(lambda b, c, v, a: leettriton.linear_attention(b, c, v, log_decay=a, return_state=True),
                       fullgraph=True, backend="aot_eager")
    got = _grads(lambda b, a: fn(b, c, v, a), [b, a])
    want = _grads(lambda b, a: reference(b, c, v, log_decay=a, return_state=True), [b, a])
    for name, x, y in zip(("b", "a"), got, want):
        assert_close(x, y.double(), 1e-5, f"compiled d{name}")
    fg = torch.compile(lambda g: leettriton.linear_attention(b.detach(), c, v, g, return_state=True), fullgraph=True,
                       backend="aot_eager")
    (dg,) = _grads(fg, [gamma])
    (rg,) = _grads(lambda g: reference(b.detach(), c, v, log_decay=torch.log(g).view(1, 2, 1).expand(1, 2, 9),
                                       return_state=True), [gamma])
    assert_close(dg, rg.double(), 1e-5, "compiled dγ")
    step = torch.compile(lambda b, c, v, s, a: leettriton.decode_step(b, c, v, s, log_decay=a), fullgraph=True,
                         backend="aot_eager")
    state = torch.zeros(1, 2, 3, 4, device=DEVICE)
    with torch.no_grad():
        for t in range(9):
            o, _ = step(b[:, :, t], c[:, :, t], v[:, :, t], state, a[:, :, t])
    ref, ref_state = reference(b.detach(), c, v, log_decay=a.detach(), return_state=True)
    assert_close(o, ref[:, :, -1], 1e-5, "compiled decode_step")
    assert_close(state, ref_state, 1e-5, "compiled decode_step's state")


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_repeated_calls_read_each_calls_decay(layout, monkeypatch):
    """The repeated-call fast path (docs/design.md §4.5) keys on the decay's shape and strides and reads each
    call's values; on CPU outside the interpreter it still checks them on every call."""
    b, c, v, a = _inputs(1, 2, 12, 3, 3, layout, seed=18, strength=2.0)
    for method in ("causal_dot_product", "causal_dot_product_torch"):
        for scale in (1.0, 0.25, 3.0):
            a2 = (a * scale).clone() if layout == "bhnd" else (a.transpose(1, 2) * scale).clone().transpose(1, 2)
            out = leettriton.linear_attention(b, c, v, log_decay=a2, method=method, layout=layout)
            assert_close(out, reference(b, c, v, log_decay=a2, layout=layout), 1e-5, f"{method} × {scale}")
        out = leettriton.linear_attention(b, c, v, method=method, layout=layout)   # the same call without a decay
        assert_close(out, reference(b, c, v, layout=layout), 1e-5, f"{method} without a decay")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = [x.cpu() for x in (b, c, v)]
    good = a.cpu().clone()
    leettriton.linear_attention(*cpu, log_decay=good, method="causal_dot_product_torch", layout=layout)
    good[0, 1, 1] = 1.0
    with pytest.raises(ValueError, match="log_decay must be ≤ 0"):
        leettriton.linear_attention(*cpu, log_decay=good, method="causal_dot_product_torch", layout=layout)
