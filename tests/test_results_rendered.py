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
