"""Sequence parallelism: one sequence cut into contiguous slices across the ranks of a process group.

Rank k holds rows [s_k, s_{k+1}) of every (batch, head) sequence and gets back the same rows of the
output.  The ranks exchange nothing but one float32 state of (batch, heads, r, d) each, plus a few
integers of metadata (docs/design.md §11):

1. each rank gathers (asynchronously) a small metadata row: its sizes, dtype, layout, method,
   precision, γ checksum and slice length, so that ranks that disagree fail together, never hang;
2. meanwhile it computes its slice's **local state** S_k = Σ_{t in slice} γ^(s_{k+1} − 1 − t) c_tᵀ v_t
   (rank 0 from ``initial_state``, every other rank from zero): a state-only pass that reads c and v
   once and writes no output.  Where the slice's own call is ``block_based`` over several segments,
   this pass computes the segments' local states, which that call needs anyway, and sums them: the
   output pass then starts from them instead of reading c and v a second time (:func:`local_pass`);
3. one all-gather of the local states; rank k's true start state is
   Σ_{j<k} γ^(s_k − s_{j+1}) S_j, and the final state Σ_j γ^(N − s_{j+1}) S_j, every factor an
   exp2(λ · distance) with distance ≥ 0 (§2.1);
4. the output pass: the rank's slice with ``method`` from its true start state.

The backward is the same scan in reverse (docs/design.md §11.4): each rank's output gives the gradient of
its start state, one all-gather of those, and each rank's slice-end state gradient
Σ_{k>j} γ^(s_k − s_{j+1}) dS_start(k) (+ the final state's) adds one product to its dc and dv.

``import leettriton`` does not import this module: ``import leettriton.distributed``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Optional, Sequence

import torch

from . import ops, registry
from .api import linear_attention as _single_device
from .autograd import add_state_term, group_sum, initial_state_grad, log2_gamma, output_grads
from .autotune.families import current_family, is_interpreting
from .kernels import segments
from .methods.block_based.kernels import walk_segments
from .methods.block_based.space import segmenting, state_pieces
from .kernels.walk import WALK_MAX_R
from .plan import resolve, run_problem
from .problem import (DTYPES, LAYOUTS, Problem, check_state, device_guards_only, expand_heads, log2_gamma64, make_problem,
                      requires_grad)

__all__ = ["linear_attention", "simulate", "start_weights", "slice_weights", "suffix_decay", "combine_states",
           "combine_state_grads", "slice_state", "local_pass"]

_WHERE = "leettriton.distributed.linear_attention"

# the metadata row every rank gathers before any state moves (int64; γ's checksums as float64 bits)
_FIELDS = ("ok", "batch", "heads", "r", "d", "n", "dtype", "layout", "method", "precision", "return_state",
           "grad", "initial_state", "log_decay", "gamma", "gamma (weighted)")
_AGREE = ("batch", "heads", "r", "d", "dtype", "layout", "method", "precision", "return_state", "log_decay", "gamma",
          "gamma (weighted)")
_PRECISIONS = ("ieee", "tf32")
# the "grad" field: grad mode off; on, but no input requires grad; on, and an input requires grad
_GRAD_OFF, _GRAD_ON, _GRAD_NEEDED = 0, 1, 2


def linear_attention(b, c, v, gamma=None, *, group=None, method: str = "auto", layout: str = "bhnd",
                     initial_state=None, return_state: bool = False, precision: Optional[str] = None,
                     log_decay=None):
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
            read on rank 0 only (validated and ignored on the others).  One given on another rank while
            rank 0 has none is a ValueError on every rank (it would be ignored).
        return_state: also return the state after the sequence's last row, on every rank.
        log_decay: a per-token decay instead of gamma, as in :func:`leettriton.linear_attention`: this rank's
            rows of it, ``(batch, heads, n_k)`` (``"bhnd"``) or ``(batch, n_k, heads)`` (``"bnhd"``); given on
            every rank or on none.  Differentiable; the call then takes the composed form of
            docs/sequence-parallel.md §11.7 (after the same metadata check).

    Returns:
        This rank's rows of the output (dtype and layout of ``v``); with ``return_state=True``,
        ``(output, state)``.

    Raises:
        ValueError on **every** rank when the ranks disagree on batch, heads, r, d, dtype, layout,
        method, precision, return_state or γ, when one rank's inputs require grad while another rank
        runs with grad mode off, when a rank other than 0 has an initial_state and rank 0 has none, or
        when one rank's arguments are invalid (that rank raises its own error, the others a ValueError
        naming it).

    Uses two all-gathers of the group (``torch.distributed``: NCCL for CUDA tensors, gloo for CPU
    tensors) and one host synchronisation (the metadata check, which waits for the metadata's gather but
    not for this rank's state pass: docs/design.md §11.3); the backward one more all-gather.

    Autograd (docs/design.md §11.4): when the inputs (b, c, v, ``initial_state``) of **any** rank
    require grad, the output and state of **every** rank carry the backward node, and the backward
    of every rank joins one all-gather. So, as with any collective in autograd, every rank must run
    a backward that reaches its output or its state, in the same order as the other ranks' calls
    (a rank without a loss of its own: ``torch.autograd.backward(o_k, torch.zeros_like(o_k))``).
    The gradients on each rank are those of the **sum of all ranks' losses** with respect to that
    rank's inputs: the final state, returned on every rank, gets the sum of its gradients on all
    ranks (a loss computed from it identically on every rank counts once per rank, so put it on one
    rank). ``initial_state`` gets its gradient on rank 0; on the other ranks, which do not read it,
    zeros. γ is a constant (a gamma that requires grad is refused); a backward with ``create_graph=True``
    raises ``NotImplementedError``.

    Under ``torch.compile`` (``fullgraph=True`` included) the call is traced whole: the state pass as the
    operator ``torch.ops.leettriton.slice_state``, torch's functional collectives, and the output pass as
    :func:`leettriton.linear_attention`'s operator; the ranks' agreement is then not checked
    (docs/sequence-parallel.md §11.7).

    Example (``torchrun --nproc-per-node 4 script.py``)::

        >>> torch.distributed.init_process_group("nccl")
        >>> rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        >>> rows = slice(rank * n // world, (rank + 1) * n // world)
        >>> o_k, state = leettriton.distributed.linear_attention(b[:, :, rows], c[:, :, rows], v[:, :, rows],
        ...                                                      gamma, return_state=True)
        >>> (o_k.float() * target[:, :, rows]).sum().backward()          # on every rank
    """
    dist = _distributed()
    if dist is None or not dist.is_initialized():
        if group is not None:
            raise ValueError(f"{_WHERE}: group was given but torch.distributed is not initialised")
        return _single_device(b, c, v, gamma, method=method, layout=layout, initial_state=initial_state,
                              return_state=return_state, precision=precision, log_decay=log_decay)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"{_WHERE}: this process (global rank {dist.get_rank()}) is not a member of group")
    if world == 1:
        return _single_device(b, c, v, gamma, method=method, layout=layout, initial_state=initial_state,
                              return_state=return_state, precision=precision, log_decay=log_decay)

    if ops.is_compiling():  # a trace: registered operators and traceable collectives (§11.7)
        return _composed(dist, group, rank, world, b, c, v, gamma, method, layout, initial_state, return_state,
                         precision, log_decay)

    comm = _comm_device(dist, group)
    error: Optional[BaseException] = None
    try:
        name, p, out = _local_problem(b, c, v, gamma, method, layout, initial_state if rank == 0 else None,
                                      return_state, precision, log_decay)
        if rank > 0 and initial_state is not None:  # validated like rank 0's, then not read
            B, H, _, r, d = p.shape
            check_state("initial_state", initial_state, (B, H, r, d), p.v.device, optional=True)
        meta = _metadata(p, name, layout, _grad_mode(b, c, v, initial_state, log_decay),
                         initial_state is not None).to(comm)
    except (TypeError, ValueError, NotImplementedError) as exc:
        error = exc
        meta = torch.zeros(len(_FIELDS), dtype=torch.int64, device=comm)

    # 1. the metadata, gathered while this rank computes its local state
    rows = [torch.empty_like(meta) for _ in range(world)]
    meta_work = dist.all_gather(rows, meta, group=group, async_op=True)
    if log_decay is not None:
        # a per-token decay: the composed form, whose autograd carries the decay's gradient (§11.7)
        _check_agreement(_read_rows(rows, meta_work), error)
        return _composed(dist, group, rank, world, b, c, v, gamma, method, layout, initial_state, return_state,
                         precision, log_decay)
    local, output_pass = local_pass(p, name) if error is None else (None, None)   # 2. the state-only pass
    # the one host sync: it waits for the metadata's gather only, never for the state pass just queued, so
    # the states' gather and the output pass are queued behind the state pass while it runs (§11.3)
    lengths, differentiable = _check_agreement(_read_rows(rows, meta_work), error)

    scan = _Scan(dist, group, comm, rank, lengths, p.shape, name, gamma, p.gamma, layout, precision, return_state)
    if not differentiable:
        _states_and_output(scan, p, local, output_pass)
        return (out, p.state) if return_state else out
    # every rank takes the node, those whose inputs need no gradient too (through the anchor), so that
    # every rank's backward joins the backward's all-gather
    anchor = torch.empty(0, device=p.v.device, requires_grad=True)
    return _SequenceParallelFunction.apply(b, c, v, initial_state, anchor, scan,
                                           partial(_states_and_output, scan, p, local, output_pass), (out, p.state))


