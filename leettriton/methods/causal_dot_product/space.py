"""Configs of the row-by-row recurrence kernel (methods/causal_dot_product/kernels.py).

Axes: BV (value columns per program), BT (rows per block: one load and one
store per block, and the prefetch distance), num_warps.  The key dimension is
not an axis: a program holds all of it (BK = r padded to a power of two).

The kernel reads a block as a [words, BT·BV] tile (each row repeated over the
value columns; a word holds two 16-bit keys or one float32 key); coalescing
gives it, and the state, one 16-byte vector per thread (one word when rows are
not 16-word aligned), words across lanes, then value columns across the lanes
left over and the warps, rows of a block in registers once lanes and warps are
used up.  :func:`layout` predicts that split
(sm_80-90, Triton 3.6 and 3.9); a config is kept when

* each thread owns exactly one value column: a second column repeats the row
  loads and their conversions (sm_90 cubins: the same instructions per state
  element, 1.4-1.7x the registers);
* no lanes or warps are left over for the rows of a block, which would turn
  picking a row into a cross-thread reduction (lanes may be, for tiny d, when
  BV is already as large as d allows);
* the [BT, BV] block of v has fewer elements than the program has threads:
  Triton then loads it straight into the state's layout.  A larger v block is
  laid out on its own and drags the state into its layout, with a shared-memory
  relayout of b_t and c_t on every row (r = d = 64, fp16, BT = 8: 255
  registers and spills).  Of the block sizes that pass, the two largest are kept;
* the state and two blocks of rows (current and prefetched) fit in registers
  (and BT <= 4 with 8 warps, where ptxas allots fewer registers).
"""
from __future__ import annotations


from ...autotune.configs import KernelSpace
from ...autotune.sizing import elem_bytes, next_power_of_2

_MIN_BV = 2
MAX_BT = 8
_MAX_REGS = 200  # estimate of :func:`registers`; ptxas adds ~30 for addresses and predicates


def key_tile(r: int) -> int:
    """BK: the key dimension padded to a power of two (one program holds all of it)."""
    return next_power_of_2(int(r))


def keys_per_word(args) -> int:
    """KW: keys per 32-bit word the kernel reads (2 for aligned 16-bit rows, else 1).

    A launch's arguments carry the launcher's choice; otherwise it is guessed
    from the sizes and strides given.
    """
    if "KW" in args:
        return args["KW"]
    if elem_bytes(args) == 4 or args["R"] % 2:
        return 1
    for x in ("b", "c"):
        rows, keys = args.get(f"{x}_strides", (0, 0, 2, 1))[2:]
        if keys != 1 or rows % 2:
            return 1
    return 2


def layout(cfg, args) -> dict:
    """How a block of rows (and the state) is spread over a program.

    Returns the keys per thread (``vec``), the lanes and warps along keys,
    values and rows, and the value columns per thread.  Rows are read in 32-bit
    words (or 16-bit keys when they cannot be paired), 16 bytes per thread when
    Triton's specialisation proves rows and their length 16-word aligned.
    """
    bk, bv, warps = key_tile(args["R"]), cfg["BV"], cfg["num_warps"]
    kw = keys_per_word(args)
    words = bk // kw
    word_bytes = 4 if kw == 2 else elem_bytes(args)
    row_words = -(-args["R"] // kw)
    stride_words = args["b_strides"][2] // kw if "b_strides" in args else 16
    aligned = row_words % 16 == 0 and stride_words % 16 == 0
    vec_words = min(words, 16 // word_bytes) if aligned else 1
    lanes_k = min(32, words // vec_words)
    lanes_v = min(32 // lanes_k, bv)
    lanes_t = 32 // (lanes_k * lanes_v)
    warps_k = min(warps, words // (vec_words * lanes_k))
    warps_v = min(warps // warps_k, max(1, bv // lanes_v))
    warps_t = warps // (warps_k * warps_v)
    return dict(vec=vec_words * kw, vec_words=vec_words, lanes_k=lanes_k, lanes_v=lanes_v, lanes_t=lanes_t,
                warps_k=warps_k, warps_v=warps_v, warps_t=warps_t, cols=max(1, bv // (lanes_v * warps_v)))


def registers(cfg, args) -> float:
    """32-bit registers per thread for the state and two blocks of rows (current and next)."""
    lay = layout(cfg, args)
    state = lay["vec"] * lay["cols"]
    row = (2 * lay["vec_words"] + 1) * lay["cols"]  # b and c words, v (all carried in 32 bits)
    return state + 2 * cfg["BT"] * row


def _bt_cap(cfg) -> int:
    """Largest block whose [BT, BV] slice of v has fewer elements than the program has threads."""
    bt = MAX_BT
    while bt > 1 and bt * cfg["BV"] >= 32 * cfg["num_warps"]:
        bt //= 2
    return bt


def _bv_cap(args) -> int:
    return max(_MIN_BV, next_power_of_2(int(args["D"])))


def _fwd_keep(cfg) -> bool:
    """The shape-independent part of the pruning: the block size follows the program size."""
    if cfg["BT"] not in (_bt_cap(cfg), _bt_cap(cfg) // 2):
        return False
    # ptxas gives 256-thread programs only 80-128 registers on sm_80-89: BT = 8 spills there
    return not (cfg["num_warps"] >= 8 and cfg["BT"] > 4)


def _fwd_fits(cfg, args) -> bool:
    if cfg["BV"] > _bv_cap(args) or not _fwd_keep(cfg):
        return False
    lay = layout(cfg, args)
    if lay["cols"] != 1 or lay["warps_t"] > 1 or (lay["lanes_t"] > 1 and cfg["BV"] < _bv_cap(args)):
        return False
    return registers(cfg, args) <= _MAX_REGS


def _fwd_smem(cfg, args) -> int:
    # relayouts through shared memory: the initial and final state, then the output tile of a block
    return max(key_tile(args["R"]) * cfg["BV"] * 4, cfg["BT"] * cfg["BV"] * elem_bytes(args))


_AXES = dict(BT=[1, 2, 4, 8], BV=[2, 4, 8, 16, 32, 64], num_warps=[1, 2, 4, 8], num_stages=[1])

FWD = KernelSpace(
    name="causal_dot_product.fwd",
    axes={
        "default": _AXES,
        "a6000": _AXES,
        "a100": _AXES,
        "ada": _AXES,
        "h100": _AXES,
        "h200": _AXES,
    },
    cpu=dict(BT=4, BV=64, num_warps=4, num_stages=1),
    smem=_fwd_smem,
    fits=_fwd_fits,
    keep=_fwd_keep,
)
