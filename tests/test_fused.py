"""The layers' fused elementwise ops (leettriton.nn.fused): each Triton kernel (the interpreter on CPU) against a
float64 definition of its op and against its PyTorch twin, on strided views and awkward sizes; their gradients;
the layers' use of them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import leettriton.nn.fused as fused
from leettriton.nn.functional import RotaryTable
from leettriton.reference import tolerance

from helpers import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # the kernels run here (the interpreter on CPU)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=DEVICE, dtype=dtype)


def _assert_one_rounding_apart(out, twin, what):
    """The kernel and its PyTorch twin round the same float32 value: at most one unit in the last place apart."""
    assert out.dtype == twin.dtype and out.shape == twin.shape, what
    if out.dtype == torch.float32:
        assert_close(out, twin, tolerance(torch.float32) / 10, what)
        return
    bits = MANTISSA_BITS[out.dtype]   # one unit in the last place is at most |value| · 2^-bits (subnormals: a floor)
    ulp = twin.float().abs().clamp(min=torch.finfo(out.dtype).smallest_normal) * 2.0 ** -bits
    excess = (out.float() - twin.float()).abs() - ulp
    assert not (excess > 0).any(), f"{what}: {int((excess > 0).sum())} elements more than one rounding apart, " \
                                   f"first at {tuple(torch.nonzero(excess > 0)[0].tolist())}"


@pytest.fixture
def launches(monkeypatch):
    """Counts the kernels' launches, so a test fails if the op took its PyTorch path instead."""
    counts = {"norm": 0, "rotary": 0, "lrpe": 0, "swiglu": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(fused, "_rms_norm_gate_launch", counting("norm", fused._rms_norm_gate_launch))
    monkeypatch.setattr(fused, "_rotary_launch", counting("rotary", fused._rotary_launch))
    monkeypatch.setattr(fused._Lrpe, "forward", staticmethod(counting("lrpe", fused._Lrpe.forward)))
    monkeypatch.setattr(fused._SwiGLU, "forward",
                        staticmethod(counting("swiglu", fused._SwiGLU.forward)))
    return counts


def test_the_kernels_run_here():
    """The tests below test the Triton kernels: CUDA, or the interpreter on CPU (conftest sets it)."""
    assert fused.uses_kernels(torch.zeros(2, device=DEVICE))
    assert not fused.uses_kernels(torch.zeros(2, dtype=torch.float64, device=DEVICE))


# ----------------------------------------------------------------------------- RMS norm × gate

def _norm_oracle(x, weight, eps, gate, act):
    x = x.double()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if gate is not None:
        g = gate.double()
        y = y * (g * torch.sigmoid(g) if act == "swish" else g)
    return y


NORM_CASES = {
    # name: (shape of the full tensor, slice taking a strided view of it, weight, gate act)
    "rows of 20 of a 24-wide tensor, weight": ((3, 5, 24), (..., slice(0, 20)), True, None),
    "per-head norm with swish gate (B, n, H, d), odd n": ((2, 7, 3, 16), (...,), True, "swish"),
    "width 1": ((9, 1), (...,), True, "swish"),
    "transposed leading dims, no weight, identity gate": ((5, 4, 33), (...,), False, "identity"),
    "width 130, 3 rows": ((3, 130), (...,), False, None),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(NORM_CASES))
def test_rms_norm_gate_kernel(case, dtype, launches):
    shape, view, has_weight, act = NORM_CASES[case]
    full = _randn(*shape, dtype=dtype, seed=1)
    x = full[view]
    if case.startswith("transposed"):
        x = x.transpose(0, 1)
    width = x.shape[-1]
    weight = (1 + 0.5 * _randn(width, seed=2)).to(dtype) if has_weight else None
    gate = None
    if act is not None:   # a strided view of a wider tensor, as a projection's chunk is
        gate = _randn(*x.shape[:-1], 2 * width, dtype=dtype, seed=3)[..., width:]
    eps = 1e-6
    out = fused.rms_norm_gate(x, weight, eps, gate, act)
    assert launches["norm"] == 1, case
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out.double(), _norm_oracle(x, weight, eps, gate, act), tolerance(dtype), f"{case} {dtype}")
    _assert_one_rounding_apart(out, fused.rms_norm_gate_torch(x, weight, eps, gate, act), f"{case} {dtype} vs twin")
    out32 = fused.rms_norm_gate(x, weight, eps, gate, act, out_dtype=torch.float32)
    assert out32.dtype == torch.float32
    assert_close(out32, fused.rms_norm_gate_torch(x, weight, eps, gate, act, torch.float32),
                 tolerance(torch.float32) / 10, f"{case} {dtype}: float32 out")


