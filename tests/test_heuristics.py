"""Heuristic files: lookup, loading errors, the tuner's family check, and ``auto`` using them."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import pytest
import torch

import leettriton
from leettriton import tune
from leettriton.problem import make_problem
from leettriton.autotune import FAMILIES, KERNELS, autotune_enabled, current_family, recording
from leettriton.autotune import heuristics
from leettriton.autotune.heuristics import FORMAT, HeuristicsError, read_heuristics
from leettriton.plan import choose, fallback
from conftest import DEVICE
from helpers import Case, assert_close


def point(dtype="float16", decay=True, r=128, d=128, bh=32, n=1024, best="block_based", config=None):
    return {"dtype": dtype, "decay": decay, "r": r, "d": d, "bh": bh, "n": n, "best": best,
            "config": config or {}, "times_ms": {best: 1.0}, "configs": {best: config or {}}}


def write(tmp_path, points, family=None, name="h.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"format": FORMAT, "family": family or current_family().name, "measured": {},
                                "grid": {}, "points": points}))
    return str(path)


@pytest.fixture(autouse=True)
def no_active_file():
    """Each test starts and ends with the heuristics that were in use before it (on a GPU, the packaged
    file of its family): a file a test loads must not steer ``auto`` in the tests that follow it in the
    same process."""
    saved = dict(heuristics._ACTIVE)
    yield
    heuristics._ACTIVE.clear()
    heuristics._ACTIVE.update(saved)
    heuristics._GENERATION[0] += 1  # plans cached under the test's file are stale


def test_lookup_exact_and_nearest(tmp_path):
    h = read_heuristics(write(tmp_path, [
        point(n=1024, best="vanilla"), point(n=65536, best="block_based"), point(bh=512, n=65536, best="fleet_attention"),
        point(dtype="float32", n=1024, best="recursion"), point(decay=False, n=1024, best="causal_dot_product")]),
        methods=leettriton.METHODS)
    assert h.lookup("float16", True, 128, 128, 32, 1024)[0] == "vanilla"            # exact
    assert h.lookup("float16", True, 128, 128, 32, 2000)[0] == "vanilla"            # nearest in log n
    assert h.lookup("float16", True, 128, 128, 32, 30000)[0] == "block_based"
    assert h.lookup("float16", True, 128, 128, 400, 70000)[0] == "fleet_attention"  # nearest in bh too
    assert h.lookup("float32", True, 64, 64, 8, 10)[0] == "recursion"               # exact on dtype
    assert h.lookup("float16", False, 128, 128, 512, 10**6)[0] == "causal_dot_product"  # exact on decay
    assert h.lookup("bfloat16", True, 128, 128, 32, 1024) is None                   # no such dtype


def test_nearest_point_is_the_point_lookup_takes_with_every_method_s_configs(tmp_path):
    walk = {"block_based.fwd": {"BT": 64, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}}
    other = dict(point(n=8192, best="block_based", config=walk), times_ms={"block_based": 1.0, "vanilla": 2.0})
    other["configs"] = {"block_based": walk, "vanilla": {"vanilla.fwd": {"BT": 64, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2}}}
    h = read_heuristics(write(tmp_path, [point(n=1024, best="vanilla"), other]), methods=leettriton.METHODS)
    for n in (5000, 8192, 100000):
        nearest = h.nearest_point("float16", True, 128, 128, 32, n)
        assert nearest["n"] == 8192 and nearest["configs"] == other["configs"]
        assert h.lookup("float16", True, 128, 128, 32, n) == ("block_based", walk)
    assert h.nearest_point("float16", True, 128, 128, 32, 2000)["n"] == 1024
    assert h.nearest_point("bfloat16", True, 128, 128, 32, 1024) is None


@pytest.mark.parametrize("flip", [False, True])
def test_a_shape_halfway_between_points_gets_the_smaller_whatever_the_file_s_order(tmp_path, flip):
    points = [point(n=2048, best="vanilla"), point(n=8192, best="block_based"),
              point(r=64, n=1024, best="fleet_attention"), point(r=256, n=1024, best="recursion")]
    h = read_heuristics(write(tmp_path, points[::-1] if flip else points), methods=leettriton.METHODS)
    assert h.lookup("float16", True, 128, 128, 32, 4096)[0] == "vanilla"           # 2048 | 8192 in log2 n
    assert h.lookup("float16", True, 128, 128, 32, 5000)[0] == "block_based"       # nearer 8192
    # three points at the same distance (n 2048; r 64; r 256): the smallest r, d, batch·heads, n
    assert h.lookup("float16", True, 128, 128, 32, 1024)[0] == "fleet_attention"


@pytest.mark.parametrize("content,why", [
    ("{not json", "is not valid JSON"),
    ('{"format": "something-else"}', "is not a leettriton heuristic file"),
    ('[1, 2]', "is not a leettriton heuristic file"),
])
def test_corrupt_file(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}: {why}"):
        read_heuristics(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(HeuristicsError, match="cannot be read"):
        read_heuristics(str(tmp_path / "absent.json"))


def test_foreign_family(tmp_path):
    path = write(tmp_path, [point()], family="a6000")
    with pytest.raises(HeuristicsError, match="was measured on the 'a6000' family, but this device is 'h100'"):
        read_heuristics(path, "h100")


@pytest.mark.parametrize("bad,why", [({"best": "nonsense"}, "unknown method 'nonsense'"),
                                     ({"config": {"no.such.kernel": {}}}, "config for unknown kernels"),
                                     ({"n": -3}, "'n' is -3 .*; expected a positive integer")])
def test_malformed_points(tmp_path, bad, why):
    p = point()
    p.update(bad)
    with pytest.raises(HeuristicsError, match=why):
        read_heuristics(write(tmp_path, [p]), methods=leettriton.METHODS)


def test_env_variable_with_corrupt_file_fails_clearly(tmp_path, monkeypatch):
    path = tmp_path / "broken.json"
    path.write_text("garbage")
    monkeypatch.setenv("LEETTRITON_HEURISTICS", str(path))
    from leettriton.autotune import heuristics

    monkeypatch.setattr(heuristics, "_ACTIVE", {})
    b, c, v, g, _ = Case(1, 2, 100, 8, 8, gamma=0.9).tensors(DEVICE)
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}"):
        leettriton.linear_attention(b, c, v, g)


def test_fallback_without_file():
    leettriton.load_heuristics(None)
    fam = current_family()
    for n, expect in ((40, "vanilla"), (300, None)):
        b, c, v, g, _ = Case(1, 2, n, 8, 8, gamma=0.9).tensors(DEVICE)
        p, _ = make_problem(b, c, v, g)
        method, config = choose(p)
        assert config is None and method == fallback(p, fam)
        if expect:
            assert method == expect


def test_fallback_rule_by_parallelism():
    b, c, v, g, _ = Case(1, 2, 300, 8, 128, gamma=0.9).tensors("meta")
    p, _ = make_problem(b, c, v, g, device_types=("meta",))
    assert fallback(p, FAMILIES["h100"]) == "block_based"        # 4 programs cannot fill 132 SMs
    b, c, v, g, _ = Case(16, 32, 300, 8, 128, gamma=0.9).tensors("meta")
    p, _ = make_problem(b, c, v, g, device_types=("meta",))
    assert fallback(p, FAMILIES["h100"]) == "lightning_attention"


def test_auto_follows_the_file(tmp_path):
    """auto launches the file's method with the file's config, and the result is right."""
    case = Case(1, 2, 150, 20, 24, gamma=0.95, initial=True, return_state=True, seed=21)
    b, c, v, g, s0 = case.tensors(DEVICE)
    for method in ("fleet_attention", "recursion", "vanilla_torch"):
        leettriton.load_heuristics(write(tmp_path, [point(dtype="float32", r=20, d=24, bh=2, n=150, best=method)],
                                         name=f"{method}.json"))
        p, _ = make_problem(b, c, v, g)
        assert choose(p)[0] == method
        with recording() as log:
            o, s = leettriton.linear_attention(b, c, v, g, initial_state=s0, return_state=True)
        ref, ref_s = leettriton.reference(b, c, v, g, initial_state=s0, return_state=True)
        assert_close(o, ref, 1e-5, f"auto via {method}")
        assert_close(s, ref_s, 1e-5, f"auto via {method} state")
        if not method.endswith("_torch"):
            assert log, "auto launched no kernel"


def test_tune_refuses_a_foreign_family(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(tune, "current_family", lambda *a: FAMILIES["a100"])
    assert tune.main(["--gpu", "h100", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "refusing to write the 'h100' heuristic file on this NVIDIA A100-SXM4-80GB" in err
    assert "'a100' family" in err


def test_tune_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tune.main(["--gpu", "h100"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_tune_grid_axes_can_be_replaced_from_the_command_line():
    import argparse

    def opts(**kw):
        base = dict(quick=False, dtypes=None, bh=None, n=None, rd=None, decay=None)
        return argparse.Namespace(**{**base, **kw})

    grid = tune.select_grid(opts(dtypes="float16,bfloat16", bh="128,8,32,8", n="4096,64", rd="128x128,64X32"))
    assert grid["dtype"] == ["float16", "bfloat16"]
    assert grid["bh"] == [8, 32, 128]
    assert grid["n"] == [64, 4096]
    assert grid["rd"] == [[128, 128], [64, 32]]
    assert grid["decay"] == tune.GRIDS["full"]["decay"]
    assert tune.select_grid(opts(quick=True)) == tune.GRIDS["quick"]
    assert tune.select_grid(opts(decay="yes"))["decay"] == [True]
    assert tune.select_grid(opts(decay="no"))["decay"] == [False]
    assert tune.select_grid(opts(rd="300x1024"))["rd"] == [[300, 1024]]
    assert tune.select_grid(opts(bh="96,48"))["bh"] == [48, 96]
    for bad in (dict(bh="0,48"), dict(n="0,64"), dict(n="1k"), dict(rd="128"), dict(rd="1025x128"),
                dict(dtypes="float64")):
        with pytest.raises(ValueError):
            tune.select_grid(opts(**bad))


def test_tune_points_run_their_batch_heads_as_the_most_heads_up_to_32():
    """The full grid's powers of two keep 32 heads × batch (as before), and batch·heads between them run
    as bench_auto's shapes of 16 heads do (48 = 3 × 16)."""
    for bh in tune.GRIDS["full"]["bh"]:
        assert tune.point_batch_heads(bh) == (max(1, bh // 32), min(bh, 32))
    assert tune.point_batch_heads(48) == (3, 16)
    assert tune.point_batch_heads(96) == (3, 32)
    assert tune.point_batch_heads(40) == (5, 8)
    assert tune.point_batch_heads(7) == (7, 1)


def test_tune_reports_a_malformed_grid_option(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(tune, "current_family", lambda *a: FAMILIES["h100"])
    with pytest.raises(SystemExit) as exc:
        tune.main(["--gpu", "h100", "--bh", "0,48"])
    assert exc.value.code == 2
    assert "--bh must be comma-separated positive integers" in capsys.readouterr().err


PACKAGED = sorted((Path(leettriton.__file__).parent / "autotune" / "heuristics").glob("*.json"))


@pytest.mark.parametrize("path", PACKAGED, ids=[p.stem for p in PACKAGED])
def test_packaged_files_name_configs_of_todays_spaces(path):
    """Every config a packaged heuristic file pins (the chosen one and each method's) is still in its
    kernel's config list for the file's family: a space that drops or renames a config fails here."""
    leettriton.linear_attention  # the API import registers every kernel in KERNELS
    doc = json.loads(path.read_text())
    family = doc["family"]
    spaces = {name: kernel.space for name, kernel in KERNELS.items()}
    stale = []
    for p in doc["points"]:
        pinned = [p["config"], *p.get("configs", {}).values()]
        for configs in pinned:
            for name, cfg in configs.items():
                if name not in spaces:
                    stale.append((p["dtype"], p["r"], p["d"], p["bh"], p["n"], name, "unknown kernel"))
                elif dict(cfg) not in spaces[name].family_configs(family):
                    stale.append((p["dtype"], p["r"], p["d"], p["bh"], p["n"], name, cfg))
    assert doc["measured"].get("git_sha"), f"{path.name} does not record the code it was measured with"
    assert not stale, f"{path.name}: {len(stale)} pinned configs outside today's spaces, first {stale[:3]}"


def _stand_in_tuner(monkeypatch, sha: str, times: dict, calls: list, given: Optional[list] = None,
                    configs: Optional[dict] = None):
    """tune.main on the CPU: an H100 as far as the checks can tell, points built on the CPU, each method
    'timed' from ``times`` (method -> ms at n = 16; twice that per doubling of n), every timing recorded
    in ``calls``, and the recorded configs each timing was given in ``given``.  A method of ``configs``
    (method -> configs) returns them, as the winner over its recorded ones when it was given those."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(tune, "current_family", lambda *a: FAMILIES["h100"])
    monkeypatch.setattr(tune, "DEVICE", "cpu")
    monkeypatch.setattr(tune, "_git_sha", lambda: sha)

    def timed(method, b, c, v, gamma, retune, recorded=None):
        calls.append((method, b.shape[2]))
        if given is not None:
            given.append((method, b.shape[2], recorded))
        config = (configs or {}).get(method, {})
        return times[method] * b.shape[2] / 16, config, bool(config) and config == recorded

    monkeypatch.setattr(tune, "time_method", timed)


def test_tuner_times_the_replay_of_the_whole_call_s_graph(monkeypatch):
    """The tuner's time of a method is do_bench's of the replay of the call's CUDA graph (the kernels' time,
    not the host's), and the graph is of the call with every config pinned: here a stand-in graph runs the
    captured call, whose output must be the method's result, and only the replay is timed."""
    import triton.testing
    from leettriton.reference import reference, tolerance

    case = Case(1, 2, 96, 16, 16, gamma=0.9, seed=5)
    b, c, v, g, _ = case.tensors(DEVICE)
    p, _ = make_problem(b, c, v, g)
    pinned = {"vanilla.fwd": KERNELS["vanilla.fwd"].space.family_configs(current_family())[0]}
    captured, timed = [], []

    def stand_in_graph(fn):
        captured.append(fn)
        return lambda: ("replayed", fn())

    def stand_in_bench(fn, warmup, rep, return_mode):
        timed.append((fn(), return_mode))
        return 0.25

    monkeypatch.setattr(tune, "graph_replay", stand_in_graph)
    monkeypatch.setattr(triton.testing, "do_bench", stand_in_bench)
    kernel = KERNELS["vanilla.fwd"]
    kernel.cache.clear()
    with recording() as log:
        assert tune._whole_call_ms(p, "vanilla", pinned) == 0.25
    assert len(captured) == 1 and timed == [(("replayed", None), "median")]
    # the captured call launched its one kernel, then its redo (docs/nonfinite.md), with the config it was
    # given: its autotuner never ran
    assert [(k, args["REDO"]) for k, args in log] == [(kernel, False), (kernel, True)] and not kernel.cache
    assert_close(p.out, reference(b, c, v, g), tolerance(b.dtype), "the replayed call's output")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_every_builtin_method_s_call_captures_in_a_cuda_graph_as_the_tuner_times_it():
    """The tuner times each method by the replay of its call's CUDA graph (``tune._whole_call_ms``), so every
    built-in method's call must capture (no host read of a device value) and its replay must write the method's
    result: float16 at r = d = 128 (the checked walk and its redo's launch), long enough for block_based's
    segments, with per-head decay."""
    from leettriton.methods import BUILTIN_METHODS
    from leettriton.plan import run_problem
    from leettriton.reference import reference, tolerance

    b, c, v, g, _ = Case(1, 2, 2304, 128, 128, dtype=torch.float16, gamma="tensor", gammas=(0.99, 0.9),
                         seed=3).tensors(DEVICE)
    want = reference(b, c, v, g)
    for method in BUILTIN_METHODS:
        p, out = make_problem(b, c, v, g)
        replay = tune.graph_replay(lambda: run_problem(p, method, None))
        out.fill_(float("nan"))
        replay()
        torch.cuda.synchronize()
        assert_close(out, want, tolerance(torch.float16), f"{method}: its call's graph, replayed")


def _tiny_grid(out: str, decay: str, methods: str) -> list:
    """tune's arguments for a float32 series at r = d = 4, batch·heads 1 (add --n)."""
    return ["--gpu", "h100", "--dtypes", "float32", "--decay", decay, "--rd", "4x4", "--bh", "1", "--methods",
            methods, "--out", out]


@pytest.mark.parametrize("before", ["0", None])
def test_tune_turns_autotuning_on_for_its_own_run_only(tmp_path, monkeypatch, before):
    """The tuner measures each method at its autotuned best (``LEETTRITON_AUTOTUNE`` on inside ``tune.main``);
    a process that calls ``tune.main`` (a notebook, this suite) has its own setting back afterwards, whether
    the run finished or raised.  Left on, every later call of that process would tune each new shape's kernels
    (this suite's later tests on a GPU, which conftest.py runs at each family's first config)."""
    if before is None:
        monkeypatch.delenv("LEETTRITON_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("LEETTRITON_AUTOTUNE", before)
    grid = _tiny_grid(str(tmp_path / "h100.json"), "yes", "vanilla")
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0}, [])
    stand_in, seen = tune.time_method, []

    def measured(*args, **kwargs):
        seen.append(autotune_enabled())
        return stand_in(*args, **kwargs)

    monkeypatch.setattr(tune, "time_method", measured)
    assert tune.main(grid + ["--n", "16"]) == 0
    assert seen == [True] and os.environ.get("LEETTRITON_AUTOTUNE") == before

    def failed(*args, **kwargs):
        raise RuntimeError("a measurement failed")

    monkeypatch.setattr(tune, "time_method", failed)
    with pytest.raises(RuntimeError, match="a measurement failed"):
        tune.main(grid + ["--n", "32"])
    assert os.environ.get("LEETTRITON_AUTOTUNE") == before


def test_tune_records_each_point_s_code_and_remeasures_the_stale_ones(tmp_path, monkeypatch):
    out = str(tmp_path / "h100.json")
    grid = _tiny_grid(out, "yes", "vanilla,block_based")
    calls = []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, calls)
    assert tune.main(grid + ["--n", "16,32"]) == 0
    doc = json.loads(open(out).read())
    assert {(p["n"], p["best"], p["measured"]["git_sha"]) for p in doc["points"]} == {(16, "vanilla", "aaaaaaa"),
                                                                                     (32, "vanilla", "aaaaaaa")}
    assert len(calls) == 4

    # the same command resumes: nothing left to measure; --remeasure on the same code measures nothing either
    calls.clear()
    assert tune.main(grid + ["--n", "16,32"]) == 0 and tune.main(grid + ["--n", "16,32", "--remeasure"]) == 0
    assert calls == []

    # new code: --remeasure measures the selected grid's points again (n = 32 only here), keeps the others
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 3.0, "block_based": 2.0}, calls)
    assert tune.main(grid + ["--n", "32"]) == 0
    assert calls == []                      # without --remeasure a measured point is kept
    assert tune.main(grid + ["--n", "32", "--remeasure"]) == 0
    assert sorted(calls) == [("block_based", 32), ("vanilla", 32)]
    doc = json.loads(open(out).read())
    by_n = {p["n"]: p for p in doc["points"]}
    assert (by_n[16]["best"], by_n[16]["measured"]["git_sha"]) == ("vanilla", "aaaaaaa")
    assert (by_n[32]["best"], by_n[32]["measured"]["git_sha"]) == ("block_based", "bbbbbbb")
    assert by_n[32]["times_ms"] == {"vanilla": 6.0, "block_based": 4.0}
    assert doc["measured"]["git_sha"] == "bbbbbbb"
    assert by_n[32]["measured"]["timing"] == doc["measured"]["timing"] == "graph replay"
    assert len(read_heuristics(out, "h100", leettriton.METHODS).points) == 2   # the reader takes the new fields

    # --keep: the points of the commits named count as done too (n = 32's, bbbbbbb's); the others are measured
    calls.clear()
    _stand_in_tuner(monkeypatch, "ccccccc", {"vanilla": 3.0, "block_based": 2.0}, calls)
    assert tune.main(grid + ["--n", "16,32", "--remeasure", "--keep", "bbbbbbb,eeeeeee"]) == 0
    assert sorted(calls) == [("block_based", 16), ("vanilla", 16)]
    by_n = {p["n"]: p for p in json.loads(open(out).read())["points"]}
    assert (by_n[16]["measured"]["git_sha"], by_n[32]["measured"]["git_sha"]) == ("ccccccc", "bbbbbbb")
    for bad in (["--keep", "bbbbbbb"], ["--remeasure", "--keep", " , "]):
        with pytest.raises(SystemExit):
            tune.main(grid + ["--n", "16"] + bad)


