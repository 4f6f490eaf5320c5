"""``python -m leettriton.tune --gpu <family>``: measure every method and write the heuristic file.

On the current GPU, for every point of a grid (dtype × decay × (r, d) ×
batch·heads × n) every Triton method runs at its best config (each kernel
autotuned for the point) and is timed; the winner, every method's time and
config, and how it was measured go to ``leettriton/autotune/heuristics/<family>.json``
(or ``--out``).  The file is rewritten after every point, so an interrupted run
resumes where it stopped (``--restart`` starts over); ``--max-minutes`` stops
cleanly after that long, and ``--dtypes`` / ``--methods`` shard the work.

Each point records the code and date it was measured with (``"measured"``: git SHA,
date, torch and triton versions).  ``--remeasure`` measures again every point of
the selected grid that was measured with other code than the current commit (and
keeps the file's other points): after a kernel change, the same command brings
the grid up to date, and rerun after an interruption it resumes.  A point measured
again also times each method at the configs the file held for it, and keeps them
where they are faster than this run's tuning (marked ``*`` in the point's line).
With ``--prune F`` it also leaves out, at each point, the methods the file recorded
there as more than F times slower than the point's fastest, or did not run there
(their times null, their names under the point's ``"pruned"``; later ``--prune`` runs
keep them out too).  ``--keep SHA,...`` counts the points measured with those commits as done too: a
re-measure that spans sessions, with only the tuner changed between them, goes on where it stopped.

    python -m leettriton.tune --gpu h100 --quick            # a few minutes
    python -m leettriton.tune --gpu h100 --dtypes float16    # one shard of the full grid
    python -m leettriton.tune --gpu h100 --rd 128x128 --bh 8,32,128 --n 1024,4096   # a grid of one's own
    python -m leettriton.tune --gpu h100 --quick --remeasure  # the quick grid's points, on today's code
    python -m leettriton.tune --gpu h100 --remeasure --recorded-only --dtypes float16   # the file's float16 points
    python -m leettriton.tune --gpu h100 --remeasure --recorded-only --prune 2   # every point, not its 2x losers

Shards measured side by side on several GPUs of one host each write their own file (``--out``);
``--merge`` then takes their points into the family's file, without measuring anything:

    python -m leettriton.tune --gpu h100 --merge /tmp/shard0.json /tmp/shard1.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from typing import Optional

import torch

from . import registry
from .methods import BUILTIN_METHODS
from .plan import run_problem
from .problem import MAX_DIM, make_problem
from .autotune import KERNELS, chosen_configs, current_family, in_family, recording
from .autotune.families import FAMILIES
from .autotune.heuristics import FORMAT, default_path
from .bench.inputs import decay_gammas
from .bench.timing import graph_replay

GRIDS = {
    "full": dict(dtype=["float16", "bfloat16", "float32"], decay=[True, False],
                 rd=[[64, 64], [128, 128], [256, 256]], bh=[8, 32, 128, 512],
                 n=[64, 256, 1024, 4096, 16384, 65536, 131072]),
    "quick": dict(dtype=["float16", "bfloat16", "float32"], decay=[True, False], rd=[[128, 128]],
                  bh=[32, 512], n=[128, 1024, 8192, 65536]),
}
SLOWER_THAN_BEST_TO_DROP = 10.0  # a method this many times slower than the best is not run at larger n
MEMORY_FRACTION = 0.45           # points whose inputs and output would exceed this share of memory are skipped
DEVICE = "cuda"                  # where the points run (the tests' stand-in runs them on the CPU)
TIMING = "graph replay"          # how a method's whole call is timed (:func:`_whole_call_ms`), recorded per point


def _point_key(p) -> tuple:
    return (p["dtype"], bool(p["decay"]), p["r"], p["d"], p["bh"], p["n"])


def _git_sha() -> str:
    """The commit measured: ``LEETTRITON_GIT_SHA`` when set (a tree copied to a GPU machine without, or
    with stale, git metadata), else git's, else "unknown"."""
    if os.environ.get("LEETTRITON_GIT_SHA"):
        return os.environ["LEETTRITON_GIT_SHA"][:7]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def time_method(method, b, c, v, gamma, retune: bool, recorded: Optional[dict] = None):
    """(median ms, {kernel space: config}, whether ``recorded`` won) of one method, each kernel autotuned
    for this shape; then of each of the method's alternatives (``Method.alternatives``: configs pinned
    with their own schedule, the method's other kernels autotuned afresh under it, but for launches
    their autotuners met at this point already: :func:`_tuned_reusing`); then of ``recorded``
    (the configs the file holds for this method at this point, when measured again), pinned, where every
    one of them is still of its kernel's configs on this family; keeping the fastest; then, for each
    kernel of ``Method.whole_call`` that ran, each of its other configs pinned beside the chosen ones and
    timed in the whole call (:func:`_refined`).

    The recorded configs are timed because a retune can choose configs that run slower in the whole call
    than the ones the file held (the autotuner ranks each kernel timed alone): measured again, a point keeps
    the faster of the two (docs/design.md §5.5)."""
    p, _ = make_problem(b, c, v, gamma)
    spec = registry.builtin(method)
    family = current_family(p.v.device)
    chosen: dict = {}   # (kernel space, its launches' signature) -> the config its autotuner chose for them
    ms, config, launched = _tuned(p, method, {}, clear=retune, chosen=chosen if retune else None)
    guess = {k: cfg for k, cfg in config.items() if k in launched}
    for alternative in spec.alternatives(p, family):
        # the other kernels' choices depend on the schedule (a segment-state kernel on the segment count):
        # tuned afresh, but for launches their autotuners have met already at this point (_tuned_reusing)
        alt_ms, alt_config, alt_launched = _tuned_reusing(p, method, alternative, chosen, guess)
        guess = {k: cfg for k, cfg in alt_config.items() if k in alt_launched and k not in alternative}
        if alt_ms < ms:
            ms, config, launched = alt_ms, alt_config, alt_launched
    won = False
    if recorded and recorded_in_family(recorded, family):
        rec_ms, rec_config, rec_launched = _tuned(p, method, recorded, clear=True)
        if rec_ms < ms:
            ms, config, launched, won = rec_ms, rec_config, rec_launched, True
    ms, config = _refined(p, method, spec.whole_call, family, ms, config, launched)
    return ms, config, won