@pytest.mark.parametrize("act", [None, "swish", "identity"])
def test_rms_norm_gate_gradients(act, launches):
    """The kernel's forward differentiates as its PyTorch twin (x, weight, gate)."""
    x = _randn(6, 12, seed=4).requires_grad_()
    weight = (1 + _randn(12, seed=5)).requires_grad_()
    gate = _randn(6, 12, seed=6).requires_grad_() if act else None
    w_out = _randn(6, 12, seed=7)

    def grads(fn):
        for t in (x, weight, gate):
            if t is not None:
                t.grad = None
        (fn(x, weight, 1e-5, gate, act) * w_out).sum().backward()
        return [t.grad.clone() for t in (x, weight, gate) if t is not None]

    got, want = grads(fused.rms_norm_gate), grads(fused.rms_norm_gate_torch)
    assert launches["norm"] == 1
    for name, g, w in zip(["x", "weight", "gate"], got, want):
        assert_close(g, w, tolerance(torch.float32), f"{act}: d/d {name}")


def test_rms_norm_gate_checks_its_arguments():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="weight must have shape"):
        fused.rms_norm_gate(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="gate and gate_act together"):
        fused.rms_norm_gate(x, None, 1e-6, gate=x)
    with pytest.raises(ValueError, match="gate_act must be one of"):
        fused.rms_norm_gate(x, None, 1e-6, gate=x, gate_act="gelu")
    with pytest.raises(ValueError, match="gate must have x's shape"):
        fused.rms_norm_gate(x, None, 1e-6, gate=torch.zeros(2, 4), gate_act="swish")


# ----------------------------------------------------------------------------- rotary

def _rotary_oracle(x, inv_freq, positions, scale):
    """Float64 rotation by the float32 angles position × inv_freq (the angles' definition)."""
    angle = (positions.to(torch.float32)[:, None] * inv_freq[None]).double()
    shape = (1, -1, 1, angle.shape[-1]) if x.dim() == 4 else (-1, 1, angle.shape[-1])
    cos, sin = torch.cos(angle).view(shape) * scale, torch.sin(angle).view(shape) * scale
    xd = x.double()
    half = x.shape[-1] // 2
    x1, x2 = xd[..., :half], xd[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


def _fused_projection(B, n, H, r, dtype, seed):
    """The q part of a fused (q, k, v) projection's output: a (B, n, H, r) view with token stride 3·H·r."""
    qkv = _randn(B, n, 3 * H * r, dtype=dtype, seed=seed)
    return qkv[..., H * r:2 * H * r].view(B, n, H, r)


ROTARY_CASES = {
    # name: (x's shape (B, n, H, r) or (tokens, H, r), offset or positions, scale)
    "prefill from 0, scaled": ((2, 9, 3, 16), 0, 0.25),
    "prefill at offset 7000, r = 6 (half 3)": ((1, 5, 2, 6), 7000, 1.0),
    "positions per token": ((2, 6, 2, 34), [0, 5, 1, 9000, 3, 2], 0.5),
    "packed rows, one position each": ((7, 3, 8), [3, 100, 7, 9000, 2, 1, 0], 1.0),
    "one position for every row": ((4, 2, 10), [123], 0.125),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(ROTARY_CASES))
def test_rotary_kernel(case, dtype, launches):
    shape, where, scale = ROTARY_CASES[case]
    r = shape[-1]
    inv_freq = RotaryTable(r).inv_freq(DEVICE)
    x = _fused_projection(*shape, dtype, seed=8) if len(shape) == 4 else \
        _randn(shape[0], shape[1], 2 * r, dtype=dtype, seed=8)[..., r:]
    if isinstance(where, int):
        out = fused.rotary(x, inv_freq, offset=where, scale=scale)
        positions = torch.arange(where, where + shape[1], device=DEVICE)
    else:
        positions = torch.tensor(where, device=DEVICE)
        out = fused.rotary(x, inv_freq, positions=positions, scale=scale)
    assert launches["rotary"] == 1, case
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out.double(), _rotary_oracle(x, inv_freq, positions, scale), tolerance(dtype), f"{case} {dtype}")
    _assert_one_rounding_apart(out, fused.rotary_torch(x, inv_freq, positions, scale), f"{case} {dtype} vs twin")


