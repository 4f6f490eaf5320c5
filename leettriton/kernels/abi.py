"""Tile code shared by the kernels, and the launch arguments every kernel takes.

Every kernel receives the same leading arguments (see :func:`problem_args`)::

    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, s0_ptr, st_ptr,
    b_strides, c_strides, v_strides, o_strides, s0_strides, st_strides, H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,

pointers to b, c, v, the output, γ per head, the initial and the final state;
the strides of each as a tuple (batch, head, row, column) -- for a state the
rows are its r keys and the columns its d values; the sizes H, N, R, D; and the
flags.  Triton flattens a tuple argument and specialises each stride as it
would a separate integer argument (a stride of 1 becomes a constant, one
divisible by 16 is marked so), so the compiled code is that of separate
arguments.  Kernels read strides, so any layout and any non-contiguous view
runs without a copy.  A kernel starts with :func:`batch_head` and
:func:`head_ptrs` (or :func:`head_ptr`): its pointers moved to its batch
element and head.

Grouped heads (docs/design.md §1.7): b, c and v may each have fewer heads than the output, each count
dividing the output's H.  Their stride tuples end in one more entry, the group g = H / (the tensor's heads):
output head h reads head h // g (:func:`group_ptr`, which :func:`head_ptrs` applies to b, c and v).  An
ungrouped tensor's g is 1, which Triton specialises as the constant 1, so ``h // g`` folds away and the
kernel compiles to the code it had without the entry; a grouped tensor's g is an integer argument (a variant
of its own).
No tensor is expanded or copied: each program reads its group's head where it lies.

A reversed problem (``Problem.reverse``: the backward's calls in reversed time,
docs/design.md §10.3) gets, for each of b, c, v and the output, a view that
starts at the tensor's last row as the pointer and the row stride negated, so
that row t is read and written at base + (n − 1 − t) · row stride: the kernels
run unchanged and no reversed copy is made.  Triton specialises a negative
stride as any integer (a multiple of 16 is marked so; only +1 becomes a
constant), and the offsets are those of the forward's rows, in the same 32- and
64-bit arithmetic, with the sign flipped.  A problem that is not reversed gets
exactly the arguments it always did.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..problem import Problem
from ..autotune.families import is_interpreting
from ..autotune.sizing import next_power_of_2

# Triton's interpreter multiplies the raw bit patterns of bfloat16 dot operands;
# upcasting them to float32 first gives the product the GPU's tensor cores give
# (bf16 × bf16 is exact in fp32).  A compile-time no-op on the GPU (as is round_to's shim).
_INTERPRETER_BF16_DOT = tl.constexpr(is_interpreting())


def problem_args(p: Problem) -> dict:
    """The keyword arguments shared by every kernel for problem ``p`` (a new dict each call,
    built once per problem: a method launching several kernels reads the strides once)."""
    cached = p.__dict__.get("_kernel_args")
    if cached is None:
        cached = p.__dict__["_kernel_args"] = _problem_args(p)
    return dict(cached)


def _problem_args(p: Problem) -> dict:
    B, H, n, r, d = p.shape
    # Unused pointers get a harmless stand-in; the flags keep the kernel from reading them.
    gamma = p.gamma if p.gamma is not None else p.out
    s0 = p.initial_state if p.initial_state is not None else p.out
    st = p.state if p.state is not None else p.out
    args = dict(
        b_ptr=p.b, c_ptr=p.c, v_ptr=p.v, o_ptr=p.out, gamma_ptr=gamma, s0_ptr=s0, st_ptr=st,
        b_strides=group_strides(p.b, H), c_strides=group_strides(p.c, H), v_strides=group_strides(p.v, H),
        o_strides=strides(p.out),
        s0_strides=strides(s0), st_strides=strides(st),
        H=H, N=n, R=r, D=d,
        HAS_DECAY=p.gamma is not None,
        HAS_INITIAL=p.initial_state is not None,
        STORE_STATE=p.state is not None,
        DOT_PRECISION=dot_precision(p),
    )
    if p.reverse:
        for name, x in (("b", p.b), ("c", p.c), ("v", p.v), ("o", p.out)):
            ptr, st = reversed_rows(x)
            args[f"{name}_ptr"], args[f"{name}_strides"] = ptr, (st if name == "o" else st + (H // x.shape[1],))
    return args


def reversed_rows(x):
    """(pointer, strides) that address the rows of a ``(B, H, n, dim)`` tensor from the last to the first:
    a view of ``x`` starting at its last row, and its strides with the row stride negated, so that row t
    lies at base + (n − 1 − t) · row stride (docs/design.md §10.3).  With no rows, ``x`` itself."""
    n = x.shape[2]
    s = x.stride()
    return (x.narrow(2, n - 1, 1) if n > 0 else x), (s[0], s[1], -s[2], s[3])


def strides(x) -> tuple[int, ...]:
    """The strides of ``x`` as a kernel takes them: (batch, head, row, column) of a 4-D tensor (the
    stand-ins for absent states are 4-D as well), (batch, head, column) of a decode step's 3-D one."""
    return tuple(x.stride())


