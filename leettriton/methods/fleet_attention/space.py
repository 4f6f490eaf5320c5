"""Configs of the blockwise fleet_attention kernel, and the rule that cuts the sequence into segments.

Axes: BT (rows per block: the [BT, BT] decay matrix L and the rows of each
tile product), BV (value columns per program), BK (ranks per slice of the carry
update), num_warps, num_stages.  See methods/fleet_attention/kernels.py.

Each family's list starts with BT 64, BV 128, 4 warps, the config that timed
fastest on the H100 at every shape of the experiment that chose this kernel (the
first fitting config is what runs untuned).  64-row blocks with 128-wide value
tiles cross fewer block boundaries and read b and c fewer times; that saves more
than the longer block's extra multiply-adds (BT per rank and row) cost.  The
carry update holds BK rows of the carries and of c (BK = 32), whatever r, so its
registers do not grow with r.

One program holds in registers the [BT, BV] float32 output accumulator and the
product h_k ([BT, BV] float32), the block's v tile and L as an operand ([BT, BT],
both of the inputs' dtype), plus, in the carry update, one [BK, BV] float32 slice
of the carries.  The compiled figures below predate the split of c ⊙ v into two
16-bit operands, and bfloat16's column its float32 (TF32) operands; compiled cubins
(``python -m leettriton.autotune.compile --methods fleet_attention``, Triton
3.6; registers / spilled bytes / shared memory at r = d = 128 -- the same at
r = d = 256, since BK, not r, sets the update's tiles):

    BT  BV  warps   fp16 sm_90      fp16 sm_86     bf16 sm_90      fp32 tf32 sm_90
    64 128    4     247 / 0 / 32K   255 / 8 / 24K  255 / 88 / 80K  255 / 72-320 / 56K
    64 128    8     183 / 0 / 32K   218 / 0 / 40K  220 / 0 / 80K   228 / 0 / 56K
    64  64    4     162 / 0 / 20K   222 / 0 / 24K  222 / 0 / 48K   231 / 0 / 40K
    32 128    4     208 / 0 / 10K   209 / 0 / 10K  222 / 0 / 20K   220 / 0 / 37K
    32  64    4     122 / 0 /  6K   150 / 0 /  6K  140 / 0 / 12K   167 / 0 / 20K

:data:`HELD_PER_THREAD` separates them: the held estimate of ``_fwd_fits`` is
176 values for fp16 at BT 64 × BV 128 × 4 warps (clean on sm_90) and 224 for
float32 operands (spills); every other config is at most 128.  That fp16 config
spills 8 B on sm_86/89 and 56 B on sm_80; it is kept there (``fits`` does not see
the family, and it is the measured best on sm_90; not measured on those parts).  float32 inputs
with ``precision="ieee"`` run the products on CUDA cores (BT multiply-adds per
output element and rank, where the scan did 3): only 32-row blocks with at most
16 accumulator values per thread compile without spills (or with 8 bytes) on
sm_80 and sm_90; 64-row blocks spill 0.3-8 KB.
"""
from __future__ import annotations

import functools
from typing import Mapping, Optional

from ...autotune.configs import KernelSpace
from ...autotune.families import Family
from ...autotune.sizing import cdiv, elem_bytes, pow2, regs_per_thread
from ...kernels.segments_space import segment_length as shared_segment_length
from ...problem import Problem

HELD_PER_THREAD = 192
"""Float32 values a thread may hold (as ``_fwd_fits`` counts them) before ptxas spills."""

IEEE_ACC_PER_THREAD = 16
"""Accumulator values per thread above which the CUDA-core products of ``precision="ieee"`` spill."""


def _operand_bytes(args) -> int:
    """Bytes of one tensor-core operand element: the inputs' own (operands are of their dtype)."""
    return elem_bytes(args)


def _fwd_smem(cfg, args) -> int:
    """Shared memory of one program (an upper bound, 1.1-2.8× the compiled figures above, which
    predate the float16 split of c ⊙ v): the c ⊙ v (two for float16: hi and lo), L and c-slice
    operands, a float32 [BT, BV] tile for layout conversions, and ``num_stages`` copies of the
    per-rank columns of b and c and the carry row."""
    es, ob = elem_bytes(args), _operand_bytes(args)
    bt, bk, bv = cfg["BT"], cfg["BK"], cfg["BV"]
    cv_tiles = 2 if ob == 2 else 1      # 16-bit inputs split c ⊙ v in two
    return ((cv_tiles * bt * bv + bt * bt + bt * bk) * ob + bt * bv * 4
            + cfg["num_stages"] * (2 * bt * es + bv * 4))