def test_rotary_table_kernel_path_equals_its_table_path(monkeypatch):
    """RotaryTable.apply / apply_at through the kernel give the table's values (the PyTorch path)."""
    table = RotaryTable(12)
    x = _fused_projection(2, 11, 2, 12, torch.float32, seed=9)
    rows = _randn(5, 2, 12, seed=10)
    positions = torch.tensor([4, 0, 70, 3, 3], device=DEVICE)
    kernel = [table.apply(x, 5, scale=0.3), table.apply_at(rows, positions, scale=0.3),
              table.apply_at(rows, positions[2:3])]
    monkeypatch.setattr("leettriton.nn.functional.uses_kernels", lambda *t: False)
    torch_path = [table.apply(x, 5, scale=0.3), table.apply_at(rows, positions, scale=0.3),
                  table.apply_at(rows, positions[2:3])]
    for i, (got, want) in enumerate(zip(kernel, torch_path)):
        assert_close(got, want, tolerance(torch.float32) / 10, f"call {i}")


def test_rotary_gradient(launches):
    """The backward (the kernel rotating the other way) against autograd through the PyTorch twin."""
    x = _fused_projection(2, 5, 3, 10, torch.float32, seed=11).detach().requires_grad_()
    inv_freq = RotaryTable(10).inv_freq(DEVICE)
    w_out = _randn(2, 5, 3, 10, seed=12)
    (fused.rotary(x, inv_freq, offset=3, scale=0.7) * w_out).sum().backward()
    got, x.grad = x.grad.clone(), None
    (fused.rotary_torch(x, inv_freq, torch.arange(3, 8, device=DEVICE), 0.7) * w_out).sum().backward()
    assert launches["rotary"] == 2   # forward and backward
    assert_close(got, x.grad, tolerance(torch.float32), "d/d x")


def test_rotary_checks_its_arguments():
    inv_freq = RotaryTable(8).inv_freq("cpu")
    with pytest.raises(ValueError, match="dim = 2"):
        fused.rotary(torch.zeros(1, 2, 1, 6), inv_freq)
    with pytest.raises(ValueError, match="needs positions"):
        fused.rotary(torch.zeros(3, 1, 8), inv_freq)
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        fused.rotary(torch.zeros(3, 1, 8), inv_freq, positions=torch.arange(2))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        fused.rotary(torch.zeros(3, 1, 8), inv_freq, positions=torch.zeros(3))


# ----------------------------------------------------------------------------- LRPE

def _lrpe_oracle(x, theta, positions):
    """Float64 [x cos(t θ), x sin(t θ)] with the float32 angles t × θ (the angles' definition)."""
    angle = (positions.to(torch.float32)[:, None, None] * theta.reshape(x.shape[-2], x.shape[-1])[None]).double()
    if x.dim() == 4:
        angle = angle[None]
    return torch.cat((x.double() * torch.cos(angle), x.double() * torch.sin(angle)), -1)


