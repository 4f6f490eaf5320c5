"""leettriton.distributed's composed form (docs/sequence-parallel.md §11.7): a training step over 2 gloo processes
under ``torch.compile(fullgraph=True)``, and with a per-token decay (eager and compiled).

Each rank runs (compiled or not) the sequence-parallel call with its loss (its rows of one weight tensor of the whole
output, and on rank 0 a weight of the final state), runs forward and backward, and saves what it got; the
test compares every rank's output rows, final state and gradients of its slice against the float64 oracle's
autograd of the whole sequence (the gradients of the sum of the ranks' losses: docs/sequence-parallel.md
§11.4, §11.7).  ``fullgraph=True`` fails the call on any graph break.  The compiler's ``aot_eager`` backend
traces forward and backward as Inductor does, without compiling C++ on the CPU.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import traceback

import pytest
import torch
import torch.multiprocessing as mp

import leettriton
from leettriton.reference import reference

from helpers import assert_close

WORLD = 2
LENGTHS = (7, 6)
B, H, R, D = 1, 2, 4, 3
PER_TOKEN = "log_decay"
CASES = {   # name: (method, layout, gamma (or PER_TOKEN), initial state, compiled, heads of b and c)
    "compiled-torch-twin-gamma-tensor-initial": ("lightning_attention_torch", "bhnd", (0.8, 0.95), True, True, H),
    "compiled-triton-bnhd-float-gamma": ("lightning_attention", "bnhd", 0.9, False, True, H),
    "per-token-eager-initial": ("causal_dot_product_torch", "bhnd", PER_TOKEN, True, False, H),
    "per-token-compiled-triton-bnhd": ("causal_dot_product", "bnhd", PER_TOKEN, True, True, H),
    # b and c shared by the two heads (grouped heads, docs/semantics.md §1.7)
    "per-token-grouped-eager-triton": ("vanilla", "bhnd", PER_TOKEN, True, False, 1),
    "compiled-grouped-bnhd-gamma": ("lightning_attention_torch", "bnhd", 0.9, True, True, 1),
}


def _inputs(layout: str, gamma, initial: bool, bc_heads: int):
    g = torch.Generator().manual_seed(7)
    n = sum(LENGTHS)
    b, c = (torch.randn(B, bc_heads, n, R, generator=g) for _ in range(2))
    v = torch.randn(B, H, n, D, generator=g)
    w_out = torch.randn(B, H, n, D, generator=g)
    w_state = torch.randn(B, H, R, D, generator=g)
    s0 = torch.randn(B, H, R, D, generator=g) if initial else None
    # per-token decays from 0 to -3, and one of exactly 0 (no decay) at the slices' border
    a = -3 * torch.rand(B, H, n, generator=g)
    a[..., LENGTHS[0]] = 0
    if layout == "bnhd":
        b, c, v, w_out = (x.transpose(1, 2).contiguous() for x in (b, c, v, w_out))
        a = a.transpose(1, 2).contiguous()
    gamma = torch.tensor(gamma) if isinstance(gamma, tuple) else gamma
    if gamma == PER_TOKEN:
        return b, c, v, None, s0, w_out, w_state, a
    return b, c, v, gamma, s0, w_out, w_state, None


def _rows(x, rank: int, layout: str):
    start = sum(LENGTHS[:rank])
    rows = slice(start, start + LENGTHS[rank])
    return x[:, :, rows] if layout == "bhnd" else x[:, rows]


def _rows_3(a, rank: int, layout: str):
    """This rank's rows of a per-token decay: (B, H, n) in bhnd, (B, n, H) in bnhd."""
    start = sum(LENGTHS[:rank])
    rows = slice(start, start + LENGTHS[rank])
    return a[:, :, rows] if layout == "bhnd" else a[:, rows]


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    import leettriton.distributed

    torch._dynamo.config.cache_size_limit = 64
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        for name, (method, layout, gamma, initial, compiled, bc_heads) in CASES.items():
            b, c, v, gamma_t, s0, w_out, w_state, a = _inputs(layout, gamma, initial, bc_heads)
            mine = [_rows(x, rank, layout).clone().requires_grad_(True) for x in (b, c, v)]
            a_k = _rows_3(a, rank, layout).clone().requires_grad_(True) if a is not None else None
            s0 = s0.clone().requires_grad_(True) if s0 is not None else None

            def step(b_k, c_k, v_k, s0_k, a_k):
                o_k, state = leettriton.distributed.linear_attention(
                    b_k, c_k, v_k, gamma_t, method=method, layout=layout, initial_state=s0_k, return_state=True,
                    log_decay=a_k)
                loss = (o_k * _rows(w_out, rank, layout)).sum()
                if rank == 0:
                    loss = loss + (state * w_state).sum()
                return o_k, state, loss

            torch._dynamo.reset()
            run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
            o_k, state, loss = run(*mine, s0, a_k)
            loss.backward()
            results[name] = dict(out=o_k.detach(), state=state.detach(),
                                 grads=[x.grad for x in mine] + [s0.grad if s0 is not None else None],
                                 da=a_k.grad if a_k is not None else None)
    except Exception as exc:  # reported by the test, with its type and message
        results = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(os.path.join(tmp, "store"), tmp), nprocs=WORLD, join=True,
                           start_method="spawn")
        yield [torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False) for k in range(WORLD)]


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_training_step_matches_oracle(ranks, name):
    method, layout, gamma, initial, compiled, bc_heads = CASES[name]
    for k, got in enumerate(ranks):
        assert "error" not in got, f"rank {k}: {got.get('error')}"
    b, c, v, gamma_t, s0, w_out, w_state, a = _inputs(layout, gamma, initial, bc_heads)
    a_leaf = a.clone().requires_grad_(True) if a is not None else None
    # the oracle computes in float64 from float32 leaves (so float32 gradients)
    leaves = [x.clone().requires_grad_(True) for x in (b, c, v)]
    s0_64 = s0.clone().requires_grad_(True) if s0 is not None else None
    out, state = reference(*leaves, gamma_t, layout=layout, initial_state=s0_64, return_state=True, log_decay=a_leaf)
    (((out * w_out.double()).sum() + (state * w_state.double()).sum())).backward()
    tol = 1e-5
    for k, got in enumerate(ranks):
        res = got[name]
        assert_close(res["out"], _rows(out.detach(), k, layout), tol, f"rank {k} output")
        assert_close(res["state"], state.detach(), tol, f"rank {k} final state")
        for what, g, leaf in zip("bcv", res["grads"][:3], leaves):
            assert_close(g, _rows(leaf.grad, k, layout), tol, f"rank {k} d{what}")
        if a is not None:
            assert_close(res["da"], _rows_3(a_leaf.grad, k, layout), tol, f"rank {k} d log_decay")
        if s0 is not None:
            if k == 0:
                assert_close(res["grads"][3], s0_64.grad, tol, "rank 0 d initial_state")
            else:   # read on rank 0 only: no gradient reaches the other ranks' copy
                assert res["grads"][3] is None, f"rank {k}: initial_state got a gradient"
