"""leettriton.distributed: one sequence cut across 2 and 3 gloo processes, against the float64 oracle.

Each world size is spawned once (torch.multiprocessing, a file store in a temporary folder, a 60 s
collective timeout so that a hang fails); its workers run every case below and save what each rank
returned or raised (outputs, states, and the gradients of each rank's slice after a backward on every
rank), and the named tests judge those files.  Every rank builds the whole sequence from
the case's seed and passes its own rows; every output the package allocates is NaN-poisoned in the
workers as in conftest.py.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import time
from dataclasses import dataclass, field

import pytest
import torch
import torch.multiprocessing as mp

import leettriton
import leettriton.distributed
import leettriton.problem
from leettriton.reference import reference, tolerance

from helpers import assert_close

WORLDS = (2, 3)
SPAWN_TIMEOUT_S = 240


@dataclass(frozen=True)
class SPCase:
    """One sequence-parallel call: rows per rank for each world size, and the call's options."""

    name: str
    lengths: dict                       # world size -> rows per rank
    method: str = "lightning_attention_torch"
    dtype: torch.dtype = torch.float32
    layout: str = "bhnd"
    gamma: object = None                # None, a float, or a tuple (one γ per head, as a tensor)
    initial: bool = False
    return_state: bool = True
    B: int = 2
    H: int = 2
    r: int = 5
    d: int = 7
    seed: int = 0

    def n(self, world: int) -> int:
        return sum(self.lengths[world])

    def inputs(self, world: int):
        """The whole sequence: b, c, v in the case's layout, γ, the initial state (or None)."""
        g = torch.Generator().manual_seed(self.seed)
        n = self.n(world)
        b, c, v = (torch.randn(self.B, self.H, n, w, generator=g) for w in (self.r, self.r, self.d))
        s0 = torch.randn(self.B, self.H, self.r, self.d, generator=g) if self.initial else None
        if self.layout == "bnhd":
            b, c, v = (x.transpose(1, 2).contiguous() for x in (b, c, v))
        gamma = torch.tensor(self.gamma) if isinstance(self.gamma, tuple) else self.gamma
        return b.to(self.dtype), c.to(self.dtype), v.to(self.dtype), gamma, s0

    def rows(self, world: int, rank: int) -> slice:
        start = sum(self.lengths[world][:rank])
        return slice(start, start + self.lengths[world][rank])


def _take(x: torch.Tensor, rows: slice, layout: str) -> torch.Tensor:
    return x[:, :, rows] if layout == "bhnd" else x[:, rows]


CASES = [
    SPCase("decay-initial-uneven", {2: (11, 4), 3: (5, 0, 12)}, gamma=0.7, initial=True),
    SPCase("no-decay-initial-first-empty-bnhd", {2: (0, 9), 3: (0, 7, 3)}, method="causal_dot_product_torch",
           layout="bnhd", initial=True, return_state=False),
    SPCase("gamma-tensor-bfloat16", {2: (6, 6), 3: (3, 4, 5)}, method="block_based_torch", dtype=torch.bfloat16,
           gamma=(0.5, 1.0), seed=1),
    SPCase("float16-last-empty", {2: (13, 0), 3: (6, 7, 0)}, method="vanilla_torch", dtype=torch.float16,
           gamma=0.95, initial=True, seed=2),
    SPCase("all-empty", {2: (0, 0), 3: (0, 0, 0)}, gamma=0.9, initial=True),
    # the Triton kernels under the interpreter; a slice over 40 rows takes the multi-segment state pass
    SPCase("triton-lightning-attention", {2: (45, 13), 3: (7, 0, 44)}, method="lightning_attention",
           gamma=0.8, initial=True, B=1, r=8, d=8, seed=3),
    SPCase("triton-block-based-bnhd-no-decay", {2: (20, 9), 3: (9, 11, 9)}, method="block_based",
           layout="bnhd", B=1, r=8, d=8, seed=4),
    # slices of 2-3 segments (the walk sums its start states) and of 4-5 (the scan kernel): the output pass
    # walks from the state pass's segment states (distributed.local_pass)
    SPCase("triton-block-based-shared-segments", {2: (85, 170), 3: (170, 0, 85)}, method="block_based",
           gamma=(0.7, 0.999), initial=True, B=1, r=8, d=8, seed=5),
]


