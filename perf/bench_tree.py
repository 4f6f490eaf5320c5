"""Tree verification (``decode_tokens(..., parents=...)``) against running the accepted path alone.

MiniMax-Text-01's lightning layer (heads 64, r = d = 128, per-head decays), a speculative batch of 64 rows
× 4 draft tokens in a pool of 256 slots, float16 and bfloat16:

1. ``tree + commit``: the tree P = [−1, 0, 0, 1] verified with ``keep_states=True`` (the pool is not
   written), then ``serving.commit_tree`` writes each row's accepted node (token 3: the path 0 → 1 → 3)
   into its slot;
2. ``tree``: the verification alone;
3. ``chain + commit``: today's chain, ``decode_tokens(keep_states=True)`` on the 4 tokens, then
   ``serving.commit_accepted``;
4. ``accepted path alone``: ``decode_tokens`` on the path's 3 tokens, in place, no states kept: what a
   server that knew the accepted path in advance would run (the floor).

Each is timed eagerly and as a CUDA-graph replay (the GPU time alone).  The bytes each must move are
reported beside the copy bandwidth: the tree's float32 states are one root read, k + 1 node writes (and
the commit's one read and one write), the path's one read and one write.  The committed slot and the
outputs of the path's tokens are checked against float64.

    python perf/bench_tree.py             # on the GPU, well under a minute
    python perf/bench_tree.py --quick     # bfloat16 only (without a GPU: tiny shapes, eager)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench, serving  # noqa: E402

NAME = "bench_tree"
PARENTS = [-1, 0, 0, 1]
PATH = [0, 1, 3]     # the accepted path (its last node: 3)


def path_reference(b, c, v, root, gamma):
    """The accepted path's outputs (B, H, len(PATH), d) and final state in float64."""
    s = root.double()
    outs = []
    for t in PATH:
        s = gamma.double().view(1, -1, 1, 1) * s + c[:, :, t].double().unsqueeze(-1) * v[:, :, t].double().unsqueeze(-2)
        outs.append(torch.einsum("bhr,bhrd->bhd", b[:, :, t].double(), s))
    return torch.stack(outs, dim=2), s


