"""TF32 products: float32 operands rounded to nearest TF32 before the product (docs/design.md §2.2).

The tensor cores truncate float32 operands to TF32; the kernels round them first.  Triton's
interpreter ignores ``input_precision`` and multiplies in full float32, so on a CPU-only machine
the rounding is checked on the helper itself (bit patterns against a float64 reference) and
through ``mma`` (whose TF32 result must be the product of the rounded operands); the case whose
truncation errs beyond the TF32 bound runs through every method, and fails on a GPU without the
rounding.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import leettriton
from conftest import DEVICE
from helpers import Case, assert_close, magnitudes, tolerance
from leettriton.kernels.abi import mma, round_to_tf32


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to nearest TF32, ties away from zero, computed in float64 from the value:
    11 significant bits, or multiples of 2^-136 below float32's normal range (TF32 subnormals);
    infinities and NaNs as they are; past the largest TF32 value, infinity."""
    out = np.empty(x.shape, dtype=np.float32)
    for i, value in enumerate(x.astype(np.float64)):
        if not math.isfinite(value) or value == 0.0:
            out[i] = value
            continue
        _, e = math.frexp(abs(value))               # |value| = m · 2^e, m in [0.5, 1)
        quantum = 2.0 ** max(e - 11, -136)
        rounded = math.floor(abs(value) / quantum + 0.5) * quantum
        with np.errstate(over="ignore"):
            out[i] = np.float32(math.copysign(rounded, value)) if rounded < 2.0 ** 128 else math.copysign(math.inf, value)
    return out


@triton.jit
def _round_kernel(x_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, round_to_tf32(tl.load(x_ptr + o)))


def test_round_to_tf32_on_bit_patterns():
    """Ties, carries into the exponent, subnormals, the top of the range, infinities and NaNs, and
    random patterns over the whole range, against the float64 reference."""
    named = [
        0x3F800000, 0x3F800FFF, 0x3F801000, 0x3F801001, 0x3F802000, 0x3F803000,   # 1 + k·2^-23: below, at, above a tie
        0x3FFFF000, 0x3FFFEFFF, 0x3FFFFFFF,                                       # carry into the exponent (→ 2.0)
        0xBF801000, 0xBF800FFF, 0xC0490FDB,                                       # negatives, -π
        0x00000001, 0x00000FFF, 0x00001000, 0x00001FFF, 0x007FFFFF, 0x00800000,   # subnormals, the smallest normal
        0x7F7FE000, 0x7F7FEFFF, 0x7F7FF000, 0x7F7FFFFF, 0xFF7FFFFF,               # the top of the range
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000,                           # ±inf, ±0
    ]
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2 ** 32, size=512 - len(named) - 3, dtype=np.uint64).astype(np.uint32)
    random = random[(random & 0x7F800000) != 0x7F800000]      # NaNs are checked apart, below
    bits = np.concatenate([np.array(named, dtype=np.uint32), random,
                           np.array([0x7FC00000, 0x7F800001, 0xFF801FFF], dtype=np.uint32)])
    bits = np.concatenate([bits, np.full(512 - len(bits), 0x3F800000, dtype=np.uint32)])
    x = bits.view(np.float32)
    out = torch.empty(512, dtype=torch.float32, device=DEVICE)
    _round_kernel[(1,)](torch.from_numpy(x.copy()).to(DEVICE), out, N=512)
    got = out.cpu().numpy()
    nan = np.isnan(x)
    assert nan.sum() == 3 and np.isnan(got[nan]).all(), got[nan]
    expect = tf32_reference(x[~nan])
    bad = np.nonzero(got[~nan].view(np.uint32) != expect.view(np.uint32))[0]
    assert len(bad) == 0, [(hex(int(b)), float(g), float(e)) for b, g, e in
                           zip(bits[~nan][bad][:8], got[~nan][bad][:8], expect[bad][:8])]


