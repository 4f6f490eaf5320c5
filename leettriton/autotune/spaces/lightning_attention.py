"""Configs of the fused chunk-walk kernel (kernels/lightning_attention.py).

One program owns a [R, BV] slice of the float32 state in registers and walks
chunks of BT rows.  Per chunk it holds the state, the output tile, the score
tile and its decay mask, and b upcast to float32 (the operand of the TF32
state product); the loaded b, c, v tiles are pipelined through shared memory
(``num_stages`` copies) and the state is staged there as the B operand of
b · S.  The estimates below follow that inventory; ``perf/compile_check.py``
measured them (see :data:`WALK_REG_LIMIT`).

The h100/h200 lists are focused on r = d = 128, 16-bit inputs (the case the
package is tuned for): every config there compiles without spills and fits in
shared memory; the rules prune the rest for larger r or float32.
"""
from __future__ import annotations

from ..configs import KernelSpace
from ._util import elem_bytes, pow2, regs_per_thread

# fp32 values per thread above which ptxas spills (or leaves too little room
# for addresses and the loaded tiles): measured with compile_check at
# r = d = 128 fp16 (BT 64, BV 128, 8 warps holds ~144 such values in 200-odd registers).
WALK_REG_LIMIT = 160


def walk_smem(cfg, args) -> int:
    """Shared memory of one chunk-walk program: pipelined b, c, v tiles, the staged
    float32 state, the decayed v tile and the score tile re-laid-out as dot operands."""
    es = elem_bytes(args)
    bt, bv, bk = cfg["BT"], cfg["BV"], pow2(args["R"])
    return cfg["num_stages"] * bt * (2 * bk + bv) * es + bk * bv * 4 + bt * bv * es + bt * bt * es


def walk_fits(cfg, args) -> bool:
    bt, bv, bk = cfg["BT"], cfg["BV"], pow2(args["R"])
    if bv > pow2(args["D"]):
        return False
    # a 32-row chunk only pays off when nothing larger fits (r = 256, or float32 operands)
    if bt == 32 and bk * elem_bytes(args) < 512:
        return False
    # state + output tile + scores and their mask + b as a float32 operand
    held = bk * bv + bt * bv + 2 * bt * bt + bt * bk
    return regs_per_thread(held, cfg["num_warps"]) <= WALK_REG_LIMIT


def walk_space(name: str) -> KernelSpace:
    """The chunk-walk config space under ``name`` (one per method that launches the walk)."""
    return KernelSpace(
        name=name,
        axes={
            "default": dict(BT=[32, 64], BV=[32, 64, 128], num_warps=[4, 8], num_stages=[2]),
            "a6000": dict(BT=[32, 64], BV=[32, 64], num_warps=[4, 8], num_stages=[1, 2]),
            "ada": dict(BT=[32, 64], BV=[32, 64], num_warps=[4, 8], num_stages=[1, 2]),
            "a100": dict(BT=[32, 64], BV=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3]),
            "h100": dict(BT=[32, 64, 128], BV=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3]),
            "h200": dict(BT=[32, 64, 128], BV=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3]),
        },
        cpu=dict(BT=16, BV=32, num_warps=4, num_stages=1),
        smem=walk_smem,
        fits=walk_fits,
    )


FWD = walk_space("lightning_attention.fwd")
