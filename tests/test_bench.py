"""The benchmark tools: ``python -m leettriton.bench``, ``benchmark_method``, the helpers, the perf scripts.

Everything here runs the PyTorch methods on tiny shapes (on a GPU too: ``--device cpu``),
so it checks the tools' logic -- statuses, files, flags -- not any speed.
"""
from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

import leettriton
from leettriton import bench
from leettriton.bench import cell, cli, grid, report, timing

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "perf")
TINY = ["--device", "cpu", "--heads", "2", "--r", "8", "--d", "8"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny shapes gain nothing from threads, and a busy machine makes them slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- stand-in methods

def _ignores_decay(b, c, v, gamma, *, initial_state=None, return_state=False, precision="ieee"):
    return leettriton.linear_attention(b, c, v, None, method="vanilla_torch")


def _not_implemented(b, c, v, gamma, **_):
    raise NotImplementedError("not written yet")


def _out_of_memory(b, c, v, gamma, **_):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity ...")


def _raises(b, c, v, gamma, **_):
    raise ValueError("broken kernel")


def _kernel_fault(b, c, v, gamma, **_):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _slow(b, c, v, gamma, **_):
    time.sleep(0.2)
    return leettriton.linear_attention(b, c, v, gamma, method="vanilla_torch")


STAND_INS = {"bench_test_wrong": _ignores_decay, "bench_test_na": _not_implemented, "bench_test_oom": _out_of_memory,
             "bench_test_error": _raises, "bench_test_slow": _slow, "bench_test_fault": _kernel_fault}


@pytest.fixture
def register():
    """Registers methods for one test and removes them after (other test modules list every method)."""
    added = []

    def add(name, fn):
        leettriton.register_method(name, fn)
        added.append(name)

    for name, fn in STAND_INS.items():
        add(name, fn)
    yield add
    for name in added:
        leettriton.unregister_method(name)
    assert not set(added) & set(leettriton.METHODS)


def _by(rows, **keys):
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


# --------------------------------------------------------------------------- python -m leettriton.bench

def test_main_quick_statuses_and_files(tmp_path, register):
    methods = "vanilla_torch,bench_test_wrong,bench_test_na,bench_test_oom,bench_test_error"
    out = tmp_path / "res" / "bench.json"
    rows = cli.main(["--quick", *TINY, "--decay", "both", "--batch", "1,2", "--n", "16,40", "--methods", methods,
                       "--json", str(out), "--csv", str(tmp_path / "bench.csv"), "--plot", str(tmp_path / "p.png")])
    assert len(rows) == 5 * 2 * 2 * 2                                   # methods × batches × n × decays
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(bench.ROW_FIELDS))}

    for r in _by(rows, method="vanilla_torch"):
        assert r["status"] == "ok", r
        assert r["correct"] is True and r["rel_err"] <= bench.tolerance(torch.float16), r
        assert r["err_scope"] == "all"
        assert 0 < r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["floor_ms"] > 0 and math.isclose(r["ratio"], r["median_ms"] / r["floor_ms"])
        assert (r["dtype"], r["heads"], r["r"], r["d"]) == ("float16", 2, 8, 8)
    wrong = _by(rows, method="bench_test_wrong")
    assert all(r["status"] == "WRONG" and r["correct"] is False for r in _by(wrong, decay=True))
    assert all(r["status"] == "ok" and r["correct"] is True for r in _by(wrong, decay=False))   # no decay: right
    assert all(r["status"] == "n/a" and r["median_ms"] is None for r in _by(rows, method="bench_test_na"))
    oom = _by(rows, method="bench_test_oom")
    assert all(r["status"] == "OOM" and "1.50 gib" in r["note"] for r in oom)
    err = _by(rows, method="bench_test_error")
    assert all(r["status"] == "error" and "broken kernel" in r["note"] for r in err)

    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    for key in ("device", "torch", "triton", "date", "git_sha", "copy_bandwidth_gbs", "command", "grid"):
        assert key in saved["meta"]
    assert saved["meta"]["device"] == "cpu" and saved["meta"]["copy_bandwidth_gbs"] > 0
    md = out.with_suffix(".md").read_text()
    assert "### float16, batch 2, with decay" in md and "### float16, batch 1, without decay" in md
    assert "WRONG" in md and "OOM" in md and "n/a" in md

    lines = (tmp_path / "bench.csv").read_text().splitlines()
    header = [x for x in lines if x.startswith("#")]
    assert any(x.startswith("# device: cpu") for x in header)
    table = list(csv.DictReader([x for x in lines if not x.startswith("#")]))
    assert len(table) == len(rows) and list(table[0]) == bench.ROW_FIELDS


def test_main_time_budget_skips_larger_n(register):
    rows = cli.main([*TINY, "--methods", "bench_test_slow,vanilla_torch", "--decay", "on", "--batch", "1",
                       "--n", "16,32,48", "--budget-s", "0.1", "--rep-ms", "5"])
    slow = sorted(_by(rows, method="bench_test_slow"), key=lambda r: r["n"])
    assert slow[0]["status"] == "ok" and slow[0]["median_ms"] >= 200 and "timed once" in slow[0]["note"]
    assert [r["status"] for r in slow[1:]] == ["skipped", "skipped"]
    assert all("budget" in r["note"] for r in slow[1:])
    assert [r["status"] for r in _by(rows, method="vanilla_torch")] == ["ok"] * 3   # others go on


def test_predicted_time_skips_a_cell_without_running_it(register):
    calls = []

    def quadratic(b, c, v, gamma, **_):
        n = b.shape[2]
        calls.append(n)
        time.sleep((n / 16) ** 2 * 2e-3)                 # 2 ms at n = 16, 8 ms at n = 32
        return leettriton.linear_attention(b, c, v, gamma, method="vanilla_torch")

    register("bench_test_quadratic", quadratic)
    rows = cli.main([*TINY, "--methods", "bench_test_quadratic", "--decay", "on", "--batch", "1",
                       "--n", "16,32,2048", "--budget-s", "0.05", "--rep-ms", "5"])
    assert [r["status"] for r in rows] == ["ok", "ok", "skipped"]
    assert "predicted" in rows[2]["note"] and 2048 not in calls       # ≥ 8 ms × 64 > 5 budgets
    assert grid._predicted_ms([(16, 1.0), (32, 4.0)], 512) == pytest.approx(1024.0)       # quadratic
    assert grid._predicted_ms([(16, 1.0), (32, 1.0)], 64) == pytest.approx(2.0)           # at least linear
    assert grid._predicted_ms([(16, 1.0), (32, 100.0)], 64) == pytest.approx(400.0)       # at most quadratic
    assert grid._predicted_ms([], 64) == 0.0


def test_main_stops_after_a_kernel_fault_and_keeps_what_it_measured(tmp_path, register):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as stop:
        cli.main([*TINY, "--methods", "vanilla_torch,bench_test_fault", "--decay", "on", "--batch", "1",
                    "--n", "16,32", "--rep-ms", "5", "--json", str(out)])
    assert stop.value.code == 1
    saved = json.loads(out.read_text())
    assert [(r["method"], r["n"], r["status"]) for r in saved["rows"]] == [("vanilla_torch", 16, "ok"),
                                                                          ("bench_test_fault", 16, "error")]
    assert "kernel fault" in saved["rows"][1]["note"]
    assert "illegal memory access" in saved["meta"]["stopped_early"]

    # --resume keeps both cells (the fault is not run again) and measures the rest
    leettriton.unregister_method("bench_test_fault")
    leettriton.register_method("bench_test_fault", lambda b, c, v, gamma, **_: leettriton.linear_attention(
        b, c, v, gamma, method="vanilla_torch"))
    rows = cli.main([*TINY, "--methods", "vanilla_torch,bench_test_fault", "--decay", "on", "--batch", "1",
                       "--n", "16,32", "--rep-ms", "5", "--json", str(out), "--resume"])
    assert [(r["method"], r["n"], r["status"]) for r in rows] == [
        ("vanilla_torch", 16, "ok"), ("bench_test_fault", 16, "error"), ("vanilla_torch", 32, "ok"),
        ("bench_test_fault", 32, "ok")]
    assert rows[0] == saved["rows"][0]
    resumed = json.loads(out.read_text())["meta"]
    assert resumed["resumed_cells"] == 2 and resumed["resumed_from"]["date"] == saved["meta"]["date"]


