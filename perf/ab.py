"""A/B of this tree against a git revision: one benchmark command run before, after, before again; a ratio table.

    python perf/ab.py --base REV -- python perf/bench_chunked.py --shapes 1x8192,16x8192
    python perf/ab.py --base REV --out /tmp/ab -- python perf/bench_model_shapes.py --models retnet --seqlens 8192
    python perf/ab.py --base-tree .ab/before --base-label 3119bc7 -- python perf/bench_chunked.py --shapes 1x8192
    python perf/ab.py --base REV -- python -m leettriton.bench --methods auto --json {out}/bench.json

``--base REV`` checks REV out with ``git worktree add --detach`` (a ``git archive`` export where that fails, e.g.
a copy of the tree without its history) in a temporary folder, removed afterwards; ``--base-tree DIR`` takes a
tree already there (``git archive REV leettriton | tar -x -C DIR``).  The command runs three times, each in a
process of its own, with the tree measured first on ``PYTHONPATH`` and its working folder a fresh one (so no
other ``leettriton`` shadows it): the base ("before"), this tree ("after"), the base again ("before₂", the noise
between two runs of the same code).  The command is the same each time: paths in it are this tree's (the
current script measures both trees); ``{out}`` in it stands for the run's own folder, and a ``perf/`` script
without ``--out`` gets ``--out`` that folder.  Every row of every result file a run writes is matched to the
other runs' by its cell (:data:`KEYS` present in the row, or ``--keys``), and the table gives each cell's
``--metric`` (default ``median_ms``) before, after and before₂, after ÷ before and before₂ ÷ before.  ``--also REV``
(a revision or a tree on disk, repeatable) times more trees in the same run, between "after" and "before₂", each
with its own ratio to "before": candidates for one change compared on one machine at one time.  The table is
printed and written, with the rows, to ``<out>/ab.json`` through perf/common.py's writer
(``python perf/render.py`` renders it where ``<out>`` is a GPU's results folder).
"""
from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

PERF = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PERF)
sys.path.insert(0, PERF)
import render  # noqa: E402

KEYS = ("section", "model", "method", "dtype", "batch", "heads", "n", "r", "d", "decay")
SIDES = ("before", "after", "before2")


def _git(*args: str, cwd: str = ROOT) -> str:
    return subprocess.run(["git", "-C", cwd, *args], check=True, capture_output=True, text=True).stdout.strip()


