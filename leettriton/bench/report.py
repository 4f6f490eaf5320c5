"""Writing the results: progress lines, the paper's Markdown tables, JSON, CSV and the plot.

Every result row has the keys of :data:`ROW_FIELDS`.  In a table the fastest correct method
of a column is in bold only when it is faster beyond the timing spread (:func:`fastest`).
"""
from __future__ import annotations

import csv
import json
import math
import os
from typing import Callable, Iterable, Optional, Sequence

from ..methods import BUILTIN_METHODS

__all__ = ["ROW_FIELDS", "CPU_TIMING_NOTE", "echo", "fmt_ms", "progress_line", "markdown_table", "fastest",
           "format_tables", "write_results", "write_csv", "read_results", "base_path", "plot"]

ROW_FIELDS = ["method", "kind", "dtype", "batch", "heads", "n", "r", "d", "decay", "median_ms", "p20_ms", "p80_ms",
              "floor_ms", "ratio", "rel_err", "err_scope", "tol", "correct", "status", "note"]
"""Keys of every result row (CSV column order)."""

CPU_TIMING_NOTE = ("CPU timings: the PyTorch methods (or the Triton interpreter) on small shapes, wall-clock "
                   "medians; they say nothing of GPU performance.")
"""Said with every CPU run's tables."""


def echo(text: str) -> None:
    """Print a line now (flushed: progress shows while a long run goes on)."""
    print(text, flush=True)


def fmt_ms(ms: Optional[float]) -> str:
    """Milliseconds with three decimals below 1, two below 100, none from 100, and the unit; a dash for None."""
    if ms is None:
        return "—"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


def read_results(path: str, option: str) -> tuple[dict, list]:
    """``(meta, rows)`` of a file written by ``--json``; ValueError naming ``option`` and the file otherwise."""
    with open(path) as f:
        try:
            doc = json.load(f)
            return doc["meta"], doc["rows"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{option}: {path} is not a leettriton.bench --json file ({exc})") from None


def progress_line(count: int, total: int, row: dict, *, floor: bool = True) -> str:
    """One line per measured cell: ``[ 3/14] float16  B=1   n=32     decay vanilla_torch   <median> (p20 …``.

    The time is followed by its ratio to the memory floor (``2.1x floor``: the time to read b, c, v and
    write o once at the measured copy bandwidth), unless ``floor`` is False (a CPU run, where that ratio
    means nothing), then by the relative error against the float64 oracle (``err vs fp64``), with the
    (batch, head) subset it was taken on when not the whole output."""
    width = len(str(total))
    head = (f"[{count:>{width}}/{total}] {row['dtype']:<8} B={row['batch']:<3} n={row['n']:<6} "
            f"{'decay' if row['decay'] else 'plain'} {row['method']:<28}")
    if row["median_ms"] is not None:
        err = ""
        if row["rel_err"] is not None:
            scope = row.get("err_scope")
            err = f"  err vs fp64 {row['rel_err']:.1e}" + ("" if scope in (None, "all") else f" (on {scope})")
        ratio = f"  {row['ratio']:.1f}x floor" if floor and row.get("ratio") is not None else ""
        body = (f"{fmt_ms(row['median_ms']):>10} (p20 {row['p20_ms']:.4g}, p80 {row['p80_ms']:.4g})"
                f"{ratio}{err}  {row['status']}")
    else:
        body = row["status"]
    if row["note"]:
        body += f"  [{row['note']}]"
    return f"{head} {body}"


def markdown_table(headers: Sequence, body: Sequence[Sequence]) -> str:
    """A GitHub-flavoured Markdown table (tabulate when installed)."""
    try:
        from tabulate import tabulate

        return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    except ImportError:
        lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in body]
        return "\n".join(lines)


def _status_cell(row: dict) -> str:
    if row["status"] in ("ok", "WRONG") and row["median_ms"] is not None:
        return None
    return {"n/a": "n/a", "OOM": "OOM", "skipped": "skip", "error": "ERR"}.get(row["status"], row["status"])


def fastest(rows: Sequence[dict]) -> Optional[str]:
    """The method of the fastest correct row, when its lead is larger than the timing spread; else None.

    Among the rows of status ``"ok"`` with a time, the one of least median is the fastest
    only if its p80 is below every other row's p20: the middle 60 % of its samples are all
    faster than theirs.  Otherwise the lead is within the noise (a CPU scheduler's, say)
    and no method is named.  A row without p20/p80 counts its median for both.

    Example::

        >>> fastest([dict(method="a", status="ok", median_ms=1.0, p20_ms=0.9, p80_ms=1.1),
        ...          dict(method="b", status="ok", median_ms=1.05, p20_ms=1.0, p80_ms=1.2)]) is None
        True
    """
    ok = [row for row in rows if row["status"] == "ok" and row["median_ms"] is not None]
    if not ok:
        return None

    def quantile(row: dict, key: str) -> float:
        return row["median_ms"] if row.get(key) is None else row[key]

    best = min(ok, key=lambda row: row["median_ms"])
    if all(quantile(best, "p80_ms") < quantile(row, "p20_ms") for row in ok if row is not best):
        return best["method"]
    return None


