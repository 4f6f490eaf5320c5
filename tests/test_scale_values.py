"""Mamba-2's values v = dt·x (leettriton.nn.functional.scale_values, kernels/scale_rows.py, docs/design.md §12.6):
the kernels' forward and backward against the PyTorch form ``(x.float() * dt[..., None]).to(x.dtype)`` and
against float64 autograd of the same product, on the layer's strided views, an odd head dim and every config;
the registered operators under torch.compile (fullgraph, zero graph breaks); bad input refused first."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.registry import lookup_backend
from torch.library import opcheck

from leettriton.kernels.scale_rows import BWD, FWD, MAX_BP, scale_rows, scale_rows_backward
from leettriton.nn import Mamba2, mamba2, scale as scale_module
from leettriton.nn.functional import scale_values
from leettriton.nn.scale import scale_values_torch

from conftest import DEVICE

OPS = torch.ops.leettriton
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IDS = ["fp32", "bf16", "fp16"]
EPS32 = 2.0 ** -24
"""float32's unit roundoff: a float32 sum of P exact products is within P·EPS32·Σ|terms| of the exact one."""
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
"""Each dtype's unit roundoff: one float32 product rounded once to it is within (UNIT + EPS32)·|exact|."""


def layer_views(B, n, H, P, dtype, seed=0):
    """x as the Mamba-2 layer makes it (a split of the convolution's output, heads unflattened: rows not
    contiguous), dt float32 (B, n, H) a slice of a wider tensor (not contiguous either)."""
    gen = torch.Generator().manual_seed(seed)
    conv = torch.randn(B, n, H * P + 11, generator=gen).to(DEVICE, dtype)
    x = conv.split([H * P, 11], dim=-1)[0].unflatten(-1, (H, P))
    dt = (torch.rand(B, n, H + 2, generator=gen) * 0.2).to(DEVICE)[..., 1:H + 1]
    assert not x.is_contiguous() and not dt.is_contiguous()
    return x, dt


def exact(x, dt, dv):
    """(v, dx, ddt, Σ_p |dv·x|) in float64 by autograd of the product of the values as given."""
    x64, dt64 = x.detach().double().requires_grad_(), dt.detach().double().requires_grad_()
    v = x64 * dt64[..., None]
    dx, ddt = torch.autograd.grad(v, (x64, dt64), dv.double())
    return v.detach(), dx, ddt, (dv.double() * x.double()).abs().sum(-1)


def grads(fn, x, dt, dv, need=(True, True)):
    """fn(x, dt) and the gradients of x and dt (those in ``need``) for the gradient dv of its output."""
    xl, dl = x.detach().requires_grad_(need[0]), dt.detach().requires_grad_(need[1])
    v = fn(xl, dl)
    v.backward(dv)
    return v, xl.grad, dl.grad