def group_strides(x, heads: int) -> tuple[int, ...]:
    """The strides of b, c or v (or a decode step's b_t, c_t, v_t) as a kernel takes them: :func:`strides`, then
    the group, ``heads`` (the output's) // ``x``'s heads: how many output heads read each of its heads (1 when it
    has one per output head; docs/design.md §1.7).  :func:`group_ptr` reads it."""
    h = x.shape[1]
    return tuple(x.stride()) + ((heads // h) if h else 1,)


def dot_precision(p: Problem) -> str:
    """``tl.dot`` input precision: the caller's choice for float32 inputs; for 16-bit inputs TF32
    (it applies only to products whose operands a kernel upcast to float32, and holds 16-bit
    values exactly)."""
    import torch

    if p.v.dtype == torch.float32:
        return p.precision
    return "tf32"


def two_part(p: Problem) -> bool:
    """Whether ``p``'s float32 operands are rounded in two bfloat16 parts (:attr:`Problem.two_part`: its
    inputs are bfloat16 and its caller asked for it)."""
    import torch

    return p.two_part and p.v.dtype == torch.bfloat16


def pow2_at_least_16(x: int) -> int:
    """Smallest power of two ≥ max(x, 16): the least tile a ``tl.dot`` operand may have."""
    return max(16, next_power_of_2(x))


# --------------------------------------------------------------------------- jit helpers

@triton.jit
def batch_head(i_bh, H):
    """(batch, head) of the flat batch·head index ``i_bh``, as 64-bit integers: offsets across
    batch·heads (batch·heads·n·d elements) may pass 2^31."""
    return (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)


@triton.jit
def head_ptr(ptr, strides, i_b, i_h):
    """``ptr`` moved to batch element ``i_b`` and head ``i_h`` (64-bit), by its ``strides`` tuple."""
    return ptr + i_b * strides[0] + i_h * strides[1]


@triton.jit
def group_ptr(ptr, strides, i_b, i_h):
    """``ptr`` of b, c or v moved to batch element ``i_b`` and the head output head ``i_h`` reads: its strides
    tuple (:func:`group_strides`) ends in the group g, and the head is ``i_h // g`` (docs/design.md §1.7; g = 1,
    a constant, for an ungrouped tensor: the division folds away)."""
    return ptr + i_b * strides[0] + (i_h // strides[len(strides) - 1]) * strides[1]


@triton.jit
def head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h):
    """The pointers to b, c, v and the output moved to batch element ``i_b`` and output head ``i_h`` (b, c and v
    to the heads it reads: :func:`group_ptr`)."""
    return (group_ptr(b_ptr, b_strides, i_b, i_h), group_ptr(c_ptr, c_strides, i_b, i_h),
            group_ptr(v_ptr, v_strides, i_b, i_h), head_ptr(o_ptr, o_strides, i_b, i_h))


@triton.jit
def and_scalar(mask, flag):
    """``mask & flag`` for a block ``mask`` and a scalar int1 ``flag`` (a slot's liveness).  Broadcast
    by hand: Triton 3.x's interpreter gives the direct form a dtype its masked loads reject; on the
    GPU both compile to the same predicate."""
    return mask & ((tl.zeros(mask.shape, tl.int32) + flag.to(tl.int32)) != 0)


@triton.jit
def mma(a, b, PRECISION: tl.constexpr):
    """``a @ b`` with float32 accumulation; ``PRECISION`` applies to float32 operands.

    With ``PRECISION == "tf32"`` float32 operands are first rounded to nearest TF32
    (:func:`round_to_tf32`): the tensor cores would otherwise truncate them, which biases every
    product towards zero (docs/design.md §2.2).  16-bit operands and "ieee" products are as they are.
    """
    if PRECISION == "tf32":
        if a.dtype == tl.float32:
            a = round_to_tf32(a)
        if b.dtype == tl.float32:
            b = round_to_tf32(b)
    if _INTERPRETER_BF16_DOT:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
        if b.dtype == tl.bfloat16:
            b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def round_to_tf32(x):
    """float32 ``x`` rounded to nearest TF32 (10 mantissa bits, ties away from zero), as float32.

    TF32 tensor cores read only the top 10 of a float32 operand's 23 mantissa bits, dropping the
    rest (truncation towards zero: an error of up to one unit in the last place, half of one on
    average, always shrinking the magnitude).  Rounded first, the operand is exact in TF32, so the
    product sees an error of at most half a unit and no bias.  On the bit pattern: adding half a
    unit (bit 12) to the magnitude carries into the kept bits exactly when the dropped ones are at
    least half a unit, and a carry out of the mantissa moves the exponent up, as it should
    (the largest finite values round to infinity, as any round-to-nearest does).  Infinities and
    NaNs (exponent all ones) are kept as they are: adding to a NaN whose payload lies only in the
    dropped bits would give infinity.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x1000) & 0xFFFFE000
    special = (bits & 0x7F800000) == 0x7F800000
    return tl.where(special, bits, rounded).to(tl.float32, bitcast=True)


@triton.jit
def low_part(x, hi, dtype: tl.constexpr):
    """What float32 ``x`` keeps beyond ``hi`` (``x`` rounded to ``dtype`` by :func:`round_to`), rounded to
    ``dtype`` as well: ``hi + lo`` holds x to about twice ``dtype``'s significant bits, and a product with
    each part (both exact in float32, summed in float32) loses about that much less than one with ``hi``
    (docs/design.md §10.4).  The difference x − hi is exact in float32."""
    return round_to(x - hi.to(tl.float32), dtype)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 ``x`` rounded to ``dtype`` to nearest (ties to even), as the GPU converts.

    Triton's interpreter truncates float32 → bfloat16 (towards zero, a bias of half a unit in
    the last place); under it the rounding is done on the bit pattern first, so that the CPU
    suite sees the GPU's arithmetic.  A plain conversion on the GPU.
    """
    if _INTERPRETER_BF16_DOT:
        if dtype == tl.bfloat16 and x.dtype == tl.float32:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def load_tile(ptr, rows, cols, stride_row, stride_col, n_rows, n_cols):
    """A [len(rows), len(cols)] tile, zero outside ``rows < n_rows`` and ``cols < n_cols``."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(ptr + rows[:, None] * stride_row + cols[None, :] * stride_col, mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, value, rows, cols, stride_row, stride_col, n_rows, n_cols):
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(ptr + rows[:, None] * stride_row + cols[None, :] * stride_col, round_to(value, ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def masked_product(acc, b_ptr, c_ptr, v_ptr, b_strides, c_strides, v_strides, o_i, o_j, o_v, lam, N, R, D,
                   HAS_DECAY: tl.constexpr, DOT_PRECISION: tl.constexpr, BK: tl.constexpr,
                   CAUSAL: tl.constexpr = False):
    """acc + ((b_i c_jᵀ) ⊙ M_ij) v_j: the decayed scores of rows ``o_i`` against the keys ``o_j``
    (M[i, j] = γ^(i−j) for i ≥ j, else 0; b c over r in slices of BK), times those keys' values.

    ``CAUSAL``: causal for any values (docs/nonfinite.md), the slow form a kernel takes once its fast
    result holds a non-finite entry (:func:`any_nonfinite`): the scores where M is zero are selected out,
    and the product with v is :func:`lower_values_product`.  Without it, a masked score times a
    non-finite value (0 · inf) is NaN in an earlier row."""
    o_k = tl.arange(0, BK)
    scores = tl.zeros([o_i.shape[0], o_j.shape[0]], dtype=tl.float32)
    for k0 in range(0, R, BK):
        b_bi = load_tile(b_ptr, o_i, k0 + o_k, b_strides[2], b_strides[3], N, R)
        b_cj = load_tile(c_ptr, o_j, k0 + o_k, c_strides[2], c_strides[3], N, R)
        scores += mma(b_bi, tl.trans(b_cj), DOT_PRECISION)  # [BT, BK] @ [BK, BJ]
    m = causal_decay(lam, o_i, o_j, HAS_DECAY)
    b_vj = load_tile(v_ptr, o_j, o_v, v_strides[2], v_strides[3], N, D)
    if CAUSAL:
        scores = tl.where(m == 0.0, 0.0, scores * m)   # a NaN decay (a bad γ) stays NaN
    else:
        scores *= m
    if b_vj.dtype == tl.float16:
        # float16 rounds the scores to its range: a tile past it (or all below its normal range) goes in
        # scaled by a power of two, undone on the float32 product (docs/nonfinite.md)
        up, down = float16_tile_scale(scores)
        scores *= up
    else:
        down = 1.0
    if CAUSAL:
        return lower_values_product(acc, round_to(scores, b_vj.dtype), b_vj, o_i, o_j, down, DOT_PRECISION)
    return acc + mma(round_to(scores, b_vj.dtype), b_vj, DOT_PRECISION) * down  # [BT, BJ] @ [BJ, BV]


FP16_MAX = tl.constexpr(65504.0)
FP16_MIN_NORMAL = tl.constexpr(2.0 ** -14)


@triton.jit
def float16_tile_scale(x):
    """(up, down): powers of two for a float32 tile ``x`` about to be rounded to float16, as scalars.

    1 and 1 where the tile's largest finite |entry| m is zero or in float16's normal range [2^-14, 65 504]
    (the rounding keeps 11 significant bits of every entry near m, and the tile goes in as it is); else
    ``up`` brings m into [2^14, 2^15) (no overflow, and every entry down to 2^-24 of m keeps its precision)
    and ``down`` = 1 / ``up`` undoes it on the float32 product.  One reduction of the tile."""
    a = tl.where(nonfinite(x), 0.0, tl.abs(x))
    m = tl.max(tl.max(a, axis=1), axis=0)
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of m
    k = tl.minimum(tl.maximum(268 - e, 1), 253)  # biased exponent of 2^(14 − (e − 127))
    keep = (m == 0.0) | ((m >= FP16_MIN_NORMAL) & (m <= FP16_MAX))
    up = tl.where(keep, 1.0, (k << 23).to(tl.float32, bitcast=True))
    down = tl.where(keep, 1.0, ((254 - k) << 23).to(tl.float32, bitcast=True))
    return up, down


@triton.jit
def nonfinite(x):
    """Elementwise: whether each entry of ``x`` is ±inf or NaN (x · 0 is 0 exactly when x is finite)."""
    return (x.to(tl.float32) * 0.0) != 0.0


@triton.jit
def any_nonfinite(x):
    """Whether the tile ``x`` holds a non-finite entry, as a scalar: one multiply per entry and one sum
    (NaN exactly when an entry is ±inf or NaN).  A kernel checks its float32 result tile so, once, and
    only where it holds one takes its slow causal form (docs/nonfinite.md)."""
    z = tl.sum(tl.sum(x.to(tl.float32) * 0.0, axis=1), axis=0)
    return z != z


@triton.jit
def lower_values_product(acc, scores, b_v, o_i, o_j, down, PRECISION: tl.constexpr):
    """``acc + (scores @ v) · down`` ([BT, BJ] @ [BJ, BV]) for scores that are zero wherever key ``o_j`` comes
    after row ``o_i`` (selected so), such that a non-finite v_j reaches rows i ≥ j only.

    A plain product multiplies those zeros by every v_j, and 0 · ±inf is NaN in the earlier rows.  Here v
    enters with its non-finite entries set to zero, and each value column's rows from its first non-finite
    entry on are NaN in ``acc`` (the definition gives them ±inf or NaN).  The rest is the fast form's
    expression, ``acc + mma(scores, v) · down``, operand for operand: the compiler lowers both alike (the
    product accumulates onto ``acc`` where ``down`` is the constant 1), so the rows before a non-finite key
    are the fast form's bit for bit (docs/nonfinite.md).
    """
    bad = nonfinite(b_v)
    first = tl.min(tl.where(bad, o_j[:, None], 2147483647), axis=0)  # [BV]: the first key with a non-finite v
    acc = tl.where(o_i[:, None] >= first[None, :], float("nan"), acc)
    return acc + mma(scores, tl.where(bad, 0.0, b_v).to(b_v.dtype), PRECISION) * down  # [BT, BJ] @ [BJ, BV]


@triton.jit
def decay(lam, dist, HAS_DECAY: tl.constexpr):
    """γ^dist = exp2(λ · dist) for dist ≥ 0, so every factor lies in (0, 1] (never γ^-j)."""
    if HAS_DECAY:
        return tl.exp2(lam * dist.to(tl.float32))
    else:
        return tl.full(dist.shape, 1.0, tl.float32)


@triton.jit
def causal_decay(lam, rows, cols, HAS_DECAY: tl.constexpr):
    """M[i, j] = γ^(i−j) for i ≥ j, else 0, for absolute positions ``rows`` × ``cols``."""
    dist = rows[:, None] - cols[None, :]
    causal = dist >= 0
    return tl.where(causal, decay(lam, tl.where(causal, dist, 0), HAS_DECAY), 0.0)


@triton.jit
def head_log2_gamma(gamma_ptr, i_h, HAS_DECAY: tl.constexpr):
    """λ = log2 γ of head ``i_h`` as float32, from γ itself (any float dtype, one per head, contiguous).

    The kernels read γ from the caller's tensor on every launch, so no cache can hand them
    old values (docs/design.md §2); λ is computed in float64 (:func:`log2_float64`) and
    rounded once, as exact as the host's ``log2`` in float64 would be.
    """
    if HAS_DECAY:
        return log2_float64(tl.load(gamma_ptr + i_h).to(tl.float64)).to(tl.float32)
    else:
        return 0.0


@triton.jit
def log2_float64(g):
    """log2 g for a float64 γ in (0, 1], to float64 accuracy; NaN for any γ outside (0, 1].

    g = m · 2^e with m in [√½, √2) (exponent and mantissa from the bit pattern),
    log2 m = 2 atanh(s) / ln 2 with s = (m − 1)/(m + 1), |s| ≤ 0.172: the series in s²
    below leaves a relative error under 1e-16.  m − 1 is exact, so λ keeps its full
    relative precision for γ near 1, where every long decay comes from.  A γ outside
    (0, 1] -- one written into the tensor in a way its version counter missed, after it
    was checked -- gives NaN, so the output is NaN rather than silently wrong.
    """
    bits = g.to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 0x7FF) - 1023
    m = ((bits & 0xFFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
    high = m > 1.4142135623730951
    m = tl.where(high, m * 0.5, m)
    e = tl.where(high, e + 1, e)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (
        1.0 / 11 + s2 * (1.0 / 13 + s2 * (1.0 / 15 + s2 * (1.0 / 17 + s2 * (1.0 / 19)))))))))
    lam = e.to(tl.float64) + (2.0 * 1.4426950408889634) * s * series
    return tl.where((g > 0.0) & (g <= 1.0), lam, float("nan"))


@triton.jit
def step_decay(lam):
    """γ = exp2(λ) as g_hi + g_lo: g_hi in float32, g_lo what float32 rounded away.

    A recurrence multiplies the state by γ once per step, so the relative error δ
    of a float32 γ (rounding, and the GPU's approximate exp2) biases a term s
    steps back by s·δ: ~1e-5 after a few hundred steps when γ is near 1 (measured
    2.7e-6 at n = 400, γ = 0.9999, δ = 1.7e-8; 2.8e-7 with the split).
    S·g_hi + S·g_lo removes the bias.  g_lo = (1 − g_hi) + expm1(λ ln 2): 1 − g_hi
    is exact (Sterbenz) and expm1 comes from its series, exact to float32 for
    |λ ln 2| < 1/8.  Below γ ≈ 0.917 old terms fade first (the bias peaks near
    δ / (e (1 − γ)) < 5 δ) and g_lo is 0.
    """
    g_hi = tl.exp2(lam)
    x = lam * 0.6931471805599453
    expm1 = x * (1.0 + x * (0.5 + x * (1.0 / 6 + x * (1.0 / 24 + x * (1.0 / 120 + x * (1.0 / 720))))))
    g_lo = tl.where(x > -0.125, (1.0 - g_hi) + expm1, 0.0)
    return g_hi, g_lo
