"""Hostile heuristic files: every malformed file is refused at load with a ``HeuristicsError`` that names
the file, the point (its index and key fields) and the key, with what was expected and what was found;
never silent garbage, a raw error from the kernel call, or a silent fallback (docs/design.md §5.4)."""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest

import leettriton
from leettriton.autotune import KERNELS, HeuristicsError, current_family, pinnable_configs
from leettriton.autotune import heuristics
from leettriton.autotune.heuristics import FORMAT, active_heuristics, default_path, read_heuristics
from conftest import DEVICE
from helpers import Case

FAMILY = "cpu"   # the files below are read with this family named, whatever the device
WALK = "block_based.fwd"
CPU_WALK = dict(KERNELS[WALK].space.cpu)


def good_point(n=100, family=FAMILY, **changes):
    walk = pinnable_configs(KERNELS[WALK].space, family)[0]   # the family's first walk config
    p = {"dtype": "float32", "decay": True, "r": 8, "d": 8, "bh": 2, "n": n, "best": "block_based",
         "config": {WALK: dict(walk)}, "times_ms": {"block_based": 1.0, "vanilla": 2.0},
         "configs": {"block_based": {WALK: dict(walk)}, "vanilla": {}}}
    p.update(changes)
    return p


def write(tmp_path, points, family=FAMILY, name="bad.json", top=None):
    doc = {"format": FORMAT, "family": family, "measured": {}, "grid": {}, "points": points}
    doc.update(top or {})
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def label(p):
    """How a message names a point's key fields (those it has)."""
    return json.dumps({k: p[k] for k in ("dtype", "decay", "r", "d", "bh", "n") if k in p})


@pytest.fixture(autouse=True)
def no_active_file():
    """Each test starts and ends with the heuristics in use before it."""
    saved = dict(heuristics._ACTIVE)
    yield
    heuristics._ACTIVE.clear()
    heuristics._ACTIVE.update(saved)
    heuristics._GENERATION[0] += 1


def with_walk(family=FAMILY, **changes):
    return {WALK: {**pinnable_configs(KERNELS[WALK].space, family)[0], **changes}}


def without(mapping, key):
    return {k: v for k, v in mapping.items() if k != key}


# name: (the bad point, the key the message names, what it found, what it expected)
BAD_POINTS = {
    "BV_negative": (good_point(config=with_walk(BV=-16)), f"config['{WALK}']['BV']", "is -16 (an integer)",
                    "expected one of ["),
    "BT_3": (good_point(config=with_walk(BT=3)), f"config['{WALK}']['BT']", "is 3 (an integer)", "expected one of ["),
    "BT_0": (good_point(config=with_walk(BT=0)), f"config['{WALK}']['BT']", "is 0 (an integer)", "expected one of ["),
    "BT_4096": (good_point(config=with_walk(BT=4096)), f"config['{WALK}']['BT']", "is 4096 (an integer)",
                "expected one of ["),
    "BT_string": (good_point(config=with_walk(BT="16")), f"config['{WALK}']['BT']", 'is "16" (a string)',
                  "expected an integer"),
    "BT_float": (good_point(config=with_walk(BT=16.0)), f"config['{WALK}']['BT']", "is 16.0 (a number)",
                 "expected an integer"),
    "num_warps_bool": (good_point(config=with_walk(num_warps=True)), f"config['{WALK}']['num_warps']",
                       "is true (a boolean)", "expected an integer"),
    "config_without_BT": (good_point(config={WALK: without(CPU_WALK, "BT")}), f"config['{WALK}']['BT']",
                          f"lacks the key config['{WALK}']['BT']", "expected every config of kernel"),
    "config_extra_key": (good_point(config=with_walk(BX=16)), f"config['{WALK}']['BX']", "is 16 (an integer)",
                         "expected only the parameters of kernel"),
    "config_not_object": (good_point(config={WALK: [16, 64, 32]}), f"config['{WALK}']", "is [16, 64, 32] (a list)",
                          "expected a config of kernel"),
    "config_unknown_kernel": (good_point(config={"no.such.kernel": {}}), "config", "(an object)",
                              "config for unknown kernels ['no.such.kernel']"),
    "method_config_BV_negative": (good_point(configs={"block_based": with_walk(BV=-16)}),
                                  f"configs['block_based']['{WALK}']['BV']", "is -16", "expected one of ["),
    "point_without_decay": (without(good_point(), "decay"), "'decay'", "lacks the key 'decay'",
                            "expected every point to hold dtype, decay, r, d, bh, n, best"),
    "point_without_best": (without(good_point(), "best"), "'best'", "lacks the key 'best'",
                           "expected every point to hold"),
    "decay_string": (good_point(decay="false"), "'decay'", "is \"false\" (a string)", "expected a JSON boolean"),
    "decay_integer": (good_point(decay=0), "'decay'", "is 0 (an integer)", "expected a JSON boolean"),
    "best_auto": (good_point(best="auto"), "'best'", 'is "auto" (a string)', "not auto itself"),
    "best_unknown": (good_point(best="nonsense"), "'best'", 'is "nonsense"', "not an unknown method 'nonsense'"),
    "best_not_string": (good_point(best=3), "'best'", "is 3 (an integer)", "expected a method name"),
    "dtype_unknown": (good_point(dtype="float64"), "'dtype'", 'is "float64" (a string)',
                      "expected one of 'float16', 'bfloat16', 'float32'"),
    "r_string": (good_point(r="8"), "'r'", 'is "8" (a string)', "expected a positive integer"),
    "n_bool": (good_point(n=True), "'n'", "is true (a boolean)", "expected a positive integer"),
    "bh_zero": (good_point(bh=0), "'bh'", "is 0 (an integer)", "expected a positive integer"),
    "times_ms_string": (good_point(times_ms={"block_based": "1.0"}), "times_ms['block_based']",
                        'is "1.0" (a string)', "expected a non-negative number of milliseconds, or null"),
    "pruned_unknown": (good_point(pruned=["no_such_method"]), "pruned[0]", 'is "no_such_method"',
                       "not an unknown method"),
}


