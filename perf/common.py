"""Plumbing shared by the perf scripts: arguments, the result folder, the one writer of result data.

Every benchmark writes its run to ``perf/results/<gpu>/<name>.json`` through :func:`write_run` (``--out
DIR`` replaces ``perf/results``; ``<gpu>`` is a slug of the device name such as ``h100``; ``<name>.quick``
for ``--quick`` runs, so a quick run never overwrites a full one): the exact command, the device,
versions, git SHA and date (``meta``), one row per measured cell (``rows``) and the run's summary tables
(``tables``), and prints those tables and its targets last.  A run replaces the runs of the same command
in its file and keeps the others (a file may hold several runs of complementary shapes).  The Markdown is
``perf/render.py``'s, from these files alone.  The measuring itself (timing, memory floor, environment,
oracle, peers) is :mod:`leettriton.bench`'s.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Callable, Optional, Sequence

import torch

from leettriton import bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _json_safe(x):
    """NaN as null and ±inf as strings (JSON has neither)."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_run(path: str, meta: dict, rows: Sequence[dict], *, title: str, tables: Sequence[dict] = (),
              replaces: Optional[Callable[[dict], bool]] = None) -> str:
    """Write one run to ``<path>.json`` (``path`` without its extension), the one writer of result data.

    ``meta`` must hold ``command`` (and, from :func:`leettriton.bench.environment`, the device, versions,
    ``git_sha`` and ``date``); ``tables`` are ``{"title", "headers", "body", "text"}`` entries (any may be
    None or empty).  Runs already in the file are kept before this one, except those it replaces: the runs
    of the same command (less ``--out``), or those ``replaces(run)`` is true of (``render.save_run``).  The
    file is one run ``{"meta", "title", "tables", "rows"}`` or several, ``{"runs": [...]}``.  Returns its path.
    """
    if not meta.get("command"):
        raise ValueError(f"write_run: meta must record the command of the run, got keys {sorted(meta)}")
    run = {"meta": meta, "title": title, "tables": [dict(t) for t in tables], "rows": list(rows)}
    return render.save_run(path, _json_safe(run), replaces=replaces)


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every perf script has (``--quick``, ``--out``, ...)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a short run (on CPU: tiny shapes, PyTorch paths)")
    p.add_argument("--out", metavar="DIR", help="results root: files go to DIR/<gpu>/ (default perf/results)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench repetition time in ms (default 100, quick 50)")
    p.add_argument("--budget-s", type=float, default=2.0, help="a cell slower than this is timed once and the "
                   "larger shapes of that method are skipped (default 2 s)")
    return p


def layer_arg(text: str) -> tuple[int, int, int]:
    """An argparse type: ``"8,256,512"`` → (heads, r, d), three positive integers (a model layer's widths)."""
    try:
        layer = tuple(int(x) for x in text.split(","))
    except ValueError:
        layer = ()
    if len(layer) != 3 or min(layer) < 1:
        raise argparse.ArgumentTypeError(f"takes HEADS,R,D such as 8,256,512, not {text!r}")
    return layer


fmt_ms = render.fmt_ms   # milliseconds with 3-4 significant digits, or a dash: one formatter for runs and renders


def fmt_err(e: Optional[float]) -> str:
    if e is None:
        return "—"
    return "NaN/inf" if e != e else f"{e:.1e}"


def cell(row: Optional[dict]) -> str:
    """A table cell for a result row: the median ms, or the status (n/a, OOM, skipped, error)."""
    if row is None:
        return "—"
    if row.get("median_ms") is None:
        return {"n/a": "n/a", "OOM": "OOM", "skipped": "skip", "error": "ERR"}.get(row["status"], row["status"])
    txt = fmt_ms(row["median_ms"])
    return txt + " WRONG" if row["status"] == "WRONG" else txt


def verdict(passed: Optional[bool]) -> str:
    return "n/a" if passed is None else ("PASS" if passed else "FAIL")


