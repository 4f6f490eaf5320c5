"""The attention shapes of real models: ours against fla and lightning-attn, one run.

Layer shapes (heads, r, d) of three model families, with decay (one γ per head,
0.969 … 0.996, as RetNet's spread), float16 and bfloat16:

* RetNet-1.3B: heads 8, r = 256, d = 512;
* TransNormerLLM-7B: heads 32, r = d = 128;
* a small GLA / RetNet: heads 16, r = d = 64;

at batch 1, 2 and 8 and n 2048, 8192 and 32768.  Peers: fla's ``chunk_simple_gla``
(contiguous ``[B, T, H, K]`` inputs prepared outside the timed region, ``g_gamma = ln γ``)
and lightning-attn's ``lightning_attn2``, timed in the same run on the same inputs.  Ours:
``auto`` (the heuristic file's method and configs) and, unless ``--methods`` says otherwise,
the methods that split the sequence across programs, each autotuned at each shape.

Each cell's sweep times every entry once.  Then ``auto``, fla's kernel and the best of the rest are
timed again in alternating rounds (``bench_auto.confirm_rounds``: five rounds, each timing the three
in turn, the median of each kept as ``rounds_ms``), and the ratios of the tables and the targets take
each entry's lower time of the two (:func:`_ms`), so that a slow spell during one timing does not move
a ratio.  Those are calls from Python, the host's time included; the same three calls are also captured
in CUDA graphs and their replays timed in rounds (``graph_ms``: the kernels' time alone), for the
tables' "fla / auto, kernels".

Targets (issue: real model shapes): ``auto`` ≥ 1.5× faster than ``chunk_simple_gla`` at
every cell; ≤ 3× the memory floor at RetNet-1.3B's shape, batch 1, n 8192, float16.

    python perf/bench_model_shapes.py                       # the whole grid, on the GPU
    python perf/bench_model_shapes.py --models retnet --dtypes float16 --batches 1 --seqlens 8192
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_auto import confirm_rounds  # noqa: E402

from leettriton import bench  # noqa: E402
from leettriton.bench import graph_replay  # noqa: E402
from leettriton.autotune import KERNELS  # noqa: E402

NAME = "bench_model_shapes"
FLA = "fla_chunk_simple_gla"
MODELS = {
    # name: (label, heads, r, d)
    "retnet": ("RetNet-1.3B", 8, 256, 512),
    "transnormer": ("TransNormerLLM-7B", 32, 128, 128),
    "gla": ("small GLA / RetNet", 16, 64, 64),
}
OURS = ("auto", "block_based", "lightning_attention", "fleet_attention")
SEED = 0
"""Seed of every cell's inputs: the sweep's and the rounds' are the same tensors' values."""


def _csv(text: str, parse, what: str, allowed=None) -> list:
    try:
        items = [parse(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"--{what} must be a comma-separated list, got {text!r}")
    if not items or (allowed is not None and any(x not in allowed for x in items)):
        raise SystemExit(f"--{what} must name some of {sorted(allowed) if allowed else 'values'}, got {text!r}")
    return items


def _ms(row) -> float | None:
    """A row's time for the ratios: the lower of its sweep's median and, where it was timed in them, its
    alternating rounds' median.  Both are do_bench medians; at the smallest cells one of the two can meet a
    slow spell of the host path, ours or a peer's (the JSON rows keep both: ``median_ms``, ``rounds_ms``),
    and taking the lower one for every entry alike drops it."""
    if not row or row.get("status") != "ok":
        return None
    times = [t for t in (row.get("rounds_ms"), row.get("median_ms")) if t]
    return min(times) if times else None


def time_in_rounds(rows, entries, dt, batch, n, heads, r, d, device, methods, decay: bool = True,
                   seed: int = SEED) -> None:
    """Time ``auto``, fla's kernel and the fastest other method of ours of one cell (with the per-head decay
    of ``leettriton.bench.decay_gammas``, or none) again, alternating (:func:`confirm_rounds`), on the
    sweep's inputs (``seed``: the sweep's), and record each one's ``rounds_ms``; then each one's call captured
    in a CUDA graph (``leettriton.bench.graph_replay``), its replays timed in alternating rounds as well:
    ``graph_ms``, the kernels' time without the host's (where a capture fails, ``graph_note`` says why and
    the others are still timed)."""
    dname = bench.dtype_name(dt)
    get = {e.label: common.find(rows, method=e.label, dtype=dname, decay=decay, batch=batch, n=n) for e in entries}
    ok = {label: row for label, row in get.items() if row and row["status"] == "ok" and row["median_ms"]}
    ours = [m for m in methods if m != "auto" and m in ok]
    pick = [m for m in ("auto", FLA) if m in ok]
    if ours:
        pick.append(min(ours, key=lambda m: ok[m]["median_ms"]))
    if len(pick) < 2:
        return
    b, c, v = bench.make_inputs(batch, heads, n, r, d, dt, device, seed=seed)
    gamma = bench.decay_gammas(heads, device) if decay else None
    by_label = {e.label: e for e in entries}
    calls = {label: by_label[label].make(b, c, v, gamma) for label in pick}
    for label, ms in confirm_rounds(calls).items():
        ok[label]["rounds_ms"] = ms
    graphs = {}
    for label, fn in calls.items():
        try:
            graphs[label] = graph_replay(fn)
        except RuntimeError as exc:
            ok[label]["graph_note"] = f"capture failed: {type(exc).__name__}: {str(exc)[:200]}"
    if len(graphs) >= 2:
        for label, ms in confirm_rounds(graphs).items():
            ok[label]["graph_ms"] = ms
    del b, c, v, calls, graphs
    torch.cuda.empty_cache()


def run_model(rep: common.Report, args, model: str, dtypes, batches, seqlens, methods, rep_ms) -> None:
    label, heads, r, d = MODELS[model]
    device = rep.device
    entries = [common.entry(m, device) for m in methods]
    for name, factory in bench.peers(device, bench.CHUNKED_PEERS, rep.notes).items():
        entries.append(bench.peer_entry(name, factory))
    rows = []
    for batch in batches:
        for n in seqlens:
            # the autotuned methods tune at each shape (their key has no n)
            for kernel in KERNELS.values():
                kernel.cache.clear()
            cell_rows = bench.run_grid(entries, dtypes=dtypes, batches=[batch], seqlens=[n], decays=[True],
                                       heads=heads, r=r, d=d, device=device, budget_s=args.budget_s, rep_ms=rep_ms,
                                       bandwidth=rep.bandwidth, seed=SEED)
            if device.type == "cuda":
                for dt in dtypes:
                    time_in_rounds(cell_rows, entries, dt, batch, n, heads, r, d, device, methods)
            rows += cell_rows
    for row in rows:
        row["model"] = model
    rep.rows.extend(rows)

    ours = [m for m in methods if m != "auto"]
    for dt in dtypes:
        dname = bench.dtype_name(dt)
        body, speedups = [], []
        for batch in batches:
            for n in seqlens:
                get = {e.label: common.find(rows, method=e.label, dtype=dname, decay=True, batch=batch, n=n)
                       for e in entries}
                timed = [get[m] for m in ours if _ms(get[m])]
                best = min(timed, key=_ms) if timed else None
                auto, fla = get.get("auto"), get.get(FLA)
                t_auto, t_fla = _ms(auto), _ms(fla)
                speed = None if not (t_auto and t_fla) else t_fla / t_auto
                if speed is not None:
                    speedups.append(speed)
                g_auto, g_fla = ((x or {}).get("graph_ms") for x in (auto, fla))
                kernel_speed = None if not (g_auto and g_fla) else g_fla / g_auto
                floor = next((x["floor_ms"] for x in get.values() if x), None)
                ratio = None if not (t_auto and floor) else t_auto / floor
                body.append([f"{batch} × {n}", *(common.cell(get.get(e.label)) for e in entries), common.fmt_ms(floor),
                             "—" if speed is None else f"{speed:.2f}×",
                             "—" if kernel_speed is None else f"{kernel_speed:.2f}×",
                             "—" if ratio is None else f"{ratio:.2f}×",
                             best["method"] if best else "—",
                             "—" if not best or not t_fla else f"{t_fla / _ms(best):.2f}×"])
                if model == "retnet" and batch == 1 and n == 8192 and dt == torch.float16:
                    rep.target("auto × memory floor, RetNet-1.3B fp16 1 × 8192", "—" if ratio is None else
                               f"{ratio:.2f}×", "≤ 3×", None if ratio is None or device.type != "cuda" else ratio <= 3)
        rep.target(f"auto vs fla chunk_simple_gla, {label} {dname} (worst cell)",
                   "—" if not speedups else f"{min(speedups):.2f}× (best {max(speedups):.2f}×)", "≥ 1.5×",
                   None if not speedups or device.type != "cuda" else min(speedups) >= 1.5)
        rep.section(f"{label}: heads {heads}, r = {r}, d = {d}, {dname}, with decay",
                    ["batch × n", *(e.label for e in entries), "floor ms", "fla / auto", "fla / auto, kernels",
                     "auto × floor", "best of the rest", "fla / best"], body,
                    "Median ms of the sweep (do_bench; p20/p80 in the JSON rows). 'fla / auto', 'auto × floor' and "
                    "'fla / best' take each entry's lower time of the sweep and of five alternating rounds of auto, "
                    "fla and the best of the rest ('rounds_ms' in the JSON rows), each a call from Python, the "
                    "host's time included. 'fla / auto, kernels': the same two calls each captured in a CUDA graph, "
                    "the replays timed in five alternating rounds ('graph_ms'): the kernels' time alone. "
                    "'fla / auto' > 1: ours is faster. The floor is b, c, v and o once each over the measured copy "
                    "bandwidth.")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated: float16, bfloat16, float32")
    p.add_argument("--batches", default="1,2,8")
    p.add_argument("--seqlens", default="2048,8192,32768")
    p.add_argument("--methods", default=",".join(OURS), help="ours to time (auto is always first)")
    args = p.parse_args(argv)
    device = common.device_of(args)
    models = _csv(args.models, str, "models", MODELS)
    dtypes = [getattr(torch, x) for x in _csv(args.dtypes, str, "dtypes", {"float16", "bfloat16", "float32"})]
    batches = _csv(args.batches, int, "batches")
    seqlens = _csv(args.seqlens, int, "seqlens")
    methods = ["auto"] + [m for m in _csv(args.methods, str, "methods") if m != "auto"]
    if device.type != "cuda":  # the PyTorch paths on tiny shapes: the script's logic, not a measurement
        batches, seqlens = batches[:1], [64]
    rep = common.Report(NAME, "Real model shapes vs fla and lightning-attn", common.cli_argv(argv), device,
                        args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    failed = None
    with torch.no_grad():
        try:
            for model in models:
                run_model(rep, args, model, dtypes, batches, seqlens, methods, rep_ms)
                rep.finish(args.out)  # each model's tables on disk as soon as they exist
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
