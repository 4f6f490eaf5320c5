"""Bad input: a clear exception naming the argument, before any kernel runs (docs/design.md §4.2); γ handling (§2.6)."""
from __future__ import annotations

import math

import pytest
import torch

import leettriton
import triton
import triton.language as tl
from conftest import DEVICE
from leettriton.kernels.abi import log2_float64
from leettriton.problem import MAX_DIM


def inputs(B=1, H=2, n=8, r=4, d=5, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, n, k, generator=g).to(device=device, dtype=dtype) for k in (r, r, d))


def call(**over):
    b, c, v = inputs()
    args = dict(b=b, c=c, v=v, gamma=0.9)
    args.update(over)
    return leettriton.linear_attention(args.pop("b"), args.pop("c"), args.pop("v"), args.pop("gamma"), **args)


@pytest.mark.parametrize("name", ["b", "c", "v"])
def test_not_a_tensor(name):
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
        call(**{name: [[1.0]]})


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.complex64, torch.bool])
def test_bad_dtype(dtype):
    b, c, v = inputs()
    with pytest.raises(TypeError, match=f"b must be float16, bfloat16 or float32, got dtype {dtype}"):
        call(b=b.to(dtype))


def test_mismatched_dtypes():
    b, c, v = inputs()
    with pytest.raises(TypeError, match="b, c and v must share one dtype, got torch.float32, torch.float16"):
        call(c=c.half())


@pytest.mark.parametrize("shape", [(2, 8, 4), (1, 1, 2, 8, 4)])
def test_wrong_rank(shape):
    with pytest.raises(ValueError, match=r"b must be 4-D \(batch, heads, n, dim\) for layout 'bhnd', got shape"):
        call(b=torch.randn(*shape, device=DEVICE))


def test_wrong_rank_message_names_layout():
    with pytest.raises(ValueError, match=r"v must be 4-D \(batch, n, heads, dim\) for layout 'bnhd'"):
        b, c, v = inputs()
        call(b=b.transpose(1, 2), c=c.transpose(1, 2), v=v[0], layout="bnhd")


@pytest.mark.parametrize("which,shape", [("c", (1, 2, 8, 3)), ("c", (1, 3, 8, 4)), ("c", (2, 2, 8, 4))])
def test_c_shape_mismatch(which, shape):
    with pytest.raises(ValueError, match=r"c must have the shape of b \(1, 2, 8, 4\), got"):
        call(c=torch.randn(*shape, device=DEVICE))


@pytest.mark.parametrize("shape", [(1, 2, 9, 5), (1, 3, 8, 5), (2, 2, 8, 5)])
def test_v_shape_mismatch(shape):
    with pytest.raises(ValueError, match="v must match b in batch, heads and n"):
        call(v=torch.randn(*shape, device=DEVICE))


def test_mismatched_devices():
    b, c, v = inputs()
    if DEVICE == "cuda":
        with pytest.raises(ValueError, match="b, c and v must be on one device, got"):
            call(v=v.cpu())
    else:  # one device type on this machine: a meta tensor is refused for its device type first
        with pytest.raises(ValueError, match="v must be on a CPU or CUDA device, got a tensor on meta"):
            call(v=torch.empty(v.shape, device="meta"))


@pytest.mark.parametrize("r,d,what", [(MAX_DIM + 1, 8, "r"), (8, MAX_DIM + 1, "d")])
def test_dims_over_limit(r, d, what):
    b, c, v = inputs(r=r, d=d)
    with pytest.raises(NotImplementedError, match=f"{what} .* exceeds the supported maximum of {MAX_DIM}"):
        call(b=b, c=c, v=v)


def test_zero_dim():
    b, c, v = inputs(r=0)
    with pytest.raises(ValueError, match="r .* must be at least 1, got 0"):
        call(b=b, c=c, v=v)


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.5, math.nan, math.inf])
def test_gamma_float_out_of_range(gamma):
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\], got"):
        call(gamma=gamma)