def pruned_methods(point: dict, factor: float) -> set:
    """The methods ``--prune factor`` leaves out when ``point`` (as the file holds it) is measured again: those
    it timed at more than ``factor`` × its fastest, and those whose time it holds as null (not run there:
    pruned before, or 10× slower at a smaller n of its series, or out of memory).  A method the point
    does not name at all was not asked for when it was measured, and is measured."""
    times = point.get("times_ms", {})
    timed = {m: t for m, t in times.items() if t is not None}
    fastest = min(timed.values(), default=None)
    slow = {m for m, t in timed.items() if t > factor * fastest}
    return slow | {m for m, t in times.items() if t is None} | set(point.get("pruned", ()))


def recorded_in_family(configs: dict, family) -> bool:
    """Whether every config of ``configs`` ({kernel space name: config}, as a heuristic file records them)
    is one of its kernel's configs on ``family`` (a file measured with other kernels may hold others)."""
    return all(name in KERNELS and in_family(KERNELS[name].space, cfg, family) for name, cfg in configs.items())


def _refined(p, method: str, spaces, family, ms: float, config: dict, launched: dict):
    """(ms, configs) after timing, for each space of ``spaces`` whose kernel ran (``launched``: space name
    → the named arguments of its launch), every other config of that space that fits the launch in the
    whole call, with ``config``'s others pinned; the fastest is kept.

    An autotuner times its kernel alone, on its own inputs, after the launches before it.  In the
    whole call a kernel also shares the GPU with its neighbours' tails and finds their data in L2, so
    block_based's segment-state pass has tiles that tie timed alone and differ in the whole call
    (docs/design.md §5.5)."""
    for space in spaces:
        args = launched.get(space.name)
        if args is None:
            continue
        timed = config.get(space.name)   # timed already, in the call that chose it
        for cfg in space.usable(family, args):
            if cfg == timed:
                continue
            trial = {**config, space.name: cfg}
            trial_ms = _whole_call_ms(p, method, trial)
            if trial_ms < ms:
                ms, config = trial_ms, trial
    return ms, config