def test_a_fault_reported_late_stops_the_run(tmp_path, register, monkeypatch):
    """A kernel fault that surfaces only when memory is freed after a failed call still stops the run."""
    def fault_on_free():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cell, "free_memory", fault_on_free)
    with pytest.raises(bench.DeviceFailure, match="illegal memory access"):
        bench.measure(lambda: _out_of_memory(None, None, None, None), device="cpu")


def _saved_run(tmp_path, decay: str, seqlens: str):
    """A tiny vanilla_torch run written to JSON: (its arguments, the file, the file's contents)."""
    out = tmp_path / "bench.json"
    args = [*TINY, "--methods", "vanilla_torch", "--decay", decay, "--batch", "1", "--n", seqlens, "--rep-ms", "5",
            "--json", str(out)]
    rows = cli.main(args)
    return args, out, json.loads(out.read_text()), rows


def test_resume_measures_again_only_what_the_time_limit_skipped(tmp_path, register):
    args, out, saved, _ = _saved_run(tmp_path, "both", "16,32")
    assert len(saved["rows"]) == 4
    saved["rows"][0]["median_ms"] = 1234.5                     # kept as it is
    saved["rows"][1].update(status="skipped", median_ms=None, note="the run's time limit was reached")
    out.write_text(json.dumps(saved))
    rows = cli.main(args + ["--resume"])
    assert rows[0]["median_ms"] == 1234.5
    assert rows[1]["status"] == "ok" and rows[1]["median_ms"] is not None
    assert [(r["n"], r["decay"]) for r in rows] == [(16, True), (16, False), (32, True), (32, False)]


def test_from_json_redraws_without_measuring(tmp_path, register, capsys):
    _, out, saved, rows = _saved_run(tmp_path, "on", "16,32")
    saved["rows"][0]["median_ms"] = 98765.4              # a value no measurement here would give
    out.write_text(json.dumps(saved))
    capsys.readouterr()
    again = cli.main(["--from-json", str(out)])
    assert len(again) == len(rows) and again[0]["median_ms"] == 98765.4
    assert "98765 ms" in capsys.readouterr().out


def test_plot_styles_pair_a_method_with_its_torch_version():
    style = report._plot_styles(["lightning_attention", "lightning_attention_torch", "auto", "fla_chunk_simple_gla",
                                "lightning_attn2"])
    assert style["lightning_attention"]["color"] == style["lightning_attention_torch"]["color"]
    assert style["lightning_attention_torch"]["ls"] == "--"
    colors = [style[m]["color"] for m in ("lightning_attention", "auto", "fla_chunk_simple_gla", "lightning_attn2")]
    assert len(set(colors)) == 4


def test_resume_refuses_a_file_from_another_device(tmp_path, register):
    args, out, saved, _ = _saved_run(tmp_path, "on", "16")
    saved["meta"]["device"] = "NVIDIA H100 80GB HBM3"
    out.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="device"):
        cli.main(args + ["--resume"])


def test_main_rejects_unknown_method():
    with pytest.raises(ValueError, match="unknown method"):
        cli.main([*TINY, "--methods", "no_such_method", "--n", "16"])


# --------------------------------------------------------------------------- benchmark_method

def _kwargs():
    return dict(device="cpu", dtype="float32", batch_size=2, heads=2, rank=8, dim=8, seqlens=(16, 48),
                methods=["vanilla_torch"], verbose=False)


def test_benchmark_method_flags_a_method_that_ignores_the_decay():
    def ignores_decay(b, c, v, gamma):
        return leettriton.linear_attention(b, c, v, None, method="vanilla_torch")

    rows = bench.benchmark_method(ignores_decay, **_kwargs())
    mine = _by(rows, method="yours: ignores_decay")
    assert len(mine) == 2
    assert all(r["status"] == "WRONG" and r["check_ok"] is False and r["check_rel_err"] > 1e-3 for r in mine)
    assert all(r["median_ms"] is not None for r in mine)                        # timed anyway
    assert [r["status"] for r in _by(rows, method="vanilla_torch")] == ["ok", "ok"]


def test_benchmark_method_accepts_a_right_method():
    def right(b, c, v, gamma):
        assert gamma is not None and tuple(gamma.shape) == (2,)
        return leettriton.linear_attention(b, c, v, gamma, method="vanilla_torch")

    rows = bench.benchmark_method(right, **_kwargs())
    mine = _by(rows, method="yours: right")
    assert len(mine) == 2
    assert all(r["status"] == "ok" and r["check_ok"] is True and r["check_rel_err"] <= 1e-5 for r in mine)
    assert all(r["correct"] is True for r in mine)


def test_benchmark_method_without_decay_passes_none():
    seen = []

    def plain(b, c, v, gamma):
        seen.append(gamma)
        return leettriton.linear_attention(b, c, v, method="vanilla_torch")

    rows = bench.benchmark_method(plain, is_weight_decay=False, **_kwargs())
    assert seen and all(g is None for g in seen)
    assert all(r["status"] == "ok" and r["decay"] is False for r in _by(rows, method="yours: plain"))


# --------------------------------------------------------------------------- helpers

def test_decay_gammas_span_the_baselines_range():
    g = bench.decay_gammas(32)
    assert g.shape == (32,) and g.dtype == torch.float32
    assert g[0].item() == pytest.approx(1 - 2 ** -5) and g[-1].item() == pytest.approx(1 - 2 ** -8)
    assert bool((g[1:] > g[:-1]).all())
    assert bench.decay_gammas(1).tolist() == pytest.approx([1 - 2 ** -5])


def test_error_subset_bounds_the_oracle():
    assert bench.error_subset(2, 4, 100) == ([0, 1], [0, 1, 2, 3], "all")
    bi, hi, scope = bench.error_subset(16, 32, 100000)
    assert len(bi) * len(hi) * 100000 <= bench.ERR_MAX_ROWS
    assert bi == [0] and hi[0] == 0 and hi[-1] == 31 and scope == f"b1/16 h{len(hi)}/32"
    bi, hi, _ = bench.error_subset(16, 32, 8192)
    assert len(bi) * len(hi) * 8192 <= bench.ERR_MAX_ROWS and len(hi) == 32 and bi[0] == 0 and bi[-1] == 15


def test_oracle_on_a_subset_matches_the_full_reference():
    b, c, v = bench.make_inputs(3, 4, 20, 5, 6, torch.float32, "cpu")
    g = bench.decay_gammas(4)
    orc = bench.oracle(b, c, v, g, max_rows=2 * 2 * 20)
    full = leettriton.reference(b, c, v, g)
    assert orc.scope != "all"
    sub = full[orc.bi][:, orc.hi]
    assert torch.equal(orc.ref, sub)
    assert orc.error(full) == 0.0


def test_make_inputs_are_random_and_seeded():
    b, c, v = bench.make_inputs(1, 2, 8, 4, 3, torch.float16, "cpu", seed=3)
    assert b.shape == (1, 2, 8, 4) and v.shape == (1, 2, 8, 3) and b.dtype == torch.float16
    assert bool((c != 0).all()) and c.float().std() > 0.5
    assert torch.equal(b, bench.make_inputs(1, 2, 8, 4, 3, torch.float16, "cpu", seed=3)[0])
    assert bench.make_inputs(1, 2, 8, 4, 3, torch.float32, "cpu", layout="bnhd")[0].shape == (1, 8, 2, 4)


def test_rel_error_and_nan():
    ref = torch.ones(4, dtype=torch.float64)
    assert bench.rel_error(torch.full((4,), 1.5), ref) == pytest.approx(0.5)
    assert math.isnan(bench.rel_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref))
    assert math.isnan(bench.rel_error(torch.tensor([1.0, float("inf"), 1.0, 1.0]), ref))


def test_memory_floor_and_slug():
    # b, c (r = 128) and v, o (d = 64) in fp16, at 1e12 B/s
    ms = bench.memory_floor_ms(2, 3, 1000, 128, 64, torch.float16, 1e12)
    assert ms == pytest.approx(2 * 3 * 1000 * (2 * 128 + 2 * 64) * 2 / 1e12 * 1e3)
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_slug("NVIDIA H200") == "h200"
    assert bench.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert bench.gpu_slug("NVIDIA RTX A6000") == "rtx-a6000"