def test_tune_times_a_point_s_recorded_configs_when_it_measures_the_point_again(tmp_path, monkeypatch, capsys):
    """--remeasure hands each method its configs as the file holds them at the point (none to a point
    measured for the first time), and the log line marks a method whose recorded configs won."""
    out = str(tmp_path / "h100.json")
    grid = _tiny_grid(out, "yes", "vanilla,block_based")
    first = {"vanilla": {"vanilla.fwd": {"BT": 64, "num_warps": 4, "num_stages": 2}},
             "block_based": {"block_based.fwd": {"BT": 32, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}}}
    calls, recorded = [], []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, calls, recorded, first)
    assert tune.main(grid + ["--n", "16"]) == 0
    assert recorded == [("vanilla", 16, None), ("block_based", 16, None)]
    assert "vanilla=1.000 block_based=2.000" in capsys.readouterr().out

    # measured again: the recorded configs go to their methods; vanilla's win (its stand-in returns them)
    recorded.clear()
    again = {"vanilla": first["vanilla"], "block_based": {"block_based.fwd": dict(first["block_based"]["block_based.fwd"], BV=128)}}
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 1.0, "block_based": 2.0}, calls, recorded, again)
    assert tune.main(grid + ["--n", "16,32", "--remeasure"]) == 0
    assert recorded == [("vanilla", 16, first["vanilla"]), ("block_based", 16, first["block_based"]),
                        ("vanilla", 32, None), ("block_based", 32, None)]
    log = capsys.readouterr().out
    assert "n=16: best vanilla  vanilla=1.000* block_based=2.000  " in log
    assert "n=32: best vanilla  vanilla=2.000 block_based=4.000  " in log
    by_n = {p["n"]: p for p in json.loads(open(out).read())["points"]}
    assert by_n[16]["configs"] == again


