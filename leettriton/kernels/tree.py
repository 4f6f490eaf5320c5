"""Tree verification: k draft tokens per row, each decoded from its parent's state (docs/design.md §13.7).

Token j of row i has the parent P[i, j] ∈ {−1, 0, …, j − 1} (−1: the row's state before the call, the
root).  Its state is S_j = γ S_{P[j]} + c_jᵀ v_j (per-token decay: exp(a_j) S_{P[j]} + c_jᵀ v_j) and its
output o_j = b_j S_j.  A chain, P[i, j] = j − 1, is ``decode_tokens`` without parents.

The kernel is the k-token step's walk (kernels/decode.py) with one change: token j reads its parent's
state instead of the running one.  One program per (value tile, batch · head) walks the k tokens in
order; token j's [R, BV] slice is written to the kept states at index j + 1, where a later child reads
it (parents come first, so it is always written before it is read), and index 0 gets the root.  The
root is read from the state (or the pool slot) and never written: a tree has no single state after the
call, so the caller commits the accepted node's kept state (``leettriton.serving.commit_tree``).  The
arithmetic of a token is the k-token step's, in the same order (γ in two parts, the same tiles), so a
chain gives the same bits under the same config.

Without ``keep_states`` the node states still go through a buffer of the same size (a child reads its
parent's state there): the call costs what it costs with them.  The states move through global memory
as in the k-token step (one root read, k node writes, k parent reads that the cache mostly serves), with
a barrier between tokens.

A parent outside {−1, …, j − 1} is not read on the host on the kernel paths (no sync): the kernel reads
it as −1 (the root), so a bad value never addresses memory outside the row's own states.  On CPU tensors
outside the interpreter (the PyTorch path) the values are checked and a bad one raises ValueError.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..autotune import autotune, is_interpreting, launch
from ..autotune.sizing import cdiv
from ..problem import (INDEX_DTYPES, check_autograd, check_constant_gamma, check_slot_values, expand_heads,
                       new_empty, resolve_gamma, resolve_log_decay, type_name)
from . import tree_space as spaces
from .abi import and_scalar, batch_head, group_strides, head_log2_gamma, head_ptr, head_ptrs, step_decay, strides

_KEY = ["R", "D", "BH_BUCKET", "HAS_DECAY", "SLOTTED", "KEEP", "PER_TOKEN_DECAY"]


@triton.jit
def _node_pass(p_b, p_c, p_v, p_root, p_par, p_node, p_copy, b_stride, c_stride, v_stride, st_stride_k, st_stride_v,
               keep_stride_k, keep_stride_v, from_root, from_kept, store_root, o_v, R, D, g_hi, g_lo,
               HAS_DECAY: tl.constexpr, KEEP: tl.constexpr, live, BK: tl.constexpr, BV: tl.constexpr):
    """One draft token over a [R, BV] column slice: S = γ S_parent + c_tᵀ v_t, tile by tile, written at
    ``p_node``; returns the [BV] slice of b_t S.  The parent's slice is the root (``p_root``, read only
    where ``live``: a padding row reads zeros) where ``from_root``, else (``from_kept``) a kept state
    (``p_par``).  ``store_root`` (with ``KEEP``): the root's slice is also written at ``p_copy``, the kept
    states' index 0.  A padding row's node states are written as zeros."""
    m_d = o_v < D
    b_v = tl.load(p_v + o_v * v_stride, mask=m_d, other=0.0).to(tl.float32)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for k0 in range(0, R, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < R
        b_q = tl.load(p_b + o_k * b_stride, mask=m_k, other=0.0).to(tl.float32)  # the token's b (query) keys
        b_c = tl.load(p_c + o_k * c_stride, mask=m_k, other=0.0).to(tl.float32)
        m_s = m_k[:, None] & m_d[None, :]
        # the two sources under complementary masks: only one of them is read
        p_r = p_root + o_k[:, None] * st_stride_k + o_v[None, :] * st_stride_v
        b_r = tl.load(p_r, mask=and_scalar(m_s, from_root & live), other=0.0)
        off_keep = o_k[:, None] * keep_stride_k + o_v[None, :] * keep_stride_v
        b_p = tl.load(p_par + off_keep, mask=and_scalar(m_s, from_kept), other=0.0)
        b_s = tl.where(from_root, b_r, b_p)  # [BK, BV]
        if KEEP:
            tl.store(p_copy + off_keep, b_r, mask=and_scalar(m_s, store_root))
        if HAS_DECAY:
            b_s = tl.fma(b_s, g_hi, tl.fma(b_s, g_lo, b_c[:, None] * b_v[None, :]))  # [BK, 1] * [1, BV]
        else:
            b_s += b_c[:, None] * b_v[None, :]
        tl.store(p_node + off_keep, tl.where(live, b_s, 0.0), mask=m_s)
        acc += b_q[:, None] * b_s  # [BK, 1] * [BK, BV]
    return tl.sum(acc, axis=0)  # [BV] = b_t S over the keys


@autotune(spaces.TREE, key=_KEY)
@triton.jit(do_not_specialize=["BH_BUCKET", "K", "SLOTS"])
def _decode_tree_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, gamma_ptr, st_ptr, slot_ptr, keep_ptr, par_ptr,
    b_strides, c_strides, v_strides, o_strides, st_strides, keep_strides, par_strides, H, R, D, K, SLOTS, BH_BUCKET,
    HAS_DECAY: tl.constexpr, SLOTTED: tl.constexpr, KEEP: tl.constexpr,
    a_ptr, a_strides, PER_TOKEN_DECAY: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # b, c, v, o: (batch, head, token, column) strides; the root state (row, head, key, value), its row the
    # batch element's slot (SLOTTED) or the batch element itself; node states (batch, head, token + 1, key,
    # value); parents (batch, token).  Nothing here writes the state or the pool.
    i_v, i_bh = tl.program_id(0) % tl.cdiv(D, BV), tl.program_id(0) // tl.cdiv(D, BV)
    i_b, i_h = batch_head(i_bh, H)
    p_b, p_c, p_v, p_o = head_ptrs(b_ptr, c_ptr, v_ptr, o_ptr, b_strides, c_strides, v_strides, o_strides, i_b, i_h)
    if SLOTTED:  # the slot id is read here: < 0 padding (zero output), past the pool NaN; neither is read
        slot = tl.load(slot_ptr + i_b).to(tl.int64)
        live = (slot >= 0) & (slot < SLOTS)
        row = tl.where(live, slot, 0)
        fill = tl.where(slot < 0, 0.0, float("nan"))
    else:
        live = i_b >= 0
        row = i_b
        fill = 0.0
    p_root = head_ptr(st_ptr, st_strides, row, i_h)
    lam = head_log2_gamma(gamma_ptr, i_h, HAS_DECAY)
    g_hi, g_lo = step_decay(lam)
    o_v = i_v * BV + tl.arange(0, BV)
    p_keep = keep_ptr + i_b * keep_strides[0] + i_h * keep_strides[1]
    p_par = par_ptr + i_b * par_strides[0]
    if PER_TOKEN_DECAY:  # token t's decay a_t of this row and head (docs/design.md §1.6)
        p_a = head_ptr(a_ptr, a_strides, i_b, i_h)
    for t in range(0, K):
        # the parent, guarded: anything but -1 ... t - 1 reads the root (never memory outside this row's states)
        par = tl.load(p_par + t * par_strides[1]).to(tl.int64)
        par = tl.where((par >= 0) & (par < t), par, -1)
        if PER_TOKEN_DECAY:  # exp(a_t) = exp2(a_t · log2 e) ≤ 1; a_t > 0 or NaN gives NaN
            a_t = tl.load(p_a + t * a_strides[2]).to(tl.float32)
            g_hi = tl.where(a_t <= 0.0, tl.exp2(a_t * 1.4426950408889634), float("nan"))
            g_lo = 0.0
        b_o = _node_pass(p_b + t * b_strides[2], p_c + t * c_strides[2], p_v + t * v_strides[2], p_root,
                         p_keep + (par + 1) * keep_strides[2], p_keep + (t + 1) * keep_strides[2], p_keep,
                         b_strides[3], c_strides[3], v_strides[3], st_strides[2], st_strides[3],
                         keep_strides[3], keep_strides[4], par < 0, par >= 0, (par * 0 + t) == 0, o_v, R, D, g_hi, g_lo,
                         HAS_DECAY or PER_TOKEN_DECAY, KEEP, live, BK, BV)
        b_o = tl.where(live, b_o, fill)
        tl.store(p_o + t * o_strides[2] + o_v * o_strides[3], b_o.to(o_ptr.dtype.element_ty), mask=o_v < D)
        # a later token may read the node state this one wrote: every thread of the program must see every
        # other thread's stores
        tl.debug_barrier()


def _decode_tree_torch(b, c, v, state, gamma, out, slot_ids, kept, parents, log_decay) -> None:
    """The tree step in PyTorch, for CPU tensors outside the interpreter (float64 inside, one rounding per
    output): the k-token step's PyTorch form with each token's state taken from its parent's.  A loop over
    the k tokens, never over rows.  Grouped heads (docs/design.md §1.7) are expanded to the state's."""
    H = state.shape[1]
    b, c, v = (expand_heads(x, H) for x in (b, c, v))
    B, _, K, r = b.shape
    d = v.shape[-1]
    if slot_ids is None:
        rows, live = torch.arange(B), torch.ones(B, dtype=torch.bool)
        fill = torch.zeros(B, dtype=torch.float64)
    else:
        ids = slot_ids.long()
        live = (ids >= 0) & (ids < state.shape[0])
        rows = torch.where(live, ids, 0)
        fill = torch.where(ids < 0, 0.0, float("nan")).double()
    mask = live.view(B, 1, 1, 1)
    nodes = torch.empty((B, H, K + 1, r, d), dtype=torch.float64)
    nodes[:, :, 0] = torch.where(mask, state[rows].double(), 0.0)
    batch = torch.arange(B)
    par = parents.long()
    for t in range(K):
        s = nodes[batch, :, par[:, t] + 1]  # (B, H, r, d): each row's parent state
        new = c[:, :, t].double().unsqueeze(-1) * v[:, :, t].double().unsqueeze(-2)
        if log_decay is not None:
            a = log_decay[:, :, t].double()
            f = torch.where(a <= 0, torch.exp(a.clamp(max=0)), torch.full((), float("nan"), dtype=torch.float64))
            s = new + f.view(B, H, 1, 1) * s
        else:
            s = new + (s if gamma is None else gamma.double().view(1, -1, 1, 1) * s)
        out[:, :, t] = torch.where(live.view(B, 1, 1), (b[:, :, t].double().unsqueeze(-2) @ s).squeeze(-2),
                                   fill.view(B, 1, 1))
        nodes[:, :, t + 1] = torch.where(mask, s, 0.0)
    if kept is not None:
        kept.copy_(nodes)