@dataclass(frozen=True)
class BadCase:
    """Ranks that disagree (or one rank whose arguments are invalid): every rank must raise.

    ``errors`` maps a rank to its expected exception type (default ValueError); ``says`` must appear in
    the message of every rank that does not raise an error of its own."""

    name: str
    says: str
    errors: dict = field(default_factory=dict)


BAD_CASES = [BadCase("heads", "disagree on heads"), BadCase("r", "disagree on r"),
             BadCase("dtype", "disagree on dtype"), BadCase("gamma", "disagree on gamma"),
             BadCase("layout", "disagree on layout"), BadCase("method", "disagree on method"),
             BadCase("invalid-v", "rejected its arguments"),
             BadCase("gamma-requires-grad", "rejected its arguments", {1: NotImplementedError}),
             BadCase("grad-mode", "disagree on grad mode")]


def _bad_call(case: BadCase, rank: int, world: int):
    """The call of ``case`` on ``rank``: the last rank (or rank 1) differs from the others."""
    odd = rank == world - 1
    H = 3 if case.name == "heads" and odd else 2
    r = 6 if case.name == "r" and odd else 5
    dtype = torch.bfloat16 if case.name == "dtype" and odd else torch.float32
    b, c, v = (torch.randn(1, H, 4, w, dtype=dtype) for w in (r, r, 7))
    kwargs = dict(gamma=0.8 if case.name == "gamma" and odd else 0.9,
                  method="vanilla_torch" if case.name == "method" and odd else "lightning_attention_torch")
    if case.name == "layout" and odd:
        b, c, v = (x.transpose(1, 2) for x in (b, c, v))
        kwargs["layout"] = "bnhd"
    if case.name == "invalid-v" and odd:
        v = v[0]
    if case.name == "gamma-requires-grad" and rank == 1:
        kwargs["gamma"] = torch.full((H,), 0.9, requires_grad=True)
    if case.name == "grad-mode" and rank == 1:   # rank 1 needs gradients, the others run under no_grad
        b.requires_grad_(True)
    return b, c, v, kwargs


def _bad_grad_mode(case: BadCase, rank: int) -> bool:
    return not (case.name == "grad-mode" and rank != 1)


@dataclass(frozen=True)
class GradCase(SPCase):
    """A training step across the ranks: each rank's loss Σ W_o ⊙ o_k (its rows of one weight tensor of the
    whole sequence, in the inputs' dtype, so exact) + Σ W_S(k) ⊙ S (a float32 weight of its own on each rank:
    the final state's gradients add up over the ranks), then a backward on every rank.

    ``needs``: the inputs that require grad (b, c, v, s: the initial state, passed on every rank);
    ``grad_ranks``: the ranks whose inputs require grad (None: all); ``pieces``: consecutive calls over
    consecutive sequences of ``lengths`` rows each, the state of one passed as the next one's initial state
    on every rank (so the initial state's gradient of the next call reaches the state of the previous);
    ``last_rank_loss_only``: the other ranks have no loss and run ``torch.autograd.backward(o_k, 0)``."""

    out_loss: bool = True
    state_loss: bool = True
    needs: str = "bcvs"
    grad_ranks: object = None
    pieces: int = 1
    last_rank_loss_only: bool = False

    def n(self, world: int) -> int:
        return self.pieces * sum(self.lengths[world])

    def piece_rows(self, world: int, rank: int, piece: int) -> slice:
        rows, shift = self.rows(world, rank), piece * sum(self.lengths[world])
        return slice(rows.start + shift, rows.stop + shift)

    def weights(self, world: int):
        """The loss's weights: of the whole output (inputs' dtype), and of the final state on each rank (float32);
        zero where a rank has no loss."""
        g = torch.Generator().manual_seed(self.seed + 1000)
        b, _, v, _, _ = self.inputs(world)
        w_out = torch.randn(v.shape, generator=g).to(self.dtype)
        w_states = [torch.randn(self.B, self.H, self.r, self.d, generator=g) for _ in range(world)]
        for rank in range(world):
            if not self.has_loss(rank, world):
                w_states[rank].zero_()
                for piece in range(self.pieces):
                    _take(w_out, self.piece_rows(world, rank, piece), self.layout).zero_()
        return w_out, w_states

    def requires_grad(self, rank: int, key: str) -> bool:
        return key in self.needs and (self.grad_ranks is None or rank in self.grad_ranks)

    def has_loss(self, rank: int, world: int) -> bool:
        return not self.last_rank_loss_only or rank == world - 1


