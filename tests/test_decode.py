"""decode_step: token-by-token generation agrees with prefill, the recurrence and the oracle."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import leettriton
from conftest import DEVICE
from helpers import assert_close, tolerance


def tokens(B, H, n, r, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    b, c = (torch.randn(B, H, n, r, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, n, d, generator=g).to(device=DEVICE, dtype=dtype)
    return b, c, v


@st.composite
def decode_cases(draw):
    return dict(B=draw(st.integers(1, 3)), H=draw(st.integers(1, 3)), n=draw(st.integers(1, 24)),
                r=draw(st.sampled_from([1, 3, 16, 33, 64, 130])), d=draw(st.sampled_from([1, 5, 16, 31, 64, 129])),
                dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
                gamma=draw(st.sampled_from([None, 1.0, 0.999, 0.5, 0.01, "tensor"])),
                initial=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@given(case=decode_cases())
def test_decode_steps_equal_prefill_and_oracle(case):
    B, H, n, r, d, dtype = (case[k] for k in ("B", "H", "n", "r", "d", "dtype"))
    b, c, v = tokens(B, H, n, r, d, dtype, case["seed"])
    gamma = torch.linspace(0.5, 1.0, H, device=DEVICE) if case["gamma"] == "tensor" else case["gamma"]
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(case["seed"])).to(DEVICE) \
        if case["initial"] else None
    state = s0.clone() if s0 is not None else torch.zeros(B, H, r, d, device=DEVICE)
    outs = []
    for t in range(n):
        o_t, same = leettriton.decode_step(b[:, :, t], c[:, :, t], v[:, :, t], state, gamma)
        assert same is state and o_t.dtype == dtype and o_t.shape == (B, H, d)
        outs.append(o_t)
    steps = torch.stack(outs, dim=2)
    ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
    tol = tolerance(dtype)
    assert_close(steps, ref, tol, "decode steps vs oracle")
    assert_close(state, ref_state, tol, "decoded state vs oracle")
    prefill, prefill_state = leettriton.linear_attention(b, c, v, gamma, initial_state=s0, return_state=True)
    assert_close(steps, prefill.float(), 2 * tol, "decode steps vs prefill")
    assert_close(state, prefill_state, 2 * tol, "decoded state vs prefill")


@pytest.mark.parametrize("r,d", [(300, 20), (24, 520), (1024, 8)], ids=["r300", "d520", "r1024"])
def test_decode_wide_dims(r, d):
    """Keys and values past 256: whole-r key tiles up to 1024, any number of value tiles."""
    B, H, n = 1, 2, 3
    b, c, v = tokens(B, H, n, r, d, torch.float16, 11)
    gamma = torch.tensor([0.9, 1.0], device=DEVICE)
    s0 = torch.randn(B, H, r, d, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    state = s0.clone()
    outs = [leettriton.decode_step(b[:, :, t], c[:, :, t], v[:, :, t], state, gamma)[0] for t in range(n)]
    ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
    assert_close(torch.stack(outs, dim=2), ref, tolerance(torch.float16), f"decode r={r} d={d}")
    assert_close(state, ref_state, tolerance(torch.float16), f"decoded state r={r} d={d}")


@pytest.mark.parametrize("method", ["auto", "lightning_attention", "causal_dot_product", "fleet_attention"])
def test_prefill_then_decode_continues(method):
    """Prefill a prompt with return_state, then generate: the same as one pass over everything."""
    B, H, n, extra, r, d = 2, 3, 100, 12, 32, 40
    b, c, v = tokens(B, H, n + extra, r, d, torch.float32, 5)
    gamma = torch.tensor([0.9, 0.99, 1.0], device=DEVICE)
    _, state = leettriton.linear_attention(b[:, :, :n], c[:, :, :n], v[:, :, :n], gamma, method=method,
                                           return_state=True)
    outs = [leettriton.decode_step(b[:, :, t], c[:, :, t], v[:, :, t], state, gamma)[0] for t in range(n, n + extra)]
    ref, ref_state = leettriton.reference(b, c, v, gamma, return_state=True)
    assert_close(torch.stack(outs, dim=2), ref[:, :, n:], 1e-5, f"decode after {method} prefill")
    assert_close(state, ref_state, 1e-5, f"state after {method} prefill and decode")


def test_decode_strided_inputs_and_state():
    """Inputs sliced from a (batch, n, heads, dim) tensor and a non-contiguous state."""
    B, H, r, d = 2, 4, 24, 20
    g = torch.Generator().manual_seed(9)
    seq = torch.randn(B, 5, H, 2 * r + d, generator=g).to(DEVICE)
    b_t, c_t, v_t = seq[:, 3, :, :r], seq[:, 3, :, r:2 * r], seq[:, 3, :, 2 * r:]
    wide = torch.randn(B, H, d, r, generator=g).to(DEVICE)
    state = wide.transpose(-1, -2)  # (B, H, r, d), not contiguous
    before = state.clone()
    o_t, _ = leettriton.decode_step(b_t, c_t, v_t, state, 0.8)
    expect_state = 0.8 * before.double() + c_t.double()[..., :, None] * v_t.double()[..., None, :]
    expect_o = (b_t.double()[..., :, None] * expect_state).sum(-2)
    assert_close(state, expect_state, 1e-6, "strided state update")
    assert_close(o_t, expect_o, 1e-6, "strided decode output")


def test_decode_without_decay_is_a_plain_sum():
    B, H, r, d = 1, 2, 8, 8
    b, c, v = tokens(B, H, 1, r, d, torch.float32, 3)
    state = torch.ones(B, H, r, d, device=DEVICE)
    o_t, _ = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state)
    expect = 1.0 + c[:, :, 0, :, None].double() * v[:, :, 0, None, :].double()
    assert_close(state, expect, 1e-6, "state without decay")
    assert_close(o_t, (b[:, :, 0, :, None].double() * expect).sum(-2), 1e-6, "output without decay")


def test_decode_graph_capture():
    """On CUDA the step can be captured in a graph and replayed (no sync, no allocation but its output)."""
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    B, H, r, d = 4, 8, 64, 64
    b, c, v = tokens(B, H, 3, r, d, torch.float16, 11)
    gamma = torch.full((H,), 0.95, device=DEVICE)
    state = torch.zeros(B, H, r, d, device=DEVICE)
    leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, gamma)  # validates gamma, compiles
    state.zero_()
    b_in, c_in, v_in = b[:, :, 0].clone(), c[:, :, 0].clone(), v[:, :, 0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_t, _ = leettriton.decode_step(b_in, c_in, v_in, state, gamma)
    outs = []
    for t in range(3):
        b_in.copy_(b[:, :, t]), c_in.copy_(c[:, :, t]), v_in.copy_(v[:, :, t])
        graph.replay()
        outs.append(o_t.clone())
    ref, ref_state = leettriton.reference(b, c, v, gamma, return_state=True)
    assert_close(torch.stack(outs, dim=2), ref, 2e-3, "graph-replayed decode")
    assert_close(state, ref_state, 2e-3, "graph-replayed state")
