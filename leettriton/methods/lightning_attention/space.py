"""Configs of the fused chunk-walk kernel (methods/lightning_attention/kernels.py).

Axes: BT (rows per chunk), BK (width of the r tiles: the transposed state is
held as r/BK ≤ 4 register tiles of [BV, BK]), BV (value columns per program),
num_warps, num_stages.

One program keeps in registers the whole [BV, r] float32 state, the [BV, BT]
output tile, the [BT, BT] scores and their decay mask, and (16-bit inputs)
the 16-bit copy of one state tile, the register operand of the state product.
The rules below come from sm_90 cubins of every combination of the axes at r = d = 32, 64, 128, 256 in float16 and bfloat16 (Triton 3.6, 4
warps; ``python -m leettriton.autotune.compile`` reports registers and spills):

* r tiles of 64 (of 32 only when r ≤ 32): 32-wide tiles at larger r spill
  hundreds of bytes with 64-row chunks (and one tile of all of r in the 8-warp walk, below);
* r ≤ 128: chunks of 64 or 32 rows, value tiles up to 64 (at most a few dozen
  bytes spilled outside the chunk loop, with an initial and a final state).  128-wide value
  tiles on 8 warps, as at r > 128, gained nothing at batch 1, where reading b and c once would
  count most: such a program takes 1.7-1.8× a 64-wide one's time a row, and one a multiprocessor
  it gets twice the segments, so a longer state pass (float16, 1 × 32 heads × 32 768: 0.553 against
  0.524 ms on an H100, 0.481 against 0.459-0.483 on an H200; × 100 000: 1.57 against 1.60 and
  1.455 against 1.442-1.458; perf/results/h100/walk_r128_8warps.log, perf/results/h200/walk_r128_8warps.log);
* r > 128: 32-row chunks with value tiles up to 64 (4 warps), or 128-wide value tiles with 8 warps
  (two warpgroups, one program per multiprocessor; sm_90 only), in 32-row chunks (3 or 4 stages, no
  spill) or 64-row ones.  Tiles past 32 spill 100-500 B with 4 warps, and still run faster: at r = 256,
  d = 512 (8 heads, float16) the 64-wide tiles took 0.289 ms at 1 × 8192 and 1.57 ms at 8 × 8192, the
  32-wide ones 0.448 and 3.19 ms (perf/results/h100/walk_r256.log).  The 8-warp 32-row walk reads b
  and c half as often as two 64-wide programs and spills nothing: in bfloat16 at 4 stages it took
  0.216 ms at 1 × 8192 and 0.791 at 1 × 32 768 against 0.237 and 0.857 for the 64-wide 4-warp walk;
  in float16 (whose state products scale each row first) 0.243 against 0.238 at 1 × 8192, 1.40
  against 1.45 at 8 × 8192 (perf/results/h100/walk_r256_8warps.log).  The 8-warp 32-row walk also
  holds all of r as one tile (BK = 256: one product of K = 256 with b, one state update of N = 256, where
  64-wide tiles give four of each, each waited for before the next): its loop spills (about 60 loads a
  chunk) and still runs faster, bfloat16 0.197 ms at 1 × 8192 and 0.712 at 1 × 32 768 against 0.214 and
  0.783, float16 0.212 and 0.773 against 0.245 and 0.893 (perf/results/h100/walk_bk.log); with 4 warps
  and at r = d = 128, wider r tiles were not faster there;
* 64-row chunks with 2 stages, or 3 or 4 at r ≤ 128 (16-bit): 3 hold 120 KB
  of tiles at r = d = 128, one program per multiprocessor instead of two, which
  pays where the sequence is cut into segments sized for one program per SM
  (block_based at 1 × 32 heads × 32 768, float16: 0.533 ms against 0.590 with
  the tuned 32-row chunks, two per SM; perf/results/h100/walk_occupancy.log);
* 32-row chunks with 3 or 4 stages at r ≤ 128 (16-bit): 2 stages were never
  the tuner's choice there;
* chunks of at least 32 rows and 4 warps: Triton gives chained tile products
  all warps along the rows, so 8 warps would need 128-row value tiles;
* value tiles of 16 only where d is that small: each further value tile
  repeats the score product;
* float32 operands (TF32): chunks of at most 32 rows, as before the
  transposed state (64-row chunks, whose score product would become a TF32
  warpgroup MMA, have not been timed); the state goes through shared memory
  as the product's operand, the b tile counts twice, and the bound on held
  values is that of :data:`HELD_PER_THREAD`;
* float32 with ``precision="ieee"`` runs its products on CUDA cores, which hold
  whole operand rows per thread: no tile is spill-free there; the smallest
  tiles spill least (8-16 B at r = d = 128).

Each family's list is the product of its axes; the rules leave at most 11
for any launch.
"""
from __future__ import annotations

from ...autotune.configs import KernelSpace
from ...autotune.sizing import elem_bytes, pow2, regs_per_thread

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
    # 32-row chunk is then a warpgroup MMA, and at r = d = 128 this config measured fastest on an H100
    # (block_based at 1 × 32 heads × 100 000, float16 with decay: 1.95 ms against 2.18-2.25 ms with
    # 32-row chunks; perf/results/h100/walk_transposed.log).  (The walk before the transposed state
    # returned wrong results with 64-row chunks on Triton 3.6; this one passes the suite with them.)
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


FWD = walk_space("lightning_attention.fwd")

VARLEN = walk_space("lightning_attention.varlen")
"""The packed (variable-length) walk: the same body and table, tuned apart (docs/design.md §13.2)."""