def test_tune_recorded_only_measures_again_the_file_s_points_and_adds_none(tmp_path, monkeypatch, capsys):
    """--remeasure --recorded-only: a sparse file's points measured again, the axes the command line does not
    give taken from the file's points, no point added."""
    out = str(tmp_path / "h100.json")
    calls = []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0}, calls)
    base = ["--gpu", "h100", "--methods", "vanilla", "--out", out]
    # a sparse file: float32 r = d = 4 at (bh 1, n 16) and (bh 2, n 32); float16 8 x 8 at (bh 1, n 64), no decay
    assert tune.main(base + ["--dtypes", "float32", "--decay", "yes", "--rd", "4x4", "--bh", "1", "--n", "16"]) == 0
    assert tune.main(base + ["--dtypes", "float32", "--decay", "yes", "--rd", "4x4", "--bh", "2", "--n", "32"]) == 0
    assert tune.main(base + ["--dtypes", "float16", "--decay", "no", "--rd", "8x8", "--bh", "1", "--n", "64"]) == 0
    held = sorted(tune._point_key(p) for p in json.loads(open(out).read())["points"])
    assert len(held) == 3
    capsys.readouterr()

    calls.clear()
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 2.0}, calls)
    assert tune.main(base + ["--remeasure", "--recorded-only"]) == 0
    assert sorted(calls) == [("vanilla", 16), ("vanilla", 32), ("vanilla", 64)]
    doc = json.loads(open(out).read())
    assert sorted(tune._point_key(p) for p in doc["points"]) == held
    assert {p["measured"]["git_sha"] for p in doc["points"]} == {"bbbbbbb"}
    assert "[3/3]" in capsys.readouterr().out

    # an axis given narrows it: the float32 points only
    calls.clear()
    _stand_in_tuner(monkeypatch, "ccccccc", {"vanilla": 2.0}, calls)
    assert tune.main(base + ["--remeasure", "--recorded-only", "--dtypes", "float32"]) == 0
    assert sorted(calls) == [("vanilla", 16), ("vanilla", 32)]
    assert sorted(tune._point_key(p) for p in json.loads(open(out).read())["points"]) == held

    # with --restart there would be no points to measure: refused before anything runs
    calls.clear()
    before = open(out).read()
    with pytest.raises(SystemExit):
        tune.main(base + ["--recorded-only", "--restart"])
    assert "--recorded-only" in capsys.readouterr().err
    assert calls == [] and open(out).read() == before