@pytest.mark.parametrize("values,what", [([0.9, 0.0], "≤ 0"), ([1.01, 0.5], "> 1"), ([math.nan, 0.5], "NaN"),
                                         ([-1.0, 0.5], "≤ 0")])
def test_gamma_tensor_out_of_range(values, what):
    with pytest.raises(ValueError, match=f"gamma must hold values in \\(0, 1\\], got a value {what}"):
        call(gamma=torch.tensor(values, device=DEVICE))


@pytest.mark.parametrize("shape", [(3,), (1, 2), (2, 2), (2, 1, 1), ()])
def test_gamma_tensor_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"gamma must have shape \(2,\) or \(2, 1\) \(one γ per head\), got shape"):
        call(gamma=torch.full(shape, 0.9, device=DEVICE))


def test_gamma_tensor_integer():
    with pytest.raises(TypeError, match="gamma must be a floating-point tensor, got dtype torch.int64"):
        call(gamma=torch.ones(2, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("gamma", ["0.9", [0.9, 0.9], True])
def test_gamma_wrong_type(gamma):
    with pytest.raises(TypeError, match="gamma must be None, a float or a tensor of shape"):
        call(gamma=gamma)


def test_gamma_wrong_device():
    with pytest.raises(ValueError, match="gamma must be on the inputs' device"):
        call(gamma=torch.full((2,), 0.9, device="meta"))


def test_gamma_tensor_checked_again_after_in_place_change():
    gamma = torch.full((2,), 0.9, device=DEVICE)
    call(gamma=gamma)
    gamma[0] = 2.0  # bumps the tensor's version: the cached check must not hide this
    with pytest.raises(ValueError, match="gamma must hold values in"):
        call(gamma=gamma)


@pytest.mark.parametrize("shape", [(1, 2, 5, 4), (1, 2, 4), (2, 2, 4, 5)])
def test_state_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"initial_state must have shape \(batch, heads, r, d\) = \(1, 2, 4, 5\)"):
        call(initial_state=torch.zeros(shape, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_state_wrong_dtype(dtype):
    with pytest.raises(TypeError, match=f"initial_state must be float32, got dtype {dtype}"):
        call(initial_state=torch.zeros(1, 2, 4, 5, dtype=dtype, device=DEVICE))


def test_state_not_a_tensor():
    with pytest.raises(TypeError, match="initial_state must be None or a torch.Tensor, got list"):
        call(initial_state=[0.0])


def test_state_wrong_device():
    with pytest.raises(ValueError, match="initial_state must be on the inputs' device"):
        call(initial_state=torch.zeros(1, 2, 4, 5, device="meta"))


@pytest.mark.parametrize("method", ["nope", "Lightning", ""])
def test_unknown_method(method):
    with pytest.raises(ValueError, match=f"unknown method '{method}'; registered methods: vanilla"):
        call(method=method)


def test_method_not_a_string():
    with pytest.raises(TypeError, match="method must be a str, got"):
        call(method=3)


@pytest.mark.parametrize("layout", ["nhd", "BHND", None])
def test_unknown_layout(layout):
    with pytest.raises(ValueError, match="layout must be 'bhnd' or 'bnhd', got"):
        call(layout=layout)


def test_unknown_precision():
    with pytest.raises(ValueError, match="precision must be None, 'ieee' or 'tf32', got 'fp16'"):
        call(precision="fp16")


def test_return_state_not_bool():
    with pytest.raises(TypeError, match="return_state must be a bool"):
        call(return_state="yes")


def test_autograd_guard():
    """decode_step has no backward (it updates the state in place): it refuses inputs that require grad;
    linear_attention differentiates them, and a gamma that requires grad too (a learnable decay); decode_step and
    the oracle refuse such a gamma (docs/design.md §10)."""
    b, c, v = inputs()
    b.requires_grad_(True)
    state = torch.zeros(1, 2, 4, 5, device=DEVICE)
    with pytest.raises(RuntimeError, match="decode_step computes the forward pass only: an input requires grad"):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, 0.9)
    assert call(b=b).grad_fn is not None
    with torch.no_grad():
        out = call(b=b)
    assert out.grad_fn is None and torch.isfinite(out).all()
    gamma = torch.full((2,), 0.9, device=DEVICE, requires_grad=True)
    for run in (lambda: call(gamma=gamma), lambda: call(b=b.detach(), gamma=gamma)):
        assert run().grad_fn is not None
    for run in (lambda: leettriton.decode_step(b[:, :, 0].detach(), c[:, :, 0], v[:, :, 0], state, gamma),
                lambda: leettriton.reference(b, c, v, gamma)):
        with pytest.raises(NotImplementedError, match="gradients with respect to gamma .* are not implemented"):
            run()
    with torch.no_grad():
        assert torch.isfinite(call(b=b, gamma=gamma)).all()   # no gradient asked for: γ is read as it is


@pytest.mark.parametrize("kind", ["decode", "method_fn", "reference"])
def test_other_entry_points_validate(kind):
    b, c, v = inputs()
    if kind == "decode":
        with pytest.raises(ValueError, match=r"state must have shape \(batch, heads, r, d\) = \(1, 2, 4, 5\)"):
            leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], torch.zeros(1, 2, 5, 4, device=DEVICE))
    elif kind == "method_fn":
        with pytest.raises(ValueError, match="gamma must lie in"):
            leettriton.fleet_attention(b, c, v, 2.0)
    else:
        with pytest.raises(TypeError, match="b, c and v must share one dtype"):
            leettriton.reference(b, c.half(), v)


