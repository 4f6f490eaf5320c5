"""The results tables are rendered from the result data and up to date with it (perf/render.py).

Fails when ``perf/results/<gpu>/README.md`` or README.md's headline block differs from what
``python perf/render.py`` makes of the ``.json`` data (run it and commit the files), when README.md lacks the
headline markers, or when ``perf/results`` holds anything but data, their plots and the rendered READMEs.
"""
import copy
import glob
import importlib.util
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF = os.path.join(ROOT, "perf")
RESULTS = os.path.join(PERF, "results")


def _module(name):
    spec = importlib.util.spec_from_file_location(f"perf_{name}", os.path.join(PERF, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def render():
    return _module("render")


def test_every_gpu_results_readme_is_rendered_from_its_data(render):
    files = render.rendered_results()
    assert {os.path.basename(os.path.dirname(p)) for p in files} >= {"h100", "h200"}
    stale = [os.path.relpath(p, ROOT) for p, text in files.items()
             if not os.path.exists(p) or open(p).read() != text]
    assert not stale, f"out of date with their data (run python perf/render.py): {stale}"


def test_readme_headline_block_is_rendered_from_the_data(render):
    with open(render.README) as f:
        text = f.read()
    assert render.BEGIN in text and render.END in text, \
        f"README.md must hold the headline markers {render.BEGIN!r} and {render.END!r}"
    assert render.rendered_readme() == text, "README.md's headline block is out of date: run python perf/render.py"


def test_results_hold_data_plots_and_rendered_readmes_only(render):
    # a CPU's timings (the interpreter, stubbed launches) are not performance results
    assert not os.path.exists(os.path.join(RESULTS, "cpu")), "perf/results/cpu: CPU timings are not results"
    for path in sorted(glob.glob(os.path.join(RESULTS, "**", "*"), recursive=True)):
        if os.path.isdir(path):
            continue
        name, ext = os.path.splitext(os.path.basename(path))
        rel = os.path.relpath(path, ROOT)
        assert ext in (".json", ".png") or os.path.basename(path) == "README.md", f"{rel}: not data (logs stay in git)"
        if ext == ".png":
            assert os.path.exists(os.path.join(os.path.dirname(path), name + ".json")), f"{rel}: a plot without data"
        if ext == ".json":
            for run in render.load(path):
                for key in ("command", "device", "torch", "triton", "git_sha", "date"):
                    assert run["meta"].get(key), f"{rel}: a run without its {key}"
                assert isinstance(run["rows"], list)


def test_the_headline_follows_the_data_and_only_its_block_changes(render, tmp_path):
    """A figure changed in the data changes the headline; text outside the markers stays as it was."""
    results = tmp_path / "results"
    shutil.copytree(os.path.join(RESULTS, "h100"), results / "h100", ignore=shutil.ignore_patterns("*.png"))
    before = render.render_headline(str(results))
    path = results / "h100" / "bench_chunked.json"
    data = json.loads(path.read_text())
    runs = data["runs"] if "runs" in data else [data]
    fla = next(r for r in runs[-1]["rows"] if r["method"] == render.FLA and r["batch"] == 1 and r["n"] == 100000
               and r["dtype"] == "float16" and r["decay"] and r["heads"] == 32)
    changed = copy.deepcopy(data)
    for r in (changed["runs"] if "runs" in changed else [changed])[-1]["rows"]:
        if r == fla:
            r["median_ms"], r["rounds_ms"] = 1240.0, None
    path.write_text(json.dumps(changed))
    after = render.render_headline(str(results))
    assert before != after and "| 1240 |" in after and "| 1240 |" not in before
    text = f"intro\n{render.BEGIN}\nold block\n{render.END}\noutro\n"
    out = render.replace_block(text, "new")
    assert out == f"intro\n{render.BEGIN}\nnew\n{render.END}\noutro\n"
    with pytest.raises(ValueError, match="marker"):
        render.replace_block("no markers here\n", "new")


def test_write_run_replaces_the_runs_of_its_command_and_keeps_the_others(tmp_path, render):
    common = _module("common")
    meta = dict(device="GPU X", torch="t", triton="3", git_sha="abc", date="2026-01-01T00:00:00Z")
    path = str(tmp_path / "x" / "bench_y")
    common.write_run(path, dict(meta, command="python perf/bench_y.py --shapes 1x8 --out /a"), [{"n": 8}], title="y")
    common.write_run(path, dict(meta, command="python perf/bench_y.py --shapes 1x16 --out /a"), [{"n": 16}], title="y")
    common.write_run(path, dict(meta, command="python perf/bench_y.py --shapes 1x8 --out /b"), [{"n": 9}], title="y",
                     tables=[{"title": "T", "headers": ["a"], "body": [["1"]], "text": "words"}])
    runs = render.load(path + ".json")
    assert [r["rows"] for r in runs] == [[{"n": 16}], [{"n": 9}]]
    md = render.render_file(path + ".json")
    assert "#### T\n\n| a |\n|---|\n| 1 |\n\nwords" in md and "--shapes 1x16" in md
    with pytest.raises(ValueError, match="command"):
        common.write_run(path, meta, [], title="y")


def test_fold_moves_a_partial_run_into_its_benchmarks_file(tmp_path, render):
    meta = dict(device="GPU X", torch="t", triton="3", git_sha="abc", date="2026-01-01T00:00:00Z")
    full, part = str(tmp_path / "bench_y.json"), str(tmp_path / "bench_y_shapes.json")
    render.save_run(full, {"meta": dict(meta, command="python perf/bench_y.py --out /a"), "rows": [{"n": 8}]})
    render.save_run(part, {"meta": dict(meta, command="python perf/bench_y.py --shapes 1x16"), "rows": [{"n": 16}]})
    render.fold(part, full)
    assert not os.path.exists(part)
    assert [r["rows"] for r in render.load(full)] == [[{"n": 8}], [{"n": 16}]]
    with pytest.raises(ValueError, match="into itself"):
        render.fold(full, full)


def test_ab_matches_cells_across_runs_and_gives_both_ratios(tmp_path):
    ab = _module("ab")
    cell = dict(section="speed", method="auto", dtype="float16", batch=1, heads=32, n=8192, r=128, d=128, decay=True)
    rows = {"before": [dict(cell, median_ms=0.2), dict(cell, n=2048, median_ms=0.1)],
            "after": [dict(cell, median_ms=0.1, note="x"), dict(cell, n=4096, median_ms=0.3)],
            "before2": [dict(cell, median_ms=0.22)]}
    ratios = ab.ratio_rows(rows, ab.KEYS, "median_ms")
    assert len(ratios) == 1 and ratios[0]["n"] == 8192           # only the cell both trees measured
    assert ratios[0]["after_over_before"] == pytest.approx(0.5)
    assert ratios[0]["before2_over_before"] == pytest.approx(1.1)
    entry = ab.ratio_table(ratios, ab.KEYS, "median_ms")
    assert entry["body"][0][-2:] == ["0.500", "1.100"] and "±10.0%" in entry["text"]
    rows["cand"] = [dict(cell, median_ms=0.3)]                   # a tree more (--also): its own ratio to before
    ratios = ab.ratio_rows(rows, ab.KEYS, "median_ms", ["cand"])
    assert ratios[0]["cand"] == 0.3 and ratios[0]["cand_over_before"] == pytest.approx(1.5)
    entry = ab.ratio_table(ratios, ab.KEYS, "median_ms", ["cand"])
    assert entry["headers"][-7:] == ["before", "after", "cand", "before₂", "after ÷ before", "cand ÷ before",
                                     "before₂ ÷ before"]
    assert entry["body"][0][-3:] == ["0.500", "1.500", "1.100"]
    rows["cand"] = []                                              # a tree that measured nothing: dashes
    entry = ab.ratio_table(ab.ratio_rows(rows, ab.KEYS, "median_ms", ["cand"]), ab.KEYS, "median_ms", ["cand"])
    assert entry["body"][0][-2] == "—"
    words = ab.side_command(["python", "perf/bench_chunked.py", "--shapes", "1x8192"], str(tmp_path))
    assert words[0] == sys.executable and words[1] == os.path.join(PERF, "bench_chunked.py")
    assert words[-2:] == ["--out", str(tmp_path)]                # each run writes into its own folder
    words = ab.side_command(["python", "-m", "leettriton.bench", "--json", "{out}/b.json"], str(tmp_path))
    assert words[-1] == f"{tmp_path}/b.json" and "--out" not in words