LRPE_CASES = {
    # name: (x's shape (B, n, H, D) or (tokens, H, D), offset or positions)
    "prefill from 0": ((2, 9, 3, 16), 0),
    "prefill at offset 5000, D = 5": ((1, 6, 2, 5), 5000),
    "positions per token": ((2, 4, 2, 12), [7, 0, 3000, 2]),
    "packed rows": ((5, 3, 8), [3, 100, 7, 9000, 0]),
    "one position for every row": ((4, 2, 10), [77]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(LRPE_CASES))
def test_lrpe_kernel(case, dtype, launches):
    shape, where = LRPE_CASES[case]
    H, D = shape[-2], shape[-1]
    theta = (10000 ** (-2 / (H * D) * torch.arange(H * D, dtype=torch.float32, device=DEVICE))).reshape(H, 1, D)
    x = _fused_projection(*shape, dtype, seed=17) if len(shape) == 4 else \
        _randn(shape[0], H, 2 * D, dtype=dtype, seed=17)[..., D:]
    if isinstance(where, int):
        out = fused.lrpe(x, theta, offset=where)
        positions = torch.arange(where, where + shape[1], device=DEVICE)
    else:
        positions = torch.tensor(where, device=DEVICE)
        out = fused.lrpe(x, theta, positions=positions)
    assert launches["lrpe"] == 1, case
    assert out.dtype == dtype and out.shape == (*x.shape[:-1], 2 * D) and out.is_contiguous()
    assert_close(out.double(), _lrpe_oracle(x, theta, positions), tolerance(dtype), f"{case} {dtype}")
    _assert_one_rounding_apart(out, fused.lrpe_torch(x, theta.reshape(H, D), positions), f"{case} {dtype} vs twin")


def test_lrpe_gradients(launches):
    """d/d x and d/d θ (the layer's trainable frequencies) against autograd through the PyTorch twin."""
    x = _fused_projection(2, 5, 3, 6, torch.float32, seed=18).detach().requires_grad_()
    theta = (0.1 + _randn(3, 1, 6, seed=19).abs()).requires_grad_()
    w_out = _randn(2, 5, 3, 12, seed=20)
    (fused.lrpe(x, theta, offset=4) * w_out).sum().backward()
    got = [x.grad.clone(), theta.grad.clone()]
    x.grad = theta.grad = None
    (fused.lrpe_torch(x, theta.reshape(3, 6), torch.arange(4, 9, device=DEVICE)) * w_out).sum().backward()
    assert launches["lrpe"] == 1
    assert_close(got[0], x.grad, tolerance(torch.float32), "d/d x")
    assert_close(got[1], theta.grad, tolerance(torch.float32), "d/d theta")


def test_lrpe_module_kernel_path_equals_its_torch_path(monkeypatch):
    from leettriton.nn.lightning import Lrpe
    module = Lrpe(2, 6, device=DEVICE)
    x = _fused_projection(2, 7, 2, 6, torch.float32, seed=21)
    rows = _randn(4, 2, 6, seed=22)
    positions = torch.tensor([9, 0, 400, 2], device=DEVICE)
    kernel = [module(x, 3), module.at(rows, positions), module.at(rows, positions[2:3])]
    monkeypatch.setattr("leettriton.nn.lightning.uses_kernels", lambda *t: False)
    torch_path = [module(x, 3), module.at(rows, positions), module.at(rows, positions[2:3])]
    for i, (got, want) in enumerate(zip(kernel, torch_path)):
        assert_close(got, want, tolerance(torch.float32) / 10, f"call {i}")


def test_lrpe_checks_its_arguments():
    theta = torch.ones(2, 1, 4)
    with pytest.raises(ValueError, match="heads · D"):
        fused.lrpe(torch.zeros(1, 3, 2, 5), theta)
    with pytest.raises(ValueError, match="needs positions"):
        fused.lrpe(torch.zeros(3, 2, 4), theta)
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        fused.lrpe(torch.zeros(3, 2, 4), theta, positions=torch.arange(2))


# ----------------------------------------------------------------------------- SwiGLU

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 37, 1500])
def test_swiglu_kernel(width, dtype, launches):
    both = _randn(3, 2, 2 * width + 3, dtype=dtype, seed=13)   # gate and up: chunks of one tensor
    gate, up = both[..., :width], both[..., width + 3:]
    out = fused.swiglu(gate, up)
    assert launches["swiglu"] == 1
    want = F.silu(gate.double()) * up.double()
    assert_close(out.double(), want, tolerance(dtype), f"width {width} {dtype}")
    _assert_one_rounding_apart(out, fused.swiglu_torch(gate, up), f"width {width} {dtype} vs twin")


def test_swiglu_gradient(launches):
    gate, up = _randn(4, 19, seed=14).requires_grad_(), _randn(4, 19, seed=15).requires_grad_()
    w_out = _randn(4, 19, seed=16)
    (fused.swiglu(gate, up) * w_out).sum().backward()
    got = [gate.grad.clone(), up.grad.clone()]
    gate.grad = up.grad = None
    (fused.swiglu_torch(gate, up) * w_out).sum().backward()
    assert launches["swiglu"] == 1
    assert_close(got[0], gate.grad, tolerance(torch.float32), "d/d gate")
    assert_close(got[1], up.grad, tolerance(torch.float32), "d/d up")


def test_swiglu_checks_its_arguments():
    with pytest.raises(ValueError, match="same shape and dtype"):
        fused.swiglu(torch.zeros(2, 3), torch.zeros(2, 4))


def test_empty_inputs_give_empty_outputs():
    inv_freq = RotaryTable(8).inv_freq("cpu")
    assert fused.rms_norm_gate(torch.zeros(0, 8), torch.ones(8), 1e-6).shape == (0, 8)
    assert fused.rotary(torch.zeros(1, 0, 2, 8), inv_freq, offset=3).shape == (1, 0, 2, 8)
    assert fused.swiglu(torch.zeros(0, 5), torch.zeros(0, 5)).shape == (0, 5)
