"""Configs of the recursion kernels, its leaf length, and the memory bound of its state tree.

Two kernels of methods/recursion/kernels.py have spaces here (the leaf states come from
the shared segment-state kernel, space ``segments.state``):

* ``recursion.level``: one launch per level of the tree; elementwise over
  float32 states (memory-bound), so only the block of elements and the warps vary.
* ``recursion.fwd``: one program per [BT, BV] output tile: the dense decayed
  product inside its leaf over key blocks of BJ rows (tensor cores), then the
  float32 left states of the levels that reach the tile, summed (each with its
  decay) a [BK, BV] slice at a time, and one [BT, r] @ [r, BV] product with them
  in BK slices of r (TF32 for 16-bit inputs, ``precision`` for float32).  It holds the output tile, the [BT, BJ] scores and a [BT, BK] slice
  of b as a float32 operand; the b, c, v and state slices are pipelined.
"""
from __future__ import annotations

from typing import Mapping, Optional

from ...autotune.configs import KernelSpace
from ...autotune.sizing import elem_bytes, pow2, regs_per_thread
from ...problem import Problem

LEAF = {"cpu": 32, "default": 256}
"""Rows of a leaf, by family: a power of two, at least every BT of the family's ``FWD`` list.
The leaves are computed densely; every doubling of the leaf removes a level of the
tree (half an [r, d] float32 state read per output tile, on average) and halves the
tree's memory and float32 traffic (leaf states, level passes), and costs a dense
product twice as long.  At L0 = 256 and r = d = 128 the tree is 256 B per row, as
much as one 16-bit output row, and the dense product averages 192 keys per row; 128
would double the tree's traffic, 512 double the dense product.  The interpreter's
value is small so that short test sequences have several levels."""

TREE_BYTES = 4 << 30
"""Largest float32 state tree (cdiv(n, LEAF) states of r × d per batch element and
head) held at once: beyond it the batch (then the heads) is processed in blocks.
At batch 16 × heads 32 × n 100 000 with r = d = 128 the whole tree is 12.8 GB;
with this bound it is built four batch elements at a time (3.2 GB), beside the
52 GB of 16-bit b, c, v and output."""

# fp32 values per thread (estimated in _fwd_fits) above which ptxas spills the fwd kernel: compile_check
# at r = d = 128, 16-bit inputs, sm_80/86/90 (BT 256 × BV 64 × 8 warps: 160, 235 registers, no spill;
# BT 256 × BV 128 × 8 warps and BT 128 × BV 128 × 4 warps: 224, spill)
FWD_REG_LIMIT = 160
FP32_HELD_LIMIT = 8192




def _fwd_smem(cfg, args) -> int:
    es = elem_bytes(args)
    bt, bj, bk, bv = cfg["BT"], cfg["BJ"], cfg["BK"], cfg["BV"]
    # pipelined b, c and v tiles, the scores as a dot operand; b as a float32 operand and a state slice
    return cfg["num_stages"] * (bt * bk + bj * bk + bj * bv) * es + bt * bj * es + (bt * bk + bk * bv) * 4


def _fwd_fits(cfg, args) -> bool:
    bt, bj, bk, bv = cfg["BT"], cfg["BJ"], cfg["BK"], cfg["BV"]
    if bv > max(64, pow2(args["D"])) or bk > max(32, pow2(args["R"])) or bj > bt:
        return False
    # output tile, scores, b slice as a float32 operand
    held = bt * bv + bt * bj + bt * bk
    if args.get("PER_TOKEN_DECAY"):
        # the per-token decay's [BT, BJ] exponents and decays beside the scores (compiled for sm_90: only
        # the configs within the bound with these two tiles counted compile without spills)
        held += 2 * bt * bj
    if elem_bytes(args) == 4 and args.get("DOT_PRECISION") == "ieee":
        # float32 products on CUDA cores hold both operands in registers: measured, only
        # ≤ 8192 such values in 8 warps compile without spills on both sm_80 and sm_90
        return held <= FP32_HELD_LIMIT and cfg["num_warps"] == 8
    if not _rows_aligned(args):
        held = held * 3 // 2  # rows not 16-byte aligned: unvectorised loads hold more registers
    return regs_per_thread(held, cfg["num_warps"]) <= FWD_REG_LIMIT


def _rows_aligned(args) -> bool:
    """Whether Triton sees every row of b, c, v and the output aligned (row strides divisible by
    16 elements, the case it specialises), so that its loads are vectorised."""
    strides = [args[k] for k in ("b_strides", "c_strides", "v_strides", "o_strides") if k in args]
    if any(s[3] != 1 for s in strides):
        return False
    return all(s[2] % 16 == 0 for s in strides)


FWD = KernelSpace(
    name="recursion.fwd",
    axes={
        "default": dict(BT=[64, 128], BJ=[64], BK=[32], BV=[64, 32], num_warps=[8, 4], num_stages=[2]),
        "a6000": dict(BT=[64, 128], BJ=[64], BK=[32], BV=[64, 32], num_warps=[8, 4], num_stages=[1, 2]),
        "ada": dict(BT=[64, 128], BJ=[64], BK=[32], BV=[64, 32], num_warps=[8, 4], num_stages=[1, 2]),
        "a100": dict(BT=[128, 64], BJ=[64], BK=[32], BV=[64, 128, 32], num_warps=[8, 4], num_stages=[2]),
        "h100": dict(BT=[128, 256, 64], BJ=[64], BK=[32], BV=[64, 128, 32], num_warps=[8, 4], num_stages=[2]),
        "h200": dict(BT=[128, 256, 64], BJ=[64], BK=[32], BV=[64, 128, 32], num_warps=[8, 4], num_stages=[2]),
    },
    cpu=dict(BT=32, BJ=32, BK=128, BV=128, num_warps=4, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
)


def leaf_length(family, config=None) -> int:
    """Rows per leaf for ``family``: at least the BT of every config the autotuner may pick for
    the family and of a pinned ``config``, so that no output tile straddles two leaves."""
    tiles = FWD.family_configs(family) + ([config] if config else [])
    return max([LEAF.get(family.name, LEAF["default"])] + [cfg["BT"] for cfg in tiles])


LEVEL = KernelSpace(
    name="recursion.level",
    axes={
        "default": dict(BLOCK=[1024, 2048], num_warps=[4], num_stages=[1]),
        "h100": dict(BLOCK=[1024, 2048, 4096], num_warps=[4, 8], num_stages=[1]),
        "h200": dict(BLOCK=[1024, 2048, 4096], num_warps=[4, 8], num_stages=[1]),
    },
    cpu=dict(BLOCK=4096, num_warps=4, num_stages=1),
    smem=lambda cfg, args: 0,
)


def schedule(p: Problem, family, configs: Optional[Mapping]) -> dict:
    """recursion's launch parameters: ``leaf``, rows per leaf."""
    return dict(leaf=leaf_length(family, (configs or {}).get(FWD.name)))