@pytest.mark.parametrize("name", list(BAD_POINTS))
def test_a_bad_point_is_refused_naming_the_file_the_point_and_the_key(tmp_path, name):
    bad, key, found, expected = BAD_POINTS[name]
    path = write(tmp_path, [good_point(n=50), copy.deepcopy(bad)])
    with pytest.raises(HeuristicsError) as info:
        read_heuristics(path, FAMILY, leettriton.METHODS)
    err, msg = info.value, str(info.value)
    assert isinstance(err, ValueError)
    assert msg.startswith(f"heuristic file {path}: point 1 {label(bad)}: "), msg
    assert key in msg and found in msg and expected in msg, msg
    assert "python -m leettriton.tune" in msg, msg
    assert (err.path, err.point, err.key) == (path, 1, key)


def test_a_point_that_is_not_an_object(tmp_path):
    path = write(tmp_path, [good_point(), "float16"])
    with pytest.raises(HeuristicsError, match=r"point 1: points\[1\] is \"float16\" \(a string\); expected an object"):
        read_heuristics(path, FAMILY, leettriton.METHODS)


def test_a_point_measured_twice(tmp_path):
    path = write(tmp_path, [good_point(best="vanilla"), good_point(), good_point(n=200)])
    with pytest.raises(HeuristicsError, match=r"point 1 .*expected each point once \(point 0 has the same ones\)"):
        read_heuristics(path, FAMILY, leettriton.METHODS)


@pytest.mark.parametrize("top,key,why", [
    ({"family": None}, "'family'", "'family' is null; expected a family name"),
    ({"points": {"0": {}}}, "'points'", "'points' is .*expected a list of points"),
    ({"measured": []}, "'measured'", "'measured' is \\[\\] \\(a list\\); expected an object"),
], ids=["family_null", "points_not_list", "measured_not_object"])
def test_bad_top_level_keys(tmp_path, top, key, why):
    path = write(tmp_path, [good_point()], top=top)
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}: {why}") as info:
        read_heuristics(path, methods=leettriton.METHODS)
    assert info.value.key == key and info.value.point is None


@pytest.mark.parametrize("missing", ["family", "points"])
def test_a_file_without_a_required_key(tmp_path, missing):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(without({"format": FORMAT, "family": FAMILY, "points": []}, missing)))
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}: lacks the key '{missing}'"):
        read_heuristics(str(path), methods=leettriton.METHODS)


def _only_on(family: str, other: str):
    """A kernel and a config that is one of its configs on ``family`` but not on ``other``."""
    for name, kernel in sorted(KERNELS.items()):
        theirs = pinnable_configs(kernel.space, other)
        for cfg in pinnable_configs(kernel.space, family):
            if cfg not in theirs:
                return name, cfg
    raise AssertionError(f"every config of the {family} family is one of the {other} family's")


def test_a_config_of_another_family_is_refused(tmp_path):
    """Membership is per family: a config the h100 lists hold and the a6000 lists do not."""
    name, cfg = _only_on("h100", "a6000")
    bad = good_point(family="h100", config={name: cfg})
    read_heuristics(write(tmp_path, [bad], family="h100", name="h100.json"), "h100", leettriton.METHODS)
    path = write(tmp_path, [good_point(n=50, family="a6000"), bad], family="a6000")
    with pytest.raises(HeuristicsError) as info:
        read_heuristics(path, "a6000", leettriton.METHODS)
    assert f"point 1 {label(bad)}" in str(info.value) and f"kernel '{name}' on the a6000 family" in str(info.value)
    assert info.value.key.startswith(f"config['{name}']")