def _whole_call_ms(p, method: str, config: dict) -> float:
    """Median ms of ``method``'s kernels on ``p`` with every kernel's config pinned (as ``auto`` launches
    them): the replay of the call's CUDA graph (:func:`~leettriton.bench.timing.graph_replay`, whose capture
    runs the call once first, compiling what has not been), timed by ``do_bench`` (L2 cleared before each
    replay), as ``perf/bench_auto.py`` times ``auto`` and the methods it is checked against.

    The kernels' time, not the host's: timed from Python, a short call takes the host's time, which swings
    with the host's load between runs, and the fastest method there would be the host's choice
    (docs/design.md §5.5).  A call that cannot be captured raises (no method's call on a rectangular problem reads a device value on the host)."""
    from triton.testing import do_bench

    replay = graph_replay(lambda: run_problem(p, method, config))
    return do_bench(replay, warmup=10, rep=40, return_mode="median")


def _tuned(p, method: str, pinned: dict, clear: bool, chosen: Optional[dict] = None, signatures=None):
    """(median ms, configs, launched) of ``method`` on ``p`` with the ``pinned`` configs and every other
    kernel autotuned (afresh with ``clear``), timed exactly as ``auto`` will launch them: all configs
    pinned.  ``launched``: {kernel space name: the named arguments of its first launch}.

    ``chosen`` (with ``clear``) learns, for each kernel its autotuner tuned here, ``(space name, signature of
    its launches) -> config``; ``signatures`` (a dict) gets {space name: that signature} for every kernel
    that ran (:func:`_signature`)."""
    if clear:
        for kernel in KERNELS.values():
            kernel.cache.clear()
    with recording() as log:
        run_problem(p, method, pinned or None)   # tunes (first meeting of this key) and compiles
    torch.cuda.synchronize()
    config = {**chosen_configs(log), **pinned}
    launched, launches = {}, {}
    for kernel, args in log:
        launched.setdefault(kernel.space.name, args)
        launches.setdefault(kernel.space.name, []).append(args)
    sig = {name: _signature(all_args) for name, all_args in launches.items()}
    if signatures is not None:
        signatures.update(sig)
    if chosen is not None and clear:
        chosen.update({(name, sig[name]): config[name] for name in launched
                       if name not in pinned and name in config})
    return _whole_call_ms(p, method, config), config, launched


def _signature(launches: list) -> tuple:
    """What an autotuner's choice for one kernel in one call depends on: the named arguments of each of its
    launches, tensors by dtype, shape and strides (not their addresses), everything else by value."""
    def value(x):
        if isinstance(x, torch.Tensor):
            return ("tensor", str(x.dtype), tuple(x.shape), tuple(x.stride()))
        if isinstance(x, (list, tuple)):
            return tuple(value(y) for y in x)
        return x if isinstance(x, (int, float, bool, str, type(None))) else repr(x)
    return tuple(tuple((k, value(args[k])) for k in sorted(args)) for args in launches)


def _tuned_reusing(p, method: str, pinned: dict, chosen: dict, guess: dict):
    """:func:`_tuned` of ``pinned`` (an alternative) with every other kernel autotuned afresh, where a kernel
    whose launches match ones its autotuner met before at this point is given that choice instead of being
    tuned again (``chosen``, as :func:`_tuned` learns it).

    Which launches an alternative makes shows only once it runs: it first runs with ``guess`` (the last
    alternative's choices) pinned beside it, the kernels not in ``guess`` autotuned.  Where every guessed
    kernel's launches have that very choice in ``chosen`` the run stands; otherwise it runs again with the
    choices ``chosen`` holds for the launches it made, the others autotuned, and where that does not stand
    either, as :func:`_tuned` alone.  The result is what ``_tuned(p, method, pinned, clear=True)`` measures,
    without timing a kernel's configs again for launches they were timed for (the segment-state kernel of
    ``block_based``: the same segments for most walk configs)."""
    guess = {k: cfg for k, cfg in guess.items() if k not in pinned}
    for _ in range(2):
        signatures: dict = {}
        ms, config, launched = _tuned(p, method, {**guess, **pinned}, clear=True, chosen=chosen,
                                      signatures=signatures)
        if all(chosen.get((k, signatures[k])) == cfg for k, cfg in guess.items() if k in launched):
            return ms, {k: cfg for k, cfg in config.items() if k not in guess or k in launched}, launched
        guess = {k: chosen[(k, sig)] for k, sig in signatures.items() if k not in pinned and (k, sig) in chosen}
    return _tuned(p, method, pinned, clear=True, chosen=chosen)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"--{what} must be comma-separated positive integers, got {text!r}")
    return sorted(set(values))


