"""Hostile values: causality for any input values, and 16-bit inputs whose scores leave float16's range.

Causality (docs/nonfinite.md): output row t depends on rows ≤ t only, so a non-finite value at row k (in b, c
or v) may make rows ≥ k non-finite but leaves every row before k exactly as a run without it gives them.
Checked for every method on both CPU paths (the PyTorch twins, and the Triton kernels under the
interpreter), for the oracle itself, for the packed walk and block_based's segmented walk, and for the
backward's mirror rule (a non-finite output gradient at row k leaves the gradients of rows after k as they
are).  k is put at a chunk boundary, inside a chunk and on the last row.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import leettriton
from leettriton.reference import reference, tolerance
from conftest import DEVICE

KERNELS = ["vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention"]
METHODS = KERNELS + [m + "_torch" for m in KERNELS] + ["auto"]
N, R, D = 40, 8, 8
ROWS = [16, 21, N - 1]
"""Rows given a non-finite value: a chunk boundary of the interpreter's walk (16-row chunks), a row inside a
chunk, the last row."""


def inputs(dtype=torch.float32, seed=0, layout="bhnd"):
    g = torch.Generator().manual_seed(seed)
    b, c, v = (torch.randn(1, 2, N, x, generator=g).to(DEVICE, dtype) for x in (R, R, D))
    if layout == "bnhd":
        b, c, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (b, c, v))
    return b, c, v


def poisoned(x, k, value):
    """A copy of ``x`` with ``value`` at row k of head 0 (column 0)."""
    x = x.clone()
    x[0, 0, k, 0] = value
    return x


def check_causal(out, clean, k, what, exact=True):
    """Rows before k of head 0 and all of head 1 finite and equal to the clean run's (bit for bit unless
    ``exact`` is off: then within the dtype's tolerance)."""
    before = out[:, 0, :k]
    assert torch.isfinite(before).all(), (
        f"{what}: {int((~torch.isfinite(before)).sum())} non-finite entries before row {k}, first at "
        f"{tuple(int(i) for i in (~torch.isfinite(before)).nonzero()[0])}")
    assert torch.isfinite(out[:, 1]).all(), f"{what}: the other head has non-finite entries"
    for got, want, part in ((before, clean[:, 0, :k], f"rows < {k}"), (out[:, 1], clean[:, 1], "the other head")):
        if exact:
            diff = (got.double() - want.double()).abs()
            assert torch.equal(got, want), f"{what}: {part} differ from the clean run (max-abs {diff.max():.3e})"
        else:
            err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
            assert err <= tolerance(got.dtype), f"{what}: {part} differ from the clean run (relative {err:.3e})"


def run(method, b, c, v, gamma=0.9, **kw):
    if method == "reference":
        return reference(b, c, v, gamma, **kw)
    return leettriton.linear_attention(b, c, v, gamma, method=method, **kw)


@pytest.mark.parametrize("method", ["reference"] + METHODS)
def test_nonfinite_reaches_later_rows_only(method):
    """inf at row k of b, c or v, for k at a chunk boundary, inside a chunk and on the last row: rows < k and
    the other head exactly as without it; where the oracle's output is non-finite, so is the method's (a
    non-finite input never gives a finite, wrong row)."""
    b, c, v = inputs()
    clean = run(method, b, c, v)
    for name in "bcv":
        for k in ROWS:
            x = {"b": b, "c": c, "v": v}
            x[name] = poisoned(x[name], k, float("inf"))
            out = run(method, **x)
            check_causal(out, clean, k, f"{method}: inf in {name} at row {k}")
            ref = reference(**x, gamma=0.9)
            missed = ~torch.isfinite(ref) & torch.isfinite(out.double())
            assert not missed.any(), f"{method}: inf in {name} at row {k}: finite where the oracle is not, first at " \
                                     f"{tuple(int(i) for i in missed.nonzero()[0])}"