def check_parents(parents, batch: int, k: int, device) -> torch.Tensor:
    """``parents``' type, dtype, shape and device (never its values): an int32/int64 ``(batch, k)`` tensor on
    ``device``."""
    what = "the parent of each draft token, −1 … j − 1 for token j (−1: the state before the call)"
    if not isinstance(parents, torch.Tensor):
        raise TypeError(f"parents must be None or an int32/int64 tensor (batch, k) ({what}), got {type_name(parents)}")
    if parents.dtype not in INDEX_DTYPES:
        raise TypeError(f"parents must be int32 or int64 ({what}), got dtype {parents.dtype}")
    if tuple(parents.shape) != (batch, k):
        raise ValueError(f"parents must have shape (batch, k) = ({batch}, {k}) ({what}), got shape "
                         f"{tuple(parents.shape)}")
    if parents.device != device:
        raise ValueError(f"parents must be on the inputs' device {device}, got {parents.device}")
    return parents


def check_parent_values(parents: torch.Tensor) -> None:
    """Every parent in −1 … j − 1 for token j; only for CPU tensors outside the interpreter (a host reduction,
    no device): elsewhere the kernel reads a bad parent as the root."""
    k = parents.shape[1]
    bad = (parents < -1) | (parents >= torch.arange(k, dtype=parents.dtype).view(1, k))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"parents[{i}, {j}] must lie in −1 … {j - 1} (token {j}'s parent comes before it; −1: the "
                         f"state before the call), got {int(parents[i, j])}")