def test_time_ms_quantiles_and_budget():
    med, p20, p80 = bench.time_ms(lambda: time.sleep(0.002), rep_ms=20, device="cpu")
    assert 2.0 <= p20 <= med <= p80
    calls = []
    med, p20, p80 = bench.time_ms(lambda: (calls.append(1), time.sleep(0.02)), max_call_ms=5, device="cpu")
    assert len(calls) == 2 and med == p20 == p80 >= 20                          # warm call + one timed call


def test_cpu_time_ms_warms_up_and_times_on_one_thread():
    threads_seen, calls = [], []

    def fn():
        calls.append(time.perf_counter())
        threads_seen.append(torch.get_num_threads())
        time.sleep(0.001)

    torch.set_num_threads(2)
    med, p20, p80 = timing.cpu_time_ms(fn, warmup_ms=10, rep_ms=30)   # a 1 ms call: well under rep_ms / 3
    assert torch.get_num_threads() == 2                                        # restored
    assert threads_seen[0] == 2 and set(threads_seen[1:]) == {1}              # the warm call as is, then one thread
    assert len(calls) >= 1 + 1 + timing.CPU_MIN_SAMPLES + 3                    # warm, probe, warm-up calls, samples
    assert 1.0 <= p20 <= med <= p80
    calls.clear()
    timing.cpu_time_ms(lambda: (calls.append(1), time.sleep(0.01)), rep_ms=15, warmup_ms=100)
    assert len(calls) == 1 + 3                                                 # slower than rep_ms / 3: three timed


def _timed(method, n, median, p20, p80, status="ok"):
    return dict.fromkeys(bench.ROW_FIELDS) | dict(method=method, kind="torch", dtype="float32", batch=1, heads=2, n=n,
                                                  r=8, d=8, decay=True, median_ms=median, p20_ms=p20, p80_ms=p80,
                                                  floor_ms=0.001, ratio=median / 0.001, status=status, note="")


def test_fastest_is_marked_only_beyond_the_timing_spread():
    clear = [_timed("slow", 16, 2.0, 1.9, 2.2), _timed("quick", 16, 1.0, 0.95, 1.1)]
    noisy = [_timed("slow", 32, 1.3, 0.4, 24.0), _timed("quick", 32, 1.0, 0.9, 1.5)]     # spreads overlap
    wrong = [_timed("wrong", 48, 0.1, 0.1, 0.1, status="WRONG"), _timed("slow", 48, 2.0, 1.9, 2.2),
             _timed("quick", 48, 1.0, 0.95, 1.1)]
    assert report.fastest(clear) == "quick"
    assert report.fastest(noisy) is None
    assert report.fastest(wrong) == "quick"                                    # a wrong output is never fastest
    assert report.fastest(clear[:1]) == "slow"                                 # alone in its column
    assert report.fastest([_timed("x", 16, 1.0, None, None), _timed("y", 16, 1.5, None, None)]) == "x"

    text = report.format_tables(clear + noisy + wrong)
    quick = next(line for line in text.splitlines() if line.startswith("| quick"))
    cells = [c.strip() for c in quick.strip("|").split("|")][1:]
    assert cells[0].startswith("**") and not cells[1].startswith("**") and cells[2].startswith("**")
    assert text.count("**") == 4                                               # two bold cells, nothing else
    assert "No method in bold at n = 32: " in text
    assert report.CPU_TIMING_NOTE not in text
    assert report.format_tables(clear, meta={"device": "cpu"}).startswith(report.CPU_TIMING_NOTE)


def test_one_tolerance_table_for_tests_and_bench():
    from helpers import tolerance as tests_tolerance
    from leettriton.reference import TOLERANCES, tolerance

    assert tests_tolerance is tolerance and bench.tolerance is tolerance and bench.TOLERANCES is TOLERANCES
    assert tolerance(torch.float32) == 1e-5 and tolerance(torch.float32, "ieee") == 1e-5
    assert tolerance(torch.float32, "tf32") == 2e-3
    assert tolerance(torch.float16) == tolerance(torch.float16, "tf32") == 2e-3
    assert tolerance(torch.bfloat16) == 1e-2
    with pytest.raises(ValueError, match="dtype"):
        tolerance(torch.float64)
    assert bench.peer_entry("p", None).precision == "tf32"


def test_importing_the_bench_or_the_tuner_leaves_the_command_line_out():
    """``leettriton.bench`` re-exports the tools without its CLI, and the tuner takes its decays from ``inputs``."""
    import subprocess
    import sys

    root = os.path.dirname(PERF)
    code = ("import sys, leettriton.tune, leettriton.bench; assert 'leettriton.bench.cli' not in sys.modules; "
            "assert leettriton.tune.decay_gammas is leettriton.bench.inputs.decay_gammas")
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=root))
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "leettriton.bench", "--help"], cwd=root, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=root))
    assert res.returncode == 0 and "--from-json" in res.stdout, res.stderr


def test_write_results_round_trip(tmp_path):
    rows = [dict.fromkeys(bench.ROW_FIELDS) | dict(method="m", dtype="float16", batch=1, heads=2, n=16, r=4, d=4,
                                                 decay=True, floor_ms=1.0, rel_err=float("nan"), status="WRONG")]
    jpath, mpath = bench.write_results(rows, {"device": "cpu", "notes": ["a note"]}, str(tmp_path / "x.json"))
    data = json.loads(open(jpath).read())
    assert data["rows"][0]["rel_err"] is None and data["meta"]["device"] == "cpu"
    assert "a note" in open(mpath).read()


def test_peers_off_cuda_say_why():
    notes = []
    assert bench.peers("cpu", notes=notes) == {}
    assert len(notes) == 3 and all("needs a CUDA device" in x for x in notes)
    assert bench.peer_decode("cpu") is None


def test_environment_has_no_host_name():
    env = bench.environment("cpu")
    import socket

    host = socket.gethostname()
    assert all(host not in str(value).split() for value in env.values())
    assert env["device"] == "cpu" and env["torch"] == torch.__version__


def test_git_sha_named_by_the_environment(monkeypatch):
    """A tree copied to a benchmark machine records the commit the caller names, not stale git metadata."""
    from leettriton import tune

    monkeypatch.setenv("LEETTRITON_GIT_SHA", "0123456789abcdef")
    env = bench.environment("cpu")
    assert env["git_sha"] == "0123456789abcdef" and env["git_dirty"] is None
    assert tune._git_sha() == "0123456"


# --------------------------------------------------------------------------- perf scripts