def format_tables(rows: Sequence[dict], *, meta: Optional[dict] = None) -> str:
    """The paper's tables: one per dtype, batch and decay, a method per line and an n per column.

    Time cells read ``median (ratio × memory floor)``, the floor being the time to read b, c, v and write
    o once at the measured copy bandwidth (a CPU run shows the median alone: a CPU's floor says nothing of
    the kernels); the fastest correct method of a column is in bold when its lead exceeds the timing
    spread (:func:`fastest`), and a line under the table names the columns where it does not.  A second table per group
    gives the relative errors.  Legend: ``n/a`` not implemented, ``OOM`` out of memory,
    ``skip`` larger n skipped after a cell exceeded the time budget, ``ERR`` an exception
    (see the rows' notes), ``WRONG`` error above the dtype's tolerance.  With ``meta`` of a
    CPU run (``meta["device"] == "cpu"``) the tables begin with :data:`CPU_TIMING_NOTE`.
    """
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["batch"], row["decay"], row["heads"], row["r"], row["d"]), []).append(row)
    out = []
    on_cpu = meta is not None and meta.get("device") == "cpu"
    if on_cpu:
        out.append(f"{CPU_TIMING_NOTE}\n")
    for (dt, batch, decay, heads, r, d), grp in groups.items():
        ns = sorted({row["n"] for row in grp})
        methods = list(dict.fromkeys(row["method"] for row in grp))
        cell = {(row["method"], row["n"]): row for row in grp}
        floor = {row["n"]: row["floor_ms"] for row in grp}
        best = {n: fastest([row for row in grp if row["n"] == n]) for n in ns}
        ties = [n for n in ns if best[n] is None
                and sum(row["n"] == n and row["status"] == "ok" and row["median_ms"] is not None for row in grp) > 1]
        decay_txt = "with decay" if decay else "without decay"
        out.append(f"### {dt}, batch {batch}, {decay_txt} — heads {heads}, r = {r}, d = {d}\n")
        body = [] if on_cpu else [["memory floor"] + [fmt_ms(floor[n]) for n in ns]]
        for m in methods:
            line = [m]
            for n in ns:
                row = cell.get((m, n))
                if row is None:
                    line.append("")
                    continue
                status = _status_cell(row)
                if status is not None:
                    line.append(status)
                    continue
                txt = fmt_ms(row["median_ms"])
                if not on_cpu and row.get("ratio") is not None:
                    txt += f" ({row['ratio']:.1f}×)"
                if row["status"] == "WRONG":
                    txt += " WRONG"
                if best.get(n) == m:
                    txt = f"**{txt}**"
                line.append(txt)
            body.append(line)
        out.append(markdown_table(["median" if on_cpu else "median (× floor)"] + [f"n = {n}" for n in ns], body))
        if ties:
            out.append(f"\nNo method in bold at {', '.join(f'n = {n}' for n in ties)}: the fastest's lead is within "
                       f"the timing spread (its p80 is not below every other method's p20).")
        ebody = []
        scopes = set()
        for m in methods:
            line = [m]
            for n in ns:
                row = cell.get((m, n))
                if row is None:
                    line.append("")
                elif row["rel_err"] is None:
                    line.append(_status_cell(row) or "—")
                else:
                    e = row["rel_err"]
                    txt = "NaN/inf" if math.isnan(e) else f"{e:.1e}"
                    if row["status"] == "WRONG":
                        txt += f" WRONG (> {row['tol']:.0e})" if row.get("tol") else " WRONG"
                    line.append(txt)
                    if row["err_scope"] and row["err_scope"] != "all":
                        scopes.add(f"n = {n}: {row['err_scope']}")
            ebody.append(line)
        out.append("\nRelative error against the float64 oracle:\n")
        out.append(markdown_table(["rel. error"] + [f"n = {n}" for n in ns], ebody))
        if scopes:
            out.append("\nError computed on a subset of (batch, head) pairs: " + ", ".join(sorted(scopes)) + ".")
        notes = [f"{m} n = {n}: {cell[(m, n)]['note']}" for m in methods for n in ns
                 if (m, n) in cell and cell[(m, n)]["note"] and cell[(m, n)]["status"] != "n/a"]
        if notes:
            out.append("\nNotes:\n" + "\n".join(f"- {x}" for x in notes))
        out.append("")
    return "\n".join(out)


