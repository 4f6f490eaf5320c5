"""The decay's per-row gradient: dG_t = b_t · db_t − c_t · dc_t for every batch element, output head and row.

With a per-token decay (or a learnable γ) the backward needs ∂L/∂G_t, G_t = a_0 + … + a_t, and its
(batch, heads, n, r) part is a row-wise dot product of b with db minus one of c with dc (docs/design.md
§10.6).  db and dc are per output head; b and c per their own heads (grouped heads, docs/design.md §1.7:
output head h reads head h // g, g = H / the tensor's heads, :func:`~leettriton.kernels.abi.group_ptr`).
Here it is one pass over the four tensors: a program takes BN rows of one (batch, head), loads b, db, c
and dc in their own dtypes through their strides (either layout, any view, a gradient expanded with
stride 0), BK columns at a time with masks (any r), and writes the float32 dot products.  Every product
and every sum is float32, as in the PyTorch form on float32 copies (the CPU's, autograd.py), but no
float32 copy of db or dc (per output head: with grouped heads the size of a whole gradient of the output's
heads) and no product tensor of that size is made: those would be several passes over memory of that size,
where one read of each input suffices.
The reverse cumulative sum and the final state's term, on (batch, heads, n), stay in PyTorch (float64).
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
import triton
import triton.language as tl

from .. import problem
from ..autotune import KernelSpace, autotune, is_interpreting
from ..autotune.configs import CompiledLaunches
from ..autotune.sizing import cdiv, next_power_of_2
from .abi import batch_head, group_ptr, group_strides, head_ptr, strides

__all__ = ["decay_grad", "DECAY_GRAD_DTYPES", "MAX_BK", "ROWS", "column_tile"]

DECAY_GRAD_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

MAX_BK = 128
"""The widest column tile: a wider r is read in slices of this many columns."""


def column_tile(r: int) -> int:
    """BK for rows of ``r`` columns: ``r`` padded to a power of two (at least 16), at most :data:`MAX_BK`."""
    return min(MAX_BK, max(16, next_power_of_2(int(r))))


def _keep(cfg) -> bool:
    # each thread holds 16 to 64 entries of a full [BN, MAX_BK] tile of each of the two tensors it multiplies:
    # enough loads in flight for a pass bound by memory, few enough registers
    per_thread = cfg["BN"] * MAX_BK // (32 * cfg["num_warps"])
    return 16 <= per_thread <= 64


ROWS = KernelSpace(
    name="decay_grad.rows",
    axes={"default": dict(BN=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1])},  # a read: the same everywhere
    cpu=dict(BN=16, num_warps=4, num_stages=1),  # several row blocks, a partial last one, on small tests
    smem=lambda cfg, args: 0,  # registers only: tiles are loaded and reduced, never shared
    keep=_keep,
)
"""The kernel's configs: how many rows a program owns and how many threads share them."""


@triton.jit
def _row_dots(x_ptr, x_strides, dx_ptr, dx_strides, o_n, m_n, R, BN: tl.constexpr, BK: tl.constexpr):
    """Σ_k x[o_n, k] · dx[o_n, k] in float32 for the rows ``o_n`` (``m_n`` those that exist), BK columns at a
    time; both tensors in their own dtype, converted to float32 before the product."""
    o_k = tl.arange(0, BK)
    acc = tl.zeros([BN], dtype=tl.float32)
    for k0 in range(0, R, BK):
        o_c = k0 + o_k
        m = m_n[:, None] & (o_c < R)[None, :]
        b_x = tl.load(x_ptr + o_n[:, None] * x_strides[2] + o_c[None, :] * x_strides[3], mask=m, other=0.0)
        b_dx = tl.load(dx_ptr + o_n[:, None] * dx_strides[2] + o_c[None, :] * dx_strides[3], mask=m, other=0.0)
        acc += tl.sum(b_x.to(tl.float32) * b_dx.to(tl.float32), axis=1)
    return acc


@autotune(ROWS, key=["RB", "RC", "HAS_DB", "HAS_DC"])
@triton.jit(do_not_specialize=["N"])
def _decay_grad_kernel(b_ptr, c_ptr, db_ptr, dc_ptr, out_ptr, b_strides, c_strides, db_strides, dc_strides,
                       H, N, RB, RC, HAS_DB: tl.constexpr, HAS_DC: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr):
    # one axis: batch·heads × row blocks (a head's blocks are neighbours, and the grid's first axis has room
    # for any n)
    n_blocks = tl.cdiv(N, BN)
    i_p = tl.program_id(0)
    i_bh = i_p // n_blocks
    i_b, i_h = batch_head(i_bh, H)
    o_n = ((i_p % n_blocks) * BN + tl.arange(0, BN)).to(tl.int64)   # row offsets of long views pass 2^31
    m_n = o_n < N
    acc = tl.zeros([BN], dtype=tl.float32)
    if HAS_DB:
        acc += _row_dots(group_ptr(b_ptr, b_strides, i_b, i_h), b_strides, head_ptr(db_ptr, db_strides, i_b, i_h),
                         db_strides, o_n, m_n, RB, BN, BK)
    if HAS_DC:
        acc -= _row_dots(group_ptr(c_ptr, c_strides, i_b, i_h), c_strides, head_ptr(dc_ptr, dc_strides, i_b, i_h),
                         dc_strides, o_n, m_n, RC, BN, BK)
    tl.store(out_ptr + i_bh.to(tl.int64) * N + o_n, acc, mask=m_n)


_LAUNCHES = CompiledLaunches(_decay_grad_kernel, ("b_ptr", "c_ptr", "db_ptr", "dc_ptr", "out_ptr"))
"""The compiled kernels by sizes, strides and dtypes: a backward's launch goes straight through the compiled
kernel (host time on short sequences); the keys hold n, so a run of many lengths forgets old ones."""