def _script(name):
    spec = importlib.util.spec_from_file_location(f"perf_{name}", os.path.join(PERF, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # a script's dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_bench_auto_merge_keeps_the_later_row_and_plans_each_shape_once(tmp_path):
    """``bench_auto.py --merge`` of a float16 run, a bfloat16 run and a second float16 run of some of its
    shapes (``--resume``): the later row wins, and the planned shapes are those of one full run of the two
    dtypes, not the sum of the runs' own counts; each row names its run's commit."""
    mod = _script("bench_auto")
    planned16, planned_bf = (mod.shapes(False, [dt]) for dt in ("float16", "bfloat16"))

    def row(shape, ms):
        dt, dec, heads, r, d, batch, n = shape
        return dict(dtype=dt, decay=dec, heads=heads, r=r, d=d, batch=batch, n=n, auto_ms=ms, auto_method="block_based",
                    best_method="block_based", best_ms=1.0, ratio=ms)

    def run(name, rows, planned):
        meta = dict(device="GPU X", device_slug="x", command=f"run {name}", shapes_planned=len(planned),
                    git_sha=name)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(dict(meta=meta, rows=rows)))
        return str(path)

    first = run("a", [row(s, 1.3) for s in planned16], planned16)
    other = run("b", [row(s, 1.0) for s in planned_bf], planned_bf)
    again = run("c", [row(planned16[0], 1.05)], planned16)
    assert mod.merge([first, other, again], str(tmp_path / "out")) == 0
    merged = json.loads((tmp_path / "out" / "x" / "bench_auto.json").read_text())
    rows = {(r["dtype"], r["decay"], r["heads"], r["r"], r["d"], r["batch"], r["n"]): r for r in merged["rows"]}
    assert len(merged["rows"]) == len(rows) == len(planned16) + len(planned_bf)
    assert rows[planned16[0]]["ratio"] == 1.05 and rows[planned16[1]]["ratio"] == 1.3
    assert merged["meta"]["shapes_planned"] == len(mod.shapes(False, ["bfloat16", "float16"]))
    assert merged["meta"]["within_10pct"] == f"{1 + len(planned_bf)}/{len(rows)}"
    assert merged["meta"]["git_sha"] == "c" and merged["meta"]["dtypes"] == ["bfloat16", "float16"]
    # each row names the commit of its own run, and a merge of the merged file keeps them
    assert rows[planned16[0]]["git_sha"] == "c" and rows[planned16[1]]["git_sha"] == "a"
    assert rows[planned_bf[0]]["git_sha"] == "b" and merged["meta"]["git_shas"] == ["a", "b", "c"]
    later = run("d", [row(planned_bf[0], 1.0)], planned_bf)
    assert mod.merge([str(tmp_path / "out" / "x" / "bench_auto.json"), later], str(tmp_path / "again")) == 0
    again_rows = json.loads((tmp_path / "again" / "x" / "bench_auto.json").read_text())["rows"]
    assert {r["git_sha"] for r in again_rows} == {"a", "b", "c", "d"}


def test_bench_auto_past_its_time_limit_keeps_every_resumed_row():
    """``--resume --max-minutes``: when the time limit comes before a shape, the rows kept from the earlier run
    for shapes after it are still returned (and so saved), in the plan's order; nothing is measured."""
    mod = _script("bench_auto")
    planned = mod.planned_shapes(False, ["float16"])
    kept = [planned[0], planned[5], planned[-1]]
    done = [dict(dtype=dt, decay=dec, heads=heads, r=r, d=d, batch=batch, n=n, times_ms={"block_based": 1.0},
                 best_ms=1.0) for dt, dec, heads, r, d, batch, n in kept]
    rows = mod.auto_vs_best(False, ["block_based"], ["float16"], done=done, deadline=0.0)
    assert [mod._key(row) for row in rows] == kept


def test_bench_auto_shards_split_the_series_whole_and_cover_every_shape_once():
    """``--shard I/K``: the K shards together hold every shape of a full run exactly once, each series of
    shapes that differ only in n stays in one shard (its losers are dropped at larger n), and the shards'
    loads differ by at most one series; a bad ``I/K`` is refused."""
    mod = _script("bench_auto")
    every = mod.shapes(False, None)
    shards = [mod.shard_shapes(every, (i, 4)) for i in range(4)]
    assert sorted(s for part in shards for s in part) == sorted(every)
    owner = {}
    for i, part in enumerate(shards):
        for shape in part:
            assert owner.setdefault(shape[:-1], i) == i
        assert part == [s for s in every if s in part]     # in the run's order
    counts = [len({s[:-1] for s in part}) for part in shards]
    assert max(counts) - min(counts) <= 1
    assert mod.shard_shapes(every, (0, 1)) == every
    for bad in ("4/4", "-1/2", "1", "a/b"):
        with pytest.raises(mod.argparse.ArgumentTypeError):
            mod.parse_shard(bad)


def test_bench_auto_widths_keep_only_their_layers_shapes():
    """``--rd 256x512``: exactly the full run's shapes of those widths (RetNet-1.3B's layer, both 16-bit
    dtypes, every batch and n), in the run's order; none given: all of them; a bad list is refused."""
    mod = _script("bench_auto")
    every = mod.shapes(False, None)
    wide = mod.widths_only(every, mod.parse_widths("256x512"))
    assert wide and wide == [s for s in every if (s[3], s[4]) == (256, 512)]
    assert {s[0] for s in wide} == {"float16", "bfloat16"} and len(wide) == 2 * len(mod.MODEL_SHAPES)
    both = mod.widths_only(every, mod.parse_widths("256x512,64x64"))
    assert set(both) == set(wide) | {s for s in every if (s[3], s[4]) == (64, 64)} and len(both) > len(wide)
    assert mod.widths_only(every, None) == every
    for bad in ("256", "ax512", "256x", "256x512x2", "0x64"):
        with pytest.raises(mod.argparse.ArgumentTypeError):
            mod.parse_widths(bad)


def test_bench_auto_warm_cases_are_each_method_s_call_at_the_shapes_left_to_measure():
    """``--warm-workers N``: the warm's cases are every method's call (no states) at each planned shape but
    those a ``--resume`` keeps, with the shape's dtype, decay, widths, batch, heads and n; a negative N is
    refused."""
    mod = _script("bench_auto")
    planned = mod.planned_shapes(False, ["bfloat16"], (0, 1), mod.parse_widths("256x512"))
    kept = {planned[0]}
    cases = mod.warm_cases(planned, ["block_based", "lightning_attention"], kept)
    assert len(cases) == 2 * (len(planned) - 1)
    each_twice = [shape for shape in planned[1:] for _ in range(2)]
    for (m, dt, r, d, dec, initial, state, batch, heads, n), shape in zip(cases, each_twice):
        assert (dt, dec, heads, r, d, batch, n) == shape and not initial and not state
    assert [c[0] for c in cases[:2]] == ["block_based", "lightning_attention"]
    with pytest.raises(SystemExit):
        mod.main(["--warm-workers", "-1"])


def test_bench_auto_confirm_rounds_alternate_the_calls_and_keep_each_ones_median():
    """``confirm_rounds``: every call runs once before the first round, then the rounds time the calls in
    turn (a, b, a, b, ...), and each call's figure is the median of its rounds, so one slow round of
    either side does not decide the ratio."""
    mod = _script("bench_auto")
    ran, timed = [], []
    calls = {"auto": lambda: ran.append("auto"), "block_based": lambda: ran.append("block_based")}
    slow = {("auto", 1): 9.0, ("block_based", 3): 7.0}   # one slow spell for each, in different rounds
    counts = {}

    def timer(fn, rep_ms):
        name = next(n for n, f in calls.items() if f is fn)
        k = counts[name] = counts.get(name, 0) + 1
        timed.append((name, rep_ms))
        return slow.get((name, k), {"auto": 1.0 + k / 100, "block_based": 2.0}[name])

    out = mod.confirm_rounds(calls, rounds=5, rep_ms=3.0, timer=timer)
    assert ran == ["auto", "block_based"]
    assert timed == [("auto", 3.0), ("block_based", 3.0)] * 5
    assert out == {"auto": 1.04, "block_based": 2.0}   # auto: median of 9, 1.02, 1.03, 1.04, 1.05


def test_bench_auto_contenders_run_with_the_configs_a_tune_of_the_shape_gives_them(monkeypatch):
    """``contender_rounds``: each contender is tuned once at the shape (``tune``, given ``auto``'s configs for
    the method ``auto`` runs), and its calls in the rounds run it with those configs pinned, each on a problem
    made from the shape's inputs (validated, its own output); ``auto``'s calls go through
    ``linear_attention``; the rounds' figures and the configs come back."""
    from leettriton.reference import tolerance

    mod = _script("bench_auto")
    b, c, v = bench.make_inputs(1, 2, 64, 8, 4, torch.float32, "cpu", seed=3)
    gamma = torch.tensor([0.9, 0.99])
    configs = {"vanilla": {"vanilla.fwd": {"BT": 16}}, "lightning_attention": {}}
    tuned, ran, autos = [], [], []
    real_run = mod.run_problem

    ref = leettriton.reference(b, c, v, gamma)   # float64

    def run(p, method, config):
        ran.append((method, config, p))
        real_run(p, method, None)   # the kernels' own CPU configs (the stand-in configs are not of its space)
        assert bench.rel_error(p.out, ref) <= tolerance(torch.float32)

    monkeypatch.setattr(mod, "run_problem", run)
    monkeypatch.setattr(mod.leettriton, "linear_attention", lambda *args: autos.append(args))

    def rounds(calls):
        assert list(calls) == ["auto", "lightning_attention", "vanilla"]
        for fn in calls.values():
            fn()
            fn()
        return {name: float(i) for i, name in enumerate(calls)}

    def tune(method, recorded):
        tuned.append((method, recorded))
        return configs[method]

    auto_configs = {"vanilla.fwd": {"BT": 32}}
    out, got, timing = mod.contender_rounds(b, c, v, gamma, ["lightning_attention", "vanilla"],
                                            auto_plan=("vanilla", auto_configs), tune=tune, rounds=rounds)
    # auto's own configs are a candidate of its method's tune only
    assert tuned == [("lightning_attention", None), ("vanilla", auto_configs)]
    assert out == {"auto": 0.0, "lightning_attention": 1.0, "vanilla": 2.0} and got == configs
    assert timing == "python call"   # CPU tensors: nothing to capture
    assert [(m, cfg) for m, cfg, _ in ran] == [("lightning_attention", {}), ("lightning_attention", {}),
                                               ("vanilla", configs["vanilla"]), ("vanilla", configs["vanilla"])]
    assert all(p.b.data_ptr() == b.data_ptr() for _, _, p in ran)   # the shape's own inputs, no copy
    assert ran[0][2] is not ran[1][2] and ran[0][2].out is not ran[1][2].out   # a problem of its own per call
    assert len(autos) == 2 and all(args[0] is b and args[3] is gamma for args in autos)


def test_bench_auto_rounds_time_each_call_s_graph_replay_and_say_so_when_a_capture_fails(monkeypatch):
    """``contender_rounds`` hands the rounds each call's captured replay (``capture``), so that ``auto``'s fast
    path and a pinned call are timed alike; a capture that fails leaves every call of the shape to be timed
    from Python, and the timing says why."""
    mod = _script("bench_auto")
    b = c = v = torch.zeros(1, 1, 4, 2)
    captured = []

    def capture(fn):
        captured.append(fn)
        return lambda: ("replay", fn)

    seen = {}

    def rounds(calls):
        seen.update({name: fn() for name, fn in calls.items()})
        return {name: 1.0 for name in calls}

    _, _, timing = mod.contender_rounds(b, c, v, None, ["vanilla"], tune=lambda m, rec: {}, rounds=rounds,
                                        capture=capture)
    assert timing == "graph replay" and len(captured) == 2
    assert seen == {"auto": ("replay", captured[0]), "vanilla": ("replay", captured[1])}

    def failing(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    ran = []
    monkeypatch.setattr(mod, "run_problem", lambda p, m, cfg: ran.append(m))
    monkeypatch.setattr(mod.leettriton, "linear_attention", lambda *args: ran.append("auto"))
    _, _, timing = mod.contender_rounds(b, c, v, None, ["vanilla"], tune=lambda m, rec: {}, rounds=rounds,
                                        capture=failing)
    assert timing.startswith("python call (capture failed: RuntimeError: operation not permitted")
    assert ran == ["auto", "vanilla"]   # the rounds ran the calls themselves


def test_bench_model_shapes_times_auto_fla_and_our_fastest_in_rounds_and_takes_each_ones_lower_time(monkeypatch):
    """A cell's rounds time ``auto``, fla's kernel and the fastest of our other methods in the sweep (not a
    slower method, not a peer that failed), on inputs made for them; each records its rounds' median, and
    every ratio takes an entry's lower time of its sweep and its rounds.  Then the same calls, each captured
    in a CUDA graph, are timed in rounds of replays (``graph_ms``); a capture that fails is noted and leaves
    the others timed."""
    mod = _script("bench_model_shapes")
    made = []

    def entry(label, kind):
        return bench.Entry(label, kind, lambda b, c, v, g, label=label: made.append((label, b)) or (lambda: label))

    def row(method, ms, kind="triton", status="ok"):
        return dict(method=method, kind=kind, dtype="float16", decay=True, batch=1, n=64, status=status,
                    median_ms=ms)

    entries = [entry("auto", "auto"), entry("block_based", "triton"), entry("lightning_attention", "triton"),
               entry(mod.FLA, "peer"), entry("lightning_attn2", "peer")]
    rows = [row("auto", 1.0, "auto"), row("block_based", 0.9), row("lightning_attention", 1.2),
            row(mod.FLA, 3.0, "peer"), row("lightning_attn2", None, "peer", "error")]
    timed, captured = [], []

    def rounds(calls):
        timed.append(list(calls))
        if len(timed) == 1:
            return {"auto": 1.1, "block_based": 0.8, mod.FLA: 2.5}
        assert all(fn() == ("replay", label) for label, fn in calls.items())   # the captured calls
        return {"auto": 0.7, "block_based": 0.6}

    def capture(fn):
        label = fn()   # the stand-in call returns its entry's label
        captured.append(label)
        if label == mod.FLA:
            raise RuntimeError("operation not permitted when stream is capturing")
        return lambda: ("replay", label)

    monkeypatch.setattr(mod, "confirm_rounds", rounds)
    monkeypatch.setattr(mod, "graph_replay", capture)
    mod.time_in_rounds(rows, entries, torch.float16, 1, 64, 2, 8, 4, "cpu",
                       ["auto", "block_based", "lightning_attention"])
    # the calls from Python in rounds, then the captured ones (fla's capture failed: noted, the rest timed)
    assert timed == [["auto", mod.FLA, "block_based"], ["auto", "block_based"]]
    assert captured == ["auto", mod.FLA, "block_based"]
    assert [label for label, _ in made] == ["auto", mod.FLA, "block_based"]
    sweep_b = bench.make_inputs(1, 2, 64, 8, 4, torch.float16, "cpu", seed=mod.SEED)[0]   # the sweep's b
    assert all(torch.equal(b, sweep_b) for _, b in made)
    by = {r["method"]: r for r in rows}
    assert (by["auto"]["rounds_ms"], by["block_based"]["rounds_ms"], by[mod.FLA]["rounds_ms"]) == (1.1, 0.8, 2.5)
    assert (by["auto"]["graph_ms"], by["block_based"]["graph_ms"]) == (0.7, 0.6) and "graph_ms" not in by[mod.FLA]
    assert by[mod.FLA]["graph_note"].startswith("capture failed: RuntimeError: operation not permitted")
    assert "rounds_ms" not in by["lightning_attention"] and "rounds_ms" not in by["lightning_attn2"]
    assert [mod._ms(by[m]) for m in ("auto", "block_based", "lightning_attention", mod.FLA)] == [1.0, 0.8, 1.2, 2.5]
    assert mod._ms(by["lightning_attn2"]) is None and mod._ms(None) is None


def test_time_in_rounds_takes_the_cells_of_its_decay_and_their_inputs(monkeypatch):
    """Without decay the rounds time the cell's rows without decay (not the decayed cell's, which share
    dtype, batch and n) on calls made with no γ; with decay, the decayed rows, on the sweep's γ."""
    mod = _script("bench_model_shapes")
    made = []

    def entry(label):
        return bench.Entry(label, "triton", lambda b, c, v, g, label=label: made.append((label, g)) or (lambda: label))

    rows = [dict(method=m, kind="triton", dtype="float16", decay=decay, batch=1, n=64, status="ok",
                 median_ms=ms + (0 if decay else 10))
            for decay in (True, False) for m, ms in (("auto", 1.0), ("block_based", 0.9), (mod.FLA, 3.0))]
    monkeypatch.setattr(mod, "confirm_rounds", lambda calls: {label: 5.0 for label in calls})
    monkeypatch.setattr(mod, "graph_replay", lambda fn: fn)
    entries = [entry("auto"), entry("block_based"), entry(mod.FLA)]
    mod.time_in_rounds(rows, entries, torch.float16, 1, 64, 2, 8, 4, "cpu", ["auto", "block_based"], decay=False)
    assert [(r["decay"], "rounds_ms" in r, "graph_ms" in r) for r in rows] == [(True, False, False)] * 3 + [(False, True, True)] * 3
    assert [g for _, g in made] == [None] * 3
    made.clear()
    mod.time_in_rounds(rows, entries, torch.float16, 1, 64, 2, 8, 4, "cpu", ["auto", "block_based"], decay=True)
    assert all("rounds_ms" in r for r in rows)
    assert all(torch.equal(g, bench.decay_gammas(2, "cpu")) for _, g in made) and len(made) == 3


def test_bench_chunked_tables_take_each_entrys_lower_time_and_the_replays_for_the_kernels_column():
    """'best ours' is the one of ours whose lower time of sweep and rounds is lowest (here auto, whose rounds
    beat block_based's sweep, though its sweep did not), 'fla / best ours' divides fla's lower time by it,
    and 'fla / best ours, kernels' divides fla's replay by the fastest replay of ours; a cell whose fla failed
    has neither ratio."""
    mod = _script("bench_chunked")
    rep = mod.common.Report("bench_chunked_test", "test", [], torch.device("cpu"), False)

    def row(method, ms, n, **extra):
        return dict(method=method, dtype="float16", decay=True, batch=1, n=n, status="ok", median_ms=ms,
                    floor_ms=0.5, rel_err=1e-4, p20_ms=ms, p80_ms=ms, **extra)

    rows = [row("auto", 1.3, 64, rounds_ms=1.0, graph_ms=0.9), row("lightning_attention", 1.5, 64),
            row("block_based", 1.2, 64, rounds_ms=1.25, graph_ms=0.8), row(mod.FLA, 3.2, 64, rounds_ms=3.0, graph_ms=2.0),
            row("auto", 2.0, 128), row("lightning_attention", 2.2, 128), row("block_based", 2.1, 128),
            dict(row(mod.FLA, None, 128), status="error")]
    labels = ["auto", "lightning_attention", "block_based", mod.FLA]
    mod.speed_tables(rep, rows, labels, [torch.float16], [True], [(1, 64), (1, 128)], 2, 8, 4)
    lines = rep.sections[-1].splitlines()
    cells = {line.split("|")[1].strip(): [x.strip() for x in line.split("|")[1:-1]]
             for line in lines if line.startswith("| 1 × ")}
    header = [x.strip() for x in next(line for line in lines if line.startswith("| batch × n")).split("|")[1:-1]]
    at = header.index("best ours")
    assert header[at:at + 4] == ["best ours", "fla / best ours", "fla / best ours, kernels", "best ours × floor"]
    assert cells["1 × 64"][at:at + 4] == ["auto", "3.00×", "2.50×", "2.0×"]
    assert cells["1 × 128"][at:at + 4] == ["auto", "—", "—", "4.0×"]
    assert rep.targets[-1][:2] == ["best ours vs fla chunk_simple_gla, float16 decay (worst shape)", "3.00× (best 3.00×)"]


def test_bench_chunked_times_every_cell_again_for_each_dtype_and_decay_on_a_gpu(monkeypatch):
    """On a GPU every shape's sweep (on the rounds' seed) is followed by one ``time_in_rounds`` per dtype and
    decay, over that shape's rows and ours; the measuring itself is stubbed here (no GPU)."""
    mod = _script("bench_chunked")
    rep = mod.common.Report("bench_chunked_test", "test", [], torch.device("cpu"), False)
    rep.device = torch.device("cuda")   # the GPU branch

    def run_grid(entries, *, dtypes, batches, seqlens, decays, seed, **_):
        sweeps.append((batches[0], seqlens[0], seed))
        return [dict(method=e.label, dtype=bench.dtype_name(dt), decay=decay, batch=batches[0], n=seqlens[0],
                     status="ok", median_ms=1.0, floor_ms=0.5, rel_err=1e-4, p20_ms=1.0, p80_ms=1.0)
                for dt in dtypes for decay in decays for e in entries]

    def time_in_rounds(rows, entries, dt, batch, n, heads, r, d, device, methods, decay, seed):
        assert {(row["batch"], row["n"]) for row in rows} == {(batch, n)}   # that shape's rows only
        again.append((dt, decay, batch, n, seed, tuple(methods)))

    sweeps, again = [], []
    monkeypatch.setattr(mod.bench, "run_grid", run_grid)
    monkeypatch.setattr(mod.bench, "peers", lambda *args, **kwargs: {})
    monkeypatch.setattr(mod, "time_in_rounds", time_in_rounds)
    dtypes, shapes = [torch.float16, torch.bfloat16], [(1, 64), (2, 32)]
    mod.run_speed(rep, SimpleNamespace(budget_s=1.0), dtypes, [True, False], shapes, 2, 8, 4, 5)
    assert sweeps == [(1, 64, mod.SEED), (2, 32, mod.SEED)]
    assert again == [(dt, decay, b, n, mod.SEED, mod.OURS) for b, n in shapes for dt in dtypes for decay in (True, False)]


@pytest.mark.parametrize("name", ["bench_decode", "bench_chunked", "bench_fleet_recursion", "bench_host_time",
                                  "bench_decay"])
def test_perf_script_quick_on_cpu(name, tmp_path):
    rep = _script(name).main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5"])
    jpath = tmp_path / "cpu" / f"{name}.quick.json"
    data = json.loads(jpath.read_text())
    assert data["meta"]["command"].startswith(f"python perf/{name}.py --quick")
    assert data["meta"]["device"] == "cpu" and data["rows"] and data["meta"]["targets"]
    md = _script("render").render_file(str(jpath))          # the tables, as perf/render.py renders them
    assert "#### Targets" in md and "No CUDA device" in md
    statuses = {r["status"] for r in rep.rows}
    assert statuses <= {"ok", "n/a"}, statuses            # tiny shapes: nothing wrong, nothing out of memory
    # the verdicts judged here are of correctness (precision, no OOM), which must pass, and of the stubbed host
    # time (bench_host_time), a timing of this machine's CPU: its verdict must agree with its figure, whatever
    # the figure (a loaded machine measures more; timings are not asserted by tests)
    for what, measured, goal, verdict in rep.targets:
        if verdict != "n/a" and measured.endswith(" µs"):
            assert goal.startswith("≤ ") and goal.endswith(" µs"), (what, goal)
            assert verdict == ("PASS" if float(measured[:-3]) <= float(goal[2:-3]) else "FAIL"), (what, measured, verdict)
        else:
            assert verdict != "FAIL", (what, measured, goal)


def test_bench_chunked_shapes_measures_only_those_shapes_into_files_of_its_own(tmp_path):
    mod = _script("bench_chunked")
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5", "--shapes", "1x48"])
    assert {(r["batch"], r["n"]) for r in rep.rows} == {(1, 48)}
    assert all(r.get("section") == "speed" for r in rep.rows)             # no precision section
    # auto is timed beside the two methods autotuned at the shape, and its column is in the tables
    assert {r["method"] for r in rep.rows} >= {"auto", "lightning_attention", "block_based"}
    md = _script("render").render_file(str(tmp_path / "cpu" / "bench_chunked.quick_shapes.json"))
    assert "| batch × n | auto " in md
    assert (tmp_path / "cpu" / "bench_chunked.quick_shapes.json").exists()
    assert not (tmp_path / "cpu" / "bench_chunked.quick.json").exists()   # a full run's files are left alone
    with pytest.raises(SystemExit):
        mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--shapes", "1x"])


def test_bench_decay_oracle_reads_head_h_of_b_and_c_at_group_h_over_g():
    """The per-token decay bench's oracle, against the recurrence token by token: v = dt·x, a = A·dt, and head h
    of v reads b = C and c = B of group h // (H_v / H_k) (mamba-ssm's convention, and ours)."""
    mod = _script("bench_decay")
    layer = mod.Layer("tiny", 4, 2, 3, 2, "mamba")
    inp = mod.make_inputs(layer, 2, 5, torch.float32, "cpu")
    assert torch.equal(inp.v, inp.x * inp.dt.unsqueeze(-1)) and torch.equal(inp.a, inp.A * inp.dt)
    assert bool((inp.a < 0).all())
    x, dt, A, B, C = (t.double() for t in (inp.x, inp.dt, inp.A, inp.B, inp.C))
    want = torch.empty(2, 4, 5, 2, dtype=torch.float64)
    for b in range(2):
        for h in range(4):
            g, state = h // 2, torch.zeros(3, 2, dtype=torch.float64)
            for t in range(5):
                state = torch.exp(A[h] * dt[b, t, h]) * state + torch.outer(B[b, t, g], dt[b, t, h] * x[b, t, h])
                want[b, h, t] = C[b, t, g] @ state
    check = mod.oracle(inp)
    assert check.scope == "all" and torch.allclose(check.ref, want, rtol=1e-6, atol=1e-6)


def _stand_in_ssd(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False):
    """mamba-ssm's ``mamba_chunk_scan_combined`` in PyTorch, with its shape checks."""
    batch, n, heads, _ = x.shape
    groups = B.shape[2]
    assert dt.shape == (batch, n, heads) and A.shape == (heads,) and C.shape == B.shape == (batch, n, groups, B.shape[3])
    assert heads % groups == 0 and D is None and z is None and dt_bias is None and not dt_softplus and chunk_size > 0
    b, c = (t.repeat_interleave(heads // groups, dim=2) for t in (C, B))
    v = x * dt.unsqueeze(-1)
    return leettriton.linear_attention(b.float(), c.float(), v, log_decay=A * dt, layout="bnhd",
                                       method="vanilla_torch").to(x.dtype)


def _stand_in_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """mamba-ssm's ``selective_state_update`` in PyTorch (state updated in place), with its shape checks."""
    batch, heads, p, n = state.shape
    assert x.shape == dt.shape == (batch, heads, p) and A.shape == (heads, p, n) and C.shape == B.shape
    assert D.shape == dt_bias.shape == (heads, p) and not dt_softplus
    group = heads // B.shape[1]
    dt = dt + dt_bias
    Bh, Ch = (t.repeat_interleave(group, dim=1).float() for t in (B, C))
    state.mul_(torch.exp(A * dt.unsqueeze(-1))).add_(Bh.unsqueeze(2) * (dt * x.float()).unsqueeze(-1))
    return ((state * Ch.unsqueeze(2)).sum(-1) + x.float() * D).to(x.dtype)


def _stand_in_fla():
    """fla's ``chunk_simple_gla`` and ``fused_recurrent_simple_gla`` with a per-token ``g``, in PyTorch."""
    def chunk(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False):
        assert q.shape == k.shape and q.shape[:3] == v.shape[:3] == g.shape and g_gamma is None and scale == 1.0
        out = leettriton.linear_attention(q, k, v, log_decay=g, layout="bnhd", method="vanilla_torch",
                                          initial_state=initial_state, return_state=output_final_state)
        return out if output_final_state else (out, None)

    module = type(sys)("fla.ops.simple_gla")
    module.chunk_simple_gla = module.fused_recurrent_simple_gla = chunk
    return module


def test_bench_decay_runs_the_peers_on_the_inputs_they_take(tmp_path, monkeypatch):
    """With stand-ins for fla and mamba-ssm (PyTorch, checking the shapes their kernels assert), the run feeds
    each the mapped inputs (q = C, k = B expanded, g = A·dt; x, dt, A, B, C; the decode step's state as
    (B, H, d, r) with dt, A, D and dt_bias broadcast), gets the oracle's output back, and tables their ratios."""
    mod = _script("bench_decay")
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, type(sys)(name))
    monkeypatch.setitem(sys.modules, "fla.ops.simple_gla", _stand_in_fla())

    def find_peers(rep, args):
        rep.meta["peers"] = {"fla": "stand-in", "mamba-ssm": "stand-in"}
        return mod.Peers(fla=True, ssd=_stand_in_ssd, state_update=_stand_in_state_update, status=rep.meta["peers"])

    monkeypatch.setattr(mod, "find_peers", find_peers)
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5", "--models", "nemotron",
                    "--methods", "none"])
    peers = [r for r in rep.rows if r["kind"] == "peer"]
    assert {(r["section"], r["method"]) for r in peers} == {
        (s, m) for s in ("forward", "train", "precision") for m in (mod.FLA, mod.MAMBA)} | {
        ("decode", mod.DEC_FLA), ("decode", mod.DEC_MAMBA)}
    assert all(r["status"] == "ok" for r in peers)
    assert all(r["rel_err"] < 1e-3 for r in peers if r["section"] != "train")    # float16 inputs, exact stand-ins
    forward = next(t for t in rep.tables if ", forward, " in t["title"])
    column = next(i for i, h in enumerate(forward["headers"]) if h.startswith("mamba / auto"))   # "auto" or
    ratios = [row[column] for row in forward["body"]]                      # "auto (b, c expanded)": the tree's
    assert ratios and all(x.endswith("×") for x in ratios)
    judged = [t for t in rep.targets if "training step vs mamba_chunk_scan_combined" in t[0]]
    assert judged and all(t[1].endswith("×)") and t[3] == "n/a" for t in judged)    # measured, judged on a GPU


def test_bench_decay_records_missing_peers_grouped_heads_and_its_time_limit(tmp_path):
    """A run names each peer it lacks and whether this tree takes grouped b, c (printed and in the data), and
    one past ``--max-minutes`` still writes its file, saying where it stopped."""
    mod = _script("bench_decay")
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--max-minutes", "0", "--no-mamba"])
    data = json.loads((tmp_path / "cpu" / "bench_decay.quick.json").read_text())
    meta = data["meta"]
    assert meta["peers"] == {"fla": "missing: needs a CUDA device", "mamba-ssm": "missing: --no-mamba"}
    assert set(meta["grouped_heads"]) == {"linear_attention", "decode_step"}
    assert meta["cut_short"].startswith("mamba2 ") and not rep.rows
    md = _script("render").render_file(str(tmp_path / "cpu" / "bench_decay.quick.json"))
    assert "peer mamba-ssm: not available: --no-mamba" in md and "stopped at the time limit" in md


def test_bench_decay_loads_mamba_ssm_kernels_without_its_package_init(tmp_path):
    """``--mamba-src``: the Triton kernels' modules load from the source tree, whose ``mamba_ssm/__init__.py``
    (it imports the CUDA extensions) never runs; a folder without them is a reason, not an error."""
    mod = _script("bench_decay")
    ops = tmp_path / "mamba_ssm" / "ops" / "triton"
    ops.mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "utils").mkdir()
    (tmp_path / "mamba_ssm" / "__init__.py").write_text("raise ImportError('the CUDA extensions')\n")
    (ops / "ssd_combined.py").write_text("from mamba_ssm.ops.triton.helper import TWO\n"
                                         "def mamba_chunk_scan_combined(*args):\n    return TWO\n")
    (ops / "helper.py").write_text("TWO = 2\n")
    (ops / "selective_state_update.py").write_text("def selective_state_update(*args, **kw):\n    return 3\n")
    (tmp_path / "COMMIT").write_text("0123456789abcdef\n")
    path, modules = list(sys.path), set(sys.modules)
    try:
        got, why = mod.load_mamba(str(tmp_path))
        assert why == "" and got.commit == "0123456789ab" and got.ssd() == 2 and got.state_update() == 3
        missing, why = mod.load_mamba(str(tmp_path / "nowhere"))
        assert missing is None and "no mamba_ssm/ops/triton/ssd_combined.py under" in why
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            del sys.modules[name]


