"""The public API around the kernels: names, aliases, registration, layouts, edge sizes, compat."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import leettriton
from conftest import DEVICE
from helpers import Case, assert_close

BUILTINS = ["vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention"]


def test_methods_listed():
    for name in BUILTINS:
        assert name in leettriton.METHODS and f"{name}_torch" in leettriton.METHODS
        assert callable(getattr(leettriton, name))
    assert "auto" in leettriton.METHODS


def test_import_does_not_touch_cuda():
    code = ("import torch, leettriton; "
            "assert not torch.cuda.is_initialized(), 'importing leettriton initialised CUDA'; "
            "print(sorted(leettriton.METHODS))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "fleet_attention" in res.stdout


@pytest.mark.parametrize("alias,name", [("lightningAttention2", "lightning_attention"),
                                        ("FleetAttention", "fleet_attention"), ("block-based", "block_based"),
                                        ("FleetAttention_torch", "fleet_attention_torch"),
                                        ("lightningAttention2_torch", "lightning_attention_torch")])
def test_paper_spellings(alias, name):
    case = Case(1, 2, 40, 8, 6, gamma=0.9, seed=3)
    b, c, v, gamma, _ = case.tensors(DEVICE)
    via_alias = leettriton.linear_attention(b, c, v, gamma, method=alias)
    direct = leettriton.linear_attention(b, c, v, gamma, method=name)
    assert torch.equal(via_alias, direct)


def test_method_functions_match_linear_attention():
    case = Case(2, 1, 33, 5, 7, gamma=0.8, initial=True, seed=4)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    for name in BUILTINS + [f"{m}_torch" for m in BUILTINS]:
        fn = getattr(leettriton, name)
        assert fn.__name__ == name
        o1, s1 = fn(b, c, v, gamma, initial_state=s0, return_state=True)
        o2, s2 = leettriton.linear_attention(b, c, v, gamma, method=name, initial_state=s0, return_state=True)
        assert torch.equal(o1, o2) and torch.equal(s1, s2), name


def test_register_method_is_dispatched_and_listed():
    calls = []

    def mine(b, c, v, gamma, *, initial_state=None, return_state=False, precision="ieee"):
        calls.append((tuple(b.shape), tuple(gamma.shape), initial_state is None, return_state))
        o = leettriton.reference(b, c, v, gamma, initial_state=initial_state, return_state=return_state)
        return (o[0].to(v.dtype), o[1].float()) if return_state else o.to(v.dtype)

    leettriton.register_method("mine_for_test", mine)
    assert "mine_for_test" in leettriton.METHODS
    case = Case(1, 2, 20, 4, 3, layout="bnhd", gamma=0.7, seed=5)
    b, c, v, gamma, _ = case.tensors(DEVICE)
    o, s = leettriton.linear_attention(b, c, v, gamma, method="mine_for_test", layout="bnhd", return_state=True)
    ref, ref_s = leettriton.reference(b, c, v, gamma, layout="bnhd", return_state=True)
    assert calls == [((1, 2, 20, 4), (2,), True, True)]  # bhnd views, one γ per head
    assert_close(o, ref, 1e-6, "registered method output")
    assert_close(s, ref_s, 1e-6, "registered method state")


def test_register_method_rejects_builtin_names():
    with pytest.raises(ValueError, match="taken by a built-in"):
        leettriton.register_method("vanilla", lambda *a, **k: None)
    with pytest.raises(TypeError, match="fn must be callable"):
        leettriton.register_method("x_not_callable", 3)


def test_registered_method_wrong_output_is_reported():
    leettriton.register_method("wrong_shape_for_test", lambda b, c, v, gamma, **kw: v[..., :1])
    b, c, v, _, _ = Case(1, 1, 5, 2, 3).tensors(DEVICE)
    with pytest.raises(ValueError, match=r"registered method returned .* expected an output of shape \(1, 1, 5, 3\)"):
        leettriton.linear_attention(b, c, v, method="wrong_shape_for_test")


@pytest.mark.parametrize("method", ["vanilla", "lightning_attention", "lightning_attention_torch", "auto"])
def test_layouts_give_the_same_numbers(method):
    case = Case(2, 3, 50, 8, 12, gamma=0.95, seed=6)
    b, c, v, gamma, _ = case.tensors(DEVICE)
    o = leettriton.linear_attention(b, c, v, gamma, method=method)
    bt, ct, vt = (x.transpose(1, 2).contiguous() for x in (b, c, v))
    ot = leettriton.linear_attention(bt, ct, vt, gamma, method=method, layout="bnhd")
    assert ot.shape == (2, 50, 3, 12) and ot.is_contiguous()
    assert torch.equal(ot.transpose(1, 2), o)


@pytest.mark.parametrize("method", ["vanilla", "auto", "vanilla_torch"])
def test_empty_sequence_returns_initial_state(method):
    b, c, v, gamma, s0 = Case(2, 2, 0, 4, 5, gamma=0.9, initial=True).tensors(DEVICE)
    o, s = leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0, return_state=True)
    assert o.shape == (2, 2, 0, 5) and torch.equal(s, s0) and s is not s0
    o, s = leettriton.linear_attention(b, c, v, gamma, method=method, return_state=True)
    assert torch.equal(s, torch.zeros_like(s))


def test_gamma_forms_agree():
    b, c, v, _, _ = Case(1, 2, 30, 4, 4, seed=8).tensors(DEVICE)
    # 0.75 is exact in every float dtype, so every form gives the same λ
    outs = [leettriton.linear_attention(b, c, v, g, method="vanilla_torch")
            for g in (0.75, torch.full((2,), 0.75, device=DEVICE, dtype=torch.float16),
                      torch.full((2, 1), 0.75, device=DEVICE, dtype=torch.float64))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    no_decay = [leettriton.linear_attention(b, c, v, g, method="vanilla") for g in (None, 1.0, torch.ones(2, device=DEVICE))]
    assert torch.equal(no_decay[0], no_decay[1]) and torch.equal(no_decay[1], no_decay[2])


def test_causal_linear_decoder_compat():
    case = Case(1, 2, 40, 8, 8, gamma="tensor", gammas=(0.9, 0.99), seed=9)
    b, c, v, gamma, _ = case.tensors(DEVICE)
    o = leettriton.causal_linear_decoder(b, c, v, is_mask_weight=True, gamma=gamma, attn_method="FleetAttention")
    assert_close(o, leettriton.reference(b, c, v, gamma), 1e-5, "causal_linear_decoder with decay")
    o = leettriton.causal_linear_decoder(b, c, v)
    assert_close(o, leettriton.reference(b, c, v), 1e-5, "causal_linear_decoder without decay")
    with pytest.raises(ValueError, match="is_mask_weight=True needs gamma"):
        leettriton.causal_linear_decoder(b, c, v, is_mask_weight=True)
    with pytest.raises(ValueError, match="gamma was given with is_mask_weight=False"):
        leettriton.causal_linear_decoder(b, c, v, gamma=gamma)


def test_reference_matches_naive_recurrence():
    """The oracle against the literal recurrence of docs/design.md §1.2, also across its chunked path."""
    from leettriton import reference as reference_module

    B, H, n, r, d = 1, 2, 2100, 3, 2
    g = torch.Generator().manual_seed(10)
    b, c, v = torch.randn(B, H, n, r, generator=g), torch.randn(B, H, n, r, generator=g), torch.randn(B, H, n, d, generator=g)
    s0 = torch.randn(B, H, r, d, generator=g)
    gamma = torch.tensor([0.999, 0.9])
    o, s = reference_module(b, c, v, gamma, initial_state=s0, return_state=True, device="cpu")
    S = s0.double()
    gd = gamma.double().view(1, H, 1, 1)
    expect = torch.empty(B, H, n, d, dtype=torch.float64)
    for t in range(n):
        S = gd * S + c[:, :, t, :, None].double() * v[:, :, t, None, :].double()
        expect[:, :, t] = (b[:, :, t, :, None].double() * S).sum(-2)
    assert n > 1024  # exercises the chunked path
    assert (o - expect).abs().max() < 1e-9 and (s - S).abs().max() < 1e-9


def test_methods_is_an_immutable_tuple_that_follows_registration():
    assert isinstance(leettriton.METHODS, tuple)
    leettriton.register_method("listed_for_test", lambda b, c, v, gamma: v)
    try:
        assert leettriton.METHODS[-1] == "listed_for_test"
    finally:
        leettriton.unregister_method("listed_for_test")
    assert "listed_for_test" not in leettriton.METHODS


def test_a_plain_four_argument_method_works_everywhere():
    """One user-method contract (docs/design.md §6): gamma is None without decay, a float32 (heads,) tensor
    with it; the same function serves linear_attention, causal_linear_decoder and benchmark_method."""
    seen = []

    def plain(b, c, v, gamma):
        seen.append(None if gamma is None else (gamma.dtype, tuple(gamma.shape)))
        return leettriton.reference(b, c, v, gamma).to(v.dtype)

    leettriton.register_method("plain_for_test", plain)
    try:
        b, c, v, _, _ = Case(1, 2, 12, 3, 4, seed=11).tensors(DEVICE)
        o = leettriton.linear_attention(b, c, v, method="plain_for_test")
        assert_close(o, leettriton.reference(b, c, v), 1e-6, "plain method without decay")
        o = leettriton.causal_linear_decoder(b, c, v, is_mask_weight=True, gamma=0.5, attn_method="plain_for_test")
        assert_close(o, leettriton.reference(b, c, v, 0.5), 1e-6, "plain method through causal_linear_decoder")
        assert seen == [None, (torch.float32, (2,))]
        # a call that needs a keyword the function does not take is refused, not run without it
        with pytest.raises(TypeError, match="method 'plain' was called with initial_state, but it takes no "
                                            "'initial_state' keyword"):
            leettriton.linear_attention(b, c, v, 0.5, method="plain_for_test",
                                        initial_state=torch.zeros(1, 2, 3, 4, device=DEVICE))
        with pytest.raises(TypeError, match="takes no 'return_state' keyword"):
            leettriton.linear_attention(b, c, v, 0.5, method="plain_for_test", return_state=True)
    finally:
        leettriton.unregister_method("plain_for_test")


def test_a_method_that_cannot_take_four_arguments_is_refused_at_registration():
    with pytest.raises(TypeError, match=r"a method must take \(b, c, v, gamma\); 'f' takes 3"):
        def f(b, c, v):
            return v
        leettriton.register_method("three_for_test", f)
    assert "three_for_test" not in leettriton.METHODS
