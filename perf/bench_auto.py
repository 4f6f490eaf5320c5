"""method="auto" against the best single method, on shapes the tune grid does not contain; cold start.

    python perf/bench_auto.py [--quick] [--out perf/results] [--no-cold] [--dtypes float16,...]
    python perf/bench_auto.py --no-cold --max-minutes 8 --resume   # in pieces: the file is written
                                                                    # after every shape
    python perf/bench_auto.py --cold-only                           # the cold start alone
    python perf/bench_auto.py --no-cold --dtypes float16 --out /tmp/a   # one dtype per GPU, side by side,
    python perf/bench_auto.py --merge /tmp/a/h100/bench_auto.json ...   # then one file of them all
    python perf/bench_auto.py --no-cold --shard 0/4 --out /tmp/s0       # a quarter of the series of
                                                                        # shapes per GPU, then --merge
    python perf/bench_auto.py --no-cold --rd 256x512 --out /tmp/w       # one layer's widths, then --merge
    python perf/bench_auto.py --no-cold --warm-workers 16               # compile the shapes' kernels first,
                                                                        # in 16 processes

1. For n ∈ {3000, 20000, 70000}, batch·heads ∈ {48, 96}, fp16 / bf16 / fp32, with and without decay
   (heads 16, r = d = 128), and batch 1 × n 8192 at heads 32 (r = d = 128); in float16 and bfloat16
   with decay, the attention layers of the model benchmark (perf/bench_model_shapes.py: RetNet-1.3B,
   heads 8, r = 256, d = 512; TransNormerLLM-7B, heads 32, r = d = 128; small GLA / RetNet, heads 16,
   r = d = 64) at sequence lengths the tune grid does not hold: ``auto`` (the heuristic file's method
   and config, no tuning on the call path) and every Triton method (each autotuned for the shape: the
   autotuners' caches are cleared before each shape) timed in the same run; a method 10× slower than
   the best is not run at the larger n of its series.  Then every method within 1.25× of the sweep's
   best is tuned at the shape as the tuner tunes a point (``leettriton.tune.time_method``: its
   autotuners, its alternative schedules, its whole-call configs, and ``auto``'s configs where ``auto``
   runs that method, kept where faster), and ``auto`` and those methods, each
   with its configs pinned, are timed again in five alternating rounds, each call by the replay of its
   CUDA graph (the kernels' time, not the host's); each figure is the median of its rounds
   (:func:`contender_rounds`, :func:`confirm_rounds`).  A row records the configs of ``auto`` and of the
   best method, and how the rounds were timed.
   Target: auto within 10% of the best on ≥ 90% of the shapes, never worse than 1.5×.
2. Cold start, each in a fresh process with an empty Triton cache: the wall time of the first ``auto``
   call at a new shape (compile included), then of a second call at another n (no recompile, no
   re-tune); the same for flash-linear-attention's ``chunk_simple_gla`` when installed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import leettriton
from leettriton.methods import BUILTIN_METHODS
from leettriton.bench import decay_gammas, environment, graph_replay, make_inputs, time_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import render  # noqa: E402
from leettriton.plan import run_problem
from leettriton.problem import make_problem

HEADS = 16

COLD_SNIPPET = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
which, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
H, r = 32, 128
g = (1 - torch.exp2(-5 - 3 * torch.arange(H, dtype=torch.float64) / (H - 1))).float().cuda()
def inputs(n):
    x = [torch.randn(1, H, n, r, device="cuda", dtype=torch.float16) for _ in range(3)]
    return x if which == "auto" else [t.transpose(1, 2).contiguous() for t in x]
torch.cuda.synchronize()
if which == "auto":
    import leettriton
    run = lambda b, c, v: leettriton.linear_attention(b, c, v, g)
else:
    from fla.ops.simple_gla import chunk_simple_gla
    run = lambda b, c, v: chunk_simple_gla(b, c, v, g_gamma=g.log(), scale=1.0)
t_import = time.perf_counter() - t0
out = {}
for key, n in (("first_call_s", n1), ("second_call_s", n2)):
    b, c, v = inputs(n)
    torch.cuda.synchronize()
    t = time.perf_counter()
    run(b, c, v)
    torch.cuda.synchronize()
    out[key] = time.perf_counter() - t
out["import_s"] = t_import
print("RESULT " + json.dumps(out))
"""