def test_host_overhead_script_on_cpu():
    """perf/host_overhead.py stubs the launches, so it runs in a process of its own."""
    import subprocess
    import sys

    # the repository's root on the child's path, so that it imports this tree whether or not it is installed
    root = os.path.dirname(PERF)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, os.path.join(PERF, "host_overhead.py"), "--device", "cpu", "--calls", "20",
                          "--n", "256", "--heads", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "launches stubbed, family h100" in lines[0]
    timed = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    assert set(timed) == {"auto", "vanilla", "causal_dot_product", "block_based", "recursion",
                          "lightning_attention", "fleet_attention", "decode_step", "decode_step_slots"}
    assert all(0 < us < 1e6 for us in timed.values())


def test_a_file_that_is_not_a_bench_run_is_refused_by_name(tmp_path, register):
    out = tmp_path / "bench.json"
    out.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="--resume: .*bench.json is not a leettriton.bench --json file"):
        cli.main([*TINY, "--methods", "vanilla_torch", "--n", "16", "--json", str(out), "--resume"])
    with pytest.raises(SystemExit, match="--from-json: .*bench.json is not"):
        cli.main(["--from-json", str(out)])


def test_a_resumed_grid_primes_the_autotuned_entries_at_its_first_cell():
    seen = []

    def make(b, c, v, gamma):
        seen.append((b.shape[2], gamma is not None))
        return lambda: leettriton.linear_attention(b, c, v, gamma, method="vanilla_torch")

    entries = [bench.Entry("tuned", "triton", make), bench.method_entry("vanilla_torch")]
    grid = dict(dtypes=["float32"], batches=[1], seqlens=[16, 32], decays=[True], heads=2, r=8, d=8, device="cpu",
                rep_ms=5, warmup_ms=1, bandwidth=1e9)
    rows = bench.run_grid(entries, **grid)
    assert seen == [(16, True), (32, True)]                  # a fresh run measures its cells, nothing more
    done = {bench.cell_key(r["method"], torch.float32, 1, 2, r["n"], 8, 8, True): r for r in rows if r["n"] == 16}
    seen.clear()
    again = bench.run_grid(entries, done=done, **grid)
    assert seen == [(16, True), (32, True)]                  # primed at n = 16 first, then the pending n = 32 cell
    assert [r["n"] for r in again] == [16, 16, 32, 32] and again[0] is done[bench.cell_key("tuned", torch.float32, 1,
                                                                                          2, 16, 8, 8, True)]


