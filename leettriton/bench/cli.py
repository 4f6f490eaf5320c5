"""``python -m leettriton.bench``: every method over the LeetDecoding paper's grid, printed as its tables.

The grid is the paper's: heads 32, r = d = 128, batch 1 and 16,
n ∈ {128, 512, 2048, 8192, 12800, 25600, 100000}, with and without decay, here in
float16 by default (``--dtype``).  Each cell reports

* the median time of one call (``triton.testing.do_bench``, p20/p80 beside it),
  after a warm call that absorbs compilation and autotuning; on a CPU, wall-clock
  medians of repeated calls after warm-up calls (:func:`~leettriton.bench.timing.cpu_time_ms`),
  which say nothing of GPU performance;
* on a GPU, the ratio to the **memory floor**: the bytes of b, c, v and o read/written once,
  divided by the copy bandwidth measured at the start of the run (a CPU run records it in its
  rows but does not print it: a CPU's floor says nothing of the kernels);
* the relative error ‖o − o_ref‖ / ‖o_ref‖ against the float64 oracle (``err vs fp64``)
  (:func:`leettriton.reference`, computed in float64 on the inputs' device).  When
  batch·heads·n exceeds :data:`ERR_MAX_ROWS` rows, the error is taken on an evenly
  spaced subset of batch elements and heads (always the whole sequence, so late
  positions are checked); the row's ``err_scope`` says which, e.g. ``b1/16 h20/32``;
* ``OOM`` where memory runs out, ``n/a`` for a method that is not implemented,
  ``skipped`` for the larger n of a method once one of its cells took longer than
  the cell budget (``--budget-s``, 2 s by default) or is predicted, from its smaller
  n, to take more than five budgets.

Decay: γ_h = 1 − 2^(−5 − 3·h/(H−1)) for head h of H (:func:`decay_gammas`), which spans
0.969 … 0.996 (RetNet's choice stretched over the heads).  Inputs are
standard normal, b scaled by r^(−1/2) as a caller scales queries.

    python -m leettriton.bench                                # the full grid, fp16
    python -m leettriton.bench --quick                        # about a minute
    python -m leettriton.bench --dtype bfloat16 --methods lightning_attention,block_based --peers
    python -m leettriton.bench --json bench.json --csv bench.csv --plot bench.png
    python -m leettriton.bench --json bench.json --resume     # go on with an interrupted run
    python -m leettriton.bench --from-json bench.json --plot bench.png   # tables and plot, no measuring

A kernel fault (a peer's, say) leaves the CUDA context unusable: the run then stops,
writes what it measured with the faulting cell marked ``error``, and exits 1;
``--resume`` in a fresh process keeps those cells and measures the rest.  On a machine
without a GPU it runs the PyTorch methods on small shapes.

The measuring itself lives in the package's other modules (:mod:`leettriton.bench`), shared
by the scripts in ``perf/`` and by :func:`~leettriton.bench.user.benchmark_method`; this one
only reads the options and prints.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Optional, Sequence

import torch

from ..autotune.families import is_interpreting
from .cell import ERR_MAX_ROWS
from .environment import environment
from .failures import DeviceFailure
from .grid import (CPU_BATCHES, CPU_DIM, CPU_HEADS, CPU_RANK, CPU_SEQLENS, PAPER_BATCHES, PAPER_DIM, PAPER_HEADS,
                   PAPER_RANK, PAPER_SEQLENS, QUICK_BATCHES, QUICK_SEQLENS, QUICK_SHAPE, default_methods, method_entry,
                   peer_entry, resumable_rows, run_grid)
from .inputs import dtype_name, parse_dtype, resolve_device
from .peers import CHUNKED_PEERS, peers
from .report import CPU_TIMING_NOTE, base_path, echo, format_tables, plot, read_results, write_csv, write_results
from .timing import CPU_MIN_SAMPLES, CPU_THREADS, copy_bandwidth

__all__ = ["main"]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m leettriton.bench",
        description="Time every leettriton method over the LeetDecoding paper's grid and print its tables "
                    "(median ms, ratio to the memory floor, relative error against the fp64 oracle).")
    p.add_argument("--quick", action="store_true", help="a one-minute version: batch 1 and 16, n 512 and 8192, "
                   "with decay (CPU: tiny shapes)")
    p.add_argument("--methods", help="comma-separated methods (paper spellings accepted; default: every method, "
                   "its _torch version and auto; on CPU the _torch versions)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16, float32, or a comma list")
    p.add_argument("--batch", type=_ints, help="comma list of batch sizes (default 1,16)")
    p.add_argument("--n", type=_ints, help="comma list of sequence lengths (default the paper's)")
    p.add_argument("--heads", type=int, help="heads (default 32)")
    p.add_argument("--r", type=int, help="rank of b and c (default 128)")
    p.add_argument("--d", type=int, help="dim of v (default 128)")
    p.add_argument("--decay", choices=("both", "on", "off"), help="with decay, without, or both (default both; "
                   "--quick: on)")
    p.add_argument("--peers", action="store_true", help="add fla chunk_simple_gla and lightning_attn2 when installed")
    p.add_argument("--budget-s", type=float, default=2.0, help="skip larger n of a method once a cell takes longer "
                   "(default 2 s)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench repetition time (default 100, quick 50)")
    p.add_argument("--warmup-ms", type=float, default=25, help="do_bench warm-up time (default 25)")
    p.add_argument("--no-check", action="store_true", help="skip the error against the fp64 oracle")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-json", metavar="FILE",
                   help="measure nothing: print the tables of an earlier --json file (and draw --plot from it)")
    p.add_argument("--resume", action="store_true",
                   help="keep the cells already in the --json file (an interrupted run, or one stopped by a "
                   "kernel fault) and measure the rest")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="skip the cells reached after this long (the tables mark them), so the run ends in time")
    p.add_argument("--json", metavar="FILE", help="write the rows and run header as JSON, and the tables beside "
                   "it as .md")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV with the run header as # lines")
    p.add_argument("--plot", metavar="FILE.png", help="latency against n, log-log, per method (needs matplotlib)")
    return p


def _replay(path: str, plot_path: Optional[str]) -> list[dict]:
    """``--from-json``: the tables (and plot) of a run written earlier with ``--json``."""
    try:
        meta, rows = read_results(path, "--from-json")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    echo(format_tables(rows, meta=meta))
    if plot_path and plot(rows, plot_path, log=echo):
        echo(f"wrote {plot_path}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    """Run the benchmark as ``python -m leettriton.bench [options]``; returns the result rows."""
    args = _parser().parse_args(argv)
    if args.from_json:
        return _replay(args.from_json, args.plot)
    start = time.time()
    device = resolve_device(args.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    log = echo
    dtypes = [parse_dtype(x) for x in args.dtype.split(",") if x]

    if args.quick:
        heads, r, d = QUICK_SHAPE[kind]
        batches, seqlens, decay = QUICK_BATCHES[kind], QUICK_SEQLENS[kind], "on"
    elif kind == "cuda":
        heads, r, d = PAPER_HEADS, PAPER_RANK, PAPER_DIM
        batches, seqlens, decay = PAPER_BATCHES, PAPER_SEQLENS, "both"
    else:
        heads, r, d = CPU_HEADS, CPU_RANK, CPU_DIM
        batches, seqlens, decay = CPU_BATCHES, CPU_SEQLENS, "both"
    heads = args.heads or heads
    r = args.r or r
    d = args.d or d
    batches = args.batch or batches
    seqlens = args.n or seqlens
    decay = args.decay or decay
    decays = {"both": [True, False], "on": [True], "off": [False]}[decay]
    rep_ms = args.rep_ms or (50 if args.quick else 100)

    if args.methods:
        names = [x.strip() for x in args.methods.split(",") if x.strip()]
        names = default_methods(device) if names == ["all"] else names
    else:
        names = default_methods(device)
    entries = [method_entry(x) for x in names]
    notes: list[str] = []
    if args.peers:
        for name, factory in peers(device, CHUNKED_PEERS, notes).items():
            entries.append(peer_entry(name, factory))

    if kind == "cpu":
        log("No CUDA device: running the PyTorch methods on small CPU shapes "
            f"(heads {heads}, r = {r}, d = {d}); the paper's grid needs a GPU."
            + (" TRITON_INTERPRET=1: Triton methods run in the interpreter." if is_interpreting() else ""))
        log(CPU_TIMING_NOTE)
    meta = environment(device)
    meta["command"] = "python -m leettriton.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    bw = copy_bandwidth(device)
    meta["copy_bandwidth_gbs"] = round(bw / 1e9, 1)
    meta.update(grid=dict(dtypes=[dtype_name(x) for x in dtypes], batches=list(batches), seqlens=list(seqlens),
                          decays=decays, heads=heads, r=r, d=d),
                decay_formula="gamma_h = 1 - 2^(-5 - 3*h/(H-1))",
                timing=(f"triton.testing.do_bench median, rep {rep_ms:g} ms, warm-up {args.warmup_ms:g} ms"
                        if kind == "cuda" else f"time.perf_counter median of >= {CPU_MIN_SAMPLES} calls over >= "
                        f"{rep_ms:g} ms after {args.warmup_ms:g} ms of warm-up calls, {CPU_THREADS} thread")
                + ", one warm call first",
                budget_s=args.budget_s,
                err_max_rows=ERR_MAX_ROWS, peers=notes)
    bandwidth = f"  copy bandwidth {bw / 1e9:.1f} GB/s" if kind == "cuda" else ""
    log(f"{meta['device']}{bandwidth}  torch {meta['torch']}  triton {meta['triton']}  git {str(meta['git_sha'])[:10]}")
    for x in notes:
        log(x)
    log(f"methods: {', '.join(e.label for e in entries)}")
    log(f"grid: dtypes {','.join(dtype_name(x) for x in dtypes)}, batch {list(batches)}, n {list(seqlens)}, "
        f"decay {decay}, heads {heads}, r {r}, d {d}")

    done: dict = {}
    if args.resume:
        if not args.json:
            raise SystemExit("--resume needs --json FILE: the run to go on with")
        if os.path.exists(base_path(args.json) + ".json"):
            done = resumable_rows(base_path(args.json) + ".json", meta)
            log(f"resuming: {len(done)} cells kept from {base_path(args.json)}.json")
            earlier_meta, _ = read_results(base_path(args.json) + ".json", "--resume")
            meta["resumed_cells"] = len(done)
            meta["resumed_from"] = {k: earlier_meta.get(k) for k in ("date", "git_sha", "command")}
    failure = None
    rows: list[dict] = []
    with torch.no_grad():
        try:
            rows = run_grid(entries, dtypes=dtypes, batches=batches, seqlens=seqlens, decays=decays, heads=heads,
                            r=r, d=d, device=device, check=not args.no_check, budget_s=args.budget_s,
                            warmup_ms=args.warmup_ms, rep_ms=rep_ms, bandwidth=bw, seed=args.seed, log=log,
                            deadline=None if args.max_minutes is None else start + 60 * args.max_minutes,
                            done=done)
        except DeviceFailure as exc:
            failure = str(exc)
            rows = exc.rows
            log(f"stopping: the CUDA context is unusable after a kernel fault ({failure}); the tables below hold "
                f"what was measured before it")
            meta["stopped_early"] = failure
    log("")
    log(format_tables(rows, meta=meta))
    if args.json:
        jpath, mpath = write_results(rows, meta, args.json)
        log(f"wrote {jpath} and {mpath}")
    if args.csv:
        log(f"wrote {write_csv(rows, meta, args.csv)}")
    if args.plot:
        if plot(rows, args.plot, log=log):
            log(f"wrote {args.plot}")
    if failure is not None:
        raise SystemExit(1)
    return rows

