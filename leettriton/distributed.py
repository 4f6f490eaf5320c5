"""Sequence parallelism: one sequence cut into contiguous slices across the ranks of a process group.

Rank k holds rows [s_k, s_{k+1}) of every (batch, head) sequence and gets back the same rows of the
output.  The ranks exchange nothing but one float32 state of (batch, heads, r, d) each, plus a few
integers of metadata (docs/design.md §11):

1. each rank gathers (asynchronously) a small metadata row: its sizes, dtype, layout, method,
   precision, γ checksum and slice length, so that ranks that disagree fail together, never hang;
2. meanwhile it computes its slice's **local state** S_k = Σ_{t in slice} γ^(s_{k+1} − 1 − t) c_tᵀ v_t
   (rank 0 from ``initial_state``, every other rank from zero): a state-only pass that reads c and v
   once and writes no output;
3. one all-gather of the local states; rank k's true start state is
   Σ_{j<k} γ^(s_k − s_{j+1}) S_j, and the final state Σ_j γ^(N − s_{j+1}) S_j, every factor an
   exp2(λ · distance) with distance ≥ 0 (§2.1);
4. the output pass: the rank's slice with ``method`` from its true start state.

``import leettriton`` does not import this module: ``import leettriton.distributed``.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Optional, Sequence

import torch

from . import registry
from .api import linear_attention as _single_device
from .autotune.families import current_family, is_interpreting
from .kernels import segments
from .methods.block_based.space import segment_length
from .plan import run_problem
from .problem import DTYPES, LAYOUTS, Problem, check_state, make_problem

__all__ = ["linear_attention", "simulate", "combine_states", "slice_state"]

_WHERE = "leettriton.distributed.linear_attention"

# the metadata row every rank gathers before any state moves (int64; γ's checksums as float64 bits)
_FIELDS = ("ok", "batch", "heads", "r", "d", "n", "dtype", "layout", "method", "precision", "return_state",
           "gamma", "gamma (weighted)")
_AGREE = ("batch", "heads", "r", "d", "dtype", "layout", "method", "precision", "return_state", "gamma",
          "gamma (weighted)")
_PRECISIONS = ("ieee", "tf32")


def linear_attention(b, c, v, gamma=None, *, group=None, method: str = "auto", layout: str = "bhnd",
                     initial_state=None, return_state: bool = False, precision: Optional[str] = None):
    """:func:`leettriton.linear_attention` over a sequence cut into slices, one per rank of ``group``.

    Every rank of the group calls this with its contiguous slice of the sequence, the ranks in
    sequence order (rank 0 holds the first rows).  Slices may differ in length, and may be empty.

    Args:
        b, c: ``(batch, heads, n_k, r)`` (layout ``"bhnd"``) or ``(batch, n_k, heads, r)``
            (``"bnhd"``): this rank's n_k rows; float16, bfloat16 or float32.
        v: ``(batch, heads, n_k, d)`` or ``(batch, n_k, heads, d)``, same dtype and device.
        gamma: as in :func:`leettriton.linear_attention`; the same on every rank.
        group: a ``torch.distributed`` process group (default: the default group).  Without an
            initialised group, or with one rank, this is the single-device call.
        method, layout, precision: as in :func:`leettriton.linear_attention`; the same on every
            rank (``"auto"`` chooses per rank, for the rank's own slice length).
        initial_state: float32 ``(batch, heads, r, d)``, the state before the sequence's first row:
            read on rank 0 only (validated and ignored on the others).
        return_state: also return the state after the sequence's last row, on every rank.

    Returns:
        This rank's rows of the output (dtype and layout of ``v``); with ``return_state=True``,
        ``(output, state)``.

    Raises:
        ValueError on **every** rank when the ranks disagree on batch, heads, r, d, dtype, layout,
        method, precision, return_state or γ, or when one rank's arguments are invalid (that rank
        raises its own error, the others a ValueError naming it).
        NotImplementedError when a gradient is needed (the backward across ranks is not built yet).

    Uses two all-gathers of the group (``torch.distributed``: NCCL for CUDA tensors, gloo for CPU
    tensors) and one host synchronisation (the metadata check).

    Example (``torchrun --nproc-per-node 4 script.py``)::

        >>> torch.distributed.init_process_group("nccl")
        >>> rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        >>> rows = slice(rank * n // world, (rank + 1) * n // world)
        >>> o_k, state = leettriton.distributed.linear_attention(b[:, :, rows], c[:, :, rows], v[:, :, rows],
        ...                                                      gamma, return_state=True)
    """
    dist = _distributed()
    if dist is None or not dist.is_initialized():
        if group is not None:
            raise ValueError(f"{_WHERE}: group was given but torch.distributed is not initialised")
        return _single_device(b, c, v, gamma, method=method, layout=layout, initial_state=initial_state,
                              return_state=return_state, precision=precision)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"{_WHERE}: this process (global rank {dist.get_rank()}) is not a member of group")
    if world == 1:
        return _single_device(b, c, v, gamma, method=method, layout=layout, initial_state=initial_state,
                              return_state=return_state, precision=precision)

    comm = _comm_device(dist, group)
    error: Optional[BaseException] = None
    try:
        name, p, out = _local_problem(b, c, v, gamma, method, layout, initial_state if rank == 0 else None,
                                      return_state, precision)
        if rank > 0 and initial_state is not None:  # validated like rank 0's, then not read
            B, H, _, r, d = p.shape
            check_state("initial_state", initial_state, (B, H, r, d), p.v.device, optional=True)
        meta = _metadata(p, name, layout).to(comm)
    except (TypeError, ValueError, NotImplementedError) as exc:
        error = exc
        meta = torch.zeros(len(_FIELDS), dtype=torch.int64, device=comm)

    # 1. the metadata, gathered while this rank computes its local state
    rows = [torch.empty_like(meta) for _ in range(world)]
    meta_work = dist.all_gather(rows, meta, group=group, async_op=True)
    local = slice_state(p, name) if error is None else None          # 2. the state-only pass
    meta_work.wait()
    lengths = _check_agreement(torch.stack(rows).cpu().tolist(), error)   # the one host sync; raises

    # 3. one all-gather of the local states: batch · heads · r · d float32 per rank
    device = p.v.device
    states = [torch.empty_like(local, device=comm) for _ in range(world)]
    state_work = dist.all_gather(states, local.to(comm), group=group, async_op=True)
    if rank == 0:  # rank 0's start state is its own initial state: its output pass overlaps the gather
        run_problem(replace(p, state=None), name)
    state_work.wait()
    gathered = torch.stack(states).to(device)
    if rank > 0:   # 4. the output pass from the true start state
        run_problem(replace(p, initial_state=combine_states(gathered, lengths, p.gamma, rank), state=None), name)
    if return_state:
        p.state.copy_(combine_states(gathered, lengths, p.gamma, world))
        return out, p.state
    return out


def simulate(b, c, v, gamma=None, *, lengths: Sequence[int], method: str = "auto", layout: str = "bhnd",
             initial_state=None, return_state: bool = False, precision: Optional[str] = None):
    """The sequence-parallel algorithm on one device, without communication: the whole sequence is cut
    into consecutive slices of ``lengths`` rows, each computed as a rank of :func:`linear_attention`
    would (its local state, the states combined, its output pass from its true start state).

    Arguments and result as :func:`leettriton.linear_attention` for the whole sequence; ``lengths``
    must add up to its length.  For checking the algorithm and modelling its cost on one GPU.
    """
    name = registry.canonical_method(method)
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision, where="leettriton.distributed.simulate")
    lengths = [int(x) for x in lengths]
    if any(x < 0 for x in lengths) or sum(lengths) != p.shape[2]:
        raise ValueError(f"lengths must be non-negative and add up to n = {p.shape[2]}, got {lengths}")
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    parts = [_rows(p, s, s + n, initial_state if k == 0 else None) for k, (s, n) in enumerate(zip(starts, lengths))]
    states = torch.stack([slice_state(q, name) for q in parts])
    for k, q in enumerate(parts):
        start = q.initial_state if k == 0 else combine_states(states, lengths, p.gamma, k)
        run_problem(replace(q, initial_state=start), name)
    if return_state:
        p.state.copy_(combine_states(states, lengths, p.gamma, len(lengths)))
        return out, p.state
    return out


def _rows(p: Problem, start: int, end: int, initial_state) -> Problem:
    """Rows [start, end) of ``p`` as a problem of their own (views, the output's rows included)."""
    rows = slice(start, end)
    return replace(p, b=p.b[:, :, rows], c=p.c[:, :, rows], v=p.v[:, :, rows], out=p.out[:, :, rows],
                   initial_state=initial_state, state=None)


def _distributed():
    """``torch.distributed`` when this build of torch has it, else None."""
    import torch.distributed as dist  # noqa: PLC0415  (a module of torch; loaded on use)

    return dist if dist.is_available() else None


def _comm_device(dist, group) -> torch.device:
    """Where the collectives' tensors live: the current CUDA device for NCCL, the CPU otherwise."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_problem(b, c, v, gamma, method, layout, initial_state, return_state, precision):
    """This rank's validated call: (method name, Problem with ``state`` allocated when asked, output)."""
    name = registry.canonical_method(method)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (b, c, v, initial_state)):
        _backward_not_built()
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision, where=_WHERE)
    return name, p, out