def test_a_combination_the_space_leaves_out_is_refused(tmp_path):
    """Each value is one some config of the kernel takes, but the space's rules (its ``keep`` predicate, or
    the union of products it lists) leave this combination out."""
    for name, kernel in sorted(KERNELS.items()):
        listed = pinnable_configs(kernel.space, "h100")
        keys = list(listed[0])
        values = [sorted({c[k] for c in listed}) for k in keys]
        combo = next((dict(zip(keys, v)) for v in itertools.product(*values) if dict(zip(keys, v)) not in listed),
                     None)
        if combo is not None:
            break
    else:
        raise AssertionError("every space lists the full product of its values")
    bad = good_point(family="h100", config={name: combo})
    path = write(tmp_path, [good_point(n=50, family="h100"), bad], family="h100")
    with pytest.raises(HeuristicsError) as info:
        read_heuristics(path, "h100", leettriton.METHODS)
    msg = str(info.value)
    assert f"point 1 {label(bad)}: config['{name}'] is " in msg and "none combines them" in msg, msg
    assert info.value.key == f"config['{name}']"


def test_the_interpreter_s_file_may_pin_any_family_s_config(tmp_path):
    """The interpreter runs any config of a kernel, so a ``cpu`` file may pin one of a GPU family's."""
    cfg = next(c for c in KERNELS[WALK].space.family_configs("h100") if c != CPU_WALK)
    h = read_heuristics(write(tmp_path, [good_point(config={WALK: cfg})]), FAMILY, leettriton.METHODS)
    assert h.lookup("float32", True, 8, 8, 2, 100) == ("block_based", {WALK: cfg})


def test_the_variable_s_broken_file_fails_the_call_instead_of_falling_back(tmp_path, monkeypatch):
    """LEETTRITON_HEURISTICS names a broken file: auto raises (catchable as ValueError), it does not fall
    back; the message says how to fix it."""
    family = current_family().name
    bad = good_point(family=family, config=with_walk(family, BV=-16))
    path = write(tmp_path, [bad], family=family)
    monkeypatch.setenv("LEETTRITON_HEURISTICS", path)
    monkeypatch.setattr(heuristics, "_ACTIVE", {})
    b, c, v, g, _ = Case(1, 2, 100, 8, 8, gamma=0.9).tensors(DEVICE)
    with pytest.raises(ValueError) as info:
        leettriton.linear_attention(b, c, v, g)
    msg = str(info.value)
    assert isinstance(info.value, HeuristicsError)
    assert f"heuristic file {path}: point 0 {label(bad)}: config['{WALK}']['BV'] is -16" in msg, msg
    assert "python -m leettriton.tune" in msg and "unset LEETTRITON_HEURISTICS" in msg, msg


def test_load_heuristics_refuses_a_broken_file_and_keeps_the_one_in_use(tmp_path):
    family = current_family().name
    good = leettriton.load_heuristics(write(tmp_path, [good_point(family=family)], family=family, name="ok.json"))
    path = write(tmp_path, [good_point(family=family, decay="false")], family=family)
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}: point 0 .*'decay' is \"false\""):
        leettriton.load_heuristics(path)
    assert heuristics._ACTIVE[family] is good


def test_the_family_s_packaged_file_is_checked_when_it_resolves(tmp_path, monkeypatch):
    """The file a family resolves to (``heuristics/<family>.json``) is checked like any other, once: the
    loaded table is kept, so later calls do not read or check it again."""
    monkeypatch.delenv("LEETTRITON_HEURISTICS", raising=False)
    monkeypatch.setattr(heuristics, "_ACTIVE", {})
    monkeypatch.setattr(heuristics, "HERE", str(tmp_path))
    path = write(tmp_path, [good_point(family="h100"), good_point(n=200, family="h100", best="auto")], family="h100",
                 name="h100.json")
    assert default_path("h100") == path
    with pytest.raises(HeuristicsError, match=f"heuristic file {path}: point 1 .*'best' is \"auto\""):
        active_heuristics("h100", leettriton.METHODS)
    write(tmp_path, [good_point(family="h100"), good_point(n=200, family="h100", best="vanilla")], family="h100",
          name="h100.json")
    loaded = active_heuristics("h100", leettriton.METHODS)
    Path(path).write_text("broken since")   # the table in use was checked once, and is kept
    assert active_heuristics("h100", leettriton.METHODS) is loaded
    walk = pinnable_configs(KERNELS[WALK].space, "h100")[0]
    assert loaded.lookup("float32", True, 8, 8, 2, 200) == ("vanilla", {WALK: walk})


PACKAGED = sorted((Path(leettriton.__file__).parent / "autotune" / "heuristics").glob("*.json"))


@pytest.mark.parametrize("path", PACKAGED, ids=[p.stem for p in PACKAGED])
def test_the_packaged_files_load_clean(path):
    family = path.stem
    h = read_heuristics(str(path), family, leettriton.METHODS)
    doc = json.loads(path.read_text())
    assert h.family == family and len(h.points) == sum(p["best"] is not None for p in doc["points"])


def test_both_committed_files_are_packaged():
    assert {p.stem for p in PACKAGED} >= {"h100", "h200"}