MODEL_LAYERS = ((8, 256, 512), (32, 128, 128), (16, 64, 64))
"""(heads, r, d) of the attention layers of perf/bench_model_shapes.py: RetNet-1.3B, TransNormerLLM-7B and a
small GLA / RetNet."""

MODEL_SHAPES = ((1, 5000), (1, 12000), (3, 12000))
"""(batch, n) of those layers here: sequence lengths between the tune grid's 2048, 8192 and 32768."""


def shapes(quick: bool, dtypes):
    """The shapes measured, as (dtype, decay, heads, r, d, batch, n)."""
    ns = [3000, 20000] if quick else [3000, 20000, 70000]
    bhs = [48] if quick else [48, 96]
    dtypes = dtypes or (["float16"] if quick else ["float16", "bfloat16", "float32"])
    out = [(dt, dec, HEADS, 128, 128, bh // HEADS, n) for dt in dtypes for dec in (True, False) for bh in bhs
           for n in ns]
    if quick:
        return out
    out += [(dt, dec, 32, 128, 128, 1, 8192) for dt in dtypes for dec in (True, False)]
    out += [(dt, True, heads, r, d, batch, n) for dt in dtypes if dt != "float32" for heads, r, d in MODEL_LAYERS
            for batch, n in MODEL_SHAPES]
    return out


def _key(row) -> tuple:
    return (row["dtype"], row["decay"], row.get("heads", HEADS), row.get("r", 128), row.get("d", 128),
            row["batch"], row["n"])


AUTO = "auto"

CONTENDER = 1.25
"""Methods within this factor of the best in the sweep are timed again beside ``auto`` (:func:`confirm_rounds`)."""

ROUNDS = 5
"""Alternating rounds of :func:`confirm_rounds`."""

ROUND_MS = 20.0
"""``do_bench`` repetition time of one call's timing in a round."""


def confirm_rounds(calls, rounds: int = ROUNDS, rep_ms: float = ROUND_MS, timer=None) -> dict:
    """{name: median ms} of each of ``calls`` ({name: fn}) over ``rounds`` rounds, each round timing every
    call once in turn (``timer(fn, rep_ms)`` → ms; ``time_ms``'s median by default).

    The cells take 0.04-2 ms, and one ``do_bench`` of the same config moves by up to 0.04 ms between
    timings a minute apart (an H100's repeated runs, in git history): alternating the calls puts ``auto``
    and the methods it is compared with under the same conditions, and the median of the rounds drops a
    round that met a slow spell."""
    timer = timer or (lambda fn, ms: time_ms(fn, rep_ms=ms, warm=False)[0])
    for fn in calls.values():
        fn()  # compiled and tuned before the first round
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            samples[name].append(timer(fn, rep_ms))
    return {name: statistics.median(values) for name, values in samples.items()}


def contender_rounds(b, c, v, gamma, contenders, *, auto_plan=None, tune=None, rounds=None,
                     capture=None) -> tuple[dict, dict, str]:
    """({name: median ms}, {method: configs}, how they were timed): ``auto`` and each of ``contenders`` timed
    in alternating rounds (``rounds``: :func:`confirm_rounds`), each contender with the configs a tune of
    this very shape gives it (``tune(method, recorded)`` → {kernel space: config}; by default
    ``leettriton.tune.time_method``, as the tuner measures a point again: its autotuners, its alternative
    schedules, its whole-call configs, and ``recorded``, the configs ``auto`` runs that method with
    (``auto_plan``: (method, configs)), kept where faster), pinned as ``auto`` pins the file's.

    Each call is timed by the replay of its CUDA graph (``capture``: ``leettriton.bench.graph_replay`` on
    CUDA): the kernels' time, the same for a call through ``auto``'s fast path and for a pinned one, which
    the host prepares more slowly.  Timed from Python, a short call measures the host's time or the kernels' from
    run to run (perf/ab_compare.py).  Where a capture fails, every call of the shape is timed from Python
    and the third value says why.

    A kernel's autotuner alone times its configs apart from the call, under a schedule of its own: at
    1 × 32 heads × 8192 (r = d = 128, a point of the tune grid) ``block_based`` autotuned ran slower than
    ``auto`` with the file's configs for that very point (the rows of that shape in
    perf/results/h100/bench_auto.json and perf/results/h200/bench_auto.json), so it cannot stand for "the best
    method tuned at the shape" that ``auto`` is held to.  Each call validates its inputs and allocates its
    output, as ``auto``'s does."""
    if tune is None:
        from leettriton.tune import time_method

        def tune(method, recorded):
            # retune=False: the sweep's autotuners chose at this very shape (their caches cleared before it);
            # an earlier contender's alternatives clear them again, and those that find none tune afresh
            return time_method(method, b, c, v, gamma, retune=False, recorded=recorded)[1]
    auto_method, auto_configs = auto_plan or (None, None)
    configs = {m: tune(m, dict(auto_configs or {}) if m == auto_method else None) for m in contenders}
    calls = {AUTO: lambda: leettriton.linear_attention(b, c, v, gamma)}
    calls.update({m: (lambda m=m: run_problem(make_problem(b, c, v, gamma)[0], m, configs[m])) for m in contenders})
    if capture is None and b.is_cuda:
        capture = graph_replay
    timing = "python call"
    if capture is not None:
        try:
            calls, timing = {name: capture(fn) for name, fn in calls.items()}, "graph replay"
        except RuntimeError as exc:   # a call that cannot be captured: the shape's calls all from Python
            timing = f"python call (capture failed: {type(exc).__name__}: {str(exc)[:200]})"
    return (rounds or confirm_rounds)(calls), configs, timing


def _plain(configs):
    """A plan's configs ({space: config} mappings, or None) as plain dicts for the JSON file."""
    return None if configs is None else {space: dict(config) for space, config in configs.items()}


SLOWER_TO_DROP = 10.0
"""A method this many times slower than the best at a shape is not run at the larger n of its series."""


def shard_shapes(all_shapes, shard) -> list:
    """The shapes of shard (I, K): every K-th series from the I-th, a series being the shapes that differ in n
    alone, kept whole so that a method that loses by 10× at small n is dropped at larger n here too."""
    i, k = shard
    series = list(dict.fromkeys(shape[:-1] for shape in all_shapes))
    mine = set(series[i::k])
    return [shape for shape in all_shapes if shape[:-1] in mine]


def widths_only(all_shapes, widths) -> list:
    """The shapes whose (r, d) is one of ``widths`` (all of them when ``widths`` is None): a run of one
    layer's shapes after a change that only its widths see, joined with the others by ``--merge``."""
    return [shape for shape in all_shapes if widths is None or (shape[3], shape[4]) in widths]


def parse_widths(text: str) -> set:
    """``"256x512,64x64"`` → {(256, 512), (64, 64)}."""
    try:
        widths = {tuple(int(x) for x in pair.split("x")) for pair in text.split(",")}
    except ValueError:
        widths = set()
    if not widths or any(len(pair) != 2 or min(pair) < 1 for pair in widths):
        raise argparse.ArgumentTypeError(f"--rd takes RxD pairs (e.g. 256x512,64x64), not {text!r}")
    return widths


def planned_shapes(quick: bool, dtypes, shard=(0, 1), widths=None) -> list:
    """The shapes a run measures: :func:`shapes`, then its :func:`shard_shapes` and :func:`widths_only`."""
    return widths_only(shard_shapes(shapes(quick, dtypes), shard), widths)


def warm_cases(planned, methods, kept=()) -> list:
    """The warm's cases (``leettriton.autotune.warm.cases_tasks``) of the ``planned`` shapes not in ``kept``
    (keys of rows kept by ``--resume``): each method's call, no states, at each shape."""
    return [(m, dt, r, d, dec, False, False, batch, heads, n)
            for dt, dec, heads, r, d, batch, n in planned if (dt, dec, heads, r, d, batch, n) not in kept
            for m in methods]


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/K"`` → (I, K): the shard that takes every K-th series of shapes from the I-th (0 ≤ I < K)."""
    try:
        i, k = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/K (e.g. 0/4), not {text!r}") from None
    if not 0 <= i < k:
        raise argparse.ArgumentTypeError(f"--shard {text}: needs 0 ≤ I < K")
    return i, k


def auto_vs_best(quick: bool, methods, dtypes=None, *, done=None, save=None, deadline=None, shard=(0, 1),
                 widths=None):
    """One row per shape: ``auto`` (its pinned heuristic config) against every method autotuned at that shape.

    The autotuners' caches are cleared before each shape, so each method runs the config that is best
    for that shape, as the tuner measured it.  ``done``: rows of an earlier run (kept, not measured
    again); ``save(rows)`` is called after every shape; past ``deadline`` (a ``time.time()``) the shapes
    not measured are left for a ``--resume`` (the rows of ``done`` are all returned, in the plan's order).
    ``shard`` (I, K): only the shapes of :func:`shard_shapes` (one GPU's share of a run spread over K, joined
    afterwards with ``--merge``); ``widths``: only those of :func:`widths_only`.
    """
    from leettriton.autotune import KERNELS

    done = {_key(r): r for r in (done or [])}
    rows, dropped, stopped = [], {}, False
    for dt, dec, heads, r, d, batch, n in planned_shapes(quick, dtypes, shard, widths):
        series = (dt, dec, heads, r, d, batch)
        if (dt, dec, heads, r, d, batch, n) in done:
            row = done[(dt, dec, heads, r, d, batch, n)]
            rows.append(row)
            timed = {m: t for m, t in row["times_ms"].items() if t is not None}
            dropped.setdefault(series, set()).update(m for m, t in timed.items()
                                                      if t > SLOWER_TO_DROP * row["best_ms"])
            continue
        if stopped:
            continue  # past the time limit: the kept rows of later shapes are still kept
        if deadline is not None and time.time() > deadline:
            print(f"time limit reached before {dt} decay={dec} {batch}×{heads}×{n} r={r} d={d}: rerun with --resume",
                  flush=True)
            stopped = True
            continue
        dtype = getattr(torch, dt)
        shape_start = time.time()
        b, c, v = make_inputs(batch, heads, n, r, d, dtype, "cuda", seed=n)
        gamma = decay_gammas(heads, "cuda") if dec else None
        chosen, chosen_configs = leettriton.plan.choose(leettriton.problem.make_problem(b, c, v, gamma)[0])
        times = {}
        os.environ["LEETTRITON_AUTOTUNE"] = "1"
        for kernel in KERNELS.values():
            kernel.cache.clear()          # every method tunes itself at this shape
        for m in methods:
            if m in dropped.get(series, ()):
                times[m] = None
                continue
            try:
                times[m] = time_ms(lambda: leettriton.linear_attention(b, c, v, gamma, method=m), rep_ms=50,
                                   max_call_ms=2000)[0]
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                times[m] = None
        sweep_s = time.time() - shape_start      # each method's autotuning at this shape and its time
        timed = {m: t for m, t in times.items() if t is not None}
        swept = min(timed, key=timed.get)
        dropped.setdefault(series, set()).update(m for m, t in timed.items() if t > SLOWER_TO_DROP * timed[swept])
        # the methods near the sweep's best, tuned at this shape as the tuner tunes a point, and auto, timed
        # again in alternating rounds
        contenders = sorted(m for m, t in timed.items() if t <= CONTENDER * timed[swept])
        rounds, contender_configs, timing = contender_rounds(b, c, v, gamma, contenders,
                                                             auto_plan=(chosen, chosen_configs))
        t_auto = rounds.pop(AUTO)
        best = min(rounds, key=rounds.get)
        row = dict(dtype=dt, decay=dec, bh=batch * heads, batch=batch, heads=heads, n=n, r=r, d=d, auto_ms=t_auto,
                   auto_method=chosen, best_method=best, best_ms=rounds[best], ratio=t_auto / rounds[best],
                   times_ms=times, rounds_ms=rounds, rounds_timing=timing, auto_configs=_plain(chosen_configs),
                   best_configs=_plain(contender_configs[best]))
        rows.append(row)
        # the rounds' times, of which the ratio is made (the sweep's, timed[best], differed by up to 9% on an H100)
        print(f"{dt} decay={dec} {batch}×{heads}×{n} r={r} d={d}: auto={t_auto:.3f} ms ({chosen}), "
              f"best {best}={rounds[best]:.3f} ms, ratio {row['ratio']:.2f} "
              f"({time.time() - shape_start:.0f} s: the sweep of {len(timed)} methods {sweep_s:.0f} s)", flush=True)
        del b, c, v
        if save is not None:
            save(rows)
    return rows


def cold_start(n1: int, n2: int, timeout: float = 420):
    results = {}
    for which in ("auto", "fla_chunk_simple_gla"):
        if which != "auto":
            try:
                __import__("fla.ops.simple_gla")
            except ImportError:
                results[which] = {"note": "flash-linear-attention not installed"}
                continue
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            env.pop("LEETTRITON_AUTOTUNE", None)
            try:
                res = subprocess.run([sys.executable, "-c", COLD_SNIPPET, which, str(n1), str(n2)], env=env,
                                     capture_output=True, text=True, timeout=timeout)
                line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
                results[which] = json.loads(line[0][7:]) if line else {"note": res.stderr[-500:]}
            except subprocess.TimeoutExpired:
                results[which] = {"note": f"more than {timeout:g} s"}
        print(f"cold start {which}: {results[which]}", flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="perf/results")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-start measurement")
    ap.add_argument("--cold-only", action="store_true", help="only the cold-start measurement (its own file)")
    ap.add_argument("--methods", default=",".join(BUILTIN_METHODS))
    ap.add_argument("--dtypes", default=None, help="comma-separated subset of float16,bfloat16,float32")
    ap.add_argument("--cold-timeout", type=float, default=420, help="seconds allowed to each cold-start process")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop before a shape once this long has passed")
    ap.add_argument("--resume", action="store_true", help="keep the shapes already in the output file")
    ap.add_argument("--shard", type=parse_shard, default=(0, 1), metavar="I/K",
                    help="measure only every K-th series of shapes from the I-th (one GPU's share; join with --merge)")
    ap.add_argument("--rd", type=parse_widths, default=None, metavar="RxD,...",
                    help="measure only the shapes of these widths (join with --merge)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="write one file of the rows of these runs (of one GPU model, e.g. one dtype per GPU) "
                         "to OUT/<gpu>/bench_auto; measures nothing")
    ap.add_argument("--warm-workers", type=int, default=0, metavar="N",
                    help="first compile, in N processes, the kernel variants the shapes left to measure launch")
    opts = ap.parse_args(argv)
    if opts.warm_workers < 0:
        ap.error("--warm-workers takes a number of processes, 0 (no warm) or more")
    if opts.merge:
        return merge(opts.merge, opts.out)
    if not torch.cuda.is_available():
        print("bench_auto: needs a CUDA device (auto is measured against the kernels on the GPU)")
        return 0
    start = time.time()
    env = environment("cuda")
    meta = dict(env, command="python perf/bench_auto.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                heuristics=getattr(leettriton.autotune.heuristics.active_heuristics(env["family"], leettriton.METHODS),
                                   "path", None))
    if opts.cold_only:
        cold = cold_start(3000, 5000, opts.cold_timeout)
        meta.update(cold_start=cold)
        path = os.path.join(opts.out, env["device_slug"], "bench_auto")
        common.write_run(path, meta, [], title="method='auto': cold start", tables=[_cold_entry(cold)],
                         replaces=_is_cold)
        print(_cold_table(cold))
        return 0
    name = "bench_auto" + (".quick" if opts.quick else "")
    path = os.path.join(opts.out, env["device_slug"], name)
    done = None
    if opts.resume and os.path.exists(path + ".json"):
        old = _sweep_run(path + ".json")
        if old["meta"].get("device") != env["device"]:
            raise SystemExit(f"--resume: {path}.json was measured on {old['meta'].get('device')}, not {env['device']}")
        done = old["rows"]
        print(f"resuming: {len(done)} shapes kept from {path}.json", flush=True)

    def save(rows, cold=None):
        within = sum(r["ratio"] <= 1.10 for r in rows)
        worst = max((r["ratio"] for r in rows), default=None)
        planned = planned_shapes(opts.quick, opts.dtypes.split(",") if opts.dtypes else None, opts.shard, opts.rd)
        meta.update(within_10pct=f"{within}/{len(rows)}", worst_ratio=worst, shapes_planned=len(planned),
                    dtypes=sorted({shape[0] for shape in planned}))
        if cold is not None:
            meta.update(cold_start=cold)
        common.write_run(path, meta, rows, title="method='auto' vs the best method", tables=_tables(rows, cold),
                         replaces=lambda run: not _is_cold(run))

    if opts.warm_workers:
        from leettriton.autotune import warm

        kept = {_key(row) for row in done or []}
        warm.compile_tasks(warm.cases_tasks(warm_cases(
            planned_shapes(opts.quick, opts.dtypes.split(",") if opts.dtypes else None, opts.shard, opts.rd),
            opts.methods.split(","), kept)), opts.warm_workers)
    rows = auto_vs_best(opts.quick, opts.methods.split(","), opts.dtypes.split(",") if opts.dtypes else None,
                        done=done, save=save, shard=opts.shard, widths=opts.rd,
                        deadline=None if opts.max_minutes is None else start + 60 * opts.max_minutes)
    cold = None if opts.no_cold else cold_start(3000, 5000, opts.cold_timeout)
    save(rows, cold)
    print(_table(rows, cold))
    return 0


