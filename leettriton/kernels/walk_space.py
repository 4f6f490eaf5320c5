"""Configs of the chunk walk (kernels/walk.py): one table, one space per method that launches it.

Axes: BT (rows per chunk), BK (width of the r tiles: the transposed state is
held as r/BK ≤ 4 register tiles of [BV, BK]), BV (value columns per program),
num_warps, num_stages.

One program keeps in registers the whole [BV, r] float32 state, the [BV, BT]
output tile, the [BT, BT] scores and their decay mask, and (16-bit inputs)
the 16-bit copy of one state tile, the register operand of the state product.
The rules below come from sm_90 cubins of every combination of the axes at
r = d = 32, 64, 128, 256 in float16 and bfloat16 (``python -m
leettriton.autotune.compile`` reports registers and spills for any target) and
from timing the configs on the GPU; the figures live in perf/ (docs/design.md
§3.4, §5.2):

* r tiles of 64 (of 32 only when r ≤ 32): 32-wide tiles at larger r spill
  hundreds of bytes with 64-row chunks;
* r ≤ 128: chunks of 64 or 32 rows, value tiles up to 64.  128-wide value
  tiles on 8 warps are left out there: such a program costs almost twice a
  64-wide one per row, and one program a multiprocessor gets twice the
  segments, so a longer state pass;
* r > 128: 32-row chunks with value tiles up to 64 (4 warps), or 128-wide
  value tiles with 8 warps (two warpgroups, one program per multiprocessor;
  sm_90 only), in 32-row chunks (3 or 4 stages, no spill) or 64-row ones.
  Wider tiles spill a little with 4 warps and still run faster than 32-wide
  ones, which read b and c more often.  The 8-warp walk reads b and c half as
  often as two 64-wide programs.  It may also hold all of r as one tile
  (BK = 256: one product of K = 256 with b and one state update, where
  64-wide tiles give four of each, each waited for before the next, §3.4):
  its loop spills and still runs faster.  With 4 warps, and at r = d = 128,
  wider r tiles gain nothing;
* 64-row chunks with 2 stages, or 3 or 4 at r ≤ 128 (16-bit): 3 stages hold
  so many tiles at r = d = 128 that one program fits a multiprocessor, which
  pays where block_based cuts its segments for one program per SM (§3.6);
* 32-row chunks with 3 or 4 stages at r ≤ 128 (16-bit): 2 stages were never
  the tuner's choice there;
* chunks of at least 32 rows and 4 warps: Triton gives chained tile products
  all warps along the rows, so 8 warps would need 128-row value tiles;
* value tiles of 16 only where d is that small: each further value tile
  repeats the score product;
* float32 operands (TF32): chunks of at most 32 rows; the state goes through
  shared memory as the product's operand, the b tile counts twice, and the
  bound on held values is that of :data:`HELD_PER_THREAD`;
* float32 with ``precision="ieee"`` runs its products on CUDA cores, which hold
  whole operand rows per thread: no tile is spill-free there; the smallest
  tiles spill least.

Each family's list is the product of its axes; the rules leave at most 11
for any launch.
"""
from __future__ import annotations

from ..autotune.configs import KernelSpace
from ..autotune.sizing import elem_bytes, pow2, regs_per_thread

HELD_PER_THREAD = 116
"""Upper bound on the float32 values a thread may hold with TF32 operands."""


def _operands(args) -> str:
    if elem_bytes(args) == 2:
        return "16bit"
    return "tf32" if args.get("DOT_PRECISION") == "tf32" else "ieee"


def walk_smem(cfg, args) -> int:
    """Shared memory of one chunk-walk program (an upper bound): ``num_stages`` copies of
    the b, c, v tiles, the scores and the decayed values re-laid-out as operands, and with
    float32 operands the state staged as the operand of its product."""
    es = elem_bytes(args)
    bt, bv, rp = cfg["BT"], cfg["BV"], pow2(args["R"])
    staged_state = rp * bv * 4 if es == 4 else 0
    return cfg["num_stages"] * bt * (2 * rp + bv) * es + bt * bt * es + bt * bv * es + staged_state


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
    if bt == 64 and cfg["num_stages"] > (4 if kind == "16bit" and rp <= 128 else 2):
        return False
    if kind == "16bit" and rp <= 128 and bt == 32 and cfg["num_stages"] == 2:
        return False
    if bv == 16 and dp > 16 and (rp <= 128 or kind == "16bit"):
        return False
    if warps == 8:  # the two-warpgroup configs (128-wide value tiles): measured at r > 128 only
        return kind == "16bit" and rp > 128 and bv == 128
    if kind == "16bit":
        return rp <= 128 or (bt <= 32 and bv <= 64)
    if bt > 32:
        return False
    # float32 operands: the b tile is itself a float32 load
    held = rp * bv + bt * bv + 2 * bt * bt + 2 * bt * bk
    return regs_per_thread(held, warps) <= HELD_PER_THREAD


def walk_space(name: str) -> KernelSpace:
    """The chunk-walk config space under ``name`` (one per method that launches the walk)."""
    # value order = preference: the first fitting config is the one run untuned.
    # sm_90: 64-row chunks and 64-wide value tiles first: every product but the [BT, BT] scores of a
    # 32-row chunk is then a warpgroup MMA; at r = d = 128 this config is the fastest the H100 measured.
    # 16-row chunks serve float32 "ieee" alone (CUDA-core products, 16 × 16 tiles).
    sm90 = [dict(BT=[64, 32], BK=[64, 32], BV=[64, 32, 16], num_warps=[4], num_stages=[2, 4, 3]),
            dict(BT=[64], BK=[64], BV=[128], num_warps=[8], num_stages=[2]),
            dict(BT=[32], BK=[256, 64], BV=[128], num_warps=[8], num_stages=[4, 3]),
            dict(BT=[16], BK=[64, 32], BV=[16], num_warps=[4], num_stages=[4, 3])]
    # sm_80/86/89 (mma.sync): 64-row chunks with 32- or 16-wide value tiles only (with 64-wide ones
    # the register tiles spill ~800 B on those targets)
    ampere = [dict(BT=[64], BK=[64, 32], BV=[32, 16], num_warps=[4], num_stages=[2]),
              dict(BT=[32], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[3, 2]),
              dict(BT=[16], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[3, 2])]
    # one stage (no prefetch) only where nothing else fits (r > 128 with float32 operands)
    small_smem = [dict(BT=[64], BK=[64, 32], BV=[32, 16], num_warps=[4], num_stages=[2]),
                  dict(BT=[32], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[2, 1]),
                  dict(BT=[16], BK=[64, 32], BV=[32, 64, 16], num_warps=[4], num_stages=[2, 1])]
    return KernelSpace(
        name=name,
        axes={"default": ampere, "a100": ampere, "a6000": small_smem, "ada": small_smem, "h100": sm90, "h200": sm90},
        cpu=dict(BT=16, BK=64, BV=32, num_warps=4, num_stages=1),
        smem=walk_smem,
        fits=walk_fits,
    )


VARLEN = walk_space("lightning_attention.varlen")
"""The packed (variable-length) walk: the same body and table, tuned apart (docs/design.md §13.2)."""