GRAD_CASES = [
    GradCase("grad-decay-initial-uneven", {2: (11, 4), 3: (5, 0, 12)}, gamma=0.7, initial=True),
    GradCase("grad-no-decay-first-empty-bnhd-output-loss", {2: (0, 9), 3: (0, 7, 3)},
             method="causal_dot_product_torch", layout="bnhd", initial=True, return_state=False, state_loss=False),
    GradCase("grad-gamma-tensor-bfloat16-state-loss-only", {2: (6, 6), 3: (3, 4, 5)}, method="block_based_torch",
             dtype=torch.bfloat16, gamma=(0.5, 1.0), out_loss=False, seed=1),
    GradCase("grad-float16-last-empty-state-unused", {2: (13, 0), 3: (6, 7, 0)}, method="vanilla_torch",
             dtype=torch.float16, gamma=0.95, initial=True, state_loss=False, seed=2),
    GradCase("grad-all-empty", {2: (0, 0), 3: (0, 0, 0)}, gamma=0.9, initial=True),
    # the later ranks' inputs need no gradient, yet their outputs' losses reach rank 0's c, v, S₀
    GradCase("grad-first-rank-only", {2: (7, 9), 3: (4, 6, 5)}, gamma=(0.9, 0.6), initial=True, grad_ranks=(0,),
             seed=3),
    # only the last rank has a loss: the others' gradients all come through the reverse scan
    GradCase("grad-last-rank-loss-only", {2: (8, 5), 3: (6, 3, 4)}, gamma=0.9, layout="bnhd", initial=True,
             last_rank_loss_only=True, seed=6),
    GradCase("grad-c-v-only-two-pieces", {2: (5, 6), 3: (2, 5, 4)}, gamma=0.8, initial=True, needs="cvs",
             pieces=2, seed=4),
    GradCase("grad-triton-lightning-attention", {2: (20, 13), 3: (7, 0, 26)}, method="lightning_attention",
             gamma=0.8, initial=True, B=1, r=8, d=8, seed=5),
]