@dataclass(frozen=True)
class _Scan:
    """One rank's place in the scan, after the metadata check: what its forward and its backward need."""

    dist: object                 # torch.distributed
    group: object
    comm: torch.device           # where the collectives' tensors live
    rank: int
    lengths: list                # rows per rank, in rank order
    shape: tuple                 # this rank's (B, H, n, r, d)
    name: str                    # the canonical method name
    gamma: object                # γ as the caller gave it (for the backward's calls)
    gamma_h: Optional[torch.Tensor]   # γ per head (H,), or None
    layout: str
    precision: Optional[str]
    return_state: bool


def _states_and_output(scan: _Scan, p: Problem, local: torch.Tensor,
                       output_pass: Callable[[Optional[torch.Tensor]], None]) -> Optional[torch.Tensor]:
    """Steps 3 and 4: the all-gather of the local states (``local``: this rank's), then this rank's output
    pass from its true start state (``output_pass``, from :func:`local_pass`; the final state into
    ``p.state`` when asked).  Returns the start state (None on rank 0 without an initial state)."""
    rank, world = scan.rank, len(scan.lengths)
    # 3. one all-gather of the local states: batch · heads · r · d float32 per rank
    states = [torch.empty_like(local, device=scan.comm) for _ in range(world)]
    state_work = scan.dist.all_gather(states, local.to(scan.comm), group=scan.group, async_op=True)
    if rank == 0:  # rank 0's start state is its own initial state: its output pass overlaps the gather
        output_pass(p.initial_state)
    state_work.wait()
    gathered = torch.stack(states).to(p.v.device)
    start = p.initial_state
    if rank > 0:   # 4. the output pass from the true start state
        start = combine_states(gathered, scan.lengths, p.gamma, rank)
        output_pass(start)
    if p.state is not None:
        p.state.copy_(combine_states(gathered, scan.lengths, p.gamma, world))
    return start