def _meta_lines(meta: dict) -> str:
    keys = ["command", "device", "capability", "family", "copy_bandwidth_gbs", "torch", "triton", "cuda", "leettriton",
            "git_sha", "git_dirty", "date", "interpreter"]
    lines = [f"- {k}: {meta[k]}" for k in keys if k in meta and meta[k] is not None]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in keys and not isinstance(v, (dict, list))
              and v is not None]
    for k, v in meta.items():
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            lines.append(f"- {k}:")
            lines += [f"  - {x}" for x in v]
    return "\n".join(lines)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def base_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext.lower() in (".json", ".md", ".csv") else path


def write_results(rows: Sequence[dict], meta: dict, path: str, *, title: str = "leettriton benchmark",
                  body: Optional[str] = None) -> tuple[str, str]:
    """Write ``<path>.json`` (``{"meta": ..., "rows": [...]}``) and ``<path>.md`` (header + tables).

    ``path`` may end in ``.json`` or ``.md`` (the extension is replaced).  A NaN error is
    written as ``null`` in JSON.  ``body`` replaces the default Markdown tables
    (:func:`format_tables`).  Returns the two paths.
    """
    base = base_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    jpath, mpath = base + ".json", base + ".md"
    with open(jpath, "w") as f:
        json.dump(_json_safe({"meta": meta, "rows": list(rows)}), f, indent=1)
        f.write("\n")
    with open(mpath, "w") as f:
        f.write(f"# {title}\n\n{_meta_lines(meta)}\n\n")
        f.write(body if body is not None else format_tables(rows, meta=meta))
        f.write("\n")
    return jpath, mpath


def write_csv(rows: Sequence[dict], meta: dict, path: str) -> str:
    """Write the rows as CSV (:data:`ROW_FIELDS` columns) after ``# key: value`` header lines."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for k, v in meta.items():
            if not isinstance(v, (dict, list)):
                f.write(f"# {k}: {v}\n")
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)
    return path


def _plot_styles(methods: Iterable[str]) -> dict:
    """One look per line: a built-in method and its PyTorch version share a colour (solid, dashed),
    ``auto`` is a thick black line, peers and other functions get their own colours and markers."""
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    others = ["tab:pink", "tab:olive", "tab:cyan", "tab:gray", "gold", "navy"]
    markers = ["s", "^", "D", "v", "P", "X"]
    style, k = {}, 0
    for m in methods:
        base = m[:-len("_torch")] if m.endswith("_torch") else m
        if m == "auto":
            style[m] = dict(color="black", lw=2.2, marker="o", ms=3, zorder=5)
        elif base in BUILTIN_METHODS:
            style[m] = dict(color=palette[BUILTIN_METHODS.index(base) % len(palette)],
                            ls="--" if m.endswith("_torch") else "-", marker="o", ms=3)
        else:
            style[m] = dict(color=others[k % len(others)], ls="-.", marker=markers[k % len(markers)], ms=4)
            k += 1
    return style


def plot(rows: Sequence[dict], path: str, *, log: Callable[[str], None] = print) -> Optional[str]:
    """Latency against n on log-log axes, one panel per dtype/batch/decay, one line per method.

    Needs matplotlib (``pip install matplotlib``); without it, says so and writes nothing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"--plot: matplotlib is not installed (pip install matplotlib, or leettriton[plot]); {path} not written")
        return None
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["batch"], row["decay"]), []).append(row)
    ncols = min(2, len(groups)) or 1
    nrows = max(1, math.ceil(len(groups) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4.8 * nrows), squeeze=False)
    style = _plot_styles(dict.fromkeys(row["method"] for row in rows))
    for ax, ((dt, batch, decay), grp) in zip(axes.flat, groups.items()):
        for m in dict.fromkeys(row["method"] for row in grp):
            pts = sorted((row["n"], row["median_ms"]) for row in grp
                         if row["method"] == m and row["status"] in ("ok", "WRONG") and row["median_ms"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=m, **style[m])
        fl = sorted({(row["n"], row["floor_ms"]) for row in grp})
        ax.plot([p[0] for p in fl], [p[1] for p in fl], ":", color="0.5", label="memory floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel("median ms")
        ax.set_title(f"{dt}, batch {batch}, {'decay' if decay else 'no decay'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