def _grad_step(case: GradCase, rank: int, world: int):
    """This rank's share of ``case``'s training step: whether its output requires grad, and the gradients of
    its leaves (per input, one per piece)."""
    b, c, v, gamma, s0 = case.inputs(world)
    w_out, w_states = case.weights(world)
    leaves: dict = {}

    def leaf(key, x):
        x = x.clone().requires_grad_(case.requires_grad(rank, key))
        leaves.setdefault(key, []).append(x)
        return x

    state = None if s0 is None else leaf("s", s0)
    loss = torch.zeros(())
    for piece in range(case.pieces):
        rows = case.piece_rows(world, rank, piece)
        b_k, c_k, v_k = (leaf(key, _take(x, rows, case.layout)) for key, x in zip("bcv", (b, c, v)))
        return_state = case.return_state or case.state_loss or piece < case.pieces - 1
        res = leettriton.distributed.linear_attention(b_k, c_k, v_k, gamma, method=case.method, layout=case.layout,
                                                      initial_state=state, return_state=return_state)
        out, state = res if return_state else (res, None)
        if case.out_loss:
            loss = loss + (out.float() * _take(w_out, rows, case.layout).float()).sum()
    if case.state_loss:
        loss = loss + (state * w_states[rank]).sum()
    if case.has_loss(rank, world):
        loss.backward()
    else:   # a rank without a loss of its own still joins the backward
        torch.autograd.backward(out, torch.zeros_like(out))
    return out.requires_grad, {key: [x.grad for x in xs] for key, xs in leaves.items()}


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    real = leettriton.problem.new_empty
    leettriton.problem.new_empty = lambda shape, dtype, device: real(shape, dtype, device).fill_(float("nan"))
    real_like = leettriton.problem.new_like
    leettriton.problem.new_like = lambda template: real_like(template).fill_(float("nan"))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    for case in CASES:
        b, c, v, gamma, s0 = case.inputs(world)
        rows = case.rows(world, rank)
        try:
            got = leettriton.distributed.linear_attention(
                _take(b, rows, case.layout), _take(c, rows, case.layout), _take(v, rows, case.layout), gamma,
                method=case.method, layout=case.layout, initial_state=s0, return_state=case.return_state)
            results[case.name] = ("ok", got)
        except Exception as exc:  # recorded for the test to report
            results[case.name] = ("raised", type(exc).__name__, str(exc))
    for case in BAD_CASES:
        b, c, v, kwargs = _bad_call(case, rank, world)
        gamma = kwargs.pop("gamma")
        try:
            with torch.set_grad_enabled(_bad_grad_mode(case, rank)):
                leettriton.distributed.linear_attention(b, c, v, gamma, **kwargs)
            results["bad-" + case.name] = ("ok", None)
        except Exception as exc:
            results["bad-" + case.name] = ("raised", type(exc).__name__, str(exc))
    for case in GRAD_CASES:
        try:
            results[case.name] = ("ok", *_grad_step(case, rank, world))
        except Exception as exc:
            results[case.name] = ("raised", type(exc).__name__, str(exc))
    try:   # gradients of gradients: refused on every rank, before any collective
        b, c, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
        out = leettriton.distributed.linear_attention(b, c, v, 0.9, method="vanilla_torch")
        torch.autograd.grad(out.sum(), [b, c, v], create_graph=True)
        results["create-graph"] = ("ok", None)
    except Exception as exc:
        results["create-graph"] = ("raised", type(exc).__name__, str(exc))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


_RUNS: dict = {}


def run_world(world: int) -> list[dict]:
    """Every rank's results of one spawn of ``world`` gloo processes (spawned once per session)."""
    if world not in _RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            ctx = mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), tmp), nprocs=world,
                                     join=False, start_method="spawn")
            deadline = time.monotonic() + SPAWN_TIMEOUT_S
            while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    for proc in ctx.processes:
                        proc.kill()
                    pytest.fail(f"{world} gloo processes did not finish within {SPAWN_TIMEOUT_S} s (a hang?)")
            _RUNS[world] = [torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False) for k in range(world)]
    return _RUNS[world]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_rank_matches_the_oracle(world, case):
    b, c, v, gamma, s0 = case.inputs(world)
    ref, ref_state = reference(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=True)
    tol = tolerance(case.dtype)
    for rank, results in enumerate(run_world(world)):
        got = results[case.name]
        assert got[0] == "ok", f"rank {rank} raised {got[1]}: {got[2]}"
        out, state = got[1] if case.return_state else (got[1], None)
        assert out.dtype == case.dtype
        assert_close(out, _take(ref, case.rows(world, rank), case.layout), tol, f"rank {rank} of {world}: output")
        if case.return_state:
            assert state.dtype == torch.float32
            # the state gathers every token: float32 sums, judged at the inputs' tolerance
            assert_close(state, ref_state, tol, f"rank {rank} of {world}: final state")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", BAD_CASES, ids=[c.name for c in BAD_CASES])