def test_a_method_s_recorded_configs_are_timed_pinned_and_kept_only_where_faster(monkeypatch):
    """time_method: the file's configs of the point, timed pinned after the tuning, win where faster; a
    recorded config that is not of its kernel's configs on the family is not timed."""
    family = FAMILIES["h100"]
    monkeypatch.setattr(tune, "current_family", lambda *a: family)
    tuned_cfg, other = KERNELS["vanilla.fwd"].space.family_configs(family)[:2]
    pinned_runs = []

    def stand_in(ms_recorded):
        def tuned(p, method, pinned, clear, **learned):
            pinned_runs.append(pinned)
            if pinned:
                return ms_recorded, {**pinned}, {}
            return 2.0, {"vanilla.fwd": tuned_cfg}, {}
        return tuned

    b = c = v = torch.zeros(1, 1, 8, 4)
    monkeypatch.setattr(tune, "_tuned", stand_in(1.5))
    assert tune.time_method("vanilla", b, c, v, None, True) == (2.0, {"vanilla.fwd": tuned_cfg}, False)
    assert pinned_runs == [{}]
    assert tune.time_method("vanilla", b, c, v, None, True, {"vanilla.fwd": other}) == (
        1.5, {"vanilla.fwd": other}, True)
    monkeypatch.setattr(tune, "_tuned", stand_in(2.5))
    assert tune.time_method("vanilla", b, c, v, None, True, {"vanilla.fwd": other}) == (
        2.0, {"vanilla.fwd": tuned_cfg}, False)
    pinned_runs.clear()
    foreign = {"vanilla.fwd": dict(other, BT=3)}
    assert not tune.recorded_in_family(foreign, family)
    assert not tune.recorded_in_family({"no.such.kernel": other}, family)
    assert tune.recorded_in_family({"vanilla.fwd": other}, family)
    assert tune.time_method("vanilla", b, c, v, None, True, foreign) == (2.0, {"vanilla.fwd": tuned_cfg}, False)
    assert pinned_runs == [{}]


