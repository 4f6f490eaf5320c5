"""Configs of the fleet_attention scan kernel, and the rule that cuts the sequence into segments.

One program is ``num_warps`` warps that own a [BT, BV] output tile at a time;
the kernel keeps every value column of the tile inside one thread (see
kernels/fleet_attention.py), so a thread holds BT · BV / (32 · num_warps)
"values" of each of three float32 tiles (v, the output, the working scan) plus
the BT values of one column of b and of c.  compile_check (perf/compile_check.py)
and the SASS of the rank loop at r = d = 128, fp16, sm_90, with decay:

    BT  BV  warps  values  registers  instructions per (t, k, j) element
    32   64    2      32       200        4.27
    32  128    4      32       202        4.36
    32   32    1      32       200        4.13
    16   64    1      32       192        4.46
    16  128    2      32       138        4.52
     8  128    1      32       144        4.36
    16   64    2      16       124        5.22
    16   32    1      16       124        5.03
     8   64    1      16       120        5.80

Three of those instructions are the work itself (c·v, the decayed step
h ← γh + c·v, the weighted sum o ← o + b·h; two without decay, 3.27 in all);
the rest is the broadcast of the b and c columns to every lane (shared memory)
and the carry load and store.  Above 32 values per thread ptxas spills; below 16
the broadcast dominates.  BT also sets the carry traffic: one float32 load and
store per rank column and value column per block, i.e. 8/BT bytes per element
(L1/L2), which is why the longer blocks come first.
"""
from __future__ import annotations

from typing import Mapping, Optional


from ..configs import KernelSpace
from ..families import Family
from ._util import cdiv, next_power_of_2

VALUES_PER_THREAD = 32
"""Elements of one [BT, BV] tile per thread above which ptxas spills (measured, see above)."""

MIN_VALUES_PER_THREAD = 16
"""Below this the broadcast of the b and c columns outweighs the work it feeds (and BT 8 ×
BV 128 × 4 warps, 8 values, even spills)."""


def _fwd_smem(cfg, args) -> int:
    # the b and c columns staged for their broadcast to every lane (an upper bound)
    return 2 * 8 * cfg["BT"] * 4 * cfg["num_warps"]


def _fwd_fits(cfg, args) -> bool:
    lanes = 32 * cfg["num_warps"]
    if cfg["BV"] < lanes:  # every thread owns at least one value column
        return False
    if cfg["BV"] > max(lanes, next_power_of_2(int(args["D"]))):
        return False
    values = cfg["BT"] * cfg["BV"] // lanes
    return MIN_VALUES_PER_THREAD <= values <= VALUES_PER_THREAD


FWD = KernelSpace(
    name="fleet_attention.fwd",
    axes={
        "default": dict(BT=[32, 16, 8], BV=[64, 128, 32], num_warps=[2, 1, 4], num_stages=[1]),
        # sm_86 spills BT 8 × BV 128 in one warp (ptxas caps it at 168 registers)
        "a6000": dict(BT=[32, 16, 8], BV=[64, 32], num_warps=[2, 1], num_stages=[1]),
        "ada": dict(BT=[32, 16, 8], BV=[64, 32], num_warps=[2, 1], num_stages=[1]),
        "h100": dict(BT=[32, 16, 8], BV=[64, 128, 32], num_warps=[2, 1, 4], num_stages=[1]),
        "h200": dict(BT=[32, 16, 8], BV=[64, 128, 32], num_warps=[2, 1, 4], num_stages=[1]),
    },
    # the fastest interpreter config on the test shapes (tried BT 16-64 × BV 64-256): whole tiles
    # are numpy calls, so fewer and larger ones win
    cpu=dict(BT=64, BV=256, num_warps=1, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
)

WARPS_PER_SM = 8
"""Warps of the scan to aim for per multiprocessor: the decayed step is a chain of
dependent FMAs per column, so several warps per scheduler hide its latency
(ten warps of ~200 registers fit on one SM)."""

MIN_SEGMENT = {"cpu": 64, "default": 256}
"""Fewest rows per segment: each segment costs one float32 start state (r·d·4 B,
written by the segment-state pass and read back as carries), small against the
segment's own scan work at this length.  The interpreter's value is small so that
short test sequences still run the multi-segment path."""

SEGMENT_ALIGN = 64
"""Segment lengths are multiples of every BT, so no tile straddles two segments."""

REFERENCE_COLUMNS_PER_WARP = 64
"""Value columns per warp that the segment count assumes when no config is pinned."""


def segment_length(batch_heads: int, n: int, d: int, family: Family,
                   config: Optional[Mapping[str, int]] = None) -> int:
    """Rows per segment for ``batch_heads`` sequences of ``n`` rows and value width ``d``.

    Aims at ``WARPS_PER_SM × family.num_sms`` warps in all, each segment at least
    ``MIN_SEGMENT`` rows; returns ``n`` (one segment) when batch·heads and the
    value tiles already fill the GPU or the sequence is too short to split.
    """
    if config:
        warps = batch_heads * cdiv(d, config["BV"]) * config.get("num_warps", 1)
    else:
        warps = batch_heads * cdiv(d, REFERENCE_COLUMNS_PER_WARP)
    target = WARPS_PER_SM * family.num_sms
    shortest = MIN_SEGMENT.get(family.name, MIN_SEGMENT["default"])
    segments = min(cdiv(target, warps), n // shortest)
    if segments <= 1:
        return n
    seg = cdiv(cdiv(n, segments), SEGMENT_ALIGN) * SEGMENT_ALIGN
    return min(seg, n)