def test_ranks_that_disagree_all_raise(world, case):
    outcomes = [results["bad-" + case.name] for results in run_world(world)]
    own = {world - 1: ValueError} if case.name == "invalid-v" else case.errors
    for rank, got in enumerate(outcomes):
        assert got[0] == "raised", f"rank {rank} of {world} returned instead of raising"
        expected = own.get(rank, ValueError)
        assert got[1] == expected.__name__, f"rank {rank} of {world} raised {got[1]}: {got[2]}"
        if rank not in own:
            assert case.says in got[2], f"rank {rank} of {world}: {got[2]}"
    assert len({got[2] for rank, got in enumerate(outcomes) if rank not in own}) == 1, "different messages"
    if case.name == "gamma-requires-grad":
        assert "gradients with respect to gamma" in outcomes[1][2]


@pytest.mark.parametrize("world", WORLDS)
def test_a_backward_with_create_graph_raises_on_every_rank(world):
    for rank, results in enumerate(run_world(world)):
        got = results["create-graph"]
        assert got[:2] == ("raised", "NotImplementedError"), f"rank {rank} of {world}: {got}"
        assert "create_graph=True" in got[2]


def oracle_gradients(case: GradCase, world: int, rows=None) -> dict:
    """The float64 oracle's gradients of the whole sequence's loss (the sum of every rank's), with respect to
    the whole b, c, v and the initial state (float32 copies of the inputs, so float32 gradients); ``rows``:
    the loss of the output on those rows only, and none on the state."""
    b, c, v, gamma, s0 = case.inputs(world)
    w_out, w_states = case.weights(world)
    leaves = {key: x.detach().float().requires_grad_(key in case.needs)
              for key, x in zip("bcvs", (b, c, v, s0)) if x is not None}
    out, state = reference(leaves["b"], leaves["c"], leaves["v"], gamma, layout=case.layout,
                           initial_state=leaves.get("s"), return_state=True)
    loss = torch.zeros((), dtype=torch.float64)
    if case.out_loss or rows is not None:
        w = w_out.double() if rows is None else torch.zeros_like(w_out.double())
        if rows is not None:
            _take(w, rows, case.layout).copy_(_take(w_out, rows, case.layout).double())
        loss = loss + (out * w).sum()
    if case.state_loss and rows is None:
        loss = loss + (state * torch.stack(w_states).sum(0).double()).sum()
    wanted = [key for key in leaves if leaves[key].requires_grad]
    if not loss.requires_grad:   # nothing of the loss depends on the inputs (an empty sequence's output)
        return {key: torch.zeros_like(leaves[key]) for key in wanted}
    grads = torch.autograd.grad(loss, [leaves[key] for key in wanted], allow_unused=True, materialize_grads=True)
    return dict(zip(wanted, grads))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_every_rank_gradients_match_the_oracle(world, case):
    """Each rank's gradients of its slices of b, c, v (every piece) and of the initial state (rank 0; zeros
    elsewhere) equal the oracle's gradients of the sum of all ranks' losses, at the dtype's tolerance."""
    want = oracle_gradients(case, world)
    tol = tolerance(case.dtype)
    for rank, results in enumerate(run_world(world)):
        got = results[case.name]
        assert got[0] == "ok", f"rank {rank} raised {got[1]}: {got[2]}"
        output_requires_grad, grads = got[1], got[2]
        assert output_requires_grad, f"rank {rank} of {world}: the output is not in the graph"
        for key in "bcvs":
            for piece, grad in enumerate(grads.get(key, [])):
                what = f"rank {rank} of {world}: d{key}" + (f" of piece {piece}" if case.pieces > 1 else "")
                if not case.requires_grad(rank, key):
                    assert grad is None, f"{what}: a gradient for an input that does not require grad"
                    continue
                if key == "s":
                    assert grad is None or grad.dtype == torch.float32
                    expected = want["s"] if rank == 0 else torch.zeros_like(want["s"])
                else:
                    assert grad is None or grad.dtype == case.dtype, f"{what}: dtype {grad.dtype}"
                    expected = _take(want[key], case.piece_rows(world, rank, piece), case.layout)
                if grad is None:   # no path from the loss to this input (b, with a loss on the state alone)
                    grad = torch.zeros_like(expected, dtype=torch.float32 if key == "s" else case.dtype)
                assert_close(grad, expected, tol, what)


