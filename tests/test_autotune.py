"""Families, config spaces and the autotune wrapper (no GPU needed)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch
import triton

from leettriton.autotune import FAMILIES, KERNELS, autotune_enabled
from leettriton.autotune.families import family_of_device
import leettriton.methods
from conftest import DEVICE
import leettriton.kernels.decode  # noqa: F401  (and decode_step's)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name,cap,family", [
    ("NVIDIA H100 80GB HBM3", (9, 0), "h100"), ("NVIDIA H200", (9, 0), "h200"), ("NVIDIA H800", (9, 0), "h100"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "a100"), ("NVIDIA RTX A6000", (8, 6), "a6000"),
    ("NVIDIA GeForce RTX 3090", (8, 6), "a6000"), ("NVIDIA L40S", (8, 9), "ada"),
])
def test_family_of_device(name, cap, family):
    assert family_of_device(name, cap).name == family


def test_undeclared_architecture_gets_its_own_family():
    fam = family_of_device("NVIDIA B200", (10, 0), smem_optin=232448, num_sms=148)
    assert fam.name == "sm_100" and fam.smem_per_block == 232448 and fam.num_sms == 148


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "cpu"])
def test_every_kernel_has_configs_for_every_family(family):
    assert KERNELS, "no kernel registered"
    for name, kernel in KERNELS.items():
        configs = kernel.space.family_configs(family)
        assert configs, f"{name} has no config for {family}"
        assert len(configs) <= 48, f"{name}: {len(configs)} configs for {family} is too many to tune"
        for cfg in configs:
            assert {"num_warps", "num_stages"} <= set(cfg), f"{name}: {cfg} lacks launch options"


def test_cpu_family_has_one_config_per_kernel():
    for name, kernel in KERNELS.items():
        assert len(kernel.space.family_configs("cpu")) == 1, name


def test_pruning_respects_shared_memory():
    """A family with less shared memory keeps only configs whose estimate fits it."""
    import torch
    from leettriton.autotune.families import Family

    kernel = KERNELS["vanilla.fwd"]
    args = {"R": 128, "D": 128, "v_ptr": torch.empty(1, dtype=torch.float16)}
    big = kernel.space.usable(FAMILIES["h100"], args)
    tiny = Family("tiny", (8, 6), 60000, 10, "test")
    small = kernel.space.usable(tiny, args)
    assert len(small) < len(big)
    assert all(kernel.space.smem(c, args) <= 60000 for c in small)


def test_axes_given_as_a_list_are_the_union_of_their_products_in_order():
    from leettriton.autotune import KernelSpace

    space = KernelSpace(
        name="test.union",
        axes={"default": [dict(BT=[64], BV=[32], num_warps=[4], num_stages=[2]),
                          dict(BT=[32, 16], BV=[64], num_warps=[4], num_stages=[3])]},
        cpu=dict(BT=16, BV=16, num_warps=4, num_stages=1),
        smem=lambda cfg, args: 0,
    )
    assert space.family_configs("h100") == [
        dict(BT=64, BV=32, num_warps=4, num_stages=2),
        dict(BT=32, BV=64, num_warps=4, num_stages=3),
        dict(BT=16, BV=64, num_warps=4, num_stages=3),
    ]


def test_chunk_walk_space_on_sm90_puts_64_row_chunks_first_for_16bit_only():
    from leettriton.methods.lightning_attention import space as walk

    def first(dtype, precision, r=128, d=128):
        args = {"R": r, "D": d, "v_ptr": torch.empty(1, dtype=dtype), "DOT_PRECISION": precision}
        return walk.FWD.usable(FAMILIES["h100"], args)

    assert first(torch.float16, "tf32")[0] == dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=2)
    # r > 128: 32-row chunks with value tiles of 32 or 64 on 4 warps, or 128-wide tiles on 8 warps (32- or
    # 64-row chunks); no 16-wide tiles where d is wider
    wide = first(torch.bfloat16, "tf32", r=256, d=256)
    assert {(cfg["BT"], cfg["BV"], cfg["num_warps"]) for cfg in wide} == {(32, 64, 4), (32, 32, 4), (64, 128, 8),
                                                                           (32, 128, 8)}
    assert {cfg["num_stages"] for cfg in wide if (cfg["BT"], cfg["num_warps"]) == (32, 8)} == {3, 4}
    # the 8-warp 32-row walk also holds all of r as one tile; no other config has a tile wider than 64
    assert {cfg["BK"] for cfg in wide if (cfg["BT"], cfg["num_warps"]) == (32, 8)} == {64, 256}
    assert all(cfg["BK"] == 64 for cfg in wide if (cfg["BT"], cfg["num_warps"]) != (32, 8))
    assert all(cfg["BK"] <= 64 for cfg in first(torch.float16, "tf32"))   # r ≤ 128: no tile past r
    assert len(first(torch.float16, "tf32", r=256, d=512)) <= 11
    assert all(cfg["num_warps"] == 4 for cfg in first(torch.float16, "tf32"))   # r ≤ 128: 4 warps only
    assert all(cfg["BT"] <= 32 for cfg in first(torch.float32, "tf32"))
    assert all(cfg["BT"] == 16 and cfg["BV"] == 16 for cfg in first(torch.float32, "ieee"))
    # 64-row chunks with 2 stages, and 3 or 4 (one program per multiprocessor) only at r ≤ 128
    assert {cfg["num_stages"] for cfg in first(torch.float16, "tf32") if cfg["BT"] == 64} == {2, 3, 4}
    assert all(cfg["num_stages"] == 2 for cfg in wide if cfg["BT"] == 64)


def test_segment_state_space_on_sm90_holds_all_of_r_in_one_tile_only_past_128():
    from leettriton.kernels import segments_space

    def tiles(dtype, r, d):
        args = {"R": r, "D": d, "v_ptr": torch.empty(1, dtype=dtype)}
        return {(cfg["BK"], cfg["BV"], cfg["num_warps"]) for cfg in segments_space.STATE.usable(FAMILIES["h100"], args)}

    assert (256, 128, 8) in tiles(torch.float16, 256, 512) and (256, 128, 8) in tiles(torch.bfloat16, 1024, 1024)
    assert (128, 128, 8) in tiles(torch.float16, 256, 512)
    # the 256 × 128 tile with 3 and 4 stages, the deeper one within the family's shared memory
    wide = [cfg for cfg in segments_space.STATE.usable(FAMILIES["h100"], {"R": 256, "D": 512, "v_ptr": torch.empty(
        1, dtype=torch.float16)}) if cfg["BK"] == 256]
    assert sorted(cfg["num_stages"] for cfg in wide) == [3, 4]
    assert max(segments_space.STATE.smem(cfg, {"v_ptr": torch.empty(1, dtype=torch.float16)}) for cfg in wide) \
        <= FAMILIES["h100"].smem_per_block
    # no tile wider than r, and none past 64 accumulator registers a thread but the 8-warp 256 × 128 one
    assert max(bk for bk, _, _ in tiles(torch.float16, 128, 128)) == 128
    assert all(bk * bv // (32 * w) <= 64 or (bk, bv, w) == (256, 128, 8) for bk, bv, w in tiles(torch.float16, 256, 512))
    # float32 operands: 64 × 64 tiles at most, whatever r
    assert all(bk * bv <= 64 * 64 for bk, bv, _ in tiles(torch.float32, 256, 512))


def test_block_based_segments_follow_the_walk_config_s_occupancy():
    """A walk config that leaves room for one program per SM gets segments for one program per SM (half
    as many, twice as long).  An autotuned walk is cut for the class the tuner chose (on sm_90, 16-bit,
    r = 128: one program a multiprocessor) and times only that class's configs, so that its choice, kept
    for every n, never runs under segments cut for another occupancy; the tuner times the others pinned,
    each with its own segments."""
    from leettriton.methods.block_based import space as bb
    from leettriton.problem import make_problem

    h100 = FAMILIES["h100"]
    two = dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=2)    # 80 KB of tiles at r = d = 128
    one = dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=3)    # 120 KB: one program per SM
    wide = dict(BT=64, BK=64, BV=128, num_warps=8, num_stages=2)  # 8 warps of 255 registers
    assert [bb.programs_per_sm(cfg, 128, 2, h100) for cfg in (two, one, wide)] == [2, 1, 1]
    assert bb.programs_per_sm(one, 64, 2, h100) == 2                 # narrower b and c tiles: two fit
    # the class an autotuned walk is cut for: one program a multiprocessor on sm_90 at 16-bit r = 128 (64-wide
    # tiles) and r = 256 (128-wide, where d has them); two elsewhere
    assert bb.reference_walk(128, 128, 2, h100) == bb.walk_class(one, 128, 128, 2, h100) == (64, 1)
    assert bb.reference_walk(256, 512, 2, h100) == bb.walk_class(wide, 256, 512, 2, h100) == (128, 1)
    assert bb.reference_walk(128, 128, 2, FAMILIES["h200"]) == (64, 1)
    assert bb.reference_walk(128, 32, 2, h100) == (32, 1)
    assert [bb.one_per_sm_reference(*args) for args in ((64, 64, 2, h100), (128, 128, 4, h100), (256, 64, 2, h100),
                                                        (128, 128, 2, FAMILIES["a100"]))] == [None] * 4
    assert bb.reference_walk(64, 64, 2, h100) == bb.reference_walk(128, 128, 2, FAMILIES["a100"]) == (64, 2)
    # 1 × 32 heads × 32 768: 64 walks (value tiles × heads), 132 SMs
    assert bb.segment_length(32, 32768, 128, 128, 2, h100, two) == 8192
    assert bb.segment_length(32, 32768, 128, 128, 2, h100, one) == bb.segment_length(32, 32768, 128, 128, 2, h100) \
        == 16384
    assert bb.segment_length(32, 32768, 128, 128, 4, h100) == 8192   # float32: cut for two a multiprocessor

    # the state pass: one segment but the last at one program per SM gives 32 heads × 2 tiles (of 128 × 64)
    # = 64 programs, cut into 8 pieces for 2 per SM; three at two per SM, 192 programs, into 2
    assert bb.segmenting(32, 32768, 128, 128, 2, h100, one) == bb.segmenting(32, 32768, 128, 128, 2, h100) == (16384, 8)
    assert bb.segmenting(32, 32768, 128, 128, 2, h100, two) == (8192, 2)
    # pieces of at least MIN_STATE_PIECE rows (none at 4 segments of 1024); segments rounded up to whole
    # pieces of SEGMENT_ALIGN rows (50 000 to 50 176 = 8 × 49 × 128)
    assert bb.segmenting(32, 4096, 128, 128, 2, h100, two) == (1024, 1)
    assert bb.segmenting(32, 100000, 128, 128, 2, h100, one) == bb.segmenting(32, 100000, 128, 128, 2, h100) \
        == (50176, 8)
    # RetNet-1.3B at 1 × 8192 (8 heads, r = 256, d = 512): 3 × 8 × 2 × 8 = 384 state programs, no pieces
    assert bb.segmenting(8, 8192, 256, 512, 2, h100) == bb.segmenting(8, 8192, 256, 512, 2, h100, wide) == (2048, 1)
    assert bb.schedule(make_problem(*(torch.empty(1, 32, 32768, 128, dtype=torch.float16) for _ in range(3)))[0],
                       h100, {bb.FWD.name: two}) == dict(seg_len=8192, split=2, prefix=False)

    v = torch.empty(1, dtype=torch.float16)
    ws = torch.empty(1, 32, 4, 1, 1)   # the walk's workspace, (B, H, NS, r, d): batch·heads 32
    seg = {"R": 128, "D": 128, "N": 32768, "SEG": 16384, "v_ptr": v, "ws_ptr": ws, "DOT_PRECISION": "ieee",
           "SEGMENTED": True}
    assert bb.FWD.trial(one, seg, h100) and not bb.FWD.trial(two, seg, h100)
    assert bb.FWD.trial(two, {**seg, "SEGMENTED": False}, h100)     # one segment: every config is timed
    # 1 × 32 heads × 2048: two segments either way (of at least MIN_SEGMENT rows), but a config of the other
    # class would get other segments at a longer n, where the autotuner's choice is kept: only the cut's class
    short = {**seg, "N": 2048, "SEG": 1024}
    assert bb.segment_length(32, 2048, 128, 128, 2, h100) == bb.segment_length(32, 2048, 128, 128, 2, h100, two) \
        == 1024
    assert bb.FWD.trial(one, short, h100) and not bb.FWD.trial(two, short, h100)
    # where the cut names no class, every config that gets the launch's segments is timed
    r64 = {**seg, "R": 64, "D": 64, "N": 8192, "SEG": bb.segment_length(32, 8192, 64, 64, 2, h100)}
    timed_r64 = [cfg for cfg in bb.FWD.usable(h100, r64) if bb.FWD.trial(cfg, r64, h100)]
    assert {cfg["num_stages"] for cfg in timed_r64 if cfg["BT"] == 64} == {2, 3, 4}

    b, c = (torch.empty(1, 2, 131072, 128, dtype=torch.float16) for _ in range(2))
    p, _ = make_problem(b, c, torch.empty(1, 2, 131072, 128, dtype=torch.float16), None)
    alternatives = [a["block_based.fwd"] for a in bb.alternatives(p, h100)]
    assert two in alternatives and one not in alternatives
    assert dict(one, BV=32) in alternatives                          # 32-wide value tiles: other segments too
    # the alternatives are exactly the usable configs the autotuner does not time under the reference segments
    usable = bb.FWD.usable(h100, {"R": 128, "D": 128, "v_ptr": v, "DOT_PRECISION": "ieee"})
    launch = {**seg, "N": 131072, "SEG": bb.segment_length(2, 131072, 128, 128, 2, h100),
              "ws_ptr": torch.empty(1, 2, 1, 1, 1)}
    assert sorted(map(str, alternatives)) == sorted(str(cfg) for cfg in usable if not bb.FWD.trial(cfg, launch, h100))
    # 2 × 32 heads × 2048: one segment for one program a multiprocessor (128 walks), two for two: those configs
    # are timed pinned, with their two segments
    wide_batch = torch.empty(2, 32, 2048, 128, dtype=torch.float16)
    many, _ = make_problem(wide_batch, wide_batch, wide_batch, None)
    assert bb.segment_length(64, 2048, 128, 128, 2, h100) == 2048
    pinned = [a["block_based.fwd"] for a in bb.alternatives(many, h100)]
    assert two in pinned and one not in pinned
    assert all(bb.segment_length(64, 2048, 128, 128, 2, h100, cfg) < 2048 for cfg in pinned)
    assert bb.alternatives(make_problem(b[:, :, :2048], c[:, :, :2048], b[:, :, :2048], None)[0],
                           FAMILIES["cpu"]) == []                   # the interpreter's segments take no config


def test_block_based_cut_for_a_class_always_has_configs_of_it_to_time():
    """Wherever an autotuned walk is cut for a class of configs (one_per_sm_reference), some config that fits
    the launch is of that class and gets its segments: the autotuner never falls back to configs cut for
    another occupancy.  Over widths powers of two and not (r up to one walk's 256: wider runs in pieces of it), both
    16-bit dtypes, batch 1 to 64 heads."""
    from leettriton.kernels.abi import problem_args
    from leettriton.methods.block_based import space as bb
    from leettriton.problem import make_problem

    checked = 0
    for family in (FAMILIES["h100"], FAMILIES["h200"]):
        for dtype in (torch.float16, torch.bfloat16):
            for r, d in itertools.product((80, 128, 200, 256), (16, 100, 128, 512, 1024)):
                for bh, n in ((1, 8192), (8, 8192), (32, 32768), (64, 65536)):
                    if bb.one_per_sm_reference(r, d, 2, family) is None:
                        continue
                    seg = bb.segment_length(bh, n, r, d, 2, family)
                    if seg >= n:
                        continue
                    b = torch.empty(1, 1, 1, r, dtype=dtype).expand(1, bh, n, r)
                    v = torch.empty(1, 1, 1, d, dtype=dtype).expand(1, bh, n, d)
                    p, _ = make_problem(b, b, v, None)
                    args = {**problem_args(p), "SEGMENTED": True, "SEG": seg, "ws_ptr": torch.empty(1, bh, 1, 1, 1)}
                    timed = [cfg for cfg in bb.FWD.usable(family, args) if bb.FWD.trial(cfg, args, family)]
                    assert timed, (family.name, dtype, r, d, bh, n)
                    classes = {bb.walk_class(cfg, r, d, 2, family) for cfg in timed}
                    assert classes == {bb.reference_walk(r, d, 2, family)}
                    checked += 1
    assert checked > 100


def test_segment_state_pass_is_tuned_apart_by_its_size_class():
    """The segment-state kernel's autotune key holds its pass's size class (pass_wave: its programs at 128 × 128
    tiles per multiprocessor, in powers of two from an eighth of a wave to two waves), never n: a tile chosen for
    a pass of a quarter of a wave is not kept for one of two.  Every launch of the kernel carries its class."""
    import leettriton
    from leettriton.autotune import current_family, recording
    from leettriton.kernels import segments, segments_space as sp
    from leettriton.methods.block_based import space as bb

    h200 = FAMILIES["h200"]
    assert "WAVE" in segments._segment_state_kernel.key_names
    assert not {"N", "SEG", "NL", "NS"} & set(segments._segment_state_kernel.key_names)
    # 1 × 32 heads, r = d = 128: 32 sums at 2048 rows (two segments), 64 at 4096, 128 at 8192, 256 from 32 768 (in
    # pieces); many more at larger batch
    assert [sp.pass_wave(sums, 128, 128, h200) for sums in (32, 64, 128, 256, 1024)] == [-3, -2, -1, 0, 1]
    # RetNet-1.3B's layer at 1 × 8192: 3 segments × 8 heads, 2 × 4 tiles of 128 × 128, 192 programs
    assert sp.pass_wave(24, 256, 512, h200) == 0
    assert sp.pass_wave(1, 16, 16, h200) == -3 and sp.pass_wave(10 ** 6, 64, 64, h200) == 1

    family = current_family(torch.device(DEVICE))
    n = 200   # long enough for block_based to cut it into segments on this device (40-row ones under the interpreter)
    while bb.segment_length(2, n, 32, 32, 4, family) >= n:
        n *= 2
    b, c, v = (torch.randn(1, 2, n, 32, device=DEVICE) for _ in range(3))
    with recording() as log:
        leettriton.linear_attention(b, c, v, torch.tensor([0.9, 0.99], device=DEVICE), method="block_based")
        leettriton.linear_attention(b, c, v, method="vanilla", return_state=True)   # the final state, directly
    passes = [args for kernel, args in log if kernel is segments._segment_state_kernel]
    assert [args["DIRECT"] for args in passes] == [False, True]
    assert [args["WAVE"] for args in passes] == [sp.pass_wave(2 * passes[0]["NL"], 32, 32, family),
                                                  sp.pass_wave(2, 32, 32, family)]


def test_block_based_small_states_take_shorter_segments_while_the_walk_sums_its_start_states():
    """At r = d = 64 segments go down to 512 rows as long as the walk sums its own start states (at most
    PREFIX_SEGMENTS segments); at r·d of 256 × 256 or more too, but only as far as one walk program a multiprocessor;
    at the states between, or where that needs more segments, 1024 rows at least."""
    from leettriton.methods.block_based import space as bb

    h100 = FAMILIES["h100"]
    cfg = dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=3)
    assert bb.PREFIX_SEGMENTS == 8
    # 1 × 16 heads: 16 walks; the rule asks for more segments than any of these lengths give
    assert [bb.segmenting(16, n, 64, 64, 2, h100, cfg)[0] for n in (2048, 4096, 8192)] == [512, 512, 1024]
    assert [bb.min_segment(n, 64, 64) for n in (2048, 4096, 5000, 8192, 32768)] == [512, 512, 625, 1024, 1024]
    assert bb.min_segment(2048, 128, 128) == bb.min_segment(2048, 64, 128) == bb.MIN_SEGMENT == 1024
    assert bb.min_segment(2048, 256, 512) == 1024 and bb.short_min_segment(2048) == 512
    # RetNet-1.3B's layer at 1 × 8 heads.  The 8-warp walk, one program a multiprocessor: 32 walks a segment, four
    # segments of 512 rows at n = 2048 (two of 1024 in the rule's wave alone)
    wide = dict(BT=32, BK=256, BV=128, num_warps=8, num_stages=3)
    assert bb.programs_per_sm(wide, 256, 2, h100) == 1
    assert [bb.segmenting(8, n, 256, 512, 2, h100, wide)[0] for n in (1024, 2048, 3072, 8192)] == [512, 512, 768, 2048]
    # the 4-warp walk, two programs a multiprocessor: 64 walks a segment; shorter segments only up to two
    # segments (one program a multiprocessor), so 2048 rows stay in two of 1024, and the wave of two programs a
    # multiprocessor gives four of 1024 at 4096 rows and of 2048 at 8192
    narrow = dict(BT=32, BK=64, BV=64, num_warps=4, num_stages=3)
    assert bb.programs_per_sm(narrow, 256, 2, h100) == 2
    assert [bb.segmenting(8, n, 256, 512, 2, h100, narrow)[0] for n in (1024, 2048, 4096, 8192)] == [512, 1024, 1024,
                                                                                                   2048]
    # a state just short of 256 × 256 entries keeps the rule's 1024 rows
    assert bb.segmenting(8, 2048, 128, 256, 2, h100, wide)[0] == 1024
    assert bb.segmenting(32, 2048, 128, 128, 2, h100, cfg)[0] == 1024
    for n in (2048, 4096, 5000, 6000):
        seg_len = bb.segmenting(16, n, 64, 64, 2, h100, cfg)[0]
        assert -(-n // seg_len) <= bb.PREFIX_SEGMENTS and bb.walk_sums_prefix(-(-n // seg_len), h100)


def test_autotune_switch(monkeypatch):
    monkeypatch.setenv("LEETTRITON_AUTOTUNE", "0")
    assert not autotune_enabled()
    monkeypatch.setenv("LEETTRITON_AUTOTUNE", "1")
    assert autotune_enabled()


@pytest.mark.parametrize("arch,family", [(90, "h100"), (80, "a100"), (86, "a6000")])
def test_kernels_compile_for_gpu_targets(arch, family):
    """Each kernel's first config compiles for the family's GPU target, within its shared memory.

    The interpreter accepts code the compiler rejects; this compiles real cubins
    on any machine (Triton ships LLVM and ptxas).
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    cmd = [sys.executable, "-m", "leettriton.autotune.compile", "--arch", str(arch), "--family", family, "--first"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "FAIL" not in res.stdout and "configs for" in res.stdout


def test_host_integer_helpers_match_triton():
    """The plain host helpers give what triton.cdiv / triton.next_power_of_2 give."""
    from leettriton.autotune.sizing import cdiv, next_power_of_2

    for a in (0, 1, 2, 15, 16, 17, 100000, 2 ** 31 + 3):
        for b in (1, 2, 16, 64, 100):
            assert cdiv(a, b) == triton.cdiv(a, b)
    for x in (1, 2, 3, 15, 16, 17, 100, 128, 129, 2 ** 20 + 1):
        assert next_power_of_2(x) == triton.next_power_of_2(x)


def test_problem_args_are_built_once_and_handed_out_as_copies():
    from leettriton.problem import make_problem
    from leettriton.kernels.abi import problem_args

    b = torch.randn(1, 2, 8, 4)
    p, _ = make_problem(b, b, b, 0.5)
    first = problem_args(p)
    first["BK"] = 999                      # a launcher adds its own arguments to its copy
    second = problem_args(p)
    assert "BK" not in second and second["b_ptr"] is p.b and second["HAS_DECAY"]
    assert second["b_strides"] == b.stride() + (1,)      # the group ends the tuple (1: not grouped)


def test_an_autotuned_choice_is_launched_directly_until_the_autotuner_forgets_it(monkeypatch):
    import leettriton

    kernel = KERNELS["lightning_attention.fwd"]
    calls = []
    tuned_run = kernel.run

    def counting_run(*args, **kwargs):
        calls.append(kwargs.get("grid"))
        return tuned_run(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", counting_run)
    kernel.cache.clear()
    gen = torch.Generator().manual_seed(0)
    b, c, v = (torch.randn(1, 2, 40, 16, generator=gen).to(DEVICE) for _ in range(3))
    ref = leettriton.reference(b, c, v, 0.9).float()

    def call(x=b):
        return leettriton.linear_attention(x, c.to(x.dtype), v.to(x.dtype), 0.9, method="lightning_attention")

    torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1 and kernel.cache              # the first launch tunes
    first = kernel.best_config
    kernel.best_config = None
    torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1                               # the second goes straight to the kernel
    assert kernel.best_config is first                   # and says which config ran
    call(b.to(torch.float16))
    assert len(calls) == 2                               # another dtype is another key: tuned
    kernel.cache.clear()
    torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-4)
    assert len(calls) == 3                               # a cleared autotuner tunes again


def test_config_fit_cache_tells_precisions_and_alignments_apart(monkeypatch):
    from leettriton.autotune import configs

    monkeypatch.setattr(configs, "current_family", lambda *a: FAMILIES["h100"])
    space = KERNELS["recursion.fwd"].space
    cfg = dict(BT=128, BJ=64, BK=32, BV=64, num_warps=4, num_stages=2)
    x = torch.empty(1, 1, 1, 1, dtype=torch.float32)
    args = dict(v_ptr=x, R=128, D=128, DOT_PRECISION="tf32", b_strides=(0, 0, 128, 1), c_strides=(0, 0, 128, 1),
                v_strides=(0, 0, 128, 1), o_strides=(0, 0, 128, 1))
    ieee = dict(args, DOT_PRECISION="ieee")
    assert configs._fits(space, cfg, args) == space.fits(cfg, args)
    assert configs._fits(space, cfg, ieee) == space.fits(cfg, ieee)
    assert space.fits(cfg, args) != space.fits(cfg, ieee)   # the case the cache must not merge


def _misfit_space():
    from leettriton.autotune import KernelSpace

    return KernelSpace(name="test.misfit", axes={"default": dict(BT=[64, 32], num_warps=[4], num_stages=[2])},
                       cpu=dict(BT=16, num_warps=4, num_stages=1), smem=lambda cfg, args: 0,
                       fits=lambda cfg, args: cfg["BT"] <= args["R"])


def test_a_pinned_config_that_does_not_fit_is_replaced_and_a_foreign_one_is_named(monkeypatch):
    from leettriton.autotune import configs

    monkeypatch.setattr(configs, "current_family", lambda *a, **k: FAMILIES["h100"])
    space, args = _misfit_space(), dict(R=40)
    # one of the family's configs, measured where it fit: the family's first that fits here, no warning
    # (a warning would be an error in this suite)
    assert configs._replace_misfit(space, dict(BT=64, num_warps=4, num_stages=2), args) == dict(
        BT=32, num_warps=4, num_stages=2)
    # a config the family does not have (a file measured with other kernels): named, once
    with pytest.raises(configs.PinnedConfigWarning, match="not one of its configs on the h100 family"):
        configs._replace_misfit(space, dict(BT=128, num_warps=8, num_stages=2), args)


def test_launch_replaces_a_pinned_config_only_when_it_does_not_fit(monkeypatch):
    from leettriton.autotune import configs

    monkeypatch.setattr(configs, "current_family", lambda *a, **k: FAMILIES["h100"])
    launched = []

    class Fn:
        def __getitem__(self, grid):
            return lambda **kw: launched.append({k: kw[k] for k in ("BT", "num_warps", "num_stages")})

    class Kernel:
        space, fn = _misfit_space(), Fn()

    configs.launch(Kernel, (1,), dict(BT=64, num_warps=4, num_stages=2), R=100, D=8)
    configs.launch(Kernel, (1,), dict(BT=64, num_warps=4, num_stages=2), R=40, D=8)
    assert launched == [dict(BT=64, num_warps=4, num_stages=2), dict(BT=32, num_warps=4, num_stages=2)]


def test_warm_lists_each_kernel_of_every_method_and_refuses_without_cuda(monkeypatch, capsys):
    """``python -m leettriton.autotune.warm``: its task list holds every built-in method's kernels, each kernel
    once with ``--first``; ``--shapes`` adds the variants another shape launches (n = 3000, not a multiple of 16,
    is another specialization of every kernel taking n; on a GPU family it may add segment kernels) and none
    twice; its defaults parse (the method list it imports), a bad ``--shapes`` is refused, and with no GPU it
    stops with a message before compiling anything."""
    from leettriton.autotune import warm
    from leettriton.methods import BUILTIN_METHODS

    tasks = warm._tasks(list(BUILTIN_METHODS), ["float16"], [(128, 128)], [(True, False, False)], 32, first=True)
    assert {t[0] for t in tasks} == set(BUILTIN_METHODS)
    per_method = [(t[0], t[8]) for t in tasks]
    assert len(per_method) == len(set(per_method))
    assert {(t[10], t[11]) for t in tasks} == {(1, 1024)}

    one = warm._tasks(["block_based"], ["float16"], [(128, 128)], [(True, False, False)], 4, first=False)
    again = warm._tasks(["block_based"], ["float16"], [(128, 128)], [(True, False, False)], 4, first=False,
                        shapes=[(1, 1024), (1, 1024)])
    assert again == one
    more = warm._tasks(["block_based"], ["float16"], [(128, 128)], [(True, False, False)], 4, first=False,
                       shapes=[(1, 1024), (1, 3000)])
    assert more[:len(one)] == one
    added = more[len(one):]
    assert {(t[10], t[11]) for t in added} == {(1, 3000)}
    # every kernel of 1 × 1024 again, with its configs (a GPU family that cuts n = 3000 into segments adds the
    # segment kernels besides)
    again_at_3000 = [t for t in added if t[8] in {u[8] for u in one}]
    assert {t[8] for t in again_at_3000} == {t[8] for t in one}
    assert sorted(repr(t[9]) for t in again_at_3000) == sorted(repr(t[9]) for t in one)

    for bad in ("1x", "0x1024", "1x1024x2", "a"):
        with pytest.raises(SystemExit):
            warm.main(["--shapes", bad])
        assert "--shapes takes BATCHxN" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        warm.main([])
    assert e.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err