def test_tune_writes_the_points_in_key_order_and_a_point_measured_again_keeps_its_place(tmp_path, monkeypatch):
    out = str(tmp_path / "h100.json")
    calls = []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, calls)
    assert tune.main(_tiny_grid(out, "both", "vanilla,block_based") + ["--n", "32,16"]) == 0
    keys = [(p["decay"], p["n"]) for p in json.loads(open(out).read())["points"]]
    assert keys == [(False, 16), (False, 32), (True, 16), (True, 32)]
    before = open(out).read().splitlines()
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 3.0, "block_based": 2.0}, calls)
    assert tune.main(_tiny_grid(out, "yes", "vanilla,block_based") + ["--n", "16", "--remeasure"]) == 0
    doc = json.loads(open(out).read())
    assert [(p["decay"], p["n"], p["measured"]["git_sha"]) for p in doc["points"]] == [
        (False, 16, "aaaaaaa"), (False, 32, "aaaaaaa"), (True, 16, "bbbbbbb"), (True, 32, "aaaaaaa")]
    after = open(out).read().splitlines()
    # besides the file's own record of the run, only the lines of the point measured again changed
    starts = [i for i, line in enumerate(after) if line == "  {"] + [len(after)]
    assert len(after) == len(before) and len(starts) == 5
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert any(starts[2] < i < starts[3] for i in changed)
    assert all(i < starts[0] or starts[2] < i < starts[3] for i in changed)


def test_tune_does_not_run_at_larger_n_what_lost_tenfold_at_a_measured_point(tmp_path, monkeypatch):
    out = str(tmp_path / "h100.json")
    grid = _tiny_grid(out, "no", "vanilla,causal_dot_product")
    calls = []
    _stand_in_tuner(monkeypatch, "ccccccc", {"vanilla": 1.0, "causal_dot_product": 20.0}, calls)
    assert tune.main(grid + ["--n", "16"]) == 0
    calls.clear()
    # n = 16 is in the file: its loser is dropped at n = 32 although this run did not measure it
    assert tune.main(grid + ["--n", "16,32"]) == 0
    assert calls == [("vanilla", 32)]
    doc = json.loads(open(out).read())
    assert {p["n"]: p["times_ms"]["causal_dot_product"] for p in doc["points"]} == {16: 320.0 / 16, 32: None}


