"""Row reversal: copies of up to three tensors with the rows of each head in reverse order.

The backward runs the operator backwards in time.  The built-in Triton methods do that on the tensors as
they are (reversed problems: docs/design.md §10.3); a call whose method cannot (a user method, a PyTorch
method, a backward with ``create_graph``) runs on reversed copies of its inputs made here, and its output
is reversed back.  Each copy is one read and one write of the tensor: a program
moves a [BN, BD] tile of one head's rows, row i to row n − 1 − i, reading any strides (a ``bnhd``
view, a non-contiguous slice, a gradient expanded with stride 0) and writing a new tensor contiguous in
the caller's layout.  Rows are read and written whole, so both sides are coalesced along the columns.
Up to three tensors of one (batch, heads, n) -- of any column counts and dtypes -- are reversed by one
launch (the second grid axis picks the tensor), which saves host time on short sequences.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
import triton
import triton.language as tl

from .. import problem
from ..autotune import autotune, is_interpreting
from ..autotune.configs import CompiledLaunches
from ..autotune.sizing import cdiv
from . import reverse_space as spaces
from .abi import batch_head, head_ptr

__all__ = ["reverse_rows", "MAX_TENSORS", "REVERSIBLE_DTYPES"]

MAX_TENSORS = 3
"""Most tensors one launch reverses."""

REVERSIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _reverse_head_rows(src_ptr, dst_ptr, src_strides, dst_strides, i_b, i_h, o_n, N, DIM, BD: tl.constexpr):
    """Rows ``o_n`` of head (i_b, i_h) of ``src`` stored as rows N − 1 − o_n of ``dst``, BD columns at a time."""
    p_src = head_ptr(src_ptr, src_strides, i_b, i_h)
    p_dst = head_ptr(dst_ptr, dst_strides, i_b, i_h)
    m_n = o_n < N
    o_rev = N - 1 - o_n          # negative past the last row: masked by m_n, never by the row count
    for d0 in range(0, DIM, BD):
        o_d = d0 + tl.arange(0, BD)
        m = m_n[:, None] & (o_d < DIM)[None, :]
        b_x = tl.load(p_src + o_n[:, None] * src_strides[2] + o_d[None, :] * src_strides[3], mask=m)  # [BN, BD]
        tl.store(p_dst + o_rev[:, None] * dst_strides[2] + o_d[None, :] * dst_strides[3], b_x, mask=m)


@autotune(spaces.ROWS, key=["DIM0", "DIM1", "DIM2", "COUNT"])
@triton.jit(do_not_specialize=["N"])
def _reverse_rows_kernel(
    src0_ptr, dst0_ptr, src1_ptr, dst1_ptr, src2_ptr, dst2_ptr,
    src0_strides, dst0_strides, src1_strides, dst1_strides, src2_strides, dst2_strides,
    H, N, DIM0, DIM1, DIM2,
    COUNT: tl.constexpr, BD0: tl.constexpr, BD1: tl.constexpr, BD2: tl.constexpr,
    BN: tl.constexpr,
):
    # axis 0: batch·heads × row blocks (a head's blocks are neighbours); axis 1: which tensor
    n_blocks = tl.cdiv(N, BN)
    i_p, i_t = tl.program_id(0), tl.program_id(1)
    i_b, i_h = batch_head(i_p // n_blocks, H)
    o_n = (i_p % n_blocks) * BN + tl.arange(0, BN)
    if i_t == 0:
        _reverse_head_rows(src0_ptr, dst0_ptr, src0_strides, dst0_strides, i_b, i_h, o_n, N, DIM0, BD0)
    if COUNT > 1:
        if i_t == 1:
            _reverse_head_rows(src1_ptr, dst1_ptr, src1_strides, dst1_strides, i_b, i_h, o_n, N, DIM1, BD1)
    if COUNT > 2:
        if i_t == 2:
            _reverse_head_rows(src2_ptr, dst2_ptr, src2_strides, dst2_strides, i_b, i_h, o_n, N, DIM2, BD2)


_LAUNCHES = CompiledLaunches(_reverse_rows_kernel, ("src0_ptr", "dst0_ptr", "src1_ptr", "dst1_ptr", "src2_ptr",
                                                     "dst2_ptr"))
"""The reversal's compiled kernels by sizes, strides and dtypes: a backward's reversals are launched
straight through the compiled kernel (their host time counts on short sequences); the keys hold n, so a
run of many sequence lengths forgets old ones (``CompiledLaunches.MAX_LAUNCHES``) rather than grow."""


def _check(tensors, layout: str) -> tuple[list[torch.Tensor], tuple[int, int, int]]:
    """The tensors as ``(batch, heads, n, dim)`` views, and (batch, heads, n); errors before any work."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list or tuple of 1 to {MAX_TENSORS} tensors, got "
                        f"{problem.type_name(tensors)}")
    if not 1 <= len(tensors) <= MAX_TENSORS:
        raise ValueError(f"tensors must hold 1 to {MAX_TENSORS} tensors, got {len(tensors)}")
    if layout not in problem.LAYOUTS:
        raise ValueError(f"layout must be 'bhnd' or 'bnhd', got {layout!r}")
    views = []
    for i, x in enumerate(tensors):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"tensors[{i}] must be a tensor, got {problem.type_name(x)}")
        if x.dtype not in REVERSIBLE_DTYPES:
            raise TypeError(f"tensors[{i}] must be float16, bfloat16, float32 or float64, got {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"tensors[{i}] must be 4-D (layout '{layout}'), got shape {tuple(x.shape)}")
        problem.check_device(f"tensors[{i}]", x)
        views.append(problem.to_bhnd(x, layout))
    lead = tuple(views[0].shape[:3])
    for i, (x, view) in enumerate(zip(tensors, views)):
        if tuple(view.shape[:3]) != lead or x.device != tensors[0].device:
            raise ValueError(f"tensors must share batch, heads, n and device: tensors[0] has shape "
                             f"{tuple(tensors[0].shape)} on {tensors[0].device}, tensors[{i}] {tuple(x.shape)} on "
                             f"{x.device}")
    return views, lead


def reverse_rows(tensors: Sequence[torch.Tensor], layout: str = "bhnd", config: Optional[Mapping] = None, *,
                 check: bool = True) -> list[torch.Tensor]:
    """Copies of ``tensors`` with the sequence reversed: ``[x.flip(n axis) for x in tensors]``, in one launch.

    Args:
        tensors: 1 to 3 tensors ``(batch, heads, n, dim)`` (layout ``"bhnd"``) or ``(batch, n, heads, dim)``
            (``"bnhd"``) of one batch, heads, n and device; any dim, any strides (stride 0 too);
            float16, bfloat16, float32 or float64, each its own.
        layout: where the sequence axis n is (dim 2 for ``"bhnd"``, dim 1 for ``"bnhd"``).
        config: maps ``"reverse.rows"`` to a config of the kernel (tests); None: autotuned.
        check: validate ``tensors`` and ``layout`` first (``TypeError``/``ValueError`` before any work).
            ``False`` is for a caller that vouches for them, as the backward does for the forward's
            validated inputs, their gradient and its own calls' outputs (host time on short sequences).

    Returns:
        A list of new tensors, each contiguous in ``layout``, of its input's shape and dtype, row i of
        each head holding the input's row n − 1 − i.  CUDA tensors (and CPU tensors under
        ``TRITON_INTERPRET=1``) run the Triton kernel; other CPU tensors ``torch.flip``.

    Example::

        >>> b_rev, do_rev = reverse_rows([b, do])           # (B, H, n, r), (B, H, n, d)
    """
    if check:
        views, (B, H, n) = _check(tensors, layout)
    else:
        views = [x if layout == "bhnd" else x.transpose(1, 2) for x in tensors]
        B, H, n = views[0].shape[:3]
    device = tensors[0].device
    if device.type == "cpu" and not is_interpreting():
        axis = 2 if layout == "bhnd" else 1
        return [x.flip(axis).contiguous() for x in tensors]   # flip keeps a permuted input's strides
    outs = [problem.new_empty(x.shape, x.dtype, device) for x in tensors]
    if B * H * n == 0:
        return outs
    count = len(views)
    args = dict(H=H, N=n, COUNT=count)
    dims, key_strides, aligned = [], [], []
    for k in range(MAX_TENSORS):
        # unused slots repeat the first tensor (never read: COUNT prunes their code), with 0 columns
        src, out = (views[k], outs[k]) if k < count else (views[0], outs[0])
        dst = out if layout == "bhnd" else out.transpose(1, 2)
        src_strides, dst_strides = src.stride(), dst.stride()
        dim = src.shape[3] if k < count else 0
        names = _SLOT_ARGS[k]
        args[names[0]], args[names[1]], args[names[2]], args[names[3]] = src, dst, src_strides, dst_strides
        args[names[4]], args[names[5]] = dim, spaces.column_tile(dim)
        if k < count:
            dims.append(dim)
            key_strides += (src_strides, dst_strides)
            aligned += (src.data_ptr() % 16 == 0, dst.data_ptr() % 16 == 0)
    bh = B * H
    grid = lambda meta: (bh * cdiv(n, meta["BN"]), count)  # noqa: E731
    pinned = (config or {}).get(spaces.ROWS.name)
    # everything the compiled kernel, its config and the grid depend on: sizes, strides, dtypes, alignment
    key = (bh, H, n, tuple(dims), tuple(x.dtype for x in views), tuple(key_strides), tuple(aligned),
           None if pinned is None else tuple(sorted(pinned.items())))
    _LAUNCHES.launch(key, grid, pinned, args, device)
    return outs


_SLOT_ARGS = tuple((f"src{k}_ptr", f"dst{k}_ptr", f"src{k}_strides", f"dst{k}_strides", f"DIM{k}", f"BD{k}")
                   for k in range(MAX_TENSORS))