def test_bench_backward_model_sets_the_layer_and_names_its_files(tmp_path):
    """``--model HEADS,R,D``: the speed rows are of that layer, written to files named after it (a full run's
    are left alone); a bad triple is refused before anything runs."""
    mod = _script("bench_backward")
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5", "--speed-only",
                    "--shapes", "1x40", "--model", "3,24,40"])
    speed = [r for r in rep.rows if r.get("section", "speed") == "speed" and "heads" in r]
    assert speed and {(r["heads"], r["r"], r["d"], r["n"]) for r in speed} == {(3, 24, 40, 40)}
    assert (tmp_path / "cpu" / "bench_backward.quick_shapes_h3_r24_d40.json").exists()
    assert not (tmp_path / "cpu" / "bench_backward.quick_shapes.json").exists()
    for bad in ("3,24", "3,0,40", "a,b,c"):
        with pytest.raises(SystemExit):
            mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--model", bad])


def _stand_in_capture(monkeypatch, launched: list) -> None:
    """torch.cuda's streams and graph capture on the CPU, for graph_replay: ``launched`` is the work a call
    launches; a capture during which nothing was added warns at its end, as torch's does."""
    class Graph:
        def replay(self):
            pass

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(cuda_graph, stream=None):
        before = len(launched)
        yield
        if len(launched) == before:
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                          "captured on wrong device or stream.", UserWarning)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", graph)