def decode_tree(b, c, v, state, gamma, parents, *, slot_ids, keep_states: bool, check_slots: bool, log_decay):
    """``decode_tokens(..., parents=...)`` once its tensors passed the k-token step's checks
    (``api._check_decode_tokens``; ``slot_ids`` already as the kernel reads it): the parents, γ or the
    per-token decay, autograd, the slot ids' values; then one launch.  Validated on every call (no
    repeated-launch signature).

    Returns ``(out (B, H, k, d), kept (B, H, k + 1, r, d) or None)``; the state is only read.  H is the state's
    heads; b, c, v may have fewer (grouped heads, docs/design.md §1.7)."""
    B, _, K, r = b.shape
    H, d = state.shape[1], v.shape[-1]
    check_parents(parents, B, K, v.device)
    torch_path = v.device.type == "cpu" and not is_interpreting()
    if torch_path:
        check_parent_values(parents)
    check_autograd("decode_tokens", b, c, v, state, log_decay)
    if log_decay is not None:
        ld = resolve_log_decay(log_decay, gamma, (B, H, K), v.dtype, v.device, where="decode_tokens",
                               axes="(batch, heads, k)")
        gamma_h = None
    else:
        ld = None
        check_constant_gamma(gamma)
        gamma_h = resolve_gamma(gamma, H, v.device)
    if slot_ids is not None:
        check_slot_values("slot_ids", slot_ids, state.shape[0], check_slots)
    out = new_empty((B, H, K, d), v.dtype, v.device)
    kept = new_empty((B, H, K + 1, r, d), torch.float32, v.device) if keep_states else None
    if B and H:
        decode_tree_impl(b, c, v, state, gamma_h, out, slot_ids, kept, parents, log_decay=ld)
    return out, kept


