"""The decay's per-row gradient kernel (kernels/decay_grad.py, docs/design.md §10.6): dG = Σ_r b ⊙ db − Σ_r c ⊙ dc
per batch element, output head and row, against the same sums in float64 of the same values."""
from __future__ import annotations

import pytest
import torch

from leettriton.kernels.decay_grad import MAX_BK, ROWS, decay_grad

from conftest import DEVICE

RTOL = 1e-6
"""Float32 products and sums against float64: each entry within RTOL of the sum of the terms' magnitudes
(the scale a float32 sum of a few hundred terms keeps to a few units of 2^-24; dG may cancel to near 0)."""


def _grouped(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``x`` ``(B, h, n, r)`` with each head repeated for the heads that read it: output head k reads x's head
    k // (heads / h) (docs/design.md §1.7)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _expected(b, c, db, dc, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dG, Σ|terms|) in float64 from the values as given, ``(B, H, n)``."""
    t = (lambda x: x) if layout == "bhnd" else (lambda x: x.transpose(1, 2))
    H = t(db if db is not None else dc).shape[1]
    dG = scale = 0
    for x, g, sign in ((b, db, 1.0), (c, dc, -1.0)):
        if g is not None:
            prod = _grouped(t(x).double(), H) * t(g).double()
            dG = dG + sign * prod.sum(-1)
            scale = scale + prod.abs().sum(-1)
    return dG, scale


def _check(b, c, db, dc, layout: str):
    got = decay_grad(b, c, db, dc, layout)
    want, scale = _expected(b, c, db, dc, layout)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = (got.double() - want).abs()
    assert torch.all(err <= RTOL * scale), float((err / scale.clamp_min(1e-300)).max())
    return got


def _make(shape, dtype, layout, gen):
    """A tensor of (B, heads, n, r) in ``layout``."""
    B, h, n, r = shape
    x = torch.randn((B, h, n, r) if layout == "bhnd" else (B, n, h, r), generator=gen, dtype=torch.float32)
    return x.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_matches_float64_grouped_heads_and_an_r_past_the_tile(layout, dtype):
    """H = 4 output heads, b with 1 head, c with 2: head k of db meets b's head 0, of dc c's head k // 2;
    r = MAX_BK + 9 is read in two slices, the second masked; n = 37 is not a multiple of the row block."""
    gen = torch.Generator().manual_seed(0)
    B, H, n, r = 2, 4, 37, MAX_BK + 9
    b, c = _make((B, 1, n, r), dtype, layout, gen), _make((B, 2, n, r), dtype, layout, gen)
    db, dc = _make((B, H, n, r), dtype, layout, gen), _make((B, H, n, r), dtype, layout, gen)
    got = _check(b, c, db, dc, layout)
    # the grouping is the one the rest of the package uses: the broadcast copies give the same sums
    alone = decay_grad(_grouped_layout(b, H, layout), _grouped_layout(c, H, layout), db, dc, layout)
    assert torch.equal(got, alone)


def _grouped_layout(x, heads, layout):
    axis = 1 if layout == "bhnd" else 2
    return x.repeat_interleave(heads // x.shape[axis], dim=axis)


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_non_contiguous_views_and_mixed_dtypes(layout):
    """b a transposed copy's view (the other layout's storage), c a slice of r, db a slice of rows, dc
    expanded over the batch (stride 0); b bfloat16 with float32 gradients; r = 20 (not a power of two)."""
    gen = torch.Generator().manual_seed(1)
    B, H, n, r = 2, 2, 19, 20
    other = "bnhd" if layout == "bhnd" else "bhnd"
    b = _make((B, H, n, r), torch.bfloat16, other, gen).transpose(1, 2)          # layout's shape, other strides
    c = _make((B, H, n, r + 7), torch.float32, layout, gen)[..., 3:3 + r]
    rows = (slice(None), slice(None), slice(1, n + 1)) if layout == "bhnd" else (slice(None), slice(1, n + 1))
    db = _make((B, H, n + 2, r), torch.float32, layout, gen)[rows]
    dc = _make((1, H, n, r), torch.float32, layout, gen).expand(B, -1, -1, -1)
    for x in (b, c, db):
        assert not x.is_contiguous()
    assert dc.stride(0) == 0
    _check(b, c, db, dc, layout)


@pytest.mark.parametrize("cfg", ROWS.all_configs(), ids=lambda cfg: f"BN{cfg['BN']}w{cfg['num_warps']}")
def test_every_config_of_every_family(cfg):
    """Each GPU config, pinned, through the production launch: rows in blocks of BN (n = 150 leaves a partial
    block for every BN), grouped b, r = 48 (one masked column tile)."""
    gen = torch.Generator().manual_seed(5)
    B, H, n, r = 1, 2, 150, 48
    b, c = _make((B, 1, n, r), torch.bfloat16, "bnhd", gen), _make((B, H, n, r), torch.bfloat16, "bnhd", gen)
    db, dc = _make((B, H, n, r), torch.bfloat16, "bnhd", gen), _make((B, H, n, r), torch.bfloat16, "bnhd", gen)
    got = decay_grad(b, c, db, dc, "bnhd", config={ROWS.name: cfg})
    want, scale = _expected(b, c, db, dc, "bnhd")
    assert torch.all((got.double() - want).abs() <= RTOL * scale)


@pytest.mark.parametrize("which", ["db", "dc"])
def test_one_gradient_alone(which):
    """db None gives −Σ c ⊙ dc; dc None gives Σ b ⊙ db (the other slot never read: a NaN there changes nothing)."""
    gen = torch.Generator().manual_seed(2)
    B, H, n, r = 1, 2, 40, 16
    b, c = _make((B, H, n, r), torch.float32, "bhnd", gen), _make((B, 1, n, r), torch.float32, "bhnd", gen)
    g = _make((B, H, n, r), torch.float32, "bhnd", gen)
    db, dc = (None, g) if which == "db" else (g, None)
    if which == "db":
        b = torch.full_like(b, float("nan"))
    else:
        c = torch.full_like(c, float("nan"))
    got = _check(b, c, db, dc, "bhnd")
    assert torch.isfinite(got).all()


def test_the_backward_uses_the_kernel_where_kernels_run(monkeypatch):
    """decay_grad_of forms dG by the kernel under the interpreter (as on CUDA), and gives the reverse
    cumulative sum of it in float64 with the final state's term at the last row."""
    from leettriton import autograd

    gen = torch.Generator().manual_seed(3)
    B, H, n, r = 1, 2, 12, 8
    b, c = _make((B, 1, n, r), torch.float32, "bnhd", gen), _make((B, 1, n, r), torch.float32, "bnhd", gen)
    db, dc = _make((B, H, n, r), torch.float32, "bnhd", gen), _make((B, H, n, r), torch.float32, "bnhd", gen)
    ds, final = (torch.randn(B, H, r, 3, generator=gen).to(DEVICE) for _ in range(2))
    calls = []
    real = autograd.decay_grad
    monkeypatch.setattr(autograd, "decay_grad", lambda *a, **k: calls.append(a) or real(*a, **k))
    da = autograd.decay_grad_of(b, c, db, dc, ds, final, "bnhd", n)
    assert len(calls) == 1
    dG, _ = _expected(b, c, db, dc, "bnhd")
    dG[..., -1] += (ds.double() * final.double()).sum((-1, -2))
    want = dG.flip(-1).cumsum(-1).flip(-1)
    assert da.dtype == torch.float64
    torch.testing.assert_close(da, want, rtol=1e-5, atol=1e-5)


def test_the_cpu_formula_without_the_interpreter_agrees(monkeypatch):
    """On the CPU without the interpreter decay_grad_of keeps the PyTorch formula (no kernel call); its dG is
    the kernel's to float32 rounding of the sums."""
    from leettriton import autograd

    gen = torch.Generator().manual_seed(4)
    B, H, n, r = 2, 4, 10, 24
    b, c = _make((B, 2, n, r), torch.bfloat16, "bhnd", gen), _make((B, 4, n, r), torch.bfloat16, "bhnd", gen)
    db, dc = _make((B, H, n, r), torch.bfloat16, "bhnd", gen), _make((B, H, n, r), torch.bfloat16, "bhnd", gen)
    kernel = autograd.decay_grad_of(b, c, db, dc, None, None, "bhnd", n).cpu()
    monkeypatch.setattr(autograd, "is_interpreting", lambda: False)
    monkeypatch.setattr(autograd, "decay_grad", lambda *a, **k: pytest.fail("the kernel ran on the CPU"))
    torch_form = autograd.decay_grad_of(*(x.cpu() for x in (b, c, db, dc)), None, None, "bhnd", n)
    torch.testing.assert_close(kernel, torch_form, rtol=1e-5, atol=1e-4)


def test_bad_arguments_are_refused_before_any_work():
    x = torch.zeros(1, 2, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="layout"):
        decay_grad(x, x, x, x, "bnd")
    with pytest.raises(ValueError, match="db and dc"):
        decay_grad(x, x, None, None)
    with pytest.raises(TypeError, match="dc must be float16"):
        decay_grad(x, x, x, x.int())
    with pytest.raises(ValueError, match="b's heads must divide"):
        decay_grad(torch.zeros(1, 3, 4, 8, device=DEVICE), x, x, x)
    with pytest.raises(ValueError, match="c must match dc"):
        decay_grad(x, torch.zeros(1, 2, 5, 8, device=DEVICE), x, x)
    with pytest.raises(ValueError, match="same heads"):
        decay_grad(x, x, x, torch.zeros(1, 4, 4, 8, device=DEVICE))