def _backward_not_built():
    """The hook for the backward across ranks (docs/design.md §11.4).

    It is the forward's scan run in reverse: each rank computes the gradient dS_k of its slice's start
    state from zero, one all-gather of those, and rank k's true end-state gradient
    Σ_{j>k} γ^(s_j − s_{k+1}) dS_j feeds its local backward.  It needs the single-device backward.
    """
    raise NotImplementedError(
        f"{_WHERE}: gradients across ranks are not implemented yet (the single-device backward they build "
        f"on is another issue); call it under torch.no_grad() or with inputs that do not require grad")


def _metadata(p: Problem, name: str, layout: str) -> torch.Tensor:
    """This rank's metadata row (see ``_FIELDS``), on the inputs' device; γ's checksums stay on the device."""
    B, H, n, r, d = p.shape
    ints = [1, B, H, r, d, n, DTYPES.index(p.v.dtype), LAYOUTS.index(layout), zlib.crc32(name.encode()),
            _PRECISIONS.index(p.precision), int(p.state is not None)]
    g = (torch.ones(H, dtype=torch.float64, device=p.v.device) if p.gamma is None
         else p.gamma.to(torch.float64))
    weights = torch.arange(1, H + 1, dtype=torch.float64, device=g.device)
    checks = torch.stack([g.sum(), (g * weights).sum()]) if H else torch.zeros(2, dtype=torch.float64,
                                                                                  device=g.device)
    return torch.cat([torch.tensor(ints, dtype=torch.int64, device=g.device), checks.view(torch.int64)])