class _SequenceParallelFunction(torch.autograd.Function):
    """A rank's output (and the final state) as an autograd node whose backward is the reverse scan.

    ``apply(b, c, v, initial_state, anchor, scan, run, outputs)``: the rank's inputs as the caller gave
    them, an empty tensor that requires grad (so that a rank whose inputs do not still takes the node),
    its :class:`_Scan`, the forward's remaining steps (``run()`` fills the outputs and returns the start
    state) and the (output, state or None) it fills.  Saves b, c, v and the rank's start state; the
    outputs are not kept.
    """

    @staticmethod
    def forward(ctx, b, c, v, initial_state, anchor, scan: _Scan, run, outputs):
        ctx.set_materialize_grads(False)  # a gradient that is not given (an unused output) is None, not zeros
        ctx.scan, ctx.start = scan, run()
        ctx.save_for_backward(b, c, v)
        return outputs if scan.return_state else outputs[0]

    @staticmethod
    def backward(ctx, grad_out, grad_state=None):
        b, c, v = ctx.saved_tensors
        need_b, need_c, need_v, need_s0 = ctx.needs_input_grad[:4]
        db, dc, dv, ds0 = _backward(ctx.scan, ctx.start, b, c, v, grad_out, grad_state, need_b=need_b,
                                    need_c=need_c, need_v=need_v, need_s0=need_s0)
        return db, dc, dv, ds0, None, None, None, None


def _backward(scan: _Scan, start, b, c, v, grad_out, grad_state, *, need_b: bool, need_c: bool, need_v: bool,
              need_s0: bool):
    """This rank's (db, dc, dv, d initial_state): its output's share from the local calls of §10.1, then the
    gradient of its slice's end state from the later ranks' start-state gradients (one all-gather)."""
    if torch.is_grad_enabled():   # every rank's backward is taken the same way, so every rank raises here
        raise NotImplementedError(f"{_WHERE}: a backward with create_graph=True (gradients of gradients) is not "
                                  f"implemented across ranks: the all-gather of the state gradients is not "
                                  f"differentiable")
    rank, lengths, layout, gamma = scan.rank, scan.lengths, scan.layout, scan.gamma
    B, H, n, r, d = scan.shape
    op = partial(_single_device, method=scan.name, layout=layout, precision=scan.precision)
    lam = log2_gamma(gamma, H, v.device)
    # the reversed calls first: dc, dv from this rank's output, and its start state's gradient, which the
    # earlier ranks wait for (rank 0's is needed only for the initial state's gradient)
    need_start = n > 0 and (rank > 0 or need_s0)
    _, dc, dv, state_rev = output_grads(op, b, c, v, None, gamma, grad_out, layout, need_b=False, need_c=need_c,
                                        need_v=need_v, need_state=need_start)
    zeros = torch.zeros((B, H, r, d), dtype=torch.float32, device=v.device)
    start_grad = zeros if state_rev is None else initial_state_grad(state_rev, None, lam, n)
    sent = [start_grad]
    if scan.return_state:   # the returned final state's gradient on this rank (summed over the ranks)
        sent.append(zeros if grad_state is None else grad_state.to(torch.float32))
    sent = torch.stack(sent).to(scan.comm)
    received = [torch.empty_like(sent) for _ in lengths]
    work = scan.dist.all_gather(received, sent, group=scan.group, async_op=True)
    db = None
    if need_b:   # db needs nothing from the other ranks: it overlaps the gather
        db = output_grads(op, b, c, v, start, gamma, grad_out, layout, need_b=True, need_c=False, need_v=False,
                          need_state=False)[0]
    work.wait()
    received = torch.stack(received).to(v.device)                      # [W, 1 or 2, B, H, r, d]
    end_grad = combine_state_grads(received[:, 0], lengths, scan.gamma_h, rank,
                                   received[:, 1] if scan.return_state else None)
    if need_c:
        dc = add_state_term(dc, v, end_grad.transpose(-1, -2), lam, layout, c.dtype)
    if need_v:
        dv = add_state_term(dv, c, end_grad, lam, layout, v.dtype)
    ds0 = None
    if need_s0:   # rank 0 reads the initial state; the other ranks do not, so its gradient there is zero
        ds0 = initial_state_grad(state_rev, end_grad, lam, n) if rank == 0 else zeros
    # per output head: a shared (grouped) tensor's gradient sums its group (docs/design.md §1.7)
    return group_sum(db, b, layout), group_sum(dc, c, layout), group_sum(dv, v, layout), ds0


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
    passes = [local_pass(q, name) for q in parts]
    states = torch.stack([local for local, _ in passes])
    for k, (q, (_, output_pass)) in enumerate(zip(parts, passes)):
        output_pass(q.initial_state if k == 0 else combine_states(states, lengths, p.gamma, k))
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