@pytest.mark.parametrize("method", ["lightning_attention", "vanilla", "fleet_attention", "recursion",
                                    "lightning_attention_torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_nonfinite_16_bit(method, dtype):
    """16-bit inputs (their own products and roundings) and NaN as well as -inf, in the bnhd layout."""
    b, c, v = inputs(dtype, seed=1, layout="bnhd")
    bn = [x.transpose(1, 2) for x in (b, c, v)]   # the same tensors in the bnhd layout
    clean = run(method, *bn, layout="bnhd").transpose(1, 2)
    for name, k, value in (("v", 16, float("nan")), ("c", 21, -float("inf")), ("v", N - 1, float("inf"))):
        x = {"b": b, "c": c, "v": v}
        x[name] = poisoned(x[name], k, value)
        out = run(method, *(x[n].transpose(1, 2) for n in "bcv"), layout="bnhd").transpose(1, 2)
        check_causal(out, clean, k, f"{method} {dtype}: {value} in {name} at row {k}")


CARRY_METHODS = KERNELS + ["auto"] if DEVICE == "cuda" else ["fleet_attention", "lightning_attention"]
CARRY_N, CARRY_RD, CARRY_ROWS = (300, 64, (127, 200, 299)) if DEVICE == "cuda" else (150, 8, (127, 149))


@pytest.mark.parametrize("method", CARRY_METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_nonfinite_16_bit_after_a_carry(method, dtype):
    """A non-finite value in a later block or chunk, whose rows start from a carried state (on the last row of
    a 64- or 128-row tile, inside one, on the last row): the slow form's rows before it are the fast form's bit
    for bit, the carry's term included (on a GPU the compiler fuses it with the product's sum in one rounding,
    and the slow form must keep that)."""
    g = torch.Generator().manual_seed(3)
    b, c, v = (torch.randn(1, 2, CARRY_N, x, generator=g).to(DEVICE, dtype) for x in (CARRY_RD, CARRY_RD, CARRY_RD))
    clean = run(method, b, c, v)
    for name in "bcv":
        for k in CARRY_ROWS:
            x = {"b": b, "c": c, "v": v}
            x[name] = poisoned(x[name], k, float("inf"))
            check_causal(run(method, **x), clean, k, f"{method} {dtype}: inf in {name} at row {k}")


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "scan"])
def test_nonfinite_segmented_walk(prefix):
    """block_based's segment-parallel walk (segments of 16 rows, start states summed by the walk or by the
    scan): a non-finite value in segment 2 leaves segments 0 and 1, and its own earlier rows, as they were."""
    from leettriton.methods.block_based.kernels import block_based_fwd
    from leettriton.methods.spec import Plan
    from leettriton.problem import make_problem

    plan = Plan("block_based", block_based_fwd, schedule=dict(seg_len=16, split=1, prefix=prefix))

    def walk(b, c, v):
        p, out = make_problem(b, c, v, 0.9, return_state=True)
        block_based_fwd(p, plan)
        return out

    b, c, v = inputs(seed=2)
    clean = walk(b, c, v)
    for name, k in (("c", 37), ("v", 33)):
        x = {"b": b, "c": c, "v": v}
        x[name] = poisoned(x[name], k, float("inf"))
        check_causal(walk(**x), clean, k, f"block_based segments (prefix {prefix}): inf in {name} at row {k}")


@pytest.mark.parametrize("method", ["lightning_attention", "lightning_attention_torch"])
def test_nonfinite_packed_sequences(method):
    """The packed walk: inf at the last row of a sequence (its padding, say) leaves its earlier rows and the
    other sequences as they were."""
    g = torch.Generator().manual_seed(3)
    T = 36
    b, c, v = (torch.randn(T, 2, x, generator=g).to(DEVICE) for x in (R, R, D))
    cu = torch.tensor([0, 9, 30, 36], dtype=torch.int32, device=DEVICE)
    clean = leettriton.linear_attention_varlen(b, c, v, cu, 0.9, method=method)
    for name in "cv":
        x = {"b": b, "c": c, "v": v}
        x[name] = x[name].clone()
        x[name][29, 0, 0] = float("inf")
        out = leettriton.linear_attention_varlen(x["b"], x["c"], x["v"], cu, 0.9, method=method)
        keep = torch.ones(T, dtype=torch.bool)
        keep[29] = False
        assert torch.isfinite(out[keep]).all(), f"{method}: inf in {name} at token 29 spread to other rows"
        assert torch.equal(out[keep], clean[keep]), f"{method}: inf in {name} at token 29 changed other rows"


@pytest.mark.parametrize("method", ["auto", "lightning_attention", "vanilla", "fleet_attention", "lightning_attention_torch",
                                    "fleet_attention_torch", "block_based_torch", "recursion_torch", "vanilla_torch"])
def test_backward_mirror_rule(method):
    """A non-finite output gradient at row k spoils at most the gradients of rows ≤ k: those of the rows
    after k are the clean run's, bit for bit (the backward's reversed calls are the forward run backwards
    in time, so the forward's causality is the backward's)."""
    b, c, v = inputs(seed=4)
    g = torch.Generator().manual_seed(5)
    do = torch.randn(1, 2, N, D, generator=g).to(DEVICE)

    def grads(do):
        leaves = [x.clone().requires_grad_(True) for x in (b, c, v)]
        out = leettriton.linear_attention(*leaves, 0.9, method=method)
        return torch.autograd.grad(out, leaves, do)

    clean = grads(do)
    for k in (16, 21):
        got = grads(poisoned(do, k, float("inf")))
        for name, x, y in zip("bcv", got, clean):
            after = x[:, 0, k + 1:]
            assert torch.isfinite(after).all(), f"{method}: inf in do at row {k}: d{name} non-finite after row {k}"
            assert torch.equal(after, y[:, 0, k + 1:]), f"{method}: inf in do at row {k}: d{name} changed after it"
            assert torch.equal(x[:, 1], y[:, 1]), f"{method}: inf in do at row {k}: d{name} of the other head changed"


RANGE_CASES = {
    "scores past 65504": (300.0, 300.0, 1e-3),
    "c v past 65504": (1e-4, 200.0, 200.0),
    "scores below 2^-14": (1e-3, 1e-3, 1e3),
}
"""float16 inputs whose exact output fits float16 but whose scores b·c (or products c·v) do not: the scales of
b, c and v (docs/nonfinite.md)."""


@pytest.mark.parametrize("method", KERNELS)
@pytest.mark.parametrize("case", list(RANGE_CASES), ids=lambda s: s.replace(" ", "-"))
def test_float16_scores_out_of_range(method, case):
    """Finite float16 inputs whose output fits float16 while their scores b·c lie past 65 504 or all below
    float16's normal range: finite, within float16's tolerance of the oracle (the score tiles go in scaled)."""
    sb, sc, sv = RANGE_CASES[case]
    g = torch.Generator().manual_seed(6)
    b, c, v = ((torch.randn(1, 1, N, 16, generator=g) * s).to(DEVICE, torch.float16) for s in (sb, sc, sv))
    ref = reference(b, c, v, 0.9)
    assert ref.abs().max() < 60000, "the case's exact output must fit float16"
    out = leettriton.linear_attention(b, c, v, 0.9, method=method)
    assert torch.isfinite(out).all(), f"{method} [{case}]: {int((~torch.isfinite(out)).sum())} non-finite outputs"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= tolerance(torch.float16), f"{method} [{case}]: relative error {err:.3e}"


def test_float16_scores_below_range_with_zero_rows():
    """float16 scores all below 2^-14 in a sequence shorter than one chunk (the chunk's other rows absent)
    and in one whose last rows are zeros (rows of zeros count neither for nor against the walk's range check):
    within tolerance; and a zero-padded ordinary sequence gives its unpadded rows' bits."""
    g = torch.Generator().manual_seed(7)
    for n in (11, N):
        b, c, v = ((torch.randn(1, 1, n, 16, generator=g) * s).to(DEVICE, torch.float16) for s in (1e-3, 1e-3, 1e3))
        if n == N:
            b[:, :, 30:] = 0
            c[:, :, 30:] = 0
        ref = reference(b, c, v, 0.9)
        out = leettriton.linear_attention(b, c, v, 0.9, method="lightning_attention")
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err <= tolerance(torch.float16), f"lightning_attention, n = {n}: relative error {err:.3e}"
    b, c, v = (torch.randn(1, 1, N, 16, generator=g).to(DEVICE, torch.float16) for _ in range(3))
    padded = [x.clone() for x in (b, c, v)]
    for x in padded:
        x[:, :, 30:] = 0
    short = leettriton.linear_attention(*(x[:, :, :30] for x in (b, c, v)), 0.9, method="lightning_attention")
    out = leettriton.linear_attention(*padded, 0.9, method="lightning_attention")
    assert torch.equal(out[:, :, :30], short), "zero padding changed the rows before it"


def test_oracle_chunked_form(monkeypatch):
    """The oracle's chunked form (its float64 state between chunks, here of 16 rows): a non-finite value at
    row k leaves rows < k as the clean run gives them, and equal to the dense form's."""
    import importlib

    oracle = importlib.import_module("leettriton.reference")

    b, c, v = inputs(seed=8)
    dense = reference(b, c, v, 0.9)
    monkeypatch.setattr(oracle, "DENSE_MAX_N", 16)
    monkeypatch.setattr(oracle, "CHUNK", 16)
    clean = reference(b, c, v, 0.9)
    torch.testing.assert_close(clean, dense, rtol=1e-12, atol=1e-12)
    for name in "cv":
        for k in ROWS:
            x = {"b": b, "c": c, "v": v}
            x[name] = poisoned(x[name], k, float("inf"))
            out = reference(**x, gamma=0.9)
            check_causal(out, clean, k, f"chunked oracle: inf in {name} at row {k}")
            assert not torch.isfinite(out[:, 0, k:]).all(), f"chunked oracle: inf in {name} at row {k} vanished"