def test_graph_replay_refuses_a_capture_that_recorded_no_work(monkeypatch):
    """A call whose capture recorded nothing (its kernels on another stream or device, or none launched) would
    have its replay timed at nothing: graph_replay raises.  A capture that recorded work gives its replay, and
    the call's own warnings during the capture still reach the caller.  (torch's capture is stood in for on
    the CPU, warning as torch's does when a capture ends empty.)"""
    launched = []
    _stand_in_capture(monkeypatch, launched)
    replay = timing.graph_replay(lambda: launched.append("kernel"))
    assert launched == ["kernel", "kernel"] and callable(replay)   # the warm call, then the captured one

    with pytest.raises(RuntimeError, match="capture recorded no work"):
        timing.graph_replay(lambda: None)

    def warns():
        launched.append("kernel")
        warnings.warn("the call's own warning", UserWarning)

    with pytest.warns(UserWarning) as record:
        timing.graph_replay(warns)
    assert [str(w.message) for w in record] == ["the call's own warning"] * 2   # the warm call's, the captured


def test_ab_compare_reports_a_capture_that_recorded_no_work_as_failed(monkeypatch, capsys):
    """perf/ab_compare.py writes its capture out (it measures trees without graph_replay): a call whose capture
    recorded nothing gets no GPU time (None, the failure printed), not its empty replay's; a call that launches
    work gets its replay timed.  (torch's capture and do_bench stood in for on the CPU.)"""
    import triton

    mod = _script("ab_compare")
    launched = []
    _stand_in_capture(monkeypatch, launched)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep, quantiles: [0.5, 0.4, 0.6])
    row = mod._time(lambda: launched.append("kernel"), rep_ms=1)
    assert (row["gpu_ms"], row["gpu_p20"], row["gpu_p80"]) == (0.5, 0.4, 0.6) and row["calls"] >= 20

    row = mod._time(lambda: None, rep_ms=1)
    assert (row["gpu_ms"], row["gpu_p20"], row["gpu_p80"]) == (None, None, None) and row["calls"] >= 20
    assert "graph capture failed: RuntimeError: the capture recorded no work" in capsys.readouterr().out