@pytest.mark.parametrize("world", WORLDS)
def test_the_gradient_cases_need_the_reverse_scan(world):
    """Rank 0's gradients of c and v differ from those of its own output's loss alone, by far more than the
    tolerance: the cases above pass only if the later ranks' gradients reach it through the reverse scan."""
    case = GRAD_CASES[0]
    full, local = oracle_gradients(case, world), oracle_gradients(case, world, rows=case.rows(world, 0))
    for key in "cv":
        mine = _take(full[key], case.rows(world, 0), case.layout)
        with pytest.raises(AssertionError, match="relative error"):
            assert_close(_take(local[key], case.rows(world, 0), case.layout), mine, 100 * tolerance(case.dtype),
                         f"d{key}")


def test_without_a_process_group_it_is_the_single_device_call():
    case = CASES[0]
    b, c, v, gamma, s0 = case.inputs(2)
    out, state = leettriton.distributed.linear_attention(b, c, v, gamma, method=case.method, initial_state=s0,
                                                         return_state=True)
    ref, ref_state = reference(b, c, v, gamma, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(case.dtype), "output")
    assert_close(state, ref_state, tolerance(case.dtype), "state")
    with pytest.raises(ValueError, match="not initialised"):
        leettriton.distributed.linear_attention(b, c, v, gamma, group=object())


@pytest.mark.parametrize("method", ["lightning_attention_torch", "block_based"])
def test_simulated_slices_match_the_oracle(method):
    case = SPCase("simulate", {4: (45, 0, 3, 17)}, method=method, gamma=(0.6, 0.99), initial=True, B=1)
    b, c, v, gamma, s0 = case.inputs(4)
    out, state = leettriton.distributed.simulate(b, c, v, gamma, lengths=case.lengths[4], method=method,
                                                 initial_state=s0, return_state=True)
    ref, ref_state = reference(b, c, v, gamma, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(torch.float32), "output")
    assert_close(state, ref_state, tolerance(torch.float32), "state")
    with pytest.raises(ValueError, match="add up to n = 65"):
        leettriton.distributed.simulate(b, c, v, gamma, lengths=[1, 2])