class Report:
    """Sections of Markdown, the raw rows and the targets of one script's run.

    Args:
        name: the script's name (the result files' stem).
        title: the Markdown title.
        argv: the script's arguments, recorded with the command.
        device: the device measured.
    """

    def __init__(self, name: str, title: str, argv: Sequence[str], device, quick: bool):
        self.name = name + (".quick" if quick else "")
        self.title = title
        self.device = device
        self.meta = bench.environment(device)
        self.meta["command"] = " ".join(["python", f"perf/{name}.py", *map(shlex.quote, argv)])
        self.bandwidth = bench.copy_bandwidth(device)
        self.meta["copy_bandwidth_gbs"] = round(self.bandwidth / 1e9, 1)
        self.notes: list[str] = []
        self.meta["notes"] = self.notes
        self.sections: list[str] = []
        self.tables: list[dict] = []
        self.rows: list[dict] = []
        self.targets: list[list] = []
        print(f"{self.meta['device']}  copy bandwidth {self.bandwidth / 1e9:.1f} GB/s  torch {self.meta['torch']}  "
              f"triton {self.meta['triton']}  git {str(self.meta['git_sha'])[:10]}", flush=True)
        if torch.device(device).type != "cuda":
            self.note("No CUDA device: the GPU-only parts are skipped, the rest runs the PyTorch paths on tiny "
                      "shapes (a check of the script's logic, not a measurement).")

    def note(self, text: str) -> None:
        """A line for the report's header (also printed now)."""
        self.notes.append(text)
        print(f"note: {text}", flush=True)

    def section(self, title: str, headers: Sequence, body: Sequence[Sequence], text: str = "") -> None:
        """A titled Markdown table (printed now) with optional text under it."""
        md = f"## {title}\n\n{bench.markdown_table(list(headers), [list(map(str, r)) for r in body])}\n"
        if text:
            md += f"\n{text}\n"
        self.sections.append(md)
        self.tables.append({"title": title, "headers": [str(h) for h in headers],
                            "body": [[str(c) for c in r] for r in body], "text": text})
        print("\n" + md, flush=True)

    def target(self, what: str, measured: str, goal: str, passed: Optional[bool]) -> None:
        """One line of the closing summary: a target, what was measured, PASS / FAIL / n/a."""
        self.targets.append([what, measured, goal, verdict(passed)])

    def save(self, out: Optional[str]) -> tuple[str, str]:
        """Write ``<out>/<gpu>/<name>.json`` with what is there so far, quietly: a script that calls this
        after each section leaves its finished sections behind if it is cut off.
        Returns the path and the targets table."""
        out = os.path.join(out or RESULTS, self.meta["device_slug"])
        summary = bench.markdown_table(["target", "measured", "goal", "verdict"], self.targets) if self.targets else \
            "(no targets)"
        jpath = write_run(os.path.join(out, self.name), dict(self.meta, targets=self.targets), self.rows,
                          title=self.title, tables=self.tables)
        return jpath, summary

    def finish(self, out: Optional[str]) -> str:
        """Write ``<out>/<gpu>/<name>.json`` and print the targets table last."""
        jpath, summary = self.save(out)
        print(f"\nwrote {jpath} (tables: python perf/render.py)\n", flush=True)
        print(summary, flush=True)
        return jpath


def stopped(rep: "Report", exc: bench.DeviceFailure) -> str:
    """Record that a kernel fault ended the measurements early (the report keeps what came before)."""
    rep.note(f"stopped early: the CUDA context is unusable after a kernel fault ({exc}); later measurements "
             f"are missing")
    rep.meta["stopped_early"] = str(exc)
    return str(exc)


def find(rows: Sequence[dict], **keys) -> Optional[dict]:
    """The first row whose fields equal ``keys``."""
    for row in rows:
        if all(row.get(k) == v for k, v in keys.items()):
            return row
    return None


def run_name(method: str, device) -> str:
    """The method to run for ``method`` on ``device``: itself on CUDA, its PyTorch version elsewhere.

    (Off the GPU the Triton kernels would run in the interpreter, far too slowly to time; ``auto`` runs
    the PyTorch versions there by itself.)
    """
    return method if torch.device(device).type == "cuda" or method == "auto" else f"{method}_torch"


def entry(method: str, device) -> bench.Entry:
    """A :func:`leettriton.bench.method_entry` labelled ``method`` that runs :func:`run_name`."""
    return bench.method_entry(run_name(method, device), label=method)


def keep_first_config(module_prefix: str) -> None:
    """Make every Triton autotuner built from now on for a kernel of a module named ``module_prefix...``
    (a peer's, e.g. ``"fla."``) keep only its first config: nothing to time, one compile per kernel.

    Call it before the peer is imported (its autotuners are built when its modules are); ours prune their
    own lists (``LEETTRITON_AUTOTUNE=0``).  Idempotent per prefix.
    """
    import triton.runtime.autotuner as autotuner

    init = autotuner.Autotuner.__init__
    kept = getattr(init, "first_config_prefixes", None)
    if kept is not None:
        kept.add(module_prefix)
        return

    def python_function(fn):
        while hasattr(fn, "fn"):   # through heuristics and JIT/interpreter wrappers
            fn = fn.fn
        return fn

    def first_config_only(self, fn, arg_names, configs, *args, **kwargs):
        if getattr(python_function(fn), "__module__", "").startswith(tuple(first_config_only.first_config_prefixes)):
            configs = configs[:1]
        init(self, fn, arg_names, configs, *args, **kwargs)

    first_config_only.first_config_prefixes = {module_prefix}
    autotuner.Autotuner.__init__ = first_config_only


def device_of(args) -> torch.device:
    return torch.device(args.device) if args.device else bench.default_device()


def cli_argv(argv: Optional[Sequence[str]]) -> list[str]:
    return list(argv) if argv is not None else sys.argv[1:]


def shape_inputs(shape: str, dtype: torch.dtype, device: str = "cuda"):
    """b, c, v and γ for a ``BxHxNxRxD`` shape, seed 0: b, c ~ N(0, 1/r), v ~ N(0, 1), and RetNet's decay per
    head, 1 − 2^(−5 − 3h/(H−1)) (0.969 … 0.996)."""
    B, H, n, r, d = (int(x) for x in shape.split("x"))
    torch.manual_seed(0)
    b, c = (torch.randn(B, H, n, r, device=device, dtype=dtype) * r ** -0.5 for _ in range(2))
    v = torch.randn(B, H, n, d, device=device, dtype=dtype)
    gamma = torch.tensor([1 - 2 ** (-5 - 3 * h / max(H - 1, 1)) for h in range(H)], device=device)
    return b, c, v, gamma