@pytest.mark.parametrize("bad,err,msg", [
    ("b_rank", ValueError, r"b_t must be 3-D \(batch, heads, dim\)"),
    ("dtype", TypeError, "b_t, c_t and v_t must share one dtype"),
    ("state_dtype", TypeError, "state must be float32"),
    ("v_heads", ValueError, "v_t must match b_t in batch and heads"),
    ("gamma", ValueError, r"gamma must lie in \(0, 1\]"),
    ("big", NotImplementedError, f"exceeds the supported maximum of {MAX_DIM}"),
])
def test_decode_step_bad_input(bad, err, msg):
    B, H, r, d = 2, 3, 4, 5
    b_t, c_t = torch.randn(B, H, r, device=DEVICE), torch.randn(B, H, r, device=DEVICE)
    v_t = torch.randn(B, H, d, device=DEVICE)
    state = torch.zeros(B, H, r, d, device=DEVICE)
    gamma = 0.9
    if bad == "b_rank":
        b_t = b_t[0]
    elif bad == "dtype":
        c_t = c_t.half()
    elif bad == "state_dtype":
        state = state.double()
    elif bad == "v_heads":
        v_t = torch.randn(B, H + 1, d, device=DEVICE)
    elif bad == "gamma":
        gamma = 0.0
    elif bad == "big":
        v_t = torch.randn(B, H, MAX_DIM + 1, device=DEVICE)
        state = torch.zeros(B, H, r, MAX_DIM + 1, device=DEVICE)
    before = state.clone()
    with pytest.raises(err, match=msg):
        leettriton.decode_step(b_t, c_t, v_t, state, gamma)
    assert torch.equal(state, before)  # nothing ran


def test_inputs_on_another_device_type_are_refused_before_any_work():
    b, c, v = (torch.empty(1, 2, 8, k, device="meta") for k in (4, 4, 5))
    with pytest.raises(ValueError, match=r"b must be on a CPU or CUDA device, got a tensor on meta"):
        leettriton.linear_attention(b, c, v, 0.9)
    with pytest.raises(ValueError, match=r"b_t must be on a CPU or CUDA device"):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], torch.empty(1, 2, 4, 5, device="meta"), 0.9)


def test_bnhd_inputs_given_as_bhnd_are_named_as_a_layout_problem():
    b, c, v = inputs(H=2, n=8)
    bt, ct, vt = (x.transpose(1, 2).contiguous() for x in (b, c, v))   # (1, 8, 2, ·): heads on dim 2
    with pytest.raises(ValueError, match=r"gamma must have shape \(8,\).*are the inputs in layout 'bnhd'\? "
                                         r"Pass layout='bnhd'"):
        leettriton.linear_attention(bt, ct, vt, torch.full((2,), 0.9, device=DEVICE))