def point_batch_heads(bh: int) -> tuple[int, int]:
    """(batch, heads) a point of ``bh`` batch·heads runs as: the most heads that divide it, up to 32 (the
    full grid's batch·heads are powers of two: 32 heads × batch from 32 on; 48 runs as 3 × 16, as
    ``perf/bench_auto.py``'s shapes of 16 heads do)."""
    heads = math.gcd(bh, 32)
    return bh // heads, heads


def select_grid(opts) -> dict:
    """The grid to measure: ``--quick`` or the full one, with ``--dtypes``, ``--bh``, ``--n`` and ``--rd``
    (each a comma-separated list) replacing that axis.  Raises ValueError for a malformed list."""
    grid = dict(GRIDS["quick" if opts.quick else "full"])
    if opts.dtypes:
        grid["dtype"] = [x for x in opts.dtypes.split(",") if x]
        unknown = sorted(set(grid["dtype"]) - set(GRIDS["full"]["dtype"]))
        if unknown or not grid["dtype"]:
            raise ValueError(f"--dtypes must name float16, bfloat16 or float32, got {opts.dtypes!r}")
    if getattr(opts, "bh", None):
        grid["bh"] = _ints(opts.bh, "bh")
    if getattr(opts, "n", None):
        grid["n"] = _ints(opts.n, "n")
    if getattr(opts, "decay", None):
        grid["decay"] = {"both": [True, False], "yes": [True], "no": [False]}[opts.decay]
    if getattr(opts, "rd", None):
        pairs = []
        for item in opts.rd.split(","):
            parts = item.lower().split("x")
            if len(parts) != 2 or not all(x.strip().isdigit() and 1 <= int(x) <= MAX_DIM for x in parts):
                raise ValueError(f"--rd must be comma-separated RxD pairs with R, D in 1..{MAX_DIM}, got {opts.rd!r}")
            pairs.append([int(parts[0]), int(parts[1])])
        grid["rd"] = pairs
    return grid


def recorded_grid(grid: dict, points: list, opts) -> dict:
    """``grid`` with each axis not given on the command line (``--dtypes``, ``--bh``, ``--n``, ``--rd``) replaced
    by the values of ``points`` on it (``--recorded-only``: a file's points measured again need no list of its
    axes; ``--decay`` defaults to both)."""
    given = {"dtype": opts.dtypes, "bh": getattr(opts, "bh", None), "n": getattr(opts, "n", None),
             "rd": getattr(opts, "rd", None)}
    grid = dict(grid)
    for axis, values in given.items():
        if not values:
            if axis == "rd":
                grid[axis] = [list(x) for x in sorted({(p["r"], p["d"]) for p in points})]
            else:
                grid[axis] = sorted({p[axis] for p in points})
    return grid