def _describe(field: str, value: int) -> str:
    if field == "dtype":
        return str(DTYPES[value]).replace("torch.", "")
    if field == "layout":
        return repr(LAYOUTS[value])
    if field == "precision":
        return repr(_PRECISIONS[value])
    if field == "return_state":
        return str(bool(value))
    if field.startswith("gamma"):
        return f"checksum {torch.tensor(value, dtype=torch.int64).view(torch.float64).item()!r}"
    if field == "method":
        return f"crc32 {value:#010x}"
    return str(value)


def _check_agreement(rows: Sequence[Sequence[int]], error: Optional[BaseException]) -> list[int]:
    """Raise on every rank (the same message everywhere) unless all ranks validated and agree; else the
    slice lengths, in rank order."""
    failed = [k for k, row in enumerate(rows) if row[0] != 1]
    if failed:
        if error is not None:
            raise error
        raise ValueError(f"{_WHERE}: rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of "
                         f"{len(rows)} rejected {'their' if len(failed) > 1 else 'its'} arguments (the error is "
                         f"raised there); nothing was computed")
    for field in _AGREE:
        i = _FIELDS.index(field)
        if len({row[i] for row in rows}) > 1:
            shown = "; ".join(f"rank {k}: {_describe(field, row[i])}" for k, row in enumerate(rows))
            name = "gamma" if field.startswith("gamma") else field
            raise ValueError(f"{_WHERE}: the ranks disagree on {name} ({shown}); every rank must pass the same "
                             f"batch, heads, r, d, dtype, gamma, layout, method, precision and return_state, "
                             f"only the slice length may differ")
    return [row[_FIELDS.index("n")] for row in rows]