def _check(b, c, db, dc, layout: str) -> None:
    """Errors before any work: the arguments :func:`decay_grad` documents."""
    if layout not in problem.LAYOUTS:
        raise ValueError(f"layout must be 'bhnd' or 'bnhd', got {layout!r}")
    if db is None and dc is None:
        raise ValueError("db and dc must not both be None (there is no term to form)")
    named = (("b", b), ("c", c), ("db", db), ("dc", dc))
    for name, x in named:
        if x is None and name in ("b", "c"):
            raise TypeError(f"{name} must be a tensor, got None")
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {problem.type_name(x)}")
        if x.dtype not in DECAY_GRAD_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (layout '{layout}'), got shape {tuple(x.shape)}")
        if x.device != b.device:
            raise ValueError(f"{name} must be on b's device {b.device}, got a tensor on {x.device}")
    if b.device.type != "cuda" and not is_interpreting():
        raise ValueError(f"b must be on a CUDA device (or the CPU under TRITON_INTERPRET=1) for the kernel, got a "
                         f"tensor on {b.device}")
    grads = [(name, problem.to_bhnd(g, layout), xn, problem.to_bhnd(x, layout))
             for name, g, xn, x in (("db", db, "b", b), ("dc", dc, "c", c)) if g is not None]
    heads = grads[0][1].shape[1]
    for name, g, xn, x in grads:
        B, H, n, r = g.shape
        if H != heads:
            raise ValueError(f"db and dc must have the same heads (the output's), got {heads} and {H}")
        if (x.shape[0], x.shape[2], x.shape[3]) != (B, n, r):
            raise ValueError(f"{xn} must match {name} in batch, n and r (layout '{layout}'): {name} has shape "
                             f"{tuple(g.shape)} as (batch, heads, n, r), {xn} {tuple(x.shape)}")
        h = x.shape[1]
        if h == 0 or H % h:
            raise ValueError(f"{xn}'s heads must divide {name}'s {H} (grouped heads, docs/design.md §1.7), got {h}")


def decay_grad(b: torch.Tensor, c: torch.Tensor, db: Optional[torch.Tensor], dc: Optional[torch.Tensor],
               layout: str = "bhnd", config: Optional[Mapping] = None, *, check: bool = True) -> torch.Tensor:
    """dG = Σ_r b ⊙ db − Σ_r c ⊙ dc per batch element, output head and row, in float32, by one launch.

    Args:
        b, c: the operator's b and c in ``layout`` (``(batch, h, n, r)`` or ``(batch, n, h, r)``), any strides and
            dtype (float16, bfloat16, float32, float64); h may be fewer than the output's heads H and must
            divide it: output head k reads head k // (H / h) (docs/design.md §1.7).
        db, dc: the gradients of b and c per output head, ``(batch, H, n, r)`` in ``layout``, any strides (stride
            0 too) and dtype; either may be None (its term is left out), not both.
        layout: ``"bhnd"`` or ``"bnhd"``, of all four.
        config: maps ``"decay_grad.rows"`` to a config of the kernel (tests); None: autotuned.
        check: validate first (``TypeError``/``ValueError`` before any work); ``False`` is for the backward,
            which vouches for its own tensors.

    Returns:
        A new float32 tensor ``(batch, H, n)``: every product and sum in float32 (docs/design.md §10.6).
        Runs the Triton kernel: CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.

    Example::

        >>> dG = decay_grad(b, c, db, dc, "bnhd")       # (B, H, n) float32
    """
    if check:
        _check(b, c, db, dc, layout)
    bb, cc = problem.to_bhnd(b, layout), problem.to_bhnd(c, layout)
    gb = None if db is None else problem.to_bhnd(db, layout)
    gc = None if dc is None else problem.to_bhnd(dc, layout)
    some = gb if gb is not None else gc
    B, H, n, _ = some.shape
    device = some.device
    out = problem.new_empty((B, H, n), torch.float32, device)
    if B * H * n == 0:
        return out
    # an absent pair's slot gets the present one as a stand-in, never read (HAS_DB / HAS_DC prune its code)
    gb_, bb_ = (gb, bb) if gb is not None else (gc, cc)
    gc_, cc_ = (gc, cc) if gc is not None else (gb, bb)
    rb, rc = gb_.shape[3], gc_.shape[3]
    args = dict(b_ptr=bb_, c_ptr=cc_, db_ptr=gb_, dc_ptr=gc_, out_ptr=out, b_strides=group_strides(bb_, H),
                c_strides=group_strides(cc_, H), db_strides=strides(gb_), dc_strides=strides(gc_), H=H, N=n, RB=rb,
                RC=rc, HAS_DB=gb is not None, HAS_DC=gc is not None, BK=column_tile(max(rb, rc)))
    bh = B * H
    grid = lambda meta: (bh * cdiv(n, meta["BN"]),)  # noqa: E731
    pinned = (config or {}).get(ROWS.name)
    tensors = (bb_, cc_, gb_, gc_)
    # everything the compiled kernel, its config and the grid depend on: sizes, strides, dtypes, alignment
    key = (bh, H, n, rb, rc, args["HAS_DB"], args["HAS_DC"], tuple(x.dtype for x in tensors),
           tuple(x.stride() for x in tensors), tuple(x.shape[1] for x in (bb_, cc_)),
           tuple(x.data_ptr() % 16 == 0 for x in tensors + (out,)),
           None if pinned is None else tuple(sorted(pinned.items())))
    _LAUNCHES.launch(key, grid, pinned, args, device)
    return out
