"""Configs of the fused chunk-walk kernel (kernels/lightning_attention.py).

Axes: BT (rows per chunk), BK (width of the r tiles: the state is held as
r/BK ≤ 4 register tiles of [BK, BV]), BV (value columns per program),
num_warps, num_stages.

One program keeps in registers the whole [r, BV] float32 state, the [BT, BV]
output tile, the [BT, BT] scores and their decay mask, and one [BT, BK] tile
of b upcast to float32 (the operand of the TF32 state product).  Measured on
sm_90 cubins (``perf/compile_check.py``, fp16, 4 warps, 3 stages), ptxas needs
~75-140 registers per thread on top of those for addresses, predicates and
the loaded tiles, so a config is kept when they come to at most
:data:`HELD_PER_THREAD` float32 values per thread.  With the rules below
(from the same measurements, Triton 3.6 and 3.9) it keeps every 16-bit config
measured clean at r = d = 32, 64, 128, 256 and drops every spilling one:

* r tiles of 32 only when r ≤ 32 (four [32, BV] state tiles go through the
  older mma.sync path and spill); r tiles of 128 are not offered (two [128, BV]
  tiles measured no better than four of 64 in registers, and spill at r = 256);
* r > 128: chunks of 32 rows only (64 sit at the register limit and spill with
  Triton 3.6 or on sm_80);
* 4 warps only: Triton gives chained tile products all warps along the rows,
  so 8 warps would need 128-row chunks, whose scores alone take 64 registers;
* ``num_stages`` ≥ 3 is what prefetches the next chunk (with 2, Triton 3.6 and
  3.9 issue the next loads right before waiting on them); 4 prefetches two;
* value tiles of 16 only where the state leaves no room for 32 (large r) or
  d is that small: each further value tile repeats the score product;
* float32 operands (TF32): the b tile counts twice (its loaded copy is float32
  too) and the bound is lower;
* float32 with ``precision="ieee"`` runs its products on CUDA cores, which hold
  whole operand rows per thread: no tile is spill-free there; the smallest
  tiles spill least (8-16 B at r = d = 128, ~850 B at r = d = 256).

Each family's list is the product of its axes; the rules leave at most 8
for any launch.
"""
from __future__ import annotations

from ..configs import KernelSpace
from ._util import elem_bytes, pow2, regs_per_thread

HELD_PER_THREAD = {"16bit": 144, "tf32": 116}
"""Upper bound on the float32 values a thread may hold (see the module docstring)."""


def _operands(args) -> str:
    if elem_bytes(args) == 2:
        return "16bit"
    return "tf32" if args.get("DOT_PRECISION") == "tf32" else "ieee"


def walk_smem(cfg, args) -> int:
    """Shared memory of one chunk-walk program (an upper bound): ``num_stages`` copies of
    the b, c, v tiles, the float32 state staged as the B operand of b · S, and the
    scores re-laid-out as an operand."""
    es = elem_bytes(args)
    bt, bv, rp = cfg["BT"], cfg["BV"], pow2(args["R"])
    return cfg["num_stages"] * bt * (2 * rp + bv) * es + rp * bv * 4 + bt * bt * es


def walk_fits(cfg, args) -> bool:
    bt, bk, bv, warps = cfg["BT"], cfg["BK"], cfg["BV"], cfg["num_warps"]
    rp, dp = pow2(args["R"]), pow2(args["D"])
    if bv > dp or bk > max(rp, 32) or rp > 4 * bk:
        return False
    kind = _operands(args)
    if cfg["num_stages"] == 1 and not (kind != "16bit" and rp > 128):
        return False
    if kind == "ieee":
        return bt == 16 and bv == 16 and bk == max(32, rp // 4)
    if bt < 32 or (bk == 32 and rp > 32):
        return False
    if rp > 128 and bt > 32:
        return False
    if bv == 16 and rp <= 128 and dp > 16:
        return False
    # float32 operands: the b tile upcast for the state product is itself a float32 load
    held = rp * bv + bt * bv + 2 * bt * bt + (2 if kind == "tf32" else 1) * bt * bk
    return regs_per_thread(held, warps) <= HELD_PER_THREAD[kind]


def walk_space(name: str) -> KernelSpace:
    """The chunk-walk config space under ``name`` (one per method that launches the walk)."""
    # value order = preference: the first fitting config is the one run untuned.
    # sm_90: no 64-row chunks.  With them the M = 64 products go to Hopper's warpgroup MMA, and on an
    # H200 with Triton 3.6 the walk then returned wrong outputs and states (relative error ~0.7) and,
    # now and then, an illegal address (perf/config_sweep.py); 32-row chunks, on the mma.sync path,
    # were exact in the same sweep.  On an H100 (Triton 3.6) a 64-row walk (BV 32, 3 stages) met an
    # illegal address at 1 × 32 heads × 100 000 (perf/results/h100/walk_configs.log).
    # sm_90: value tiles of 64 first (at r = d = 128 the tuner's choice: 32-wide tiles repeat the score
    # product twice as often, 1.9× slower at 1 × 100 000 in perf/results/h100/walk_configs.log).
    sm90 = dict(BT=[32, 16], BK=[64, 32], BV=[64, 32, 16], num_warps=[4], num_stages=[4, 3])
    ampere = dict(BT=[64, 32, 16], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[3, 2])
    # one stage (no prefetch) only where nothing else fits (r > 128 with float32 operands)
    small_smem = dict(BT=[64, 32, 16], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[2, 1])
    return KernelSpace(
        name=name,
        axes={"default": ampere, "a100": ampere, "a6000": small_smem, "ada": small_smem, "h100": sm90, "h200": sm90},
        cpu=dict(BT=16, BK=64, BV=32, num_warps=4, num_stages=1),
        smem=walk_smem,
        fits=walk_fits,
    )


FWD = walk_space("lightning_attention.fwd")