@triton.jit
def _mma_kernel(a_ptr, b_ptr, out_ptr, PRECISION: tl.constexpr, N: tl.constexpr):
    o = tl.arange(0, N)
    a = tl.load(a_ptr + o[:, None] * N + o[None, :])
    b = tl.load(b_ptr + o[:, None] * N + o[None, :])
    tl.store(out_ptr + o[:, None] * N + o[None, :], mma(a, b, PRECISION))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_mma_rounds_float32_operands_only_for_tf32(dtype, precision):
    """A diagonal ``a`` makes every output one product, exact in float32 when its operands are
    TF32 or 16-bit: with "tf32" it is the product of the operands rounded to nearest TF32 (truncated,
    as the tensor cores would take them, it errs); with "ieee", and for float16 operands, that of
    the operands as they are."""
    N = 16
    g = torch.Generator().manual_seed(0)
    diag = 1 + torch.rand(N, generator=g)
    a = torch.diag(diag).to(dtype)
    b = (torch.randn(N, N, generator=g) + 3).to(dtype)
    out = torch.empty(N, N, dtype=torch.float32, device=DEVICE)
    _mma_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), out, PRECISION=precision, N=N)
    if dtype == torch.float32 and precision == "tf32":
        a_op = torch.from_numpy(tf32_reference(a.flatten().numpy())).view(N, N)
        b_op = torch.from_numpy(tf32_reference(b.flatten().numpy())).view(N, N)
        assert not torch.equal(a_op @ b_op, (a.double() @ b.double()).float()), "operands already TF32"
    else:
        a_op, b_op = a.float(), b.float()
    expect = (a_op.double() @ b_op.double()).float()
    assert torch.equal(out.cpu(), expect), (out.cpu() - expect).abs().max()


ONE_UNDER = 1 + (2 ** 13 - 1) * 2 ** -23
"""1 + 2^-10 − 2^-23: TF32 truncates it to 1 (relative error 2^-10); it rounds to 1 + 2^-10."""


@pytest.mark.parametrize("method", leettriton.METHODS)
def test_tf32_truncation_case(method):
    """b = c = v = ``ONE_UNDER`` at n = r = d = 1: truncated operands would give 1 for
    ``ONE_UNDER``³ (relative error 2.9e-3 > the TF32 bound 2e-3); rounded, the error is ~1e-6.
    Under the interpreter the products are full float32 (this passes either way); on a GPU it
    fails if a TF32 product truncates."""
    b, c, v = (torch.full((1, 1, 1, 1), ONE_UNDER, dtype=torch.float32, device=DEVICE) for _ in range(3))
    out = leettriton.linear_attention(b, c, v, method=method, precision="tf32")
    ref = leettriton.reference(b, c, v)
    assert_close(out, ref, tolerance(torch.float32, "tf32"), f"{method} output [n1-r1-d1-tf32]")


CANCELLING = [Case(1, 1, 1, 128, 1, seed=2258), Case(1, 1, 1, 16, 1, seed=1)]
"""One output row that cancels to about a hundredth of its terms (0.396 from terms summing to 52.6 in
magnitude; −0.102 from 3.85).  With TF32 products the GPU gave fleet_attention 5.1e-3 and recursion
2.9e-3 of the output, past 2e-3, and 4e-5 and 8e-5 of the terms."""


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(tf32_reference(x.flatten().numpy())).view(x.shape).double()


@pytest.mark.parametrize("case", CANCELLING, ids=lambda case: case.id)
def test_tf32_products_keep_the_terms_bound_not_the_output_bound(case):
    """TF32 arithmetic itself, emulated in float64 on the rounded operands, errs past 2e-3 of an output
    that cancels, and stays far within 2e-3 of its terms: the bound the TF32 checks measure against
    (docs/design.md §2.5).  Both ways a method forms the product stay within a tenth of it: b · (c ⊙ v),
    as fleet_attention and recursion do (past 2e-3 of the output at both cases), and (c · b) · v, the
    scores first, as the chunked methods do."""
    b, c, v, _, _ = case.tensors("cpu")
    ref = leettriton.reference(b, c, v)
    terms = leettriton.reference(*magnitudes(b, c, v))
    rank_terms = (_tf32(b) * _tf32((c.double() * v.double()).float())).sum(-1, keepdim=True)
    scores = (_tf32(c) * _tf32(b)).sum(-1, keepdim=True).float()
    scores_first = _tf32(scores) * _tf32(v)
    tol = tolerance(torch.float32, "tf32")
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(rank_terms, ref, tol, "TF32 b · (c ⊙ v) against the output")
    for how, out in (("b · (c ⊙ v)", rank_terms), ("(c · b) · v", scores_first)):
        assert_close(out, ref, tol / 10, f"TF32 {how}", terms)


@pytest.mark.parametrize("case", CANCELLING, ids=lambda case: case.id)
@pytest.mark.parametrize("method", leettriton.METHODS)
def test_cancelling_tf32_outputs(method, case):
    """Every method at the cancelling cases with TF32 products, against the terms' magnitudes (on a CPU
    the interpreter's products are full float32: within the bound either way)."""
    b, c, v, _, _ = case.tensors(DEVICE)
    out = leettriton.linear_attention(b, c, v, method=method, precision="tf32")
    terms = leettriton.reference(*magnitudes(b, c, v))
    assert_close(out, leettriton.reference(b, c, v), tolerance(torch.float32, "tf32"), f"{method} [{case.id}]", terms)