def test_tune_prune_leaves_out_at_a_point_what_the_file_timed_there_past_the_factor(tmp_path, monkeypatch, capsys):
    """--remeasure --prune F: at each point the methods the file timed there at more than F x that point's
    fastest are not run (null, listed under "pruned"), and stay out in later --prune runs; the others, and
    points without such a loser, are measured as before; without --prune every method runs again."""
    out = str(tmp_path / "h100.json")
    grid = _tiny_grid(out, "yes", "vanilla,block_based,causal_dot_product")
    calls = []
    # at n = 16 block_based is 1.5x and causal_dot_product 3x vanilla; at n = 32 (times doubled) the same ratios
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 1.5, "causal_dot_product": 3.0}, calls)
    assert tune.main(grid + ["--n", "16,32"]) == 0
    assert len(calls) == 6

    for bad in (["--prune", "2"], ["--remeasure", "--prune", "1"], ["--remeasure", "--prune", "0.5"]):
        with pytest.raises(SystemExit):
            tune.main(grid + ["--n", "16"] + bad)
        assert "--prune" in capsys.readouterr().err

    calls.clear()
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 1.0, "block_based": 0.5, "causal_dot_product": 3.0}, calls)
    assert tune.main(grid + ["--n", "16,32", "--remeasure", "--prune", "2"]) == 0
    assert sorted(calls) == [("block_based", 16), ("block_based", 32), ("vanilla", 16), ("vanilla", 32)]
    by_n = {p["n"]: p for p in json.loads(open(out).read())["points"]}
    for n, p in by_n.items():
        assert p["pruned"] == ["causal_dot_product"] and p["times_ms"]["causal_dot_product"] is None
        assert p["best"] == "block_based" and p["times_ms"]["block_based"] == 0.5 * n / 16
    assert "causal_dot_product=-" in capsys.readouterr().out

    # a later --prune run keeps the pruned method out although the file holds no time of it; at 1.5 now
    # vanilla (2x block_based) is out too; without --prune all three run again and nothing is listed
    calls.clear()
    _stand_in_tuner(monkeypatch, "ccccccc", {"vanilla": 1.0, "block_based": 0.5, "causal_dot_product": 3.0}, calls)
    assert tune.main(grid + ["--n", "16", "--remeasure", "--prune", "1.5"]) == 0
    assert calls == [("block_based", 16)]
    p16 = {p["n"]: p for p in json.loads(open(out).read())["points"]}[16]
    assert p16["pruned"] == ["vanilla", "causal_dot_product"]
    calls.clear()
    _stand_in_tuner(monkeypatch, "ddddddd", {"vanilla": 1.0, "block_based": 0.5, "causal_dot_product": 3.0}, calls)
    assert tune.main(grid + ["--n", "16", "--remeasure"]) == 0
    assert sorted(calls) == [("block_based", 16), ("causal_dot_product", 16), ("vanilla", 16)]
    p16 = {p["n"]: p for p in json.loads(open(out).read())["points"]}[16]
    assert "pruned" not in p16 and p16["times_ms"]["causal_dot_product"] == 3.0

    # a method the point did not run (null: 10x slower at a smaller n, pruned, out of memory) stays out; one
    # it does not name (not asked for then) is measured
    point = {"times_ms": {"vanilla": 1.0, "block_based": 1.9, "causal_dot_product": None}}
    assert tune.pruned_methods(point, 2.0) == {"causal_dot_product"}
    assert tune.pruned_methods(point, 1.5) == {"causal_dot_product", "block_based"}
    assert tune.pruned_methods(dict(point, pruned=["recursion"]), 2.0) == {"causal_dot_product", "recursion"}


def test_tune_warm_workers_compiles_the_variants_of_the_points_to_measure_first(tmp_path, monkeypatch):
    """--warm-workers N: before the first point, the kernel variants that the points left to measure launch
    (no point already measured, each method asked for) go to the warm's parallel compile, in N processes."""
    from leettriton.autotune import warm

    out = str(tmp_path / "h100.json")
    calls = []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, calls)
    assert tune.main(_tiny_grid(out, "yes", "vanilla,block_based") + ["--n", "16"]) == 0
    compiled = []
    monkeypatch.setattr(warm, "compile_tasks", lambda tasks, workers: compiled.append((list(calls), tasks, workers)))
    calls.clear()
    assert tune.main(_tiny_grid(out, "yes", "vanilla,block_based") + ["--n", "16,32", "--warm-workers", "3"]) == 0
    assert calls == [("vanilla", 32), ("block_based", 32)]
    [(timed_before, tasks, workers)] = compiled
    assert timed_before == [] and workers == 3
    assert {(t[0], t[1], t[2], t[3], t[4], t[10], t[11]) for t in tasks} == {
        (m, "float32", 4, 4, True, 1, 32) for m in ("vanilla", "block_based")}
    assert tasks == warm.cases_tasks([(m, "float32", 4, 4, True, False, False, 1, 1, 32)
                                      for m in ("vanilla", "block_based")])
    with pytest.raises(SystemExit):
        tune.main(_tiny_grid(out, "yes", "vanilla") + ["--n", "16", "--warm-workers", "-1"])


def test_tune_merges_shards_measured_apart(tmp_path, monkeypatch, capsys):
    """Shards written with --out on separate GPUs come together with --merge: a shard's point replaces the
    same key's, other points stay, the grids unite, nothing is measured; a foreign file changes nothing."""
    out, shard_a, shard_b = (str(tmp_path / f) for f in ("h100.json", "a.json", "b.json"))
    calls = []
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, calls)
    assert tune.main(_tiny_grid(out, "yes", "vanilla,block_based") + ["--n", "16,32"]) == 0
    _stand_in_tuner(monkeypatch, "bbbbbbb", {"vanilla": 3.0, "block_based": 2.0}, calls)
    assert tune.main(_tiny_grid(shard_a, "yes", "vanilla,block_based") + ["--n", "32"]) == 0
    assert tune.main(_tiny_grid(shard_b, "no", "vanilla,block_based") + ["--n", "64"]) == 0
    before = open(out).read()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # merging needs no GPU
    calls.clear()

    foreign = tmp_path / "a100.json"
    foreign.write_text(json.dumps({"format": FORMAT, "family": "a100", "measured": {}, "grid": {}, "points": []}))
    assert tune.main(["--gpu", "h100", "--out", out, "--merge", shard_a, str(foreign)]) == 2
    assert "not a h100 heuristic file" in capsys.readouterr().err
    assert open(out).read() == before

    assert tune.main(["--gpu", "h100", "--out", out, "--merge", shard_a, shard_b]) == 0
    assert calls == []
    doc = json.loads(open(out).read())
    got = {(p["decay"], p["n"]): (p["best"], p["measured"]["git_sha"]) for p in doc["points"]}
    assert got == {(True, 16): ("vanilla", "aaaaaaa"), (True, 32): ("block_based", "bbbbbbb"),
                   (False, 64): ("block_based", "bbbbbbb")}
    assert doc["grid"]["n"] == [16, 32, 64] and doc["grid"]["decay"] == [False, True]
    assert doc["measured"] == json.loads(open(shard_b).read())["measured"]
    assert len(read_heuristics(out, "h100", leettriton.METHODS).points) == 3