def decode_tree_impl(b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                     gamma: Optional[torch.Tensor], out: torch.Tensor, slot_ids: Optional[torch.Tensor],
                     kept: Optional[torch.Tensor], parents: torch.Tensor, config=None,
                     log_decay: Optional[torch.Tensor] = None) -> None:
    """Launch the tree step (inputs validated by :func:`decode_tree`).

    b, c: ``(B, H, k, r)``; v, out: ``(B, H, k, d)``; state: float32 ``(B, H, r, d)``, or with ``slot_ids``
    (``(B,)`` int32/int64, contiguous) a pool ``(slots, H, r, d)``, read only; kept: float32
    ``(B, H, k + 1, r, d)`` or None (the node states then go to a buffer of that size, dropped after);
    parents: ``(B, k)`` int32/int64, any strides; gamma ``(H,)`` or None; log_decay ``(B, H, k)`` or None.
    ``config`` maps ``decode.tree`` to a config dict (None: autotune).
    """
    if state.device.type == "cpu" and not is_interpreting():
        _decode_tree_torch(b, c, v, state, gamma, out, slot_ids, kept, parents, log_decay)
        return
    B, _, K, r = b.shape
    H, d = state.shape[1], v.shape[-1]
    nodes = kept if kept is not None else torch.empty((B, H, K + 1, r, d), dtype=torch.float32, device=v.device)
    args = dict(
        b_ptr=b, c_ptr=c, v_ptr=v, o_ptr=out, gamma_ptr=out if gamma is None else gamma, st_ptr=state,
        slot_ptr=state if slot_ids is None else slot_ids, keep_ptr=nodes, par_ptr=parents,
        b_strides=group_strides(b, H), c_strides=group_strides(c, H), v_strides=group_strides(v, H),
        o_strides=strides(out), st_strides=strides(state), keep_strides=strides(nodes), par_strides=tuple(parents.stride()),
        H=H, R=r, D=d, K=K, SLOTS=state.shape[0], BH_BUCKET=(B * H).bit_length(),
        HAS_DECAY=gamma is not None, SLOTTED=slot_ids is not None, KEEP=kept is not None,
        a_ptr=out if log_decay is None else log_decay,
        a_strides=(0, 0, 0) if log_decay is None else tuple(log_decay.stride()), PER_TOKEN_DECAY=log_decay is not None,
    )
    grid = lambda meta: (cdiv(d, meta["BV"]) * B * H,)  # noqa: E731
    launch(_decode_tree_kernel, grid, (config or {}).get(spaces.TREE.name), **args)
