"""Configs of the segment-state kernels (kernels/_segments.py)."""
from __future__ import annotations

from ..configs import KernelSpace
from ._util import elem_bytes, pow2, regs_per_thread


def _state_smem(cfg, args) -> int:
    return cfg["num_stages"] * cfg["BT"] * (cfg["BK"] + cfg["BV"]) * elem_bytes(args)


def _state_fits(cfg, args) -> bool:
    if cfg["BK"] > pow2(args["R"]) or cfg["BV"] > pow2(args["D"]):
        return False
    if elem_bytes(args) == 4:
        # float32 tiles (and, for "ieee", CUDA-core products) spill beyond 64 × 64 states and 64-row steps
        return cfg["BK"] * cfg["BV"] <= 64 * 64 and cfg["BT"] <= 64
    return regs_per_thread(cfg["BK"] * cfg["BV"], cfg["num_warps"]) <= 64


STATE = KernelSpace(
    name="segments.state",
    axes={
        "default": dict(BT=[64], BK=[64, 128], BV=[32, 64], num_warps=[4], num_stages=[2, 3]),
        "a6000": dict(BT=[32, 64], BK=[64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "ada": dict(BT=[32, 64], BK=[64], BV=[32, 64], num_warps=[4], num_stages=[2]),
        "h100": dict(BT=[64, 128], BK=[64, 128], BV=[32, 64], num_warps=[4], num_stages=[2, 3]),
        "h200": dict(BT=[64, 128], BK=[64, 128], BV=[32, 64], num_warps=[4], num_stages=[2, 3]),
    },
    cpu=dict(BT=64, BK=64, BV=64, num_warps=4, num_stages=1),
    smem=_state_smem,
    fits=_state_fits,
)


def _scan_fits(cfg, args) -> bool:
    return cfg["BK"] <= pow2(args["R"]) and cfg["BV"] <= pow2(args["D"])


SCAN = KernelSpace(
    name="segments.scan",
    axes={
        "default": dict(BK=[32, 64], BV=[64], num_warps=[4], num_stages=[1]),
        "h100": dict(BK=[16, 32, 64], BV=[64, 128], num_warps=[4], num_stages=[1]),
        "h200": dict(BK=[16, 32, 64], BV=[64, 128], num_warps=[4], num_stages=[1]),
    },
    cpu=dict(BK=64, BV=64, num_warps=4, num_stages=1),
    smem=lambda cfg, args: 0,
    fits=_scan_fits,
)