def test_tune_merge_keeps_each_point_s_later_measurement_whatever_the_order(tmp_path, monkeypatch, capsys):
    """Two GPU calls each start from the committed file and measure different points; each call's file holds
    the other's points as the committed file had them.  Joined in either order, each point comes from the
    call that measured it last, and the file's "measured" is the later call's."""
    base = str(tmp_path / "h100.json")
    _stand_in_tuner(monkeypatch, "aaaaaaa", {"vanilla": 1.0, "block_based": 2.0}, [])
    assert tune.main(_tiny_grid(base, "yes", "vanilla,block_based") + ["--n", "16,32"]) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def call(name, sha, date, n):
        doc = json.loads(open(base).read())
        doc["measured"] = dict(doc["measured"], git_sha=sha, date=date)
        for p in doc["points"]:
            if p["n"] == n:
                p["best"], p["config"] = "block_based", p["configs"]["block_based"]
                p["measured"] = dict(p["measured"], git_sha=sha, date=date)
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return str(path)

    first = call("first.json", "bbbbbbb", "2099-01-01 10:00 UTC", 16)
    second = call("second.json", "ccccccc", "2099-01-01 10:10 UTC", 32)
    for order in ([first, second], [second, first]):
        out = str(tmp_path / "out.json")
        shutil.copy(base, out)
        assert tune.main(["--gpu", "h100", "--out", out, "--merge", *order]) == 0
        doc = json.loads(open(out).read())
        got = {p["n"]: (p["best"], p["measured"]["git_sha"]) for p in doc["points"]}
        assert got == {16: ("block_based", "bbbbbbb"), 32: ("block_based", "ccccccc")}
        assert doc["measured"]["git_sha"] == "ccccccc"
        assert "1 of its 2 points taken (1 measured before the file's own)" in capsys.readouterr().out


def _cpu_graph(fn):
    """The tuner's ``graph_replay`` on the CPU: the warm call and the captured one run as a capture runs them;
    the replay runs nothing of Python's, as a CUDA graph's does not."""
    fn()
    fn()
    return lambda: None


def test_tune_times_a_method_s_alternatives_each_with_its_own_schedule(monkeypatch):
    """After the autotuned choice, the tuner times each of the method's alternatives (configs the
    autotuner could not time under their own schedule): pinned, the method's other kernels autotuned
    afresh under it (every autotuner's choice forgotten first), and keeps the fastest with its configs."""
    import dataclasses
    import triton.testing
    from leettriton import registry

    method = registry.builtin("block_based")
    walk = method.spaces[0].name
    slow, fast = dict(BT=32, num_stages=3), dict(BT=64, num_stages=3)
    alternatives = [{walk: slow}, {walk: fast}]
    monkeypatch.setattr(tune.registry, "builtin", lambda name: dataclasses.replace(
        method, alternatives=lambda p, family: alternatives))
    ran, forgotten = [], []
    real_run = tune.run_problem

    def run(p, name, config=None):
        ran.append(config)
        if config is None:   # the autotuned call runs (and tunes: the autotuners remember a choice)
            real_run(p, name)
            assert any(kernel.cache for kernel in KERNELS.values())
        else:
            if config.get(walk) in (slow, fast) and all(c is None or c.get(walk) != config[walk] for c in ran[:-1]):
                # an alternative's first call: it tunes whatever it does not pin
                forgotten.append(all(not kernel.cache for kernel in KERNELS.values()))
            p.out.zero_()   # a stand-in launch: a capture that records no work is refused (graph_replay)
    monkeypatch.setattr(tune, "run_problem", run)
    times = {None: 2.0, "BT32": 3.0, "BT64": 1.5}

    real_bench = triton.testing.do_bench

    def bench(fn, **kwargs):
        if "quantiles" in kwargs:   # an autotuner's trial, inside the autotuned call (on a GPU)
            return real_bench(fn, **kwargs)
        fn()
        cfg = ran[-1].get(walk)
        return times[f"BT{cfg['BT']}" if cfg in (slow, fast) else None]
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    if DEVICE == "cpu":   # (a GPU's autotuner times its trials for real, with its own synchronizations)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(tune, "graph_replay", _cpu_graph)

    b, c, v, gamma, _ = Case(1, 1, 64, 8, 8, dtype=torch.float32, gamma=0.9).tensors(DEVICE)
    ms, config, _ = tune.time_method("block_based", b, c, v, gamma, retune=False)
    assert ms == 1.5 and config == {walk: fast}
    # the autotuned call, its graph (a warm call and the captured one), then each alternative: tuned (after
    # forgetting), then its graph; beside the first alternative the autotuned call's other kernels' choices
    # (the state pass's: _tuned_reusing's guess, which stands here since the stand-in launches nothing)
    assert ran[0] is None and ran[1] == ran[2]
    assert [{walk: c[walk]} for c in ran[3:]] == [{walk: slow}] * 3 + [{walk: fast}] * 3
    assert ran[3] == {**{k: cfg for k, cfg in ran[1].items() if k != walk}, walk: slow}
    assert forgotten == [True, True]

    times["BT64"] = 2.5   # no alternative beats the autotuned choice: it stays
    ran.clear()
    ms, config, _ = tune.time_method("block_based", b, c, v, gamma, retune=False)
    assert ms == 2.0 and config.get(walk) not in (slow, fast) and config == ran[1]