def _local_problem(b, c, v, gamma, method, layout, initial_state, return_state, precision, log_decay=None):
    """This rank's validated call: (method name, Problem with ``state`` allocated when asked, output).

    The problem holds the inputs detached: the passes are not recorded by autograd, whose node (if any)
    is :class:`_SequenceParallelFunction`."""
    name = registry.canonical_method(method)
    b, c, v, initial_state, log_decay = (x.detach() if isinstance(x, torch.Tensor) else x
                                         for x in (b, c, v, initial_state, log_decay))
    p, out = make_problem(b, c, v, gamma, layout=layout, initial_state=initial_state, return_state=return_state,
                          precision=precision, where=_WHERE, log_decay=log_decay)
    return name, p, out


def _grad_mode(*inputs) -> int:
    """This rank's "grad" field: _GRAD_OFF, _GRAD_ON or _GRAD_NEEDED."""
    if not torch.is_grad_enabled():
        return _GRAD_OFF
    return _GRAD_NEEDED if requires_grad(*inputs) else _GRAD_ON


def _metadata(p: Problem, name: str, layout: str, grad: int, has_initial: bool) -> torch.Tensor:
    """This rank's metadata row (see ``_FIELDS``), on the inputs' device; γ's checksums stay on the device.
    ``has_initial``: this rank was given an initial state."""
    B, H, n, r, d = p.shape
    ints = [1, B, H, r, d, n, DTYPES.index(p.v.dtype), LAYOUTS.index(layout), zlib.crc32(name.encode()),
            _PRECISIONS.index(p.precision), int(p.state is not None), grad, int(has_initial),
            int(p.log_decay is not None)]
    g = (torch.ones(H, dtype=torch.float64, device=p.v.device) if p.gamma is None
         else p.gamma.to(torch.float64))
    weights = torch.arange(1, H + 1, dtype=torch.float64, device=g.device)
    checks = torch.stack([g.sum(), (g * weights).sum()]) if H else torch.zeros(2, dtype=torch.float64,
                                                                                  device=g.device)
    return torch.cat([_host_to(torch.tensor(ints, dtype=torch.int64), g.device), checks.view(torch.int64)])


def _host_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The host tensor ``t`` on ``device`` without a host synchronisation: a CUDA copy goes through pinned
    memory, asynchronously on the current stream (a copy from pageable memory would wait for the stream
    to drain, docs/design.md §11.3); other devices copy as usual."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _read_rows(rows: Sequence[torch.Tensor], work) -> list:
    """The gathered metadata rows as lists of Python ints, once their all-gather (``work``) is complete.

    On CUDA the rows are read on a side stream that waits for the gather alone, not on the current
    stream: the state pass queued there after the gather was launched keeps running while the host
    compares the rows and queues the next launches (docs/design.md §11.3)."""
    device = rows[0].device
    if device.type != "cuda":
        work.wait()
        return torch.stack(rows).tolist()
    side = _side_stream(device)
    with torch.cuda.stream(side):
        work.wait()                                 # the side stream waits for the gather
        gathered = torch.stack(rows)
        host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        host.copy_(gathered, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()           # the host waits for the side stream only (then its reads of rows are done)
    return host.tolist()


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    """One CUDA stream per device for the metadata's host read."""
    stream = _SIDE_STREAMS.get(device.index)
    if stream is None:
        stream = _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    return stream


def _describe(field: str, value: int) -> str:
    if field == "dtype":
        return str(DTYPES[value]).replace("torch.", "")
    if field == "layout":
        return repr(LAYOUTS[value])
    if field == "precision":
        return repr(_PRECISIONS[value])
    if field in ("return_state", "log_decay"):
        return ("given" if value else "None") if field == "log_decay" else str(bool(value))
    if field.startswith("gamma"):
        return f"checksum {torch.tensor(value, dtype=torch.int64).view(torch.float64).item()!r}"
    if field == "method":
        return f"crc32 {value:#010x}"
    return str(value)


def _check_agreement(rows: Sequence[Sequence[int]], error: Optional[BaseException]) -> tuple[list[int], bool]:
    """Raise on every rank (the same message everywhere) unless all ranks validated and agree; else the
    slice lengths, in rank order, and whether the call takes the backward node (some rank's inputs
    require grad)."""
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
                             f"batch, heads, r, d, dtype, gamma (or a log_decay), layout, method, precision and "
                             f"return_state, "
                             f"only the slice length may differ")
    given = [k for k, row in enumerate(rows) if row[_FIELDS.index("initial_state")]]
    if given and given[0] != 0:   # only rank 0 reads it: one given elsewhere alone would be ignored
        raise ValueError(f"{_WHERE}: rank{_plural(given)} passed an initial_state but rank 0 did not; the initial "
                         f"state is the state before the sequence's first row, which rank 0 holds, and only rank 0 "
                         f"reads it: pass it on rank 0 (the other ranks may pass it too, or None)")
    grad = [row[_FIELDS.index("grad")] for row in rows]
    needed = [k for k, g in enumerate(grad) if g == _GRAD_NEEDED]
    off = [k for k, g in enumerate(grad) if g == _GRAD_OFF]
    if needed and off:
        raise ValueError(f"{_WHERE}: the ranks disagree on grad mode: the inputs of rank{_plural(needed)} require "
                         f"grad, but rank{_plural(off)} run{'s' if len(off) == 1 else ''} with grad mode off "
                         f"(torch.no_grad); the backward's all-gather needs every rank, so every rank must call "
                         f"with grad mode on, or every rank without gradients")
    return [row[_FIELDS.index("n")] for row in rows], bool(needed)