@pytest.mark.parametrize("lengths", [(85, 0, 170, 41), (120, 121, 39, 1)], ids=["prefix-and-scan", "three-segments"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_output_pass_walks_from_the_state_pass_segments(monkeypatch, lengths, dtype):
    """Slices of several segments (40 rows each under the interpreter): the state pass computes every
    segment's local state once, and the output pass makes no segment-state pass of its own."""
    import leettriton.methods.block_based.kernels as block_based
    from leettriton.kernels import segments
    from leettriton.autotune.families import is_interpreting

    state_passes = {"local_pass": 0, "output pass": 0}

    def counted(where, fn):
        def wrapper(*args, **kwargs):
            state_passes[where] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(segments, "segment_local_states", counted("local_pass", segments.segment_local_states))
    monkeypatch.setattr(block_based, "segment_local_states", counted("output pass", block_based.segment_local_states))
    case = SPCase("shared", {4: lengths}, method="block_based", dtype=dtype, gamma=(0.6, 0.99), initial=True,
                  B=2, r=8, d=8, seed=6)
    b, c, v, gamma, s0 = case.inputs(4)
    out, state = leettriton.distributed.simulate(b, c, v, gamma, lengths=lengths, method="block_based",
                                                 initial_state=s0, return_state=True)
    ref, ref_state = reference(b, c, v, gamma, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(dtype), "output")
    assert_close(state, ref_state, tolerance(dtype), "state")
    # the slices cut into segments: under the interpreter those past 40 rows; CPU tensors outside it (a machine
    # with a GPU) run block_based's PyTorch twin, which shares nothing
    segmented = sum(n > 40 for n in lengths) if is_interpreting() else 0
    assert state_passes == {"local_pass": segmented, "output pass": 0}, state_passes


def test_importing_leettriton_does_not_import_the_distributed_module():
    import subprocess
    import sys
    code = "import sys, leettriton; print('leettriton.distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_submodule_is_reached_as_an_attribute_of_the_package():
    import subprocess
    import sys
    code = "import leettriton; print(leettriton.distributed.linear_attention.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "leettriton.distributed"


def _critical_path_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One forward and backward with the passes, collectives and host reads recorded in order."""
    import traceback

    import torch.distributed as dist

    sp = leettriton.distributed
    log = []

    def recorded(what, fn, on_return=False):
        def wrapper(*args, **kwargs):
            if not on_return:
                log.append(what)
            result = fn(*args, **kwargs)
            if on_return:
                log.append(what)
            return result
        return wrapper

    def host_read(name):
        real = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            log.append(("host read", name, "".join(traceback.format_stack(limit=4)[:-1])))
            return real(self, *args, **kwargs)
        return wrapper

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    case = SPCase("critical-path", {2: (23, 17)}, gamma=0.8, initial=True, B=1, r=4, d=6, seed=7)
    b, c, v, gamma, s0 = case.inputs(world)
    rows = case.rows(world, rank)
    leaves = [x[:, :, rows].clone().requires_grad_() for x in (b, c, v)]
    sp.local_pass = recorded("state pass", sp.local_pass)
    sp._read_rows = recorded("metadata read", sp._read_rows, on_return=True)   # its own read comes before
    dist.all_gather = recorded("all-gather", dist.all_gather)
    for name in ("tolist", "item", "cpu", "numpy"):
        setattr(torch.Tensor, name, host_read(name))
    out, state = sp.linear_attention(*leaves, gamma, method=case.method, initial_state=s0, return_state=True)
    log.append("returned")
    (out.sum() + state.sum() * (rank == 0)).backward()
    log.append("backward done")
    torch.save({"log": log, "out": out.detach(), "state": state.detach(), "grads": [x.grad for x in leaves]},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_no_host_read_between_the_metadata_check_and_the_results():
    """The one host read of a call is the metadata's, made after the state pass is queued; from there to the
    output pass and through the backward nothing is read back to the host (docs/design.md §11.3), and the
    instrumented call still gives the oracle's results."""
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_critical_path_worker, args=(world, os.path.join(tmp, "store"), tmp),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail(f"{world} gloo processes did not finish within {SPAWN_TIMEOUT_S} s (a hang?)")
        got = [torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False) for k in range(world)]
    case = SPCase("critical-path", {2: (23, 17)}, gamma=0.8, initial=True, B=1, r=4, d=6, seed=7)
    b, c, v, gamma, s0 = case.inputs(world)
    leaves = [x.detach().float().requires_grad_() for x in (b, c, v)]
    ref, ref_state = reference(*leaves, gamma, initial_state=s0, return_state=True)
    (ref.sum() + ref_state.sum()).backward()
    for rank, res in enumerate(got):
        log = res["log"]
        assert log.index("state pass") < log.index("metadata read"), log
        assert log.count("metadata read") == 1, log
        assert [e for e in log if isinstance(e, str)] == ["all-gather", "state pass", "metadata read", "all-gather",
                                                          "returned", "all-gather", "backward done"], log
        after = log[log.index("metadata read") + 1:]
        assert not [e for e in after if isinstance(e, tuple)], [e[1:] for e in after if isinstance(e, tuple)]
        rows = case.rows(world, rank)
        assert_close(res["out"], ref[:, :, rows], tolerance(torch.float32), f"rank {rank} output")
        assert_close(res["state"], ref_state, tolerance(torch.float32), f"rank {rank} state")
        for name, g, leaf in zip("bcv", res["grads"], leaves):
            assert_close(g, leaf.grad[:, :, rows], tolerance(torch.float32), f"rank {rank} d{name}")
