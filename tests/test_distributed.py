"""leettriton.distributed: one sequence cut across 2 and 3 gloo processes, against the float64 oracle.

Each world size is spawned once (torch.multiprocessing, a file store in a temporary folder, a 60 s
collective timeout so that a hang fails); its workers run every case below and save what each rank
returned or raised, and the named tests judge those files.  Every rank builds the whole sequence from
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
             BadCase("grad", "rejected its arguments", {1: NotImplementedError})]


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
    if case.name == "grad" and rank == 1:
        b.requires_grad_(True)
    return b, c, v, kwargs


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    real = leettriton.problem.new_empty
    leettriton.problem.new_empty = lambda shape, dtype, device: real(shape, dtype, device).fill_(float("nan"))
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
            leettriton.distributed.linear_attention(b, c, v, gamma, **kwargs)
            results["bad-" + case.name] = ("ok", None)
        except Exception as exc:
            results["bad-" + case.name] = ("raised", type(exc).__name__, str(exc))
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
    if case.name == "grad":
        assert "not implemented" in outcomes[1][2]


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