@pytest.mark.parametrize("retune", [True, False])
def test_tune_alternatives_reuse_a_kernel_s_choice_for_launches_its_autotuner_met_at_the_point(monkeypatch, retune):
    """An alternative's other kernels are not tuned again for launches their autotuners met at the point:
    a walk config whose segments are those of one timed before gets the state pass's choice for them
    pinned; one whose segments are new, or whose guess (the last alternative's choice) was for other
    launches, runs again with what the point chose for its launches, or tunes.  Each alternative ends with
    the config its own tuning would give (a state config chosen for other segments costs 100 ms here)."""
    import contextlib
    import dataclasses
    from types import SimpleNamespace
    from leettriton import registry

    walk, state = "block_based.fwd", "segments.state"
    kernel = {name: SimpleNamespace(space=SimpleNamespace(name=name)) for name in (walk, state)}
    segments = {1: 4, 2: 4, 3: 8, 4: 4}          # a walk config (by BT) -> its segments
    base_ms = {1: 5.0, 2: 4.0, 3: 3.0, 4: 2.0}
    logs, tuned, picks = [], [], {}

    @contextlib.contextmanager
    def recording():
        logs.append([])
        yield logs[-1]

    def run(p, name, config=None):
        config = config or {}
        bt = config.get(walk, {"BT": 1})["BT"]
        picks.clear()
        for name_ in (walk, state):
            logs[-1].append((kernel[name_], {"NS": segments[bt], "x": torch.empty(2, 3)}))
            if name_ not in config:   # its autotuner runs: the state pass's choice follows the segments
                tuned.append((name_, segments[bt]))
                picks[name_] = {"BT": 1} if name_ == walk else {"BV": segments[bt]}

    def whole_call_ms(p, name, config):
        cfg = config[walk]["BT"]
        return base_ms[cfg] + (0.0 if config[state] == {"BV": segments[cfg]} else 100.0)

    method = registry.builtin("block_based")
    alternatives = [{walk: {"BT": bt}} for bt in (2, 3, 4)]
    monkeypatch.setattr(tune.registry, "builtin", lambda name: dataclasses.replace(
        method, alternatives=lambda p, family: alternatives, whole_call=()))
    monkeypatch.setattr(tune, "recording", recording)
    monkeypatch.setattr(tune, "run_problem", run)
    monkeypatch.setattr(tune, "chosen_configs", lambda log: dict(picks))
    monkeypatch.setattr(tune, "_whole_call_ms", whole_call_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    b = c = v = torch.zeros(1, 1, 8, 4)
    ms, config, _ = tune.time_method("block_based", b, c, v, None, retune=retune)
    assert ms == 2.0 and config == {walk: {"BT": 4}, state: {"BV": 4}}
    # tuned: the autotuned call's two kernels; the state pass again only for the 8 segments of BT 3 (and,
    # without retune, whose choices the autotuners' caches may hold from another point, for BT 2's 4 too)
    assert tuned == [(walk, 4), (state, 4)] + ([] if retune else [(state, 4)]) + [(state, 8)]
    # BT 2 stands with the guess; BT 3 runs with it, then tunes; BT 4 runs with BT 3's, then with the point's
    runs = [len(log) and log[0][1]["NS"] for log in logs]
    assert len(logs) == (1 + 1 + 2 + 2 if retune else 1 + 2 + 2 + 2) and runs[-1] == 4


def test_tune_times_a_whole_call_kernel_s_other_configs_pinned_beside_the_chosen_ones(monkeypatch):
    """``Method.whole_call``: after the autotuned choice, each other config of block_based's segment-state
    kernel that fits its launch runs in the whole call with the walk's chosen config pinned beside it, and
    the fastest is kept; where that kernel does not run (one segment), nothing more is timed."""
    import dataclasses
    import triton.testing
    from leettriton import registry

    method = registry.builtin("block_based")
    state = method.whole_call[0]
    assert state.name == "segments.state"
    seen_args = []
    # two configs besides the autotuner's choice (pinned runs are recorded, and launch a stand-in)
    wide, narrow = dict(BT=64, BK=256, BV=128, num_warps=8, num_stages=3), dict(BT=16, BK=16, BV=16, num_warps=1,
                                                                               num_stages=1)
    ran = []

    class Space:   # the state space as the family would list it for this launch
        name = state.name

        @staticmethod
        def usable(family, args):
            seen_args.append(args)
            return [wide, ran[1][state.name], narrow]

    monkeypatch.setattr(tune.registry, "builtin", lambda name: dataclasses.replace(
        method, alternatives=lambda p, family: [], whole_call=(Space,)))
    real_run = tune.run_problem

    def run(p, name, config=None):
        ran.append(config)
        if config is None:
            real_run(p, name)
        else:
            p.out.zero_()   # a stand-in launch: a capture that records no work is refused (graph_replay)
    monkeypatch.setattr(tune, "run_problem", run)
    times = {None: 2.0, "wide": 1.5, "narrow": 3.0}

    real_bench = triton.testing.do_bench

    def bench(fn, **kwargs):
        if "quantiles" in kwargs:
            return real_bench(fn, **kwargs)
        fn()
        cfg = ran[-1].get(state.name)
        return times["wide" if cfg == wide else "narrow" if cfg == narrow else None]
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    if DEVICE == "cpu":
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(tune, "graph_replay", _cpu_graph)

    # several segments (the interpreter cuts 40 rows, a GPU at least 1024), then one
    segmented, single = (64, 32) if DEVICE == "cpu" else (4096, 512)
    b, c, v, gamma, _ = Case(1, 1, segmented, 8, 8, dtype=torch.float32, gamma=0.9).tensors(DEVICE)
    ms, config, _ = tune.time_method("block_based", b, c, v, gamma, retune=True)
    chosen = ran[1]   # the autotuned call's configs, as timed
    assert set(chosen) >= {method.spaces[0].name, state.name}
    assert ms == 1.5 and config == {**chosen, state.name: wide}
    # the autotuned call, its graph, then each other state config's graph (a warm call and the captured one),
    # the walk's pinned
    assert ran[2] == chosen and ran[3:] == [{**chosen, state.name: cfg} for cfg in (wide, wide, narrow, narrow)]
    assert len(seen_args) == 1 and seen_args[0]["R"] == 8 and seen_args[0]["SEG"] < segmented

    times["wide"] = 2.5   # no other config beats the chosen one: it stays
    ran.clear()
    ms, config, _ = tune.time_method("block_based", b, c, v, gamma, retune=True)
    assert ms == 2.0 and config == ran[1]

    ran.clear()
    seen_args.clear()
    b, c, v, gamma, _ = Case(1, 1, single, 8, 8, dtype=torch.float32, gamma=0.9).tensors(DEVICE)
    ms, config, _ = tune.time_method("block_based", b, c, v, gamma, retune=True)
    assert ms == 2.0 and state.name not in config and len(ran) == 3 and not seen_args