def checkout(rev: str, where: str) -> tuple[str, str]:
    """REV's tree at ``where`` (a worktree, else an export) and how to remove it: ("worktree" | "export", sha)."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    try:
        _git("worktree", "add", "--detach", where, sha)
        return "worktree", sha
    except (OSError, subprocess.CalledProcessError):
        os.makedirs(where, exist_ok=True)
        archive = subprocess.run(["git", "-C", ROOT, "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
        return "export", sha


def side_command(command: Sequence[str], out: str) -> list[str]:
    """The command for one run: ``python`` this interpreter, this tree's paths made absolute, ``{out}`` replaced,
    ``--out`` added to a perf script that has none."""
    words = []
    for i, w in enumerate(command):
        if i == 0 and w in ("python", "python3"):
            w = sys.executable     # the interpreter running this script (its environment's torch, triton)
        w = w.replace("{out}", out)
        if not os.path.isabs(w) and os.path.exists(os.path.join(ROOT, w)) and ("/" in w or w.endswith(".py")):
            w = os.path.join(ROOT, w)
        words.append(w)
    script = next((w for w in words if w.startswith(PERF + os.sep) and w.endswith(".py")), None)
    if script and not any(w == "--out" or w.startswith("--out=") for w in words):
        words += ["--out", out]
    return words


def run_side(name: str, tree: str, command: Sequence[str], out: str, sha: str) -> int:
    """Run the command with ``tree`` first on PYTHONPATH, in ``out``; its output goes to ``<out>/console.log``."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p),
               LEETTRITON_GIT_SHA=sha, PYTHONUNBUFFERED="1")
    words = side_command(command, out)
    print(f"=== {name}: PYTHONPATH={tree} {' '.join(map(shlex.quote, words))}", flush=True)
    with open(os.path.join(out, "console.log"), "w") as log:
        proc = subprocess.run(words, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
    with open(os.path.join(out, "console.log")) as f:
        tail = f.read().splitlines()[-5:]
    print("\n".join(tail), flush=True)
    return proc.returncode


def side_rows(out: str) -> list[dict]:
    """Every row of every result file under ``out``."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "**", "*.json"), recursive=True)):
        try:
            runs = render.load(path)
        except (ValueError, KeyError):
            continue
        rows += [r for run in runs for r in run["rows"] if isinstance(r, dict)]
    return rows


def cell_key(row: dict, keys: Sequence[str]) -> tuple:
    return tuple((k, row[k]) for k in keys if k in row)


def ratio_rows(rows: dict[str, list[dict]], keys: Sequence[str], metric: str, also: Sequence[str] = ()) -> list[dict]:
    """One row per cell measured before and after: the metric of each side and the ratios to "before" (each
    ``also`` side's value and ratio under its label; None where that side did not measure the cell)."""
    by_side = {}
    for side, side_rows_ in rows.items():
        by_side[side] = {}
        for r in side_rows_:
            if isinstance(r.get(metric), (int, float)):
                by_side[side].setdefault(cell_key(r, keys), r[metric])
    out = []
    for key, before in by_side.get("before", {}).items():
        if key not in by_side.get("after", {}):
            continue
        after, before2 = by_side["after"][key], by_side.get("before2", {}).get(key)
        row = dict(key, before=before, after=after, before2=before2,
                   after_over_before=after / before if before else None,
                   before2_over_before=before2 / before if before and before2 is not None else None)
        for label in also:
            x = by_side.get(label, {}).get(key)
            row[label] = x
            row[f"{label}_over_before"] = x / before if before and x is not None else None
        out.append(row)
    return out


def ratio_table(ratios: Sequence[dict], keys: Sequence[str], metric: str, also: Sequence[str] = ()) -> dict:
    """The ratio table as a ``common.write_run`` table entry (``also``: the labels of the more trees)."""
    used = [k for k in keys if any(k in r for r in ratios)]

    def ratio(x):
        return f"{x:.3f}" if x is not None else "—"

    body = [[str(r.get(k, "")) for k in used]
            + [render.fmt_ms(r["before"]), render.fmt_ms(r["after"])]
            + [render.fmt_ms(r[a]) if r[a] is not None else "—" for a in also]
            + [render.fmt_ms(r["before2"]), ratio(r["after_over_before"])]
            + [ratio(r[f"{a}_over_before"]) for a in also]
            + [ratio(r["before2_over_before"])]
            for r in ratios]
    noise = [abs(r["before2_over_before"] - 1) for r in ratios if r["before2_over_before"] is not None]
    text = (f"{metric}; after ÷ before < 1: this tree is faster. before₂ ÷ before is the noise between two runs of "
            f"the same code" + (f" (here within ±{100 * max(noise):.1f}%)." if noise else "."))
    headers = [*used, "before", "after", *also, "before₂", "after ÷ before", *(f"{a} ÷ before" for a in also),
               "before₂ ÷ before"]
    return {"title": "A/B", "headers": headers, "body": body, "text": text}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("perf/ab.py: give the benchmark command after --, e.g. "
                         "python perf/ab.py --base HEAD~1 -- python perf/bench_chunked.py --shapes 1x8192")
    at = argv.index("--")
    command = argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    base = p.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", metavar="REV", help="the git revision to compare this tree with")
    base.add_argument("--base-tree", metavar="DIR", help="a tree of the earlier code already on disk")
    p.add_argument("--base-label", help="what to call --base-tree's code in the results (its commit)")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "leettriton-ab"),
                   help="folder of the three runs and ab.json (default: a temporary folder's leettriton-ab)")
    p.add_argument("--metric", default="median_ms", help="the row field compared (default median_ms)")
    p.add_argument("--keys", help=f"comma-separated row fields naming a cell (default those of {','.join(KEYS)} "
                                  "a row has)")
    p.add_argument("--no-second-before", action="store_true", help="run the base once (no noise estimate)")
    p.add_argument("--also", action="append", default=[], metavar="REV",
                   help="one more tree timed in the same run (a revision, or a folder holding a leettriton/); "
                        "repeatable")
    args = p.parse_args(argv[:at])
    if not command:
        raise SystemExit("perf/ab.py: the benchmark command after -- is empty")
    keys = args.keys.split(",") if args.keys else list(KEYS)
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    after_sha = _git("rev-parse", "HEAD") + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    tmp = tempfile.mkdtemp(prefix="leettriton-ab-base-")
    worktrees = []
    also = {}   # label → (tree, sha)
    try:
        if args.base:
            tree = os.path.join(tmp, "tree")
            kind, before_sha = checkout(args.base, tree)
            worktrees += [tree] if kind == "worktree" else []
        else:
            tree, before_sha = os.path.abspath(args.base_tree), args.base_label or "base-tree"
        for i, rev in enumerate(args.also):
            if os.path.isdir(rev):
                label, where, sha = os.path.basename(os.path.normpath(rev)), os.path.abspath(rev), rev
            else:
                where = os.path.join(tmp, f"also{i}")
                kind, sha = checkout(rev, where)
                worktrees += [where] if kind == "worktree" else []
                label = rev
            if label in SIDES or label in also:
                raise SystemExit(f"perf/ab.py: --also {rev}: the label {label!r} is taken")
            also[label] = (where, sha)
        sides = [*SIDES[:2], *also, *([] if args.no_second_before else SIDES[2:])]
        codes = {}
        for side in sides:
            if side in also:
                where, sha = also[side]
            elif side == "after":
                where, sha = ROOT, after_sha
            else:
                where, sha = tree, before_sha
            codes[side] = run_side(side, where, command, os.path.join(out, side), sha)
    finally:
        for where in worktrees:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", where], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = ratio_rows({side: side_rows(os.path.join(out, side)) for side in codes}, keys, args.metric, list(also))
    entry = ratio_table(ratios, keys, args.metric, list(also))
    print(render.render_tables([entry], "##"))
    if not ratios:
        print("no cell was measured by both trees (see each run's console.log)")
    import common      # torch and leettriton (this tree's) only now: the runs above are processes of their own

    from leettriton import bench

    meta = dict(bench.environment(), command="python perf/ab.py " + " ".join(map(shlex.quote, argv)),
                base=args.base or args.base_tree, base_sha=before_sha, git_sha=after_sha,
                also={label: sha for label, (_, sha) in also.items()}, exit_codes=codes)
    print("wrote", common.write_run(os.path.join(out, "ab"), meta, ratios, title="A/B", tables=[entry]))
    return 0 if ratios and all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