def check_against_float64(v, dx, ddt, x, dt, dv):
    """v and dx within one rounding of x's dtype of float64's (half a subnormal step below its normal range),
    ddt within a float32 sum's error of float64's."""
    v64, dx64, ddt64, terms = exact(x, dt, dv)
    bound, tiny = UNIT[x.dtype] + EPS32, torch.finfo(x.dtype).smallest_normal * UNIT[x.dtype]
    assert v.dtype == x.dtype and dx.dtype == x.dtype and ddt.dtype == torch.float32
    assert torch.all((v.double() - v64).abs() <= bound * v64.abs() + tiny), "v"
    assert torch.all((dx.double() - dx64).abs() <= bound * dx64.abs() + tiny), "dx"
    assert torch.all((ddt.double() - ddt64).abs() <= x.shape[-1] * EPS32 * terms), "ddt"


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_forward_and_backward_on_the_layers_views(dtype):
    """On the layer's strided views, P = 20 (one masked column tile), n = 37 (a partial row block): v and dx
    are the PyTorch form's bit for bit, ddt its value to float32 rounding of the sum, and all three within
    one rounding (ddt: a float32 sum's error) of float64 autograd's."""
    B, n, H, P = 2, 37, 3, 20
    x, dt = layer_views(B, n, H, P, dtype)
    dv = torch.randn(B, n, H, P, generator=torch.Generator().manual_seed(9)).to(DEVICE, dtype)
    v, dx, ddt = grads(scale_values, x, dt, dv)
    v_ref, dx_ref, ddt_ref = grads(scale_values_torch, x, dt, dv)
    assert v.is_contiguous() and v.shape == x.shape
    assert torch.equal(v, v_ref) and torch.equal(dx, dx_ref)
    terms = (dv.double() * x.double()).abs().sum(-1)
    assert torch.all((ddt.double() - ddt_ref.double()).abs() <= 2 * P * EPS32 * terms)
    check_against_float64(v, dx, ddt, x, dt, dv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_head_dim_past_the_tile_and_one_gradient_alone(dtype):
    """P = MAX_BP + 9 is read in two column slices, the second masked; with only x (only dt) requiring grad
    the backward forms dx (ddt) alone, the same values as with both."""
    B, n, H, P = 1, 5, 2, MAX_BP + 9
    x, dt = layer_views(B, n, H, P, dtype, seed=1)
    dv = torch.randn(B, n, H, P, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    v, dx, ddt = grads(scale_values, x, dt, dv)
    check_against_float64(v, dx, ddt, x, dt, dv)
    _, dx_alone, none = grads(scale_values, x, dt, dv, need=(True, False))
    assert none is None and torch.equal(dx_alone, dx)
    _, none, ddt_alone = grads(scale_values, x, dt, dv, need=(False, True))
    assert none is None and torch.equal(ddt_alone, ddt)


def test_an_expanded_gradient_and_no_grad():
    """dv expanded over everything (stride 0: the gradient of v.sum()) is read through its strides; without
    grad the forward is the same launch's values."""
    x, dt = layer_views(2, 6, 2, 24, torch.bfloat16, seed=3)
    xl, dl = x.detach().requires_grad_(), dt.detach().requires_grad_()
    scale_values(xl, dl).float().sum().backward()
    ones = torch.ones(x.shape, dtype=x.dtype, device=DEVICE)
    _, dx, ddt = grads(scale_values_torch, x, dt, ones)
    assert torch.equal(xl.grad, dx)
    check_against_float64(scale_values(x, dt), xl.grad, dl.grad, x, dt, ones)
    with torch.no_grad():
        assert torch.equal(scale_values(x, dt), scale_values_torch(x, dt))


@pytest.mark.parametrize("cfg", FWD.all_configs(), ids=lambda cfg: f"BN{cfg['BN']}w{cfg['num_warps']}")
def test_every_config_of_every_family(cfg):
    """Each GPU config, pinned, through the production launches: n = 150 leaves a partial row block for every
    BN, P = 48 one masked column tile, three heads."""
    x, dt = layer_views(1, 150, 3, 48, torch.bfloat16, seed=4)
    dv = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE, x.dtype)
    v = scale_rows(x, dt, config={FWD.name: cfg})
    dx, ddt = scale_rows_backward(dv, x, dt, config={BWD.name: cfg})
    assert torch.equal(v, scale_values_torch(x, dt))
    check_against_float64(v, dx, ddt, x, dt, dv)


def test_cpu_tensors_without_the_interpreter_take_the_pytorch_form(monkeypatch):
    """Off the kernels' devices (the CPU without the interpreter) the call is the PyTorch form itself; the
    operators' bodies there give the kernels' values (v and dx bit for bit, ddt to float32 rounding)."""
    x, dt = layer_views(1, 7, 2, 20, torch.bfloat16, seed=6)
    x, dt = x.cpu(), dt.cpu()
    dv = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(x.dtype)
    want = scale_values_torch(x, dt)
    monkeypatch.setattr(scale_module, "is_interpreting", lambda: False)
    monkeypatch.setattr(scale_module, "scale_rows", lambda *a, **k: pytest.fail("the kernel ran on the CPU"))
    monkeypatch.setattr(scale_module, "scale_rows_backward", lambda *a, **k: pytest.fail("the kernel ran"))
    v, dx, ddt = grads(scale_values, x, dt, dv)
    assert torch.equal(v, want)
    v_op = OPS.scale_values(x, dt)
    dx_op, ddt_op = OPS.scale_values_backward(dv, x, dt, True, True)
    assert v_op.is_contiguous() and torch.equal(v_op, want) and torch.equal(dx_op, dx)
    check_against_float64(v_op, dx_op, ddt_op, x, dt, dv)


def test_opcheck_the_operators():
    x, dt = layer_views(1, 5, 2, 20, torch.float32, seed=8)
    dv = torch.randn(x.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    opcheck(OPS.scale_values, (x.detach().requires_grad_(), dt.detach().requires_grad_()))
    opcheck(OPS.scale_values, (x, dt.detach().requires_grad_()))
    for need in ((True, True), (True, False), (False, True)):
        opcheck(OPS.scale_values_backward, (dv, x, dt, *need))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    torch._dynamo.reset()


def compiled(fn, seen: list):
    """``fn`` compiled whole (``fullgraph``: a graph break raises) by ``aot_eager``; ``seen`` gets the traced
    graph's call targets."""
    def backend(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes)
        return lookup_backend("aot_eager")(gm, example_inputs)
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiles_whole_forward_and_backward(dtype, fresh_dynamo):
    """torch.compile(fullgraph=True) traces the call as the operator (no graph break), and its forward and
    backward give the eager call's values."""
    def f(x, dt):
        return scale_values(x, dt) * 2

    x, dt = layer_views(2, 9, 3, 20, dtype, seed=10)
    dv = torch.randn(x.shape, generator=torch.Generator().manual_seed(11)).to(DEVICE, dtype)
    seen = []
    v, dx, ddt = grads(compiled(f, seen), x, dt, dv)
    assert any("scale_values" in target for target in seen), seen
    v_ref, dx_ref, ddt_ref = grads(f, x, dt, dv)
    assert torch.equal(v, v_ref) and torch.equal(dx, dx_ref) and torch.equal(ddt, ddt_ref)
    with torch.no_grad():
        assert torch.equal(compiled(f, [])(x, dt), v_ref)


def test_the_mamba2_layer_forms_its_values_with_it(monkeypatch):
    """The layer's output is the one it gives with the PyTorch form of v (bit for bit: v is), and its
    gradients agree to float32 rounding (ddt's sum order)."""
    gen = torch.Generator().manual_seed(12)
    torch.manual_seed(12)
    layer = Mamba2(num_heads=2, head_dim=12, hidden_size=12, state_size=8, expand=2).to(DEVICE)
    h = torch.randn(2, 9, 12, generator=gen).to(DEVICE)
    calls = []
    real = scale_module.scale_rows
    monkeypatch.setattr(scale_module, "scale_rows", lambda *a, **k: calls.append(a) or real(*a, **k))

    def run():
        layer.zero_grad()
        y = layer(h)
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in layer.parameters()]

    y, g = run()
    assert len(calls) == 1
    monkeypatch.setattr(mamba2, "scale_values", scale_values_torch)
    y_ref, g_ref = run()
    assert torch.equal(y, y_ref)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_refused_before_any_work(monkeypatch):
    monkeypatch.setattr(scale_module, "scale_rows", lambda *a, **k: pytest.fail("work was done"))
    x = torch.zeros(1, 4, 2, 8, device=DEVICE)
    dt = torch.zeros(1, 4, 2, device=DEVICE)
    with pytest.raises(TypeError, match="x must be a tensor"):
        scale_values(x.tolist(), dt)
    with pytest.raises(TypeError, match="dt must be a float32 tensor"):
        scale_values(x, 0.5)
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64, got torch.int32"):
        scale_values(x.int(), dt)
    with pytest.raises(TypeError, match="dt must be float32 .*, got torch.bfloat16"):
        scale_values(x, dt.bfloat16())
    with pytest.raises(ValueError, match=r"x must be 4-D \(batch, n, heads, P\), got shape \(4, 2, 8\)"):
        scale_values(x[0], dt[0])
    with pytest.raises(ValueError, match=r"dt must have shape \(1, 4, 2\) .*got shape \(1, 4, 3\)"):
        scale_values(x, torch.zeros(1, 4, 3, device=DEVICE))
    with pytest.raises(ValueError, match=r"dt must have shape \(1, 4, 2\) .*got shape \(1, 4, 2, 1\)"):
        scale_values(x, dt[..., None])
    with pytest.raises(ValueError, match="dt must be on x's device"):
        scale_values(x, dt.to("meta"))


def test_the_mamba2_layer_compiles_whole(fresh_dynamo):
    """The layer (its v by the operator) compiles with no graph break: the compiled forward and backward give the
    eager layer's output and gradients (the same kernels; the operators' fake outputs shape the trace)."""
    torch.manual_seed(13)
    layer = Mamba2(num_heads=2, head_dim=12, hidden_size=12, state_size=8, expand=2).to(DEVICE)
    h = torch.randn(2, 9, 12, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    seen = []

    def run(fn):
        layer.zero_grad()
        y = fn(h)
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in layer.parameters()]

    y, g = run(compiled(layer, seen))
    assert any("scale_values" in target for target in seen), seen
    y_ref, g_ref = run(layer)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