def merge(paths, out: str) -> int:
    """One bench_auto file from the rows of several runs on the same GPU model (their shapes in
    :func:`shapes` order; a shape measured twice keeps the last run's row).  Each row records the commit
    its run measured (``git_sha``, kept from an earlier merge), the meta ``git_shas`` all of them."""
    runs = [_sweep_run(path) for path in paths]
    devices = {run["meta"].get("device") for run in runs}
    if len(devices) != 1:
        raise SystemExit(f"--merge: the runs were measured on different GPUs: {sorted(map(str, devices))}")
    # each row keeps the commit its run measured (a merged file may join runs of several commits)
    by_key = {_key(row): dict(row, git_sha=row.get("git_sha", run["meta"].get("git_sha")))
              for run in runs for row in run["rows"]}
    order = {key: i for i, key in enumerate(
        (dt, dec, heads, r, d, batch, n) for dt, dec, heads, r, d, batch, n in shapes(False, None))}
    rows = sorted(by_key.values(), key=lambda row: order.get(_key(row), len(order)))
    meta = dict(runs[-1]["meta"], command=" ; ".join(run["meta"].get("command", "?") for run in runs)
                + " ; python perf/bench_auto.py --merge " + " ".join(paths))
    # the shapes a full run of the merged dtypes plans (runs of one dtype each add up to it; a run that
    # measures again shapes of another must not count them twice)
    dtypes = sorted({dt for run in runs for dt in run["meta"].get("dtypes") or []}
                    | {row["dtype"] for run in runs for row in run["rows"]})
    meta.update(git_shas=sorted({str(row["git_sha"]) for row in rows}),
                within_10pct=f"{sum(r['ratio'] <= 1.10 for r in rows)}/{len(rows)}",
                worst_ratio=max((r["ratio"] for r in rows), default=None),
                shapes_planned=len(shapes(False, dtypes)), dtypes=dtypes)
    cold = next((run["meta"]["cold_start"] for run in runs if run["meta"].get("cold_start")), None)
    path = os.path.join(out, meta["device_slug"], "bench_auto")
    common.write_run(path, meta, rows, title="method='auto' vs the best method", tables=_tables(rows, cold),
                     replaces=lambda run: not _is_cold(run))
    print(_table(rows, cold))
    return 0