def test_ab_compare_keys_cells_by_their_layer(tmp_path, capsys):
    """perf/ab_compare.py compares cells of the same layer only: rows of ``--layer`` runs carry heads, r and d,
    rows without them are the default layer's, and each table row names its layer."""
    mod = _script("ab_compare")

    def run(path, rows):
        path.write_text(json.dumps(dict(env=dict(label=path.stem, device="GPU", torch="t", triton="t"), rows=rows)))
        return str(path)

    cell = dict(kind="prefill", dtype="float16", batch=1, n=8192, method="block_based", wall_ms=1.0)
    before = run(tmp_path / "before.json", [dict(cell, gpu_ms=0.2), dict(cell, heads=8, r=256, d=512, gpu_ms=0.4)])
    after = run(tmp_path / "after.json", [dict(cell, heads=32, r=128, d=128, gpu_ms=0.1),
                                          dict(cell, heads=8, r=256, d=512, gpu_ms=0.3)])
    mod.compare(before, after, None, None)
    out = capsys.readouterr().out
    assert "| prefill | float16 | 32 × 128 × 128 | 1 × 8192 | block_based | 0.2000 | 0.1000 | 0.500 |" in out
    assert "| prefill | float16 | 8 × 256 × 512 | 1 × 8192 | block_based | 0.4000 | 0.3000 | 0.750 |" in out


def test_bench_mixed_quick_on_cpu(tmp_path, monkeypatch):
    """perf/bench_mixed.py's logic on tiny shapes (each call run once, not timed): MiniMax's decays as vLLM and
    SGLang compute them, every way of running the mixed batch agreeing with the one call and float64, its JSON."""
    from leettriton.nn import transnormer_gammas

    mod = _script("bench_mixed")
    gammas = mod.minimax_gammas(64)
    assert gammas == pytest.approx(transnormer_gammas(64, 0, 80), rel=1e-12)
    assert gammas[0] == pytest.approx(math.exp(-(2 ** -0.125) * (1 + 1e-5))) and 0.99 < gammas[-1] < 1
    with pytest.raises(ValueError, match="heads must be a power of two"):
        mod.minimax_gammas(48)

    def fla_chunk(q, k, v, *, g_gamma, scale, cu_seqlens, initial_state, output_final_state):
        """fla's varlen call on [1, T, H, K] inputs, one sequence at a time through our PyTorch twin."""
        assert scale == 1.0 and output_final_state and q.shape[0] == 1
        bounds, outs, states = cu_seqlens.tolist(), [], []
        for i in range(len(bounds) - 1):
            one = [x[:, bounds[i]:bounds[i + 1]] for x in (q, k, v)]
            o, s = leettriton.linear_attention(*one, g_gamma.exp(), method="vanilla_torch", layout="bnhd",
                                               initial_state=initial_state[i:i + 1], return_state=True)
            outs.append(o)
            states.append(s)
        return torch.cat(outs, dim=1), torch.cat(states)

    def fla_recurrent(q, k, v, *, g_gamma, scale, initial_state, output_final_state):
        return leettriton.linear_attention(q, k, v, g_gamma.exp(), method="vanilla_torch", layout="bnhd",
                                           initial_state=initial_state, return_state=True)

    monkeypatch.setattr(mod, "_fla", lambda device: (fla_chunk, fla_recurrent))   # its gathers and scatters
    monkeypatch.setattr(mod.bench, "time_ms", lambda fn, **kwargs: (fn(), (1.0, 1.0, 1.0))[1])
    monkeypatch.setattr(mod.bench, "copy_bandwidth", lambda *args, **kwargs: 1e9)
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5"])
    data = json.loads((tmp_path / "cpu" / "bench_mixed.quick.json").read_text())
    assert data["meta"]["command"].startswith("python perf/bench_mixed.py --quick")
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {"ours, one call", "ours, two calls", "vLLM-style loop", "fla cu_seqlens", "rect same tokens"}
    assert rows["ours, one call"]["rel_err"] < 1e-5
    assert max(rows[m]["rel_diff_one_call"] for m in ("ours, two calls", "vLLM-style loop", "fla cu_seqlens")) < 1e-5
    assert [t[3] for t in rep.targets] == ["n/a"] * 5 + ["PASS"]   # timings judged on a GPU only
    assert "#### Targets" in _script("render").render_file(str(tmp_path / "cpu" / "bench_mixed.quick.json"))