def rel(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def run(rep: common.Report, dtypes, batch, heads, r, d, slots, rep_ms) -> None:
    device = rep.device
    cuda = torch.device(device).type == "cuda"
    K = len(PARENTS)
    body = []
    state_bytes = batch * heads * r * d * 4
    for dt in dtypes:
        b, c, v = bench.make_inputs(batch, heads, K, r, d, dt, device, seed=1)
        gamma = bench.decay_gammas(heads, device)
        gen = torch.Generator(device=device).manual_seed(2)
        pool0 = torch.randn(slots, heads, r, d, generator=gen, device=device)
        pool = pool0.clone()
        slot_ids = torch.randperm(slots, generator=gen, device=device)[:batch]
        parents = torch.tensor([PARENTS] * batch, device=device)
        chain = torch.tensor([list(range(-1, K - 1))] * batch, device=device)
        leaf = torch.full((batch,), PATH[-1], device=device)
        counts = torch.full((batch,), K, device=device)
        idx = torch.tensor(PATH, device=device)
        pb, pc, pv = (x.index_select(2, idx).contiguous() for x in (b, c, v))   # the path's tokens

        def tree_commit():
            o, _, kept = leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=slot_ids, keep_states=True,
                                                  parents=parents, check_slots=False)
            serving.commit_tree(pool, slot_ids, kept, leaf)
            return o

        def tree():
            return leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=slot_ids, keep_states=True,
                                            parents=parents, check_slots=False)[0]

        def chain_commit():
            o, _, kept = leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=slot_ids, keep_states=True,
                                                  check_slots=False)
            serving.commit_accepted(pool, slot_ids, kept, counts)
            return o

        def path_alone():
            return leettriton.decode_tokens(pb, pc, pv, pool, gamma, slot_ids=slot_ids, check_slots=False)[0]

        # correctness: one tree + commit from the initial pool against the path in float64
        ref_o, ref_s = path_reference(b, c, v, pool0[slot_ids], gamma)
        o = tree_commit()
        err_o = rel(o.index_select(2, idx), ref_o)
        err_s = rel(pool[slot_ids], ref_s)
        pool.copy_(pool0)
        o_path = path_alone()
        err_path = rel(o_path, ref_o)
        moved = {"tree + commit": (1 + (K + 1) + 2) * state_bytes, "tree": (1 + K + 1) * state_bytes,
                 "chain + commit": (2 + (K + 1) + 2) * state_bytes, "accepted path alone": 2 * state_bytes}
        times = {}
        for name, fn in (("tree + commit", tree_commit), ("tree", tree), ("chain + commit", chain_commit),
                         ("accepted path alone", path_alone)):
            pool.copy_(pool0)
            eager = bench.time_ms(fn, rep_ms=rep_ms)[0]
            graph = bench.time_ms(bench.graph_replay(fn), rep_ms=rep_ms, warm=False)[0] if cuda else None
            times[name] = graph if cuda else eager
            row = dict(dtype=bench.dtype_name(dt), batch=batch, heads=heads, r=r, d=d, k=K, call=name,
                       status="ok", eager_ms=eager, graph_ms=graph, state_bytes=moved[name],
                       bandwidth_frac=moved[name] / (times[name] * 1e-3) / rep.bandwidth,
                       err_outputs=err_path if name == "accepted path alone" else err_o,
                       err_committed_state=err_s if name == "tree + commit" else None)
            rep.rows.append(row)
            body.append([row["dtype"], name, f"{eager * 1e3:.1f}", "n/a" if graph is None else f"{graph * 1e3:.1f}",
                         f"{moved[name] / 2**20:.0f}", f"{row['bandwidth_frac'] * 100:.0f} %",
                         common.fmt_err(row["err_outputs"])])
        ratio = times["tree + commit"] / times["accepted path alone"]
        how = "graph" if cuda else "eager"
        rep.target(f"{bench.dtype_name(dt)}: tree verify + commit / accepted path alone ({how})", f"{ratio:.2f}×",
                   "the bytes' ratio, ≈ 4×", None)
        tol = bench.tolerance(dt)   # the outputs are rounded to the inputs' dtype; the state is float32
        rep.target(f"{bench.dtype_name(dt)}: tree + commit vs the path in float64 (outputs, committed state)",
                   f"{common.fmt_err(err_o)}, {common.fmt_err(err_s)}", f"≤ {tol:g}, ≤ 1e-5",
                   err_o <= tol and err_s <= 1e-5)
    rep.section(f"Tree verify, batch {batch} × {K} draft tokens, heads {heads}, r = d = {r}",
                ["dtype", "call", "eager µs", "graph µs", "state MiB moved", "of copy bandwidth", "path outputs err"],
                body, "The tree P = [−1, 0, 0, 1], accepted path 0 → 1 → 3; the chain keeps and commits all 4 "
                "tokens; the path alone runs its 3 tokens in place.")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(common.cli_argv(argv))
    device = common.device_of(args)
    rep = common.Report(NAME, "Tree verification against the accepted path alone", common.cli_argv(argv), device,
                        args.quick)
    dtypes = [torch.bfloat16] if args.quick else [torch.float16, torch.bfloat16]
    if torch.device(device).type == "cuda":
        run(rep, dtypes, batch=64, heads=64, r=128, d=128, slots=256, rep_ms=args.rep_ms or 100)
    else:  # tiny shapes, eager only: a check of the script's logic
        run(rep, dtypes, batch=4, heads=2, r=8, d=8, slots=9, rep_ms=args.rep_ms or 50)
    rep.finish(args.out)
    return rep


if __name__ == "__main__":
    main()