def _is_cold(run: dict) -> bool:
    """Whether a run of a bench_auto file is a ``--cold-only`` run (kept beside the sweep, not resumed)."""
    return "--cold-only" in run["meta"].get("command", "")


def _sweep_run(path: str) -> dict:
    """The sweep run of a bench_auto file (the last run that is not ``--cold-only``)."""
    sweeps = [run for run in render.load(path) if not _is_cold(run)]
    if not sweeps:
        raise SystemExit(f"{path}: holds no bench_auto sweep (only --cold-only runs)")
    return sweeps[-1]


def _tables(rows, cold=None) -> list[dict]:
    """The run's tables (``common.write_run``'s entries): auto against the best, then the cold start."""
    within = sum(r["ratio"] <= 1.10 for r in rows)
    worst = max((r["ratio"] for r in rows), default=float("nan"))
    body = [[r["dtype"], r["decay"], f"{r['batch']} × {r['heads']}", f"{r.get('r', 128)} × {r.get('d', 128)}",
             r["n"], f"{r['auto_ms']:.3f}", r["auto_method"], r["best_method"], f"{r['best_ms']:.3f}",
             f"{r['ratio']:.2f}"] for r in rows]
    timings = collections.Counter(r.get("rounds_timing", "python call") for r in rows)
    text = (f"auto within 10% of the best on {within} of {len(rows)} shapes (target ≥ 90%); "
            f"worst ratio {worst:.2f} (target ≤ 1.5)\n\n"
            "rounds timed by " + ", ".join(f"{how} ({k} shapes)" for how, k in sorted(timings.items())))
    out = [{"title": None, "headers": ["dtype", "decay", "batch × heads", "r × d", "n", "auto (ms)", "auto's method",
                                       "best", "best (ms)", "auto / best"], "body": body, "text": text}]
    if cold:
        out.append(_cold_entry(cold))
    return out


def _cold_entry(cold) -> dict:
    body = [[which, f"{res['import_s']:.2f}", f"{res['first_call_s']:.2f}", f"{res['second_call_s']:.3f}"]
            if "first_call_s" in res else [which, str(res.get("note")), "", ""] for which, res in cold.items()]
    return {"title": "Cold start (fresh process, empty Triton cache), seconds", "text": "",
            "headers": ["", "import", "first call (n=3000)", "second call (n=5000)"], "body": body}


def _table(rows, cold=None) -> str:
    return render.render_tables(_tables(rows, cold), "##")


def _cold_table(cold) -> str:
    return render.render_tables([_cold_entry(cold)], "##")


if __name__ == "__main__":
    sys.exit(main())
