"""Inputs, tolerances and comparison against the oracle, shared by the tests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from leettriton.reference import tolerance  # noqa: F401  (the one table, shared with the bench)


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str,
                 terms: Optional[torch.Tensor] = None) -> None:
    """‖out − ref‖ / ‖ref‖ ≤ tol, no NaN/inf; on failure report max-abs, relative error, first bad index.

    ``terms``: the same quantity computed by the oracle from the inputs' magnitudes (every term of every
    sum counted positive, :func:`magnitudes`); the error is then measured against ‖terms‖ ≥ ‖ref‖.  That
    is the bound TF32 products keep, and 16-bit final states (docs/design.md §2.5): the former round every
    operand, the latter sum decayed values each rounded on its own, so a result that cancels to far below
    its terms carries each term's rounding.  Where nothing cancels, terms = |ref|.
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if ref.numel() == 0:
        return
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        first = tuple(int(i) for i in (~finite).nonzero()[0])
        raise AssertionError(f"{what}: {int((~finite).sum())} non-finite elements, first at {first}")
    diff = (o - r).abs()
    if terms is not None:
        assert terms.shape == ref.shape, f"{what}: terms {tuple(terms.shape)} != reference {tuple(ref.shape)}"
        r = terms.detach().to(device="cpu", dtype=torch.float64)
        what += " (against the terms' magnitudes)"
    denom = r.norm().item()
    rel = diff.norm().item() / denom if denom > 0 else diff.max().item()
    if rel > tol:
        scale = r.abs().max().item() or 1.0
        bad = (diff > tol * scale).nonzero()
        first = tuple(int(i) for i in bad[0]) if len(bad) else None
        raise AssertionError(f"{what}: relative error {rel:.3e} > {tol:.1e}; max-abs {diff.max().item():.3e} "
                             f"(reference max-abs {scale:.3e}); first bad index {first}")


def magnitudes(*tensors):
    """The inputs' absolute values, detached (None stays None): fed to the oracle they give every quantity
    with each term of its sums counted positive (γ's decays are positive), the ``terms`` of
    :func:`assert_close`."""
    return tuple(None if x is None else x.detach().abs() for x in tensors)


@dataclass
class Case:
    """One problem: shapes, dtype, layout and options."""

    B: int
    H: int
    n: int
    r: int
    d: int
    dtype: torch.dtype = torch.float32
    layout: str = "bhnd"
    gamma: object = None          # None, float, or "tensor" (per-head values drawn from gammas)
    gammas: tuple = ()
    initial: bool = False
    return_state: bool = False
    noncontiguous: bool = False
    seed: int = 0

    def tensors(self, device):
        g = torch.Generator().manual_seed(self.seed)

        def rand(*shape):
            return torch.randn(*shape, generator=g)

        def arrange(x):  # logical (B, H, n, dim) -> the case's layout, possibly non-contiguous
            if self.noncontiguous:
                # a strided slice of a wider tensor: every stride differs from the contiguous one
                wide = torch.zeros(x.shape[:-1] + (2 * x.shape[-1] + 1,))
                wide[..., 1::2] = x
                x = wide[..., 1::2]
            if self.layout == "bnhd":
                x = x.transpose(1, 2)
                if not self.noncontiguous:
                    x = x.contiguous()
            return x.to(device=device, dtype=self.dtype)

        b = arrange(rand(self.B, self.H, self.n, self.r))
        c = arrange(rand(self.B, self.H, self.n, self.r))
        v = arrange(rand(self.B, self.H, self.n, self.d))
        s0 = rand(self.B, self.H, self.r, self.d).to(device) if self.initial else None
        if self.gamma == "tensor":
            gamma = torch.tensor(self.gammas, dtype=torch.float32, device=device)
        else:
            gamma = self.gamma
        return b, c, v, gamma, s0

    @property
    def id(self) -> str:
        g = "tensor" if self.gamma == "tensor" else self.gamma
        parts = [f"B{self.B}", f"H{self.H}", f"n{self.n}", f"r{self.r}", f"d{self.d}",
                 str(self.dtype).replace("torch.", ""), self.layout, f"g{g}"]
        if self.initial:
            parts.append("s0")
        if self.noncontiguous:
            parts.append("strided")
        return "-".join(parts)