def slice_state(p: Problem, name: str = "auto") -> torch.Tensor:
    """The state after ``p``'s rows from its start state ``p.initial_state`` (zero when None), without
    computing any output: γ^n S₀ + Σ_t γ^(n − 1 − t) c_tᵀ v_t, float32 ``(B, H, r, d)``.

    CUDA tensors (and CPU tensors under the interpreter) run the segment-state kernels (§3.6) with
    block_based's segment rule; a ``_torch`` method, or CPU tensors otherwise, the same sum in PyTorch.
    """
    B, H, n, r, d = p.shape
    state = torch.empty((B, H, r, d), dtype=torch.float32, device=p.v.device)
    if n == 0 or B == 0 or H == 0:
        return state.copy_(p.initial_state) if p.initial_state is not None else state.zero_()
    q = replace(p, state=state)
    if registry.torch_method(name) is None and (p.v.device.type == "cuda" or is_interpreting()):
        seg_len = segment_length(B * H, n, d, current_family(p.v.device))
        if seg_len >= n:
            segments.final_state(q)
        else:
            segments.segment_start_states(q, seg_len)
        return state
    # PyTorch: float32 products, decays exp2(λ · (n − 1 − t)) from λ in float64
    t = torch.arange(n, dtype=torch.float64, device=p.v.device)
    cc = p.c.float()
    if p.gamma is not None:
        lam = torch.log2(p.gamma.to(torch.float64))
        cc = cc * torch.exp2(lam[:, None] * (n - 1 - t)).float()[None, :, :, None]
    state.copy_(cc.transpose(-1, -2) @ p.v.float())
    if p.initial_state is not None:
        total = 1.0 if p.gamma is None else torch.exp2(lam * n).float().view(1, H, 1, 1)
        state += total * p.initial_state
    return state


def combine_states(states: torch.Tensor, lengths: Sequence[int], gamma: Optional[torch.Tensor],
                   upto: int) -> torch.Tensor:
    """The state before slice ``upto``: Σ_{j<upto} γ^(s_upto − s_{j+1}) S_j, float32 ``(B, H, r, d)``.

    Args:
        states: float32 ``(slices, B, H, r, d)``: each slice's local state (the first slice's from the
            initial state, the others' from zero).
        lengths: rows per slice (Python ints), so s_j = Σ_{i<j} lengths[i].
        gamma: ``(H,)`` γ per head, or None (no decay).
        upto: 0 … slices; ``upto = slices`` gives the final state.

    Every factor is exp2(λ · distance) with distance = s_upto − s_{j+1} ≥ 0 (docs/design.md §2.1).
    """
    if upto == 0:
        return torch.zeros_like(states[0])
    ends = torch.tensor(lengths[:upto], dtype=torch.float64).cumsum(0)              # s_{j+1}, j < upto
    distance = (ends[-1] - ends).to(states.device)                                # ≥ 0
    if gamma is None:
        weights = torch.ones(upto, states.shape[2], dtype=torch.float32, device=states.device)
    else:
        lam = torch.log2(gamma.to(device=states.device, dtype=torch.float64))
        weights = torch.exp2(distance[:, None] * lam[None, :]).float()            # [upto, H]
    return torch.einsum("jh,jbhrd->bhrd", weights, states[:upto])