def _read_doc(path: str, family: str) -> dict:
    """A heuristic file's document; ValueError when it is not one of ``family``."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("family") != family:
        raise ValueError(f"{path} is not a {family} heuristic file (format {FORMAT!r})")
    return doc


def merge(out: str, family: str, shards: list) -> int:
    """Take the points of ``shards`` (heuristic files of ``family``) into ``out``: a shard's point replaces the
    output's point of the same key unless that one was measured later (:func:`_measured_at`; a tie goes to
    the shard), the grids are united, and the output's ``"measured"`` becomes the latest run's of the output
    and the shards (each point keeps its own).  Every shard is read before anything is written.

    Newer wins, not the order of the files: a file that a GPU call wrote from a copy of the family's file
    holds that copy's points beside its own, and joining several such files must keep each call's own
    measurements, whatever the order they are named in."""
    try:
        docs = [_read_doc(path, family) for path in shards]
        doc = _read_doc(out, family) if os.path.exists(out) else None
    except (OSError, ValueError) as e:
        print(f"leettriton.tune: {e}", file=sys.stderr)
        return 2
    if doc is None:
        doc = {"format": FORMAT, "family": family, "measured": {}, "grid": {}, "points": []}
    for path, shard in zip(shards, docs):
        held = {_point_key(p): p for p in doc["points"]}
        taken = {_point_key(p): p for p in shard["points"]
                 if _point_key(p) not in held or _measured_at(p) >= _measured_at(held[_point_key(p)])}
        doc["points"] = [p for k, p in held.items() if k not in taken] + list(taken.values())
        axes = list(doc["grid"]) + [k for k in shard.get("grid", {}) if k not in doc["grid"]]
        doc["grid"] = {k: [json.loads(x) for x in sorted({json.dumps(v) for v in doc["grid"].get(k, [])
                                                            + shard.get("grid", {}).get(k, [])})] for k in axes}
        if _measured_at(shard) >= _measured_at(doc):
            doc["measured"] = shard["measured"]
        kept = len(shard["points"]) - len(taken)
        print(f"{path}: {len(taken)} of its {len(shard['points'])} points taken"
              + (f" ({kept} measured before the file's own)" if kept else ""), flush=True)
    _save(out, doc)
    print(f"wrote {out} ({len(doc['points'])} points)", flush=True)
    return 0


def _warm(workers: int, cases: list) -> None:
    """Compile the kernel variants and configs of ``cases`` (:func:`leettriton.autotune.warm.cases_tasks`) in
    ``workers`` processes before the first point: a point's autotuners otherwise compile each config of a
    variant they have not met (the segmented walk, each size class of the segment-state pass) one by one, in
    the point's time, so the first segmented point of each series would take several times the others
    (docs/design.md §5.5)."""
    from .autotune import warm

    warm.compile_tasks(warm.cases_tasks(cases), workers)


def _measured_at(entry: dict) -> str:
    """When a point (or a file's last run) was measured, as its ``"measured"`` record's date
    ("YYYY-MM-DD HH:MM UTC", which sorts as it reads); "" (before any) where it records none."""
    return str((entry.get("measured") or {}).get("date") or "")


def _save(path: str, doc: dict) -> None:
    """Write ``doc`` with its points in the order of their keys (dtype, decay, r, d, batch·heads, n): a point
    measured again stays where it was, so a retune's diff shows the points that changed and no others
    (the lookup does not depend on the order: ``Heuristics.lookup``)."""
    doc = dict(doc, points=sorted(doc["points"], key=_point_key))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    """The command (``python -m leettriton.tune --help``); 0 when done, 2 when refused.  It measures with
    autotuning on (``LEETTRITON_AUTOTUNE=1``) and gives the calling process its own setting back on return."""
    before = os.environ.get("LEETTRITON_AUTOTUNE")
    try:
        return _main(argv)
    finally:   # left on, every later call of a process that called main (a notebook, a test) would tune again
        if before is None:
            os.environ.pop("LEETTRITON_AUTOTUNE", None)
        else:
            os.environ["LEETTRITON_AUTOTUNE"] = before


def _main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m leettriton.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, choices=[f for f in FAMILIES if f != "cpu"],
                    help="the family to measure; must be the GPU this runs on")
    ap.add_argument("--quick", action="store_true", help="the small grid (a few minutes)")
    ap.add_argument("--dtypes", help="comma-separated subset of the grid's dtypes")
    ap.add_argument("--bh", help="comma-separated batch·heads values, in place of the grid's")
    ap.add_argument("--n", help="comma-separated sequence lengths, in place of the grid's")
    ap.add_argument("--rd", help="comma-separated RxD pairs (e.g. 128x128,64x64), in place of the grid's")
    ap.add_argument("--decay", choices=["both", "yes", "no"], default="both",
                    help="points with decay, without, or both (default)")
    ap.add_argument("--methods", default=",".join(BUILTIN_METHODS), help="comma-separated methods to measure")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long")
    ap.add_argument("--out", help="where to write (default: the packaged file of the family)")
    ap.add_argument("--restart", action="store_true", help="ignore points already in the output file")
    ap.add_argument("--remeasure", action="store_true",
                    help="measure again the grid's points that were measured with other code than this commit")
    ap.add_argument("--recorded-only", action="store_true",
                    help="measure only the grid's points the file holds already (with --remeasure: a sparse file "
                         "measured again, no point added)")
    ap.add_argument("--prune", type=float, default=None, metavar="F",
                    help="with --remeasure: at each point, leave out the methods the file recorded there as more "
                         "than F times slower than its fastest, or did not run there (F > 1)")
    ap.add_argument("--keep", metavar="SHA[,SHA...]",
                    help="with --remeasure: keep the points measured with these commits too (their kernels "
                         "those of this one), measuring the others")
    ap.add_argument("--warm-workers", type=int, default=0, metavar="N",
                    help="first compile, in N processes, the kernel variants the points to measure launch "
                         "(leettriton.autotune.warm), rather than one by one as each point meets them")
    ap.add_argument("--no-retune", action="store_true",
                    help="autotune each kernel once per (dtype, flags, r, d) instead of once per point")
    ap.add_argument("--merge", nargs="+", metavar="FILE",
                    help="take the points of these files (shards written with --out) into the output, the later "
                         "measured of each point kept; measures nothing")
    opts = ap.parse_args(argv)

    if opts.merge:
        return merge(opts.out or default_path(opts.gpu), opts.gpu, opts.merge)
    if opts.recorded_only and opts.restart:
        ap.error("--recorded-only measures the points the file holds; --restart ignores them")
    if opts.warm_workers < 0:
        ap.error("--warm-workers takes a number of processes, 0 (no warm) or more")
    if opts.prune is not None and not (opts.remeasure and opts.prune > 1):
        ap.error("--prune F needs --remeasure (it reads the file's times of each point) and F > 1")
    keep = [x.strip() for x in (opts.keep or "").split(",") if x.strip()]
    if opts.keep is not None and not (opts.remeasure and keep):
        ap.error("--keep SHA[,SHA...] needs --remeasure and at least one commit")
    if not torch.cuda.is_available():
        print("leettriton.tune: no CUDA device: the heuristic file must be measured on the GPU it is for",
              file=sys.stderr)
        return 2
    family = current_family()
    device_name = torch.cuda.get_device_name()
    if family.name != opts.gpu:
        print(f"leettriton.tune: refusing to write the {opts.gpu!r} heuristic file on this {device_name}, "
              f"which is of the {family.name!r} family: run it on a {opts.gpu} GPU, or pass --gpu {family.name}",
              file=sys.stderr)
        return 2
    os.environ["LEETTRITON_AUTOTUNE"] = "1"  # the tuner measures each method at its best config (until main returns)

    try:
        grid = select_grid(opts)
    except ValueError as e:
        ap.error(str(e))
    methods = [m for m in opts.methods.split(",") if m]
    out = opts.out or default_path(family.name)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    doc = None
    if os.path.exists(out) and not opts.restart:
        with open(out) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT or doc.get("family") != family.name:
            print(f"leettriton.tune: {out} is not a {family.name} heuristic file; use --restart or --out",
                  file=sys.stderr)
            return 2
    if doc is None:
        doc = {"format": FORMAT, "family": family.name, "measured": {}, "grid": {}, "points": []}
    if opts.recorded_only:
        grid = recorded_grid(grid, doc["points"], opts)
    sha = _git_sha()
    doc["measured"] = {
        "device": device_name, "torch": torch.__version__, "triton": __import__("triton").__version__,
        "cuda": torch.version.cuda, "git_sha": sha, "timing": TIMING,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m leettriton.tune " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    # what each point records of how it was measured (the file's "measured" is the last run's)
    provenance = {k: doc["measured"][k] for k in ("git_sha", "date", "device", "torch", "triton", "timing")}
    merged = {k: sorted({json.dumps(x) for x in doc["grid"].get(k, []) + grid[k]}) for k in grid}
    doc["grid"] = {k: [json.loads(x) for x in v] for k, v in merged.items()}
    done = {_point_key(p): p for p in doc["points"]}
    # each point's configs as the file holds them: a point measured again times them too (time_method)
    recorded_configs = {k: p.get("configs", {}) for k, p in done.items()}
    pruned_at = {k: pruned_methods(p, opts.prune) for k, p in done.items()} if opts.prune else {}
    if opts.remeasure:   # only the points measured with this very commit (or one of --keep's) count as done
        current = {sha} - {"unknown"} | set(keep)
        done = {k: p for k, p in done.items() if p.get("measured", {}).get("git_sha") in current}

    total_mem = torch.cuda.get_device_properties(0).total_memory if DEVICE == "cuda" else 1 << 40
    start = time.time()
    series = [(dt, dec, rd, bh) for dt in grid["dtype"] for dec in grid["decay"] for rd in grid["rd"]
              for bh in grid["bh"]]
    held = {_point_key(p) for p in doc["points"]}   # the points the file holds (--recorded-only measures no others)
    todo = sum(not opts.recorded_only or (dt, dec, r, d, bh, n) in held
               for dt, dec, (r, d), bh in series for n in grid["n"])
    if opts.warm_workers:
        _warm(opts.warm_workers, [(m, dt, r, d, dec, False, False, *point_batch_heads(bh), n)
                                  for dt, dec, (r, d), bh in series for n in grid["n"]
                                  if (dt, dec, r, d, bh, n) not in done
                                  and (not opts.recorded_only or (dt, dec, r, d, bh, n) in held)
                                  for m in methods if m not in pruned_at.get((dt, dec, r, d, bh, n), ())])
    count = 0
    for dt, dec, (r, d), bh in series:
        dropped: set[str] = set()
        batch, heads = point_batch_heads(bh)
        for n in grid["n"]:
            key = (dt, dec, r, d, bh, n)
            if opts.recorded_only and key not in held:
                continue
            count += 1
            if key in done:   # measured already: its losers are not run at larger n either
                timed = {m: t for m, t in done[key].get("times_ms", {}).items() if t is not None}
                if timed:
                    fastest = min(timed.values())
                    dropped |= {m for m, t in timed.items() if t > SLOWER_THAN_BEST_TO_DROP * fastest}
                continue
            if opts.max_minutes is not None and time.time() - start > 60 * opts.max_minutes:
                print(f"stopping after {opts.max_minutes} minutes; rerun the same command to resume", flush=True)
                return 0
            dtype = getattr(torch, dt)
            point = {"dtype": dt, "decay": dec, "r": r, "d": d, "bh": bh, "n": n, "best": None, "config": {},
                     "times_ms": {}, "configs": {}, "measured": provenance}
            pruned = [m for m in methods if m in pruned_at.get(key, ())]
            if pruned:
                point["pruned"] = pruned
            kept: set[str] = set()   # methods whose recorded configs beat this run's tuning (marked * below)
            need = batch * heads * n * (2 * r + 2 * d) * dtype.itemsize
            if need > MEMORY_FRACTION * total_mem:
                point["note"] = "skipped: inputs exceed the memory budget"
            else:
                g = torch.Generator(device=DEVICE).manual_seed(n)
                b, c = (torch.randn(batch, heads, n, r, device=DEVICE, dtype=dtype, generator=g) for _ in range(2))
                v = torch.randn(batch, heads, n, d, device=DEVICE, dtype=dtype, generator=g)
                gamma = decay_gammas(heads, DEVICE) if dec else None
                for method in methods:
                    if method in dropped or method in pruned:
                        point["times_ms"][method] = None
                        continue
                    recorded = recorded_configs.get(key, {}).get(method)
                    try:
                        ms, config, won = time_method(method, b, c, v, gamma, retune=not opts.no_retune,
                                                       recorded=recorded)
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        ms, config, won = None, {}, False
                    point["times_ms"][method] = ms
                    point["configs"][method] = config
                    if won:
                        kept.add(method)
                timed = {m: t for m, t in point["times_ms"].items() if t is not None}
                if timed:
                    best = min(timed, key=timed.get)
                    point["best"], point["config"] = best, point["configs"][best]
                    dropped |= {m for m, t in timed.items() if t > SLOWER_THAN_BEST_TO_DROP * timed[best]}
                del b, c, v
            doc["points"] = [p for p in doc["points"] if _point_key(p) != key] + [point]
            _save(out, doc)
            times = " ".join(f"{m}={t:.3f}{'*' if m in kept else ''}" if t is not None else f"{m}=-"
                             for m, t in point["times_ms"].items())
            print(f"[{count}/{todo}] {dt} decay={dec} r={r} d={d} bh={bh} n={n}: best {point['best']}  {times}  "
                  f"({time.time() - start:.0f} s)", flush=True)
    print(f"wrote {out} ({len(doc['points'])} points)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
