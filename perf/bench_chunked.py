"""The chunked methods (lightning_attention, block_based) and ``auto`` against fla and lightning-attn.

1. Speed: heads 32, r = d = 128, with decay (γ per head 0.969 … 0.996) and without,
   float16 and bfloat16; batch 1 with n ∈ {2048, 8192, 32768, 100000} and batch 16 with
   n ∈ {2048, 8192, 25600}.  Peers: fla ``chunk_simple_gla`` (``g_gamma = ln γ``,
   ``scale=1.0``, ``[B, T, H, K]`` inputs converted outside the timed region) and
   lightning-attn ``lightning_attn2`` (``s = −ln γ``), measured in the same run.  Our two
   methods are autotuned at each shape (their tuned configs are cleared before it); ``auto``
   runs the heuristic file's method, configs and schedule, which the autotuner cannot choose
   (at batch 1 and long n it times each walk config under one segment rule only: docs/design.md §5.5).
   On the GPU each cell's ``auto``, fla and fastest other method of ours are then timed again in
   alternating rounds, as calls from Python and as CUDA-graph replays (the kernels alone), as
   ``perf/bench_model_shapes.py`` does (``time_in_rounds``); each entry counts with its lower time
   of the sweep and its rounds.
   Targets: the best of ours ≥ 1.5× faster than ``chunk_simple_gla`` at every shape (from Python),
   and ≤ 3× the memory floor at batch 16, n 8192, float16.
2. Precision: n = 100 000, batch 1, heads 4, r = d = 128, γ ∈ {1, 0.999, 0.9} (one γ for
   every head) against the float64 oracle (chunked): float16 ≤ 2e-3, bfloat16 ≤ 1e-2,
   float32 (precision "ieee") ≤ 1e-5, never NaN/inf — for both methods; the peers are
   shown for information (their float32 goes through TF32).

    python perf/bench_chunked.py            # on the GPU, ~2 minutes
    python perf/bench_chunked.py --quick    # fp16, with decay, three shapes, and the precision section
    python perf/bench_chunked.py --precision-only   # the precision section alone (bench_chunked_precision.*)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
from bench_model_shapes import SEED, _ms, time_in_rounds  # noqa: E402
from leettriton import bench  # noqa: E402
from leettriton.autotune import KERNELS  # noqa: E402

NAME = "bench_chunked"
OURS = ("auto", "lightning_attention", "block_based")
FLA, LA2 = "fla_chunk_simple_gla", "lightning_attn2"


def run_speed(rep: common.Report, args, dtypes, decays, shapes, heads, r, d, rep_ms) -> None:
    device = rep.device
    entries = [common.entry(m, device) for m in OURS]
    for name, factory in bench.peers(device, bench.CHUNKED_PEERS, rep.notes).items():
        entries.append(bench.peer_entry(name, factory))
    rows = []
    for batch, n in shapes:
        # our kernels tune themselves at each shape (their autotune key has no n: tuned once, at the
        # first shape, a config would be kept wherever it was chosen, e.g. at a host-bound 1 × 2048)
        for kernel in KERNELS.values():
            kernel.cache.clear()
        cell_rows = bench.run_grid(entries, dtypes=dtypes, batches=[batch], seqlens=[n], decays=decays, heads=heads,
                                   r=r, d=d, device=device, budget_s=args.budget_s, rep_ms=rep_ms,
                                   bandwidth=rep.bandwidth, seed=SEED)
        if device.type == "cuda":
            for dt in dtypes:
                for decay in decays:
                    time_in_rounds(cell_rows, entries, dt, batch, n, heads, r, d, device, OURS, decay=decay,
                                   seed=SEED)
        rows += cell_rows
    for row in rows:
        row["section"] = "speed"
    rep.rows.extend(rows)
    speed_tables(rep, rows, [e.label for e in entries], dtypes, decays, shapes, heads, r, d)


def speed_tables(rep: common.Report, rows, labels, dtypes, decays, shapes, heads, r, d) -> None:
    """The speed section's tables and targets from its rows (``labels``: the entries', ours first).

    Each of ours and fla counts with its lower time of the sweep and of its alternating rounds
    (``bench_model_shapes._ms``); 'fla / best ours, kernels' divides fla's CUDA-graph replay by the fastest
    replay of ours (``graph_ms``: auto's and the fastest other method's of the sweep, timed in rounds)."""
    judged = rep.device.type == "cuda"
    for dt in dtypes:
        dname = bench.dtype_name(dt)
        for decay in decays:
            body = []
            speedups = []
            for batch, n in shapes:
                get = {label: common.find(rows, method=label, dtype=dname, decay=decay, batch=batch, n=n)
                       for label in labels}
                ours = [get[m] for m in OURS if _ms(get[m])]
                best = min(ours, key=_ms) if ours else None
                t_fla = _ms(get.get(FLA))
                speed = None
                if best and t_fla:
                    speed = t_fla / _ms(best)
                    speedups.append(speed)
                replays = [get[m]["graph_ms"] for m in OURS if get[m] and get[m].get("graph_ms")]
                g_fla = (get.get(FLA) or {}).get("graph_ms")
                kernel_speed = g_fla / min(replays) if g_fla and replays else None
                errs = [get[m]["rel_err"] for m in OURS if get[m] and get[m]["rel_err"] is not None]
                floor = next(x["floor_ms"] for x in get.values() if x)
                body.append([f"{batch} × {n}", *(common.cell(get.get(label)) for label in labels), common.fmt_ms(floor),
                             best["method"] if best else "—", "—" if speed is None else f"{speed:.2f}×",
                             "—" if kernel_speed is None else f"{kernel_speed:.2f}×",
                             "—" if best is None else f"{_ms(best) / floor:.1f}×",
                             common.fmt_err(max(errs)) if errs else "—"])
                if batch == 16 and n == 8192 and dt == torch.float16:
                    ratio = None if best is None else _ms(best) / floor
                    rep.target(f"best ours × memory floor, fp16 B=16 n=8192 {'decay' if decay else 'no decay'}",
                               "—" if ratio is None else f"{ratio:.2f}×", "≤ 3×",
                               None if ratio is None or not judged else ratio <= 3.0)
            rep.target(f"best ours vs fla chunk_simple_gla, {dname} {'decay' if decay else 'no decay'} (worst shape)",
                       "—" if not speedups else f"{min(speedups):.2f}× (best {max(speedups):.2f}×)", "≥ 1.5×",
                       None if not speedups or not judged else min(speedups) >= 1.5)
            kind = "with decay" if decay else "without decay"
            rep.section(f"Speed, {dname}, {kind} — heads {heads}, r = {r}, d = {d}",
                        ["batch × n", *labels, "floor ms", "best ours", "fla / best ours",
                         "fla / best ours, kernels", "best ours × floor", "ours max rel err"], body,
                        "Median ms of the sweep (do_bench, p20/p80 in the JSON rows). 'best ours', 'fla / best ours' "
                        "and 'best ours × floor' take each entry's lower time of the sweep and of five alternating "
                        "rounds of auto, fla and the fastest other method of ours ('rounds_ms' in the JSON rows), "
                        "each a call from Python, the host's time included. 'fla / best ours, kernels': the same "
                        "calls each captured in a CUDA graph, the replays timed in five alternating rounds "
                        "('graph_ms'): the kernels' time alone. 'fla / best ours' > 1 means ours is faster. Errors "
                        "against the float64 oracle on the rows' err_scope.")


def run_precision(rep: common.Report, args, dtypes, gammas, n, heads, r, d) -> None:
    device = rep.device
    peers = bench.peers(device, bench.CHUNKED_PEERS, None)
    body = []
    for dt in dtypes:
        b, c, v = bench.make_inputs(1, heads, n, r, d, dt, device, seed=11)
        worst: dict[str, list] = {}
        for gval in gammas:
            g = None if gval == 1.0 else torch.full((heads,), gval, device=device, dtype=torch.float32)
            orc = bench.oracle(b, c, v, g)
            line = [bench.dtype_name(dt), f"{gval:g}"]
            for name in (*OURS, *peers):
                if name in OURS:
                    def prepare(name=name):
                        return lambda: leettriton.linear_attention(b, c, v, g, method=common.run_name(name, device))
                    tol = bench.tolerance(dt)
                else:
                    def prepare(name=name):
                        return peers[name](b, c, v, g)
                    tol = bench.tolerance(dt, "tf32")            # the peers' float32 goes through TF32
                m = bench.measure(prepare, check=orc, tol=tol, device=device, timed=False)
                rep.rows.append(dict(section="precision", method=name, dtype=bench.dtype_name(dt), batch=1,
                                     heads=heads, n=n, r=r, d=d, gamma=gval, rel_err=m.rel_err, tol=tol,
                                     status=m.status, note=m.note))
                if m.rel_err is None:
                    line.append(m.status)
                else:
                    line.append(f"{common.fmt_err(m.rel_err)} {'ok' if m.status == 'ok' else 'FAIL'}")
                if name in OURS:
                    worst.setdefault(name, []).append(m)
                print(f"precision {bench.dtype_name(dt):<8} γ={gval:<6g} {name:<22} err {common.fmt_err(m.rel_err)} "
                      f"(tol {tol:.0e}) {m.status} {m.note}", flush=True)
            body.append(line)
        for name, ms in worst.items():
            errs = [m.rel_err for m in ms if m.rel_err is not None]
            shown = "NaN/inf" if any(e != e for e in errs) else (f"{max(errs):.1e}" if errs else "—")
            missing = sorted({m.status for m in ms if m.rel_err is None})
            over = ", ".join(f"{x:g}" for x in gammas)
            rep.target(f"precision {name} {bench.dtype_name(dt)} n={n}, worst of γ ∈ {{{over}}}",
                       shown + (f" ({', '.join(missing)})" if missing else ""), f"≤ {bench.tolerance(dt):.0e}",
                       False if any(m.status in ("WRONG", "error") for m in ms) else
                       (None if missing else True))
        del b, c, v
        bench.free_memory()
    rep.section(f"Precision at n = {n}: batch 1, heads {heads}, r = {r}, d = {d}, relative error vs the float64 oracle",
                ["dtype", "γ", *OURS, *(f"{p} (info)" for p in peers)], body,
                "Tolerances: float16 2e-3, bfloat16 1e-2, float32 (precision 'ieee') 1e-5; NaN/inf fails. Peers' "
                "float32 goes through TF32 (judged at 2e-3). γ = 1 runs the no-decay path.")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--precision-only", action="store_true", help="only the precision section (n = 100 000)")
    p.add_argument("--precision-dtypes", default="float16,bfloat16,float32",
                   help="comma-separated dtypes of the precision section")
    p.add_argument("--shapes", help="comma-separated BATCHxN: only the speed tables, at these shapes "
                   "(their own files, bench_chunked_shapes.*: e.g. to measure short, host-bound calls again)")
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "Chunked methods vs fla and lightning-attn", common.cli_argv(argv), device, args.quick)
    if args.precision_only and args.shapes:
        p.error("--precision-only and --shapes exclude each other")
    if args.precision_only:
        rep.name += "_precision"  # its own files: a full run's speed tables are not overwritten
    if args.shapes:
        rep.name += "_shapes"
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    names = [x for x in args.precision_dtypes.split(",") if x]
    if not names or any(x not in ("float16", "bfloat16", "float32") for x in names):
        p.error(f"--precision-dtypes must name float16, bfloat16 or float32, got {args.precision_dtypes!r}")
    precision_dtypes = [getattr(torch, x) for x in names]
    if device.type == "cuda":
        heads, r, d = 32, 128, 128
        if args.quick:
            dtypes, decays = [torch.float16], [True]
            shapes = [(1, 8192), (1, 100000), (16, 8192)]
            pn, pheads = 100000, 4
        else:
            dtypes, decays = [torch.float16, torch.bfloat16], [True, False]
            shapes = [(1, 2048), (1, 8192), (1, 32768), (1, 100000), (16, 2048), (16, 8192), (16, 25600)]
            pn, pheads = 100000, 4
    else:
        heads, r, d = 2, 16, 16
        dtypes, decays = [torch.float16], [True, False]
        shapes = [(1, 64), (2, 128)]
        pn, pheads = 512, 2
    if args.shapes:
        try:
            shapes = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]
        except ValueError:
            p.error(f"--shapes takes BATCHxN pairs such as 1x8192,16x2048, got {args.shapes!r}")
        if not shapes or any(len(x) != 2 or min(x) < 1 for x in shapes):
            p.error(f"--shapes takes BATCHxN pairs such as 1x8192,16x2048, got {args.shapes!r}")
    failed = None
    with torch.no_grad():
        try:
            if not args.precision_only:
                run_speed(rep, args, dtypes, decays, shapes, heads, r, d, rep_ms)
                rep.finish(args.out)  # the speed tables on disk now: the precision section may be cut off
            if not args.shapes:
                run_precision(rep, args, precision_dtypes, (1.0, 0.999, 0.9), pn, pheads, r, d)
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