def _fwd_fits(cfg, args) -> bool:
    bt, bk, bv, warps = cfg["BT"], cfg["BK"], cfg["BV"], cfg["num_warps"]
    if bv > max(64, pow2(args["D"])) or bk > max(32, pow2(args["R"])):
        return False
    if elem_bytes(args) == 4 and args.get("DOT_PRECISION") == "ieee":
        return bt <= 32 and regs_per_thread(bt * bv, warps) <= IEEE_ACC_PER_THREAD
    if bt < 32:
        return False  # 16-row blocks are for the CUDA-core products of "ieee" only (see IEEE_BT)
    # the accumulator and h_k in float32; v and L as operands (float16 or float32)
    held = 2 * bt * bv + (bt * bv + bt * bt) * _operand_bytes(args) // 4
    return regs_per_thread(held, warps) <= HELD_PER_THREAD


# value order = preference: the first fitting config is the one run untuned (measured best first)
_GPU = dict(BT=[64, 32, 16], BV=[128, 64], BK=[32], num_warps=[4, 8], num_stages=[2, 1])

IEEE_BT = 16
"""float32 with ``precision="ieee"`` computes each block's products on CUDA cores, BT
multiply-adds per output element and rank (the row-by-row scan did about 4 instructions,
latency-bound): 16-row blocks halve that work against 32-row ones, so both are offered
to the autotuner for "ieee"; the tensor-core paths keep 32 and 64 rows."""

FWD = KernelSpace(
    name="fleet_attention.fwd",
    axes={"default": _GPU, "a100": _GPU, "a6000": _GPU, "ada": _GPU, "h100": _GPU, "h200": _GPU},
    # the fastest under the interpreter on the test shapes (BT 32-128 × BV 64-256 × BK 32-256 timed):
    # larger tiles make each numpy call slower than the calls they save
    cpu=dict(BT=64, BK=64, BV=128, num_warps=4, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
)

PROGRAMS_PER_SM = 4
"""Programs to aim for per multiprocessor (see :func:`segment_length`)."""

MIN_SEGMENT = {"cpu": 64, "default": 128}
"""Fewest rows per segment: each segment costs one float32 start state (r·d·4 B,
written by the segment-state pass and read back as carries) and a cut-short block.
128 rows (two blocks of 64) still lets 1 × 32 heads × 2048 take its measured best of
16 segments.  The interpreter's value is small so that short test sequences run the
multi-segment path."""

SEGMENT_ALIGN = max([FWD.cpu["BT"]] + [max(axes["BT"]) for axes in FWD.axes.values()])
"""Segment lengths are multiples of every BT, so only a segment's last block is cut short."""


@functools.lru_cache(maxsize=None)
def _first_bv(family_name: str) -> int:
    """BV of the family's first config: the one the segment count assumes when none is pinned."""
    return FWD.family_configs(family_name)[0]["BV"]


def segment_length(batch_heads: int, n: int, d: int, family: Family,
                   config: Optional[Mapping[str, int]] = None) -> int:
    """Rows per segment for ``batch_heads`` sequences of ``n`` rows and value width ``d``.

    The kernel runs batch·heads × cdiv(d, BV) × segments programs (BV: the pinned
    config's, else the family's first).  The segment count follows the shared rule
    (kernels/segments_space.py): ``PROGRAMS_PER_SM`` per multiprocessor, segments of at least
    ``MIN_SEGMENT`` rows.  On the H100 (132 SMs, target 528) at
    r = d = 128 with one BV = 128 tile: batch·heads 32 gives 16 segments, which
    beat 4 and 1 at n = 2048, 8192 and 100 000; batch·heads 512 gives one, as
    measured best at 16 × 8192.  (BV = 64 was measured at 1, 4 and 16 segments
    only: 4 -- 256 programs -- was its best at 1 × 8192; the rule gives it 8.)
    Returns ``n`` (one segment: no segment pass
    unless a final state is asked for) when the heads and value tiles already
    fill the GPU or the sequence is too short to split.
    """
    bv = config["BV"] if config else _first_bv(family.name)
    return shared_segment_length(n, batch_heads * cdiv(d, min(bv, pow2(d))), family,
                                 programs_per_sm=PROGRAMS_PER_SM,
                                 min_segment=MIN_SEGMENT.get(family.name, MIN_SEGMENT["default"]),
                                 align=SEGMENT_ALIGN)


def schedule(p: Problem, family: Family, configs: Optional[Mapping]) -> dict:
    """fleet_attention's launch parameters: ``seg_len``, rows per segment."""
    B, H, n, r, d = p.shape
    return dict(seg_len=segment_length(B * H, n, d, family, (configs or {}).get(FWD.name)))