def _plural(ranks: Sequence[int]) -> str:
    """"s 0, 2" or " 1": the ranks after the word rank."""
    return ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks))


def slice_state(p: Problem, name: str = "auto") -> torch.Tensor:
    """The state after ``p``'s rows from its start state ``p.initial_state`` (zero when None), without
    computing any output: γ^n S₀ + Σ_t γ^(n − 1 − t) c_tᵀ v_t, float32 ``(B, H, r, d)``.

    CUDA tensors (and CPU tensors under the interpreter) run the segment-state kernels (§3.6) with
    block_based's segment rule; a ``_torch`` method, or CPU tensors otherwise, the same sum in PyTorch.
    With a per-token decay (``p.log_decay``): exp(G_n) S₀ + Σ_t exp(G_n − G_t) c_tᵀ v_t, the exponents the
    sums of a over the rows after t, in float64, as one PyTorch product.
    """
    B, H, n, r, d = p.shape
    state = torch.empty((B, H, r, d), dtype=torch.float32, device=p.v.device)
    if n == 0 or B == 0 or H == 0:
        return state.copy_(p.initial_state) if p.initial_state is not None else state.zero_()
    if p.log_decay is not None:
        after = suffix_decay(p.log_decay)                                               # (B, H, n) float64
        cc, vv = expand_heads(p.c.float(), H), expand_heads(p.v.float(), H)       # grouped heads: §1.7
        state.copy_((cc * torch.exp(after).float()[..., None]).transpose(-1, -2) @ vv)
        if p.initial_state is not None:
            total = torch.exp(after[..., :1] + p.log_decay[..., :1].double()).float()    # exp(a_0 + … + a_{n−1})
            state += total[..., None] * p.initial_state
        return state
    q = replace(p, state=state)
    if registry.torch_method(name) is None and (p.v.device.type == "cuda" or is_interpreting()):
        seg_len, split = segmenting(B * H, n, r, d, p.v.element_size(), current_family(p.v.device))
        if seg_len >= n:
            segments.final_state(q)
        else:
            segments.segment_start_states(q, seg_len // split)
        return state
    # PyTorch: float32 products, decays exp2(λ · (n − 1 − t)) from λ in float64
    t = torch.arange(n, dtype=torch.float64, device=p.v.device)
    cc, vv = expand_heads(p.c.float(), H), expand_heads(p.v.float(), H)           # grouped heads: §1.7
    if p.gamma is not None:
        lam = log2_gamma64(p.gamma)
        cc = cc * torch.exp2(lam[:, None] * (n - 1 - t)).float()[None, :, :, None]
    state.copy_(cc.transpose(-1, -2) @ vv)
    if p.initial_state is not None:
        total = 1.0 if p.gamma is None else torch.exp2(lam * n).float().view(1, H, 1, 1)
        state += total * p.initial_state
    return state


def suffix_decay(log_decay: torch.Tensor) -> torch.Tensor:
    """Σ_{s>t} a_s for every row t of ``log_decay`` ``(B, H, n)``, float64 (≤ 0): the log of the decay from
    row t to the end of the rows, summed from the end (never a difference of two long prefix sums)."""
    a = log_decay.detach().double()
    a = torch.where(a <= 0, a, float("nan"))    # a decay > 1 (a > 0) gives NaN, as the kernels do
    return a.flip(-1).cumsum(-1).flip(-1) - a


def local_pass(p: Problem, name: str = "auto") -> tuple[torch.Tensor, Callable[[Optional[torch.Tensor]], None]]:
    """A slice's two passes: its local state now, its output later (docs/design.md §11.2).

    Returns ``(state, output_pass)``: ``state`` as :func:`slice_state` gives it (from ``p.initial_state``),
    and ``output_pass(start)``, which fills ``p.out`` with the slice's output from the start state
    ``start`` (float32 ``(B, H, r, d)``, or None for zero) by ``name``.  Where ``name`` resolves to
    ``block_based`` over several segments of the slice (on CUDA, or under the interpreter), the state
    pass is the segments' local states (every segment's, the last's included) summed, and the output
    pass walks the segments from those, so c and v are read twice in all, as in one call of the
    method, not three times; ``output_pass`` then runs once (the scan of many segments rewrites the
    local states in place).  Otherwise the state is :func:`slice_state`'s and the output pass is the
    method's own call.
    """
    B, H, n, r, d = p.shape
    plain = replace(p, state=None, memo=None)
    segmented = (n > 0 and B * H > 0 and r <= WALK_MAX_R and registry.torch_method(name) is None
                 and registry.user_method(name) is None and (p.v.device.type == "cuda" or is_interpreting()))
    if segmented:
        plan = resolve(plain, name)
        segmented = plan.method == "block_based" and plan.schedule["seg_len"] < n
    if not segmented:
        return slice_state(p, name), lambda start: run_problem(replace(plain, initial_state=start), name)
    # the state kernel as slice_state runs it (its own tuning: here it is a pass of its own over every segment,
    # not the plan's first stage), the walk with the plan's configs
    piece = state_pieces(plan.schedule, n)[0]
    ws = segments.segment_local_states(replace(plain, initial_state=None), piece, None, last=True)
    return (_sum_segments(ws, piece, n, p.gamma, p.initial_state),
            lambda start: walk_segments(replace(plain, initial_state=start), plan, ws))


def _sum_segments(ws: torch.Tensor, seg_len: int, n: int, gamma: Optional[torch.Tensor],
                  initial_state: Optional[torch.Tensor]) -> torch.Tensor:
    """γ^n S₀ + Σ_s γ^(n − e_s) ws[s], e_s = min((s + 1)·seg_len, n): the state after n rows from the
    segments' local states ``ws`` (``(B, H, NS, r, d)`` float32); every factor exp2(λ · distance),
    distance ≥ 0."""
    ns = ws.shape[2]
    ends = torch.arange(1, ns + 1, dtype=torch.float64, device=ws.device).mul_(seg_len).clamp_(max=n)
    if gamma is None:
        state = ws.sum(dim=2)
        return state if initial_state is None else state.add_(initial_state)
    lam = log2_gamma64(gamma, ws.device)                                              # [H]
    weights = torch.exp2(lam[:, None] * (n - ends)[None, :]).float()                  # [H, NS]
    state = torch.einsum("hs,bhsrd->bhrd", weights, ws)
    if initial_state is not None:
        state += torch.exp2(lam * n).float().view(1, -1, 1, 1) * initial_state
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
    distance = _host_to(ends[-1] - ends, states.device)                           # ≥ 0
    if gamma is None:
        weights = torch.ones(upto, states.shape[2], dtype=torch.float32, device=states.device)
    else:
        lam = log2_gamma64(gamma, states.device)
        weights = torch.exp2(distance[:, None] * lam[None, :]).float()            # [upto, H]
    return torch.einsum("jh,jbhrd->bhrd", weights, states[:upto])


def combine_state_grads(start_grads: torch.Tensor, lengths: Sequence[int], gamma: Optional[torch.Tensor],
                        after: int, final_grads: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The gradient of slice ``after``'s end state: Σ_{k>after} γ^(s_k − s_{after+1}) dS_start(k), plus
    γ^(N − s_{after+1}) Σ_k dS_final(k) with ``final_grads``; float32 ``(B, H, r, d)``.

    The reverse of :func:`combine_states` (docs/design.md §11.4): slice ``after``'s end state is the
    start state of every later slice, decayed, and part of the final state.

    Args:
        start_grads: float32 ``(slices, B, H, r, d)``: the gradient of each slice's start state from its
            own output alone.
        lengths: rows per slice (Python ints), so s_k = Σ_{i<k} lengths[i] and N = Σ lengths.
        gamma: ``(H,)`` γ per head, or None (no decay).
        after: 0 … slices − 1.
        final_grads: float32 ``(slices, B, H, r, d)``: the final state's gradient on each rank (their
            sum is the final state's gradient), or None.

    Every factor is exp2(λ · distance) with distance = s_k − s_{after+1} ≥ 0 (docs/design.md §2.1).
    """
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    end = bounds[after + 1]
    grads, distance = list(start_grads[after + 1:]), [bounds[k] - end for k in range(after + 1, len(lengths))]
    if final_grads is not None:   # the final state: a start state at N, its gradient summed over the ranks
        grads.append(final_grads.sum(0))
        distance.append(bounds[-1] - end)
    if not grads:
        return torch.zeros_like(start_grads[0])
    grads = torch.stack(grads)
    if gamma is None:
        return grads.sum(0)
    lam = log2_gamma64(gamma, grads.device)
    dist = _host_to(torch.tensor(distance, dtype=torch.float64), grads.device)               # ≥ 0
    weights = torch.exp2(dist[:, None] * lam[None, :]).float()                                 # [later, H]
    return torch.einsum("kh,kbhrd->bhrd", weights, grads)


# --------------------------------------------------------------------------- under torch.compile (§11.7)

@ops.custom_op("leettriton::slice_state", mutates_args=())
def _slice_state_op(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, gamma: Optional[torch.Tensor],
                    gamma_value: Optional[float], initial_state: Optional[torch.Tensor], method: str, layout: str,
                    precision: Optional[str], log_decay: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`slice_state` as a registered operator: the state after this rank's rows, float32 (B, H, r, d)."""
    g = gamma if gamma is not None else gamma_value
    with torch.no_grad(), ops.guarded(v):
        name, p, _ = _local_problem(b, c, v, g, method, layout, initial_state, False, precision, log_decay)
        return slice_state(p, name)


@_slice_state_op.register_fake
def _slice_state_fake(b, c, v, gamma, gamma_value, initial_state, method, layout, precision, log_decay=None):
    # a fake tensor has no values to check, whatever its device
    with torch.no_grad(), device_guards_only():
        _, p, _ = _local_problem(b, c, v, gamma if gamma is not None else gamma_value, method, layout, initial_state,
                                 False, precision, log_decay)
    B, H, _, r, d = p.shape
    return torch.empty((B, H, r, d), dtype=torch.float32, device=v.device)


def _slice_state_setup(ctx, inputs, output) -> None:
    b, c, v, gamma, gamma_value, initial_state, method, layout, precision = inputs[:9]
    log_decay = inputs[9] if len(inputs) > 9 else None
    ctx.layout, ctx.gamma_value = layout, gamma_value
    ctx.has_initial = initial_state is not None
    ctx.save_for_backward(c, v, gamma, initial_state, log_decay)


def _slice_state_backward(ctx, grad):
    """dc_t = w_t v_t dSᵀ, dv_t = w_t c_t dS, dS₀ = w_{−1} dS with w_t = γ^(n − 1 − t) = exp2(λ (n − 1 − t)):
    the derivative of S = w_{−1} S₀ + Σ_t w_t c_tᵀ v_t (b does not enter the state).  With a per-token decay
    w_t = exp(Σ_{s>t} a_s), w_{−1} = exp(Σ_s a_s), and da_s = Σ_{t<s} w_t ⟨dS, c_tᵀ v_t⟩ + w_{−1} ⟨dS, S₀⟩.
    PyTorch products in float32, decays from float64 exponents."""
    c, v, gamma, s0, log_decay = ctx.saved_tensors
    to_bhnd = (lambda x: x) if ctx.layout == "bhnd" else (lambda x: x.transpose(1, 2))
    H = grad.shape[1]
    # grouped heads (§1.7): per output head here, each shared tensor's gradient summed over its group below
    cc, vv = expand_heads(to_bhnd(c).float(), H), expand_heads(to_bhnd(v).float(), H)
    n = vv.shape[2]
    lam = _lambda(gamma, ctx.gamma_value, H, vv.device)
    dc = vv @ grad.transpose(-1, -2)
    dv = cc @ grad
    ds0 = da = None
    if log_decay is not None:
        a = log_decay if ctx.layout == "bhnd" else log_decay.transpose(1, 2)          # (B, H, n)
        after = suffix_decay(a)
        w = torch.exp(after).float()
        q = w * (dc * cc).sum(-1)                                                  # w_t ⟨dS, c_tᵀ v_t⟩
        dc, dv = dc * w[..., None], dv * w[..., None]
        da = q.cumsum(-1) - q
        if ctx.has_initial:
            w0 = torch.exp(after[..., :1] + a[..., :1].detach().double()).float()        # (B, H, 1)
            ds0 = w0[..., None] * grad
            da = da + w0 * (grad * s0.float()).sum((-2, -1))[..., None]
        da = (da if ctx.layout == "bhnd" else da.transpose(1, 2)).to(log_decay.dtype)
    elif lam is not None:
        w = torch.exp2(lam[:, None] * (n - 1 - torch.arange(n, dtype=torch.float64, device=vv.device))).float()
        dc, dv = dc * w[None, :, :, None], dv * w[None, :, :, None]
        if ctx.has_initial:
            ds0 = torch.exp2(lam * n).float().view(1, H, 1, 1) * grad
    elif ctx.has_initial:
        ds0 = grad.clone()
    back = (lambda x: x) if ctx.layout == "bhnd" else (lambda x: x.transpose(1, 2))
    dc, dv = back(group_sum(dc, to_bhnd(c), "bhnd")), back(group_sum(dv, to_bhnd(v), "bhnd"))
    return None, dc.to(c.dtype), dv.to(v.dtype), None, None, ds0, None, None, None, da


_slice_state_op.register_autograd(_slice_state_backward, setup_context=_slice_state_setup)


def _lambda(gamma: Optional[torch.Tensor], gamma_value: Optional[float], heads: int,
            device: torch.device) -> Optional[torch.Tensor]:
    """λ = log2 γ per head in float64 (NaN for a γ outside (0, 1]), or None without a decay."""
    if gamma is not None:
        return log2_gamma64(gamma.reshape(-1), device)
    if gamma_value is not None:
        return log2_gamma64(torch.full((heads,), gamma_value, dtype=torch.float64, device=device))
    return None


def start_weights(lengths: torch.Tensor, lam: Optional[torch.Tensor], upto: int) -> torch.Tensor:
    """The factors γ^(s_upto − s_{j+1}) of :func:`combine_states`, float32 ``(upto, H)``, from the slices'
    lengths as a float64 tensor (``(slices,)``, on the states' device): the traced path's form, which reads no
    length on the host.  Every factor exp2(λ · distance) with distance ≥ 0 (docs/design.md §2.1)."""
    ends = lengths[:upto].cumsum(0)                                        # s_{j+1}, j < upto
    distance = ends[-1] - ends
    if lam is None:
        return torch.ones_like(distance, dtype=torch.float32)[:, None]
    return torch.exp2(distance[:, None] * lam[None, :]).float()


def _gather(fc, x: torch.Tensor, group, grad: bool) -> torch.Tensor:
    """All ranks' ``x`` stacked on a new first dimension, by torch's functional collectives (which the compiler
    traces); ``grad``: the autograd form, whose backward sums each rank's share over the ranks (a
    reduce-scatter): the gradient of the sum of all ranks' losses, as in the eager path (§11.4)."""
    x = x.unsqueeze(0).contiguous()
    if grad:
        gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
        return gather(x, gather_dim=0, group=group)
    return fc.all_gather_tensor(x, gather_dim=0, group=group)


def _composed(dist, group, rank: int, world: int, b, c, v, gamma, method, layout, initial_state, return_state,
              precision, log_decay=None):
    """The sequence-parallel call composed of operators and torch's functional collectives
    (docs/sequence-parallel.md §11.7), the form ``torch.compile`` traces and the one a per-token decay takes:
    the state pass as the registered operator ``leettriton::slice_state``, one all-gather of the local states
    (with autograd), one of the slices' lengths (or, with ``log_decay``, of each slice's summed decay, with
    autograd), the start and final states as PyTorch products of those, and the output pass as
    :func:`leettriton.linear_attention` from the start state (its own operator and backward).  The ranks'
    agreement (§11.5) is not checked here: an eager caller checks it first; a trace cannot hold its host read."""
    import torch.distributed._functional_collectives as fc  # noqa: PLC0415  (loaded on use)

    if group is None:
        group = dist.group.WORLD
    axis = 1 if layout == "bhnd" else 2
    heads = max(b.shape[axis], v.shape[axis])                           # the output's heads (grouped: §1.7)
    n = v.shape[2] if layout == "bhnd" else v.shape[1]
    g_t, g_f = ops.split_gamma(gamma, heads, v.device)
    if g_t is not None and g_t.requires_grad:
        raise NotImplementedError(f"{_WHERE}: a gamma that requires grad is not supported across ranks")
    s0 = initial_state if rank == 0 else None
    local = _slice_state_op(b, c, v, g_t, g_f, s0, method, layout, precision, log_decay)
    grad = torch.is_grad_enabled()
    states = _gather(fc, local, group, grad)                               # (world, B, H, r, d)
    if log_decay is None:
        lengths = _gather(fc, torch.full((), n, dtype=torch.float64, device=v.device), group, False)
        lam = _lambda(g_t, g_f, heads, v.device)

        def combine(upto: int) -> torch.Tensor:
            return torch.einsum("jh,jbhrd->bhrd", start_weights(lengths, lam, upto), states[:upto])
    else:
        a = log_decay if layout == "bhnd" else log_decay.transpose(1, 2)    # (B, H, n)
        totals = _gather(fc, a.double().sum(-1), group, grad)              # (world, B, H): each slice's Σ a

        def combine(upto: int) -> torch.Tensor:
            return torch.einsum("jbh,jbhrd->bhrd", slice_weights(totals, upto), states[:upto])
    start = s0
    if rank > 0:
        start = combine(rank)
    out = _single_device(b, c, v, gamma, method=method, layout=layout, initial_state=start, precision=precision,
                         log_decay=log_decay)
    if not return_state:
        return out
    return out, combine(world)


def slice_weights(totals: torch.Tensor, upto: int) -> torch.Tensor:
    """The factors exp(Σ_{s=j+1}^{upto−1} T_s), float32 ``(upto, B, H)``, of the local states S_j (j < upto) in
    the start state of slice ``upto``, from each slice's summed per-token decay T (float64 ``(slices, B, H)``):
    the sums taken from slice ``upto − 1`` back, never as a difference of two long prefix sums; a T > 0 (a
    decay above 1) gives NaN, as the kernels do."""
    t = totals[:upto]
    t = torch.where(t <= 0, t, torch.full_like(t, float("nan")))
    return torch.exp(t.flip(0).cumsum(0).flip(0) - t).float()
