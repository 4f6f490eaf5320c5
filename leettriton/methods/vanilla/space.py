"""Configs of the vanilla (tiled quadratic) kernel."""
from __future__ import annotations

from ...autotune.configs import KernelSpace
from ...autotune.sizing import elem_bytes, pow2, regs_per_thread


def _fwd_smem(cfg, args) -> int:
    es = elem_bytes(args)
    bt, bk, bv = cfg["BT"], cfg["BK"], cfg["BV"]
    # pipelined b, c and v tiles, plus the score tile re-laid-out as a dot operand
    return cfg["num_stages"] * (2 * bt * bk + bt * bv) * es + bt * bt * es


def _fwd_fits(cfg, args) -> bool:
    if cfg["BK"] > pow2(args["R"]) or cfg["BV"] > pow2(args["D"]):
        return False
    # accumulator + score tile per thread; beyond ~96 the loaded tiles make ptxas spill
    held = cfg["BT"] * cfg["BV"] + cfg["BT"] * cfg["BT"]
    if args.get("PER_TOKEN_DECAY"):
        # the per-token decay's [BT, BT] exponents and decays beside the scores (compiled for sm_90: only
        # the configs within the bound with these two tiles counted compile without spills)
        held += 2 * cfg["BT"] * cfg["BT"]
    return regs_per_thread(held, cfg["num_warps"]) <= 96


FWD = KernelSpace(
    name="vanilla.fwd",
    axes={
        "default": dict(BT=[64, 128], BK=[64, 128], BV=[64, 128], num_warps=[4, 8], num_stages=[2]),
        "a6000": dict(BT=[32, 64], BK=[32, 64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "ada": dict(BT=[32, 64], BK=[32, 64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "h100": dict(BT=[64, 128], BK=[64], BV=[64, 128], num_warps=[4, 8], num_stages=[2, 3]),
        "h200": dict(BT=[64, 128], BK=[64], BV=[64, 128], num_warps=[4, 8], num_stages=[2, 3]),
    },
    cpu=dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
)

MIN_BT = min(min(axes["BT"]) for axes in FWD.axes.values())
MIN_BV = min(min(axes["BV"]) for axes in FWD.axes.values())
"""The smallest row and value tiles of any config: a launch has at most cdiv(n, MIN_BT) · cdiv(d, MIN_BV)
programs per batch·head, so many flags."""