def test_reference_validates_return_state():
    b, c, v = inputs()
    with pytest.raises(TypeError, match="return_state must be a bool, got str 'x'"):
        leettriton.reference(b, c, v, 0.9, return_state="x")


@pytest.mark.parametrize("method", ["vanilla", "causal_dot_product", "lightning_attention", "auto"])
def test_gamma_made_under_inference_mode(method):
    b, c, v = inputs()
    with torch.inference_mode():
        gamma = torch.tensor([0.9, 0.5], device=DEVICE)
        o = leettriton.linear_attention(b, c, v, gamma, method=method)
        state = torch.zeros(1, 2, 4, 5, device=DEVICE)
        o_t, _ = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, gamma)
    ref = leettriton.reference(b, c, v, gamma)
    assert (o.double() - ref).abs().max() < 1e-5
    assert (o_t.double() - ref[:, :, 0]).abs().max() < 1e-5


@pytest.mark.parametrize("write", ["data", "numpy", "inference"])
@pytest.mark.parametrize("method", ["vanilla", "block_based", "auto"])
def test_new_gamma_values_are_never_served_stale(write, method):
    """Writes that bypass the version counter: the next call computes with the new values."""
    b, c, v = inputs(n=40)
    if write == "inference":
        with torch.inference_mode():
            gamma = torch.tensor([0.9, 0.5], device=DEVICE)
    else:
        gamma = torch.tensor([0.9, 0.5], device=DEVICE)
    first = leettriton.linear_attention(b, c, v, gamma, method=method)
    state = torch.zeros(1, 2, 4, 5, device=DEVICE)
    leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, gamma)
    new = torch.tensor([0.3, 0.99], device=DEVICE)
    if write == "data":
        gamma.data.copy_(new)
    elif write == "numpy":
        if DEVICE != "cpu":
            pytest.skip("a NumPy view needs a CPU tensor")
        gamma.numpy()[:] = new.numpy()
    else:
        with torch.inference_mode():
            gamma.copy_(new)
    second = leettriton.linear_attention(b, c, v, gamma, method=method)
    assert (second.double() - leettriton.reference(b, c, v, new)).abs().max() < 1e-5
    assert not torch.allclose(first, second)
    state = torch.zeros(1, 2, 4, 5, device=DEVICE)
    o_t, state = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, gamma)
    o_t, state = leettriton.decode_step(b[:, :, 1], c[:, :, 1], v[:, :, 1], state, gamma)
    ref = leettriton.reference(b[:, :, :2], c[:, :, :2], v[:, :, :2], new)
    assert (o_t.double() - ref[:, :, 1]).abs().max() < 1e-5


@triton.jit
def _log2_kernel(g_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, log2_float64(tl.load(g_ptr + o)))


def test_kernels_compute_log2_gamma_from_gamma_itself():
    """The kernels' λ = log2 γ, in float64 from any γ, against the host's; NaN for γ outside (0, 1]."""
    good = [1.0, 0.5, 0.25, 0.999, 0.9999999, 1 - 2 ** -40, 0.7071067811865476, 0.70710678, 0.01, 1e-30, 0.3]
    bad = [0.0, -0.5, 1.5, math.nan, math.inf, -math.inf]
    g = torch.tensor(good + bad + [0.9] * (32 - len(good) - len(bad)), dtype=torch.float64, device=DEVICE)
    out = torch.empty_like(g)
    _log2_kernel[(1,)](g, out, N=32)
    expect = torch.tensor([math.log2(x) for x in good], dtype=torch.float64)
    got = out[:len(good)].cpu()
    rel = ((got - expect).abs() / expect.abs().clamp(min=1e-300))
    rel[expect == 0] = (got - expect).abs()[expect == 0]
    assert rel.max() < 1e-14, list(zip(good, got.tolist(), expect.tolist()))
    assert torch.isnan(out[len(good):len(good) + len(bad)]).all(), out[len(good):len(good) + len(bad)]
