"""Engine adapters: vLLM's and SGLang's linear-attention metadata, run through leettriton's serving calls.

A serving engine hands each linear-attention layer a metadata object built once per step.  The functions
here take that object (any object with the engine's field names: the engines' own dataclasses, or
stand-ins) and run :func:`leettriton.linear_attention_varlen`, :func:`leettriton.decode_step` and
:func:`leettriton.decode_tokens` on a state pool, writing every token's output into one tensor in the
engine's token order (docs/design.md §13.6).  No engine is imported: matching the field names is the
interface.

The fields read, and where the engines define them:

* vLLM, ``vllm/v1/attention/backends/linear_attn.py`` ``LinearAttentionMetadata`` (the MiniMax lightning
  layer's): ``num_prefills``, ``num_prefill_tokens``, ``num_decodes``, ``num_decode_tokens`` (host ints),
  ``query_start_loc`` ``(batch + 1,)``, ``seq_lens`` ``(batch,)``, ``state_indices_tensor`` ``(batch,)``
  (``block_table_tensor[:, 0]``).  Its builder's ``reorder_batch_threshold = 1`` orders the **decodes
  first**, then the prefills.  ``gdn_attn.py`` ``GDNAttentionMetadata`` adds ``has_initial_state``,
  ``spec_state_indices_tensor`` ``(batch, num_spec + 1)`` and ``num_accepted_tokens`` (bonus token
  included, so ≥ 1); padding rows hold ``PAD_SLOT_ID`` (−1, ``vllm/v1/attention/backends/utils.py``).
  ``mamba_attn.py`` ``BaseMambaAttentionMetadata`` names the same things ``has_initial_states_p``,
  ``state_indices_tensor_d`` / ``_p`` and, with prefix caching, ``block_idx_last_scheduled_token`` and
  ``block_idx_first_scheduled_token_p`` (``mamba_cache_mode = "all"``: states kept at block boundaries;
  refused, :func:`_vllm_prefix_caching` says why).
* SGLang, ``python/sglang/srt/layers/attention/linear/linear_metadata.py`` ``BailingLinearMetadata`` (used
  by ``lightning_backend.py``): ``num_prefills``, ``num_prefill_tokens``, ``num_decodes`` (host ints),
  ``query_start_loc`` (seg_la's ``q_offsets``; ``prepare_mixed`` cuts it to the prefills'
  ``num_prefills + 1`` entries), ``mamba_cache_indices`` (seg_la's ``s_offsets``; −1 = padding),
  ``has_initial_states`` (seg_la's ``s_scales``).  SGLang orders the **prefills first**, then the
  decodes.  Its ``ForwardMetadata`` (``layers/attention/mamba/mamba2_metadata.py``, filled by
  ``hybrid_linear_attn_backend.py`` ``_init_track_ssm_indices``) carries the prefix-cache fields
  ``track_ssm_h_src`` / ``track_ssm_h_dst`` (one state per tracked extend, after a multiple of the chunk
  size of its tokens, counted from the extend's start: run as the prefill's checkpoints, docs/design.md
  §13.9) and ``track_ssm_final_src`` / ``track_ssm_final_dst`` (a copy of the final state into a second
  slot).

The operator's mapping: b is the engine's q, c its k, v its v, and γ = exp(−slope) per head (the lightning
layers' ALiBi-like slopes).  The engines' ``softmax_scale`` / ``layer.scaling`` has no place in the
operator, and folding it here would cost a pass over b (or the output) on every call: the caller folds it
into b once, e.g. into the q projection's weight at load time.

State layout: each slot is ``(heads, r, d)`` = the engines' ``[K, V]``.  A pool stored ``[V, K]``
(``(slots, heads, d, r)``) is passed as ``pool.transpose(-1, -2)``, a view: the kernels read and write the
pool through its strides, so no copy is made (the PyTorch reference path writes through the view too).

Rules every adapter keeps: no device sync and no Python loop over requests.  Slicing by the host-known
counts (``num_decodes``, ``num_decode_tokens``, ``num_prefills``, ``num_prefill_tokens``, which both
engines keep on the host) is done on the host; everything derived from the metadata's tensors is computed
on the device.  ``check_indices=False`` (the default) trusts the engine's slot ids and offsets; ``True``
validates them through the library's checks, one device sync per call on CUDA (the slices are new tensors
on every call), meant for debugging.  A padding row (slot −1) outputs zeros and touches no state.

The output is returned as one tensor ``(T, heads, d)`` (or written into ``out=``): the library's calls
return their own outputs, so each part is copied into it once.
"""
from __future__ import annotations

import torch

from leettriton.api import decode_step, decode_tokens, linear_attention_varlen
from leettriton.problem import CHECKPOINT_ALIGN

__all__ = [
    "commit_accepted",
    "commit_tree",
    "copy_states",
    "parents_from_next_sibling",
    "sglang_forward",
    "sglang_target_verify",
    "vllm_forward",
    "vllm_spec_decode",
]

PAD_SLOT_ID = -1
"""The engines' padding slot id (vLLM ``PAD_SLOT_ID``; SGLang's −1 in ``mamba_cache_indices``)."""


# --------------------------------------------------------------------------- helpers


def _field(metadata, name: str, required: bool = True):
    if not hasattr(metadata, name):
        if required:
            raise TypeError(f"metadata must have the engine's field {name!r}, got {type(metadata).__name__} "
                            f"without it")
        return None
    return getattr(metadata, name)


def _count(metadata, name: str) -> int:
    value = _field(metadata, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"metadata.{name} must be a host int (the engines keep it on the host), got "
                        f"{type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"metadata.{name} must be ≥ 0, got {value}")
    return value


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return x.narrow(0, start, stop - start)


def _heads(b, c, v) -> int:
    """The output's heads: the most of b's, c's and v's (grouped heads, docs/design.md §1.7; the entry points
    check that each divides it)."""
    return max(b.shape[1], c.shape[1], v.shape[1])


def _output(out, T: int, heads: int, d: int, dtype, device):
    if out is None:
        return torch.empty((T, heads, d), dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor (T, heads, d) or None, got {type(out).__name__}")
    if tuple(out.shape) != (T, heads, d) or out.dtype != dtype or out.device != device:
        raise ValueError(f"out must be ({T}, {heads}, {d}) {dtype} on {device} (the tokens' output), got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    return out


def _slots_1d(name: str, slots: torch.Tensor) -> torch.Tensor:
    """A slot-id tensor as ``(batch,)``: vLLM's Mamba metadata keeps decode slots as ``(batch, 1 + num_spec)``
    of which column 0 is the running state (a strided view, made dense by :func:`_ids` before a call)."""
    if not isinstance(slots, torch.Tensor):
        raise TypeError(f"metadata.{name} must be an integer torch.Tensor, got {type(slots).__name__}")
    if slots.dim() == 2:
        return slots[:, 0]
    if slots.dim() != 1:
        raise ValueError(f"metadata.{name} must be 1-D (batch,) or 2-D (batch, columns), got shape "
                         f"{tuple(slots.shape)}")
    return slots


def _check_rows(name: str, x: torch.Tensor, need: int, what: str) -> None:
    if x.shape[0] < need:
        raise ValueError(f"metadata.{name} must have at least {need} entries ({what}), got {x.shape[0]}")


def _ids(x: torch.Tensor) -> torch.Tensor:
    """An index tensor handed to a call, made contiguous: the serving kernels read slot ids, offsets and
    flags as dense vectors (a strided metadata view, such as vLLM's ``block_table_tensor[:, 0]``, would be
    read at the wrong addresses).  A no-op for a dense vector; else a copy of a few integers, on the device."""
    return x.contiguous()


def _decode_part(b, c, v, pool, gamma, slots, check: bool):
    """One slotted decode step for rows already sliced: (rows, H, d), or None with no rows."""
    if b.shape[0] == 0:
        return None
    o, _ = decode_step(b, c, v, pool, gamma, slot_ids=_ids(slots), check_slots=check)
    return o


def _scatter_states(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``pool[slots[i]] = values[i]`` for every ``slots[i] ≥ 0``; negative ids write nothing.  No sync.

    Dropping the padding rows would need their count on the host.  Instead each padding row is sent to the
    slot of the batch's first real row with that row's value (or, with no real row, to slot 0 with slot 0's
    own value): every write to a slot then carries the same bytes, so the repeated index is harmless and
    the result exact (valid slots are distinct within a call, as the calls require)."""
    n = slots.shape[0]
    if n == 0:
        return
    ids = slots.long()
    valid = ids >= 0
    first = torch.argmax(valid.to(torch.int8))  # the first real row; 0 when there is none
    source = torch.where(valid, torch.arange(n, device=ids.device), first)
    target = ids.gather(0, source).clamp(min=0)
    keep = valid.gather(0, source).view(n, *([1] * (values.dim() - 1)))
    rows = torch.where(keep, values.index_select(0, source), pool.index_select(0, target))
    pool.index_copy_(0, target, rows)


def copy_states(state_pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``state_pool[dst[i]] = state_pool[src[i]]``, on the device: SGLang's ``track_ssm_final_src`` /
    ``track_ssm_final_dst`` (``lightning_backend.py`` ``forward_extend``: the final state kept in a second
    slot for the prefix cache).  ``dst[i] < 0`` writes nothing.  All reads happen before the writes."""
    if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)) or src.shape != dst.shape \
            or src.dim() != 1:
        raise ValueError(f"src and dst must be 1-D integer tensors of one length, got "
                         f"{getattr(src, 'shape', type(src).__name__)} and {getattr(dst, 'shape', type(dst).__name__)}")
    if src.numel() == 0:
        return
    _scatter_states(state_pool, dst, state_pool.index_select(0, src.long().clamp(min=0)))


def commit_accepted(state_pool: torch.Tensor, slot_ids: torch.Tensor, states: torch.Tensor,
                    num_accepted_tokens: torch.Tensor) -> None:
    """Roll each row's slot back to the state after its accepted tokens: ``state_pool[slot_ids[i]] =
    states[i, :, num_accepted_tokens[i]]``, on the device, no sync (docs/design.md §13.6).

    Args:
        state_pool: float32 ``(slots, heads, r, d)`` (a transposed ``[V, K]`` pool's view works).
        slot_ids: ``(batch,)``: each row's slot, −1 = padding (nothing written).
        states: ``decode_tokens(..., keep_states=True)``'s ``(batch, heads, k + 1, r, d)``.
        num_accepted_tokens: ``(batch,)`` integers in [0, k]: tokens whose update is kept (vLLM
            ``GDNAttentionMetadata.num_accepted_tokens`` counts the bonus token, so it is ≥ 1).
    """
    _commit(state_pool, slot_ids, states, "num_accepted_tokens", num_accepted_tokens, 0)


def _commit(state_pool: torch.Tensor, slot_ids: torch.Tensor, states: torch.Tensor, name: str, index, shift: int):
    """``state_pool[slot_ids[i]] = states[i, :, index[i] + shift]`` (the index clamped to the kept states), after
    the checks of the arguments' types and shapes: :func:`commit_accepted` and :func:`commit_tree`."""
    for what, x in (("state_pool", state_pool), ("slot_ids", slot_ids), ("states", states), (name, index)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if states.dim() != 5 or states.shape[0] != slot_ids.shape[0] or index.shape != slot_ids.shape:
        raise ValueError(f"states must be (batch, heads, k + 1, r, d) and {name} (batch,) with "
                         f"batch = len(slot_ids) = {slot_ids.shape[0]}, got states {tuple(states.shape)} and "
                         f"{name} {tuple(index.shape)}")
    B, H, K1, r, d = states.shape
    at = (index.long() + shift).clamp(0, K1 - 1).reshape(B, 1, 1, 1, 1).expand(B, H, 1, r, d)
    _scatter_states(state_pool, slot_ids, states.gather(2, at).squeeze(2))


def commit_tree(state_pool: torch.Tensor, slot_ids: torch.Tensor, states: torch.Tensor,
                accepted_node: torch.Tensor) -> None:
    """Commit a verified tree: ``state_pool[slot_ids[i]] = states[i, :, accepted_node[i] + 1]``, on the device,
    no sync, padding rows (slot −1) untouched (docs/design.md §13.7).

    ``decode_tokens(..., parents=P, keep_states=True)`` leaves the pool as it was and returns every draft
    token's state (index j + 1) and the root (index 0).  The server, once it knows each row's accepted path,
    passes the path's last draft token: its state already holds the whole path (every ancestor's update), so
    the commit is one gather and one scatter of one state per row, whatever the path's length.  For a chain
    that accepted a tokens the node is a − 1, and ``commit_accepted(..., a)`` is the same commit.

    Args:
        state_pool: float32 ``(slots, heads, r, d)`` (a transposed ``[V, K]`` pool's view works).
        slot_ids: ``(batch,)``: each row's slot, −1 = padding (nothing written).
        states: ``decode_tokens(..., parents=..., keep_states=True)``'s ``(batch, heads, k + 1, r, d)``.
        accepted_node: ``(batch,)`` integers: the accepted path's last draft token j ∈ [0, k − 1], or −1 when no
            draft token was accepted (the root: the slot keeps its state).  Values outside [−1, k − 1] are
            clamped on the device (never read on the host).
    """
    _commit(state_pool, slot_ids, states, "accepted_node", accepted_node, 1)


def _vllm_prefix_caching(field: str, value) -> NotImplementedError:
    """vLLM's ``mamba_cache_mode = "all"`` prefix caching, refused (docs/design.md §13.6).

    The contract (``vllm/v1/attention/backends/mamba_attn.py`` ``_compute_prefix_caching_block_indices``;
    ``model_executor/layers/mamba/mamba_mixer2.py``, its prefill branch): ``state_indices_tensor`` is the
    whole block table ``(batch, blocks)``, block b of a request holding its state after its first
    (b + 1)·``mamba_block_size`` tokens, counted from the request's start.  With ``nc`` its computed tokens
    (``num_computed_tokens_p``, on the device) and L its length after the step (``seq_lens``), a prefill
    reads its start state from block ``block_idx_last_computed_token = ceil(nc / B) − 1``, writes the states
    at the block ends inside the step into blocks ``block_idx_first_scheduled_token_p = floor(nc / B)`` to
    ``block_idx_last_scheduled_token − 1`` and its final state into ``block_idx_last_scheduled_token =
    ceil(L / B) − 1``.  Those ends fall every B rows of the call only where nc is a multiple of B, and the
    mixer serves any nc (chunked prefill: its ``num_unaligned_computed_tokens``); nc is read on the device
    only, so the adapter cannot tell, before any work and without a sync, that every boundary lands on a
    checkpoint (every multiple of 64 rows from the call's start).  A mapping that guessed would leave blocks
    unwritten that the cache later hands out as prefixes.  ``"align"`` mode carries none of these fields:
    its ``state_indices_tensor`` (``backends/utils.py`` ``mamba_get_block_table_tensor``) starts at the block
    of the last scheduled token, column 0 being the one slot the kernels read and write (``mamba_attn.py``:
    ``state_indices_tensor_p[:, 0]``; the runner moves states between blocks, ``vllm/v1/worker/
    mamba_utils.py``), served as without a cache."""
    given = f"a {tuple(value.shape)} tensor" if isinstance(value, torch.Tensor) else repr(value)
    return NotImplementedError(
        f"vLLM prefix caching in mamba_cache_mode 'all' is not mapped (metadata.{field} is set: {given}): "
        f"vLLM wants each prefill's states at absolute block ends ((b + 1)·block_size tokens from the request's "
        f"start), which fall every K rows of the prefill call only when its num_computed_tokens_p is a multiple "
        f"of the block size, and that count is on the device (checking it would be a sync; guessing would leave "
        f"cached blocks unwritten). Run vLLM with mamba_cache_mode 'align' (one slot per request, served "
        f"here), or call linear_attention_varlen(..., checkpoint_every=K, checkpoint_slots=S) with a table "
        f"built from host-known counts (docs/serving.md §13.9)")


# --------------------------------------------------------------------------- vLLM


def vllm_forward(b, c, v, state_pool, metadata, gamma=None, *, out=None, check_indices: bool = False):
    """A vLLM mixed batch, decodes first, then prefills: one slotted decode call and one packed prefill call.

    Args:
        b, c: ``(T, heads, r)``; v: ``(T, heads, d)``: the step's tokens in vLLM's order (q, k, v of the
            layer; b already scaled, see the module's note).  Rows past the decode and prefill tokens are
            padding of a captured decode batch: their slots must be −1.
        state_pool: float32 ``(slots, heads, r, d)`` (the layer's ``kv_cache`` state; ``[V, K]`` pools as
            a transposed view).
        metadata: vLLM ``LinearAttentionMetadata`` (``linear_attn.py``) or an object with its fields:
            ``num_decodes``, ``num_decode_tokens`` (equal: vLLM's decodes are one token each,
            ``reorder_batch_threshold = 1``), ``num_prefills``, ``num_prefill_tokens``,
            ``query_start_loc`` ``(batch + 1,)``, ``state_indices_tensor`` ``(batch,)`` or
            ``(batch, columns)`` (column 0 used), ``seq_lens`` ``(batch,)``.  A prefill starts from its
            slot when it has computed tokens before this step (``seq_lens − query length > 0``, vLLM's
            ``compute_num_computed_tokens() > 0``), or as the field ``has_initial_state``
            (``gdn_attn.py``) / ``has_initial_states_p`` (``mamba_attn.py``) says when the object has one.
            Prefix caching in ``mamba_cache_mode = "all"`` (``block_idx_first_scheduled_token_p`` /
            ``block_idx_last_scheduled_token`` not None, ``mamba_attn.py``) raises
            ``NotImplementedError`` before any work (:func:`_vllm_prefix_caching` says why); ``"align"``
            mode needs no field of its own.
        gamma: as in :func:`leettriton.linear_attention` (γ = exp(−slope) per head).
        out: ``(T, heads, d)`` in v's dtype, or None.
        check_indices: validate slot ids and offsets (one device sync per call on CUDA).

    Returns:
        ``(T, heads, d)``: token t's output at row t; padding rows zero.  The pool holds every request's
        state after this step; slots no request names are untouched.
    """
    for field in ("block_idx_first_scheduled_token_p", "block_idx_last_scheduled_token"):
        if _field(metadata, field, required=False) is not None:
            raise _vllm_prefix_caching(field, _field(metadata, field))
    nd, ndt = _count(metadata, "num_decodes"), _count(metadata, "num_decode_tokens")
    npf, npt = _count(metadata, "num_prefills"), _count(metadata, "num_prefill_tokens")
    if nd != ndt:
        raise ValueError(f"metadata.num_decode_tokens must equal num_decodes (one token per decode; "
                         f"speculative rows go through vllm_spec_decode), got {ndt} tokens for {nd} decodes")
    T = b.shape[0]
    if T < ndt + npt:
        raise ValueError(f"b must have at least num_decode_tokens + num_prefill_tokens = {ndt + npt} rows, got {T}")
    H, d = _heads(b, c, v), v.shape[2]
    o = _output(out, T, H, d, v.dtype, v.device)
    slots = _slots_1d("state_indices_tensor", _field(metadata, "state_indices_tensor"))
    qsl = _field(metadata, "query_start_loc")
    pad = T - ndt - npt  # rows of a padded (captured) batch past the real tokens: decode rows with slot -1
    decode_rows = ndt + pad if npf == 0 else ndt
    if npf and pad:
        raise ValueError(f"b has {T} rows but the batch has {ndt + npt} tokens: vLLM pads decode-only batches, "
                         f"a batch with prefills must have exactly num_decode_tokens + num_prefill_tokens rows")
    _check_rows("state_indices_tensor", slots, decode_rows + npf, "one slot per request and padding row")
    if decode_rows:
        part = _decode_part(_rows(b, 0, decode_rows), _rows(c, 0, decode_rows), _rows(v, 0, decode_rows),
                            state_pool, gamma, _rows(slots, 0, decode_rows), check_indices)
        _rows(o, 0, decode_rows).copy_(part)
    if npf:
        _check_rows("query_start_loc", qsl, nd + npf + 1, "batch + 1 offsets")
        cu = _rows(qsl, nd, nd + npf + 1) - ndt  # the prefills' offsets from 0, on the device
        initial = _field(metadata, "has_initial_state", required=False)
        if initial is None:
            initial = _field(metadata, "has_initial_states_p", required=False)
            if initial is not None:
                initial = _rows(initial, 0, npf)
        else:
            initial = _rows(initial, nd, nd + npf) if initial.shape[0] >= nd + npf else _rows(initial, 0, npf)
        if initial is None:
            seq_lens = _field(metadata, "seq_lens")
            _check_rows("seq_lens", seq_lens, nd + npf, "one length per request")
            initial = _rows(seq_lens, nd, nd + npf) > (cu[1:] - cu[:-1])
        rows = slice(ndt, ndt + npt)
        part = linear_attention_varlen(b[rows], c[rows], v[rows], _ids(cu), gamma, state_pool=state_pool,
                                       slot_ids=_ids(_rows(slots, nd, nd + npf)), has_initial_state=_ids(initial),
                                       check_indices=check_indices)
        o[rows].copy_(part)
    return o


def vllm_spec_decode(b, c, v, state_pool, metadata, gamma=None, *, out=None, check_indices: bool = False):
    """vLLM's speculative decode rows (``gdn_attn.py``): each of the batch's rows verifies ``k = num_spec + 1``
    tokens, reading its state from the slot of its last accepted token and keeping every draft token's state.

    vLLM keeps ``k`` slots per row, ``spec_state_indices_tensor[i, 0 … k − 1]``: the step starts from
    slot ``[i, num_accepted_tokens[i] − 1]`` (the previous step's accepted prefix, bonus token included)
    and leaves the state after token j in slot ``[i, j]``.  Here: one ``decode_tokens(...,
    keep_states=True)`` launch from the start slot, then one device scatter of the kept states into the
    row's k slots.  No sync, no loop over rows.

    Args:
        b, c: ``(batch · k, heads, r)``; v: ``(batch · k, heads, d)``: each row's k tokens consecutive
            (vLLM's spec tokens, ``spec_query_start_loc`` = 0, k, 2k, …).
        state_pool: as in :func:`vllm_forward`.
        metadata: an object with ``spec_state_indices_tensor`` ``(batch, k)`` (−1 rows: padding) and
            ``num_accepted_tokens`` ``(batch,)`` (≥ 1; padding rows hold 1 in vLLM's captured buffers).
            Optionally ``retrieve_parent_token`` ``(batch, k)``: an EAGLE tree, as vLLM's recurrent kernel
            takes it (``model_executor/layers/fla/ops/fused_recurrent.py``: token t ≥ 1 starts from the
            state of token ``retrieve_parent_token[i, t]``, token 0 from the start slot; column 0 is not
            read).  The rows are then verified as trees (``decode_tokens(..., parents=...)``) and slot
            ``[i, j]`` still gets token j's state, as that kernel leaves them.  ``GDNAttentionMetadata``
            itself has no such field (the engine passes it to the kernel where it has one).
        gamma, out, check_indices: as in :func:`vllm_forward`.

    Returns:
        ``(batch · k, heads, d)``, padding rows zero.
    """
    spec = _field(metadata, "spec_state_indices_tensor")
    accepted = _field(metadata, "num_accepted_tokens")
    if not isinstance(spec, torch.Tensor) or spec.dim() != 2 or spec.shape[1] < 1:
        raise ValueError(f"metadata.spec_state_indices_tensor must be a 2-D tensor (batch, num_spec + 1), got "
                         f"{getattr(spec, 'shape', type(spec).__name__)}")
    B, K = spec.shape
    if b.shape[0] != B * K:
        raise ValueError(f"b must have batch · k = {B} · {K} = {B * K} rows (k tokens per spec row), got "
                         f"{b.shape[0]}")
    if not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (B,):
        raise ValueError(f"metadata.num_accepted_tokens must be a ({B},) tensor, got "
                         f"{getattr(accepted, 'shape', type(accepted).__name__)}")
    H, r, d = _heads(b, c, v), b.shape[2], v.shape[2]
    o = _output(out, B * K, H, d, v.dtype, v.device)
    if B == 0:
        return o
    start = spec.gather(1, (accepted.long() - 1).clamp(0, K - 1).reshape(B, 1)).squeeze(1)
    rows = lambda x: x.unflatten(0, (B, K)).transpose(1, 2)  # noqa: E731  (B, H, k, dim), a view
    tree = _field(metadata, "retrieve_parent_token", required=False)
    parents = None
    if tree is not None:
        if not isinstance(tree, torch.Tensor) or tree.dim() != 2 or tree.shape[0] < B or tree.shape[1] < K:
            raise ValueError(f"metadata.retrieve_parent_token must be a 2-D tensor with at least ({B}, {K}) "
                             f"entries, got {getattr(tree, 'shape', type(tree).__name__)}")
        parents = _as_tree(tree[:B, :K])  # token 0 starts from the start slot's state
    part, _, kept = decode_tokens(rows(b), rows(c), rows(v), state_pool, gamma, slot_ids=_ids(start), keep_states=True,
                                  check_slots=check_indices, parents=parents)
    o.unflatten(0, (B, K)).copy_(part.transpose(1, 2))
    # slot [i, j] <- the state after token j (kept index j + 1); padding rows' ids are -1 in every column
    values = kept.narrow(2, 1, K).transpose(1, 2).reshape(B * K, H, r, d)
    _scatter_states(state_pool, spec.reshape(B * K), values)
    return o


# --------------------------------------------------------------------------- SGLang


def sglang_forward(b, c, v, state_pool, metadata, gamma=None, *, out=None, check_indices: bool = False,
                   mamba_chunk_size=None):
    """An SGLang extend or decode batch, prefills first, then one-token decodes (``lightning_backend.py``).

    Args:
        b, c: ``(T, heads, r)``; v: ``(T, heads, d)``: the prefills' tokens, then one token per decode row
            (rows of a padded CUDA-graph batch included: their ``mamba_cache_indices`` are −1).
        state_pool: float32 ``(slots, heads, r, d)`` (the layer's ``mamba2_layer_cache(layer_id).temporal``;
            ``[V, K]`` pools as a transposed view).
        metadata: SGLang ``BailingLinearMetadata`` (``linear_metadata.py``) or an object with its fields:
            ``num_prefills``, ``num_prefill_tokens`` (host ints), ``query_start_loc`` (the prefills'
            offsets, ≥ ``num_prefills + 1`` entries), ``mamba_cache_indices`` ``(batch,)``,
            ``has_initial_states`` ``(batch,)`` (``extend_prefix_lens > 0``).  Prefix-cache tracking:
            ``track_ssm_h_src`` / ``track_ssm_h_dst`` (mid-sequence states, see :func:`_sglang_tracked`)
            become checkpoints of the prefill call (docs/design.md §13.9); ``track_ssm_final_src`` /
            ``track_ssm_final_dst`` are applied after the call (:func:`copy_states`).
        gamma, out, check_indices: as in :func:`vllm_forward`.
        mamba_chunk_size: the chunk size C with which SGLang numbered ``track_ssm_h_src``
            (``MambaAttnBackendBase.mamba_chunk_size`` in ``hybrid_linear_attn_backend.py``: the model
            config's ``mamba_chunk_size``, 64 when it has none).  Needed, a positive multiple of 64, when
            ``track_ssm_h_dst`` is non-empty; else not read.

    Returns:
        ``(T, heads, d)``, padding rows zero.
    """
    npf, npt = _count(metadata, "num_prefills"), _count(metadata, "num_prefill_tokens")
    track = _sglang_tracked(metadata, npf, mamba_chunk_size)
    T = b.shape[0]
    if T < npt:
        raise ValueError(f"b must have at least num_prefill_tokens = {npt} rows, got {T}")
    H, d = _heads(b, c, v), v.shape[2]
    o = _output(out, T, H, d, v.dtype, v.device)
    slots = _slots_1d("mamba_cache_indices", _field(metadata, "mamba_cache_indices"))
    decode_rows = T - npt
    _check_rows("mamba_cache_indices", slots, npf + decode_rows, "one slot per prefill and decode row")
    if npf:
        qsl = _field(metadata, "query_start_loc")
        _check_rows("query_start_loc", qsl, npf + 1, "num_prefills + 1 offsets")
        initial = _field(metadata, "has_initial_states")
        _check_rows("has_initial_states", initial, npf, "one flag per prefill")
        cu, slots_p, initial_p = _ids(_rows(qsl, 0, npf + 1)), _ids(_rows(slots, 0, npf)), _ids(_rows(initial, 0, npf))
        every = table = None
        if track is not None:
            every = mamba_chunk_size
            table = _sglang_checkpoint_slots(state_pool, track, cu, slots_p, initial_p, npf, npt, every,
                                             check_indices)
            if table.shape[1] == 0:
                every = table = None
        part = linear_attention_varlen(b[:npt], c[:npt], v[:npt], cu, gamma, state_pool=state_pool, slot_ids=slots_p,
                                       has_initial_state=initial_p, check_indices=check_indices,
                                       checkpoint_every=every, checkpoint_slots=table)
        o[:npt].copy_(part)
    if decode_rows:
        part = _decode_part(b[npt:], c[npt:], v[npt:], state_pool, gamma, _rows(slots, npf, npf + decode_rows),
                            check_indices)
        o[npt:].copy_(part)
    src = _field(metadata, "track_ssm_final_src", required=False)
    dst = _field(metadata, "track_ssm_final_dst", required=False)
    if src is not None and dst is not None and dst.numel() > 0:
        copy_states(state_pool, src, dst)
    return o


def _sglang_tracked(metadata, npf: int, chunk):
    """SGLang's mid-sequence prefix-cache fields, checked on the host before any work: ``(h_src, h_dst)``, or
    None when ``track_ssm_h_dst`` is absent or empty.

    The contract (``hybrid_linear_attn_backend.py`` ``MambaAttnBackendBase._init_track_ssm_indices``, the
    branch for backends other than Mamba2, which the Lightning backend takes): a tracked extend row whose
    ``lens = mamba_track_seqlens − extend_prefix_lens`` is not a multiple of C wants the state after its
    first ``(lens // C)·C`` tokens **of this extend** (counted from the extend's first token, whatever its
    prefix length) in slot ``track_ssm_h_dst[e]``; ``track_ssm_h_src[e]`` numbers that state in the chunk
    kernels' per-chunk states of the flattened extends: ``Σ_{p < i} ceil(len_p / C) + lens // C`` for row
    i, each extend holding ``ceil(len / C)`` states, state j being the state after j·C of its tokens (state 0
    the extend's initial state).  One entry per tracked row.  A tracked row whose ``lens`` is a multiple of
    C has its final state copied instead (``track_ssm_final_src`` / ``_dst``).  The Lightning backend
    (``lightning_backend.py`` ``_prepare_seg_la_track_store``) tracks prefill rows only and raises when
    ``track_ssm_h_dst`` has entries for other rows."""
    h_dst = _field(metadata, "track_ssm_h_dst", required=False)
    if h_dst is None or h_dst.numel() == 0:
        return None
    h_src = _field(metadata, "track_ssm_h_src")
    for name, x in (("track_ssm_h_src", h_src), ("track_ssm_h_dst", h_dst)):
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"metadata.{name} must be a 1-D int32/int64 tensor, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if h_src.shape != h_dst.shape:
        raise ValueError(f"metadata.track_ssm_h_src and track_ssm_h_dst must have one length (one state per "
                         f"tracked row), got {h_src.shape[0]} and {h_dst.shape[0]}")
    if isinstance(chunk, bool) or not isinstance(chunk, int):
        raise TypeError(f"mamba_chunk_size must be an int (SGLang's chunk size C numbering track_ssm_h_src) when "
                        f"metadata.track_ssm_h_dst has {h_dst.shape[0]} entries, got {chunk!r}")
    if chunk <= 0 or chunk % CHECKPOINT_ALIGN:
        raise ValueError(f"mamba_chunk_size must be a positive multiple of {CHECKPOINT_ALIGN} to track states with "
                         f"track_ssm_h_dst (the prefill checkpoints every multiple of {CHECKPOINT_ALIGN} tokens, "
                         f"docs/design.md §13.9), got {chunk}: the state after j·{chunk} tokens falls inside the "
                         f"walk's chunks")
    if npf == 0:
        raise ValueError(f"metadata.track_ssm_h_dst has {h_dst.shape[0]} entries but num_prefills is 0: "
                         f"mid-sequence states are tracked in prefills only")
    return h_src, h_dst


def _sglang_checkpoint_slots(pool, track, cu, slots, initial, npf: int, npt: int, chunk: int, check: bool):
    """SGLang's ``track_ssm_h_src`` / ``_dst`` as the prefill's ``checkpoint_slots`` ``(npf, M)`` for
    ``checkpoint_every = C``, built on the device (no sync, no loop over rows), M = (npt − 1) // C, the
    most states past the first that any extend can hold.

    Entry e names prefill ``i`` and state ``j`` (:func:`_sglang_tracked`): i is found from the prefills'
    state counts ``ceil(len / C)`` (offsets ``cu``), j is the rest.  State j ≥ 1 is the prefill's checkpoint
    j − 1 (after j·C of its rows): ``table[i, j − 1] = h_dst[e]``.  State 0 is the extend's initial state (its
    slot's state when it has one, else zero), written to ``h_dst[e]`` here, before the call overwrites the
    slot.  An entry naming no prefill's state writes nothing (``check`` refuses it: one sync)."""
    h_src, h_dst = track
    dev = cu.device
    lens = (cu[1:] - cu[:-1]).long()
    counts = (lens + chunk - 1) // chunk
    ends = torch.cumsum(counts, 0)
    src = h_src.to(dev).long()
    seq = torch.searchsorted(ends, src, right=True)
    named = (src >= 0) & (seq < npf)
    seq = seq.clamp(max=npf - 1)
    j = src - (ends - counts).gather(0, seq)
    if check and not bool(named.all()):
        raise ValueError(f"metadata.track_ssm_h_src must name states of the {npf} prefills (flat index below "
                         f"Σ ceil(len / {chunk}) over them), got an entry outside")
    dst = h_dst.to(dev).long()
    # state 0: the extend's initial state, copied before the call
    start = slots.long().gather(0, seq)
    keep = ((initial != 0).gather(0, seq) & (start >= 0)).view(-1, *([1] * (pool.dim() - 1)))
    first = torch.where(keep, pool.index_select(0, start.clamp(min=0)), torch.zeros((), dtype=pool.dtype, device=dev))
    _scatter_states(pool, torch.where(named & (j == 0), dst, -1), first)
    # states j >= 1: checkpoint j - 1; the flat table's spare last entry takes the other entries' writes
    M = max(0, (npt - 1) // chunk)
    flat = torch.full((npf * M + 1,), -1, dtype=torch.long, device=dev)
    at = torch.where(named & (j >= 1), seq * M + j - 1, npf * M)
    flat.index_put_((at,), dst)
    return flat[:npf * M].view(npf, M)


def sglang_target_verify(b, c, v, state_pool, metadata, gamma=None, *, draft_token_num: int,
                         out=None, check_indices: bool = False):
    """SGLang's target verify (``forward_extend`` in ``is_target_verify`` mode): every row verifies
    ``draft_token_num`` tokens from its slot ``mamba_cache_indices[i]``, and every intermediate state is
    returned (SGLang's ``intermediate_ssm`` cache).

    Chains (``topk = 1``): the slot is advanced past all the tokens (as seg_la leaves it); once the sampler
    knows the accepted counts, :func:`commit_accepted` rolls each slot back on the device.

    Trees (``topk > 1``): when the metadata carries ``retrieve_next_token`` and ``retrieve_next_sibling``
    (``(batch, draft_token_num)``, the fields of the Mamba backends' ``ForwardMetadata`` in
    ``hybrid_linear_attn_backend.py``, from EAGLE's ``retrive_next_token`` / ``retrive_next_sibling``), each
    token's parent is derived from them on the device (:func:`parents_from_next_sibling`) and the row is
    verified as a tree (``decode_tokens(..., parents=...)``): the slot is not written, and
    :func:`commit_tree` writes the accepted node's state into it.  SGLang's own ``retrieve_parent_token``
    is not read: it is an output buffer its conv kernel fills.

    Returns:
        ``(out (batch · draft_token_num, heads, d), states (batch, heads, draft_token_num + 1, r, d))``.
    """
    slots = _slots_1d("mamba_cache_indices", _field(metadata, "mamba_cache_indices"))
    K = draft_token_num
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"draft_token_num must be an int ≥ 1, got {K!r}")
    if b.shape[0] % K:
        raise ValueError(f"b's rows must be batch · draft_token_num ({K}), got {b.shape[0]}")
    B = b.shape[0] // K
    _check_rows("mamba_cache_indices", slots, B, "one slot per verified row")
    H, d = _heads(b, c, v), v.shape[2]
    o = _output(out, B * K, H, d, v.dtype, v.device)
    rows = lambda x: x.unflatten(0, (B, K)).transpose(1, 2)  # noqa: E731  (B, H, k, dim), a view
    nxt = _field(metadata, "retrieve_next_token", required=False)
    sib = _field(metadata, "retrieve_next_sibling", required=False)
    parents = None if nxt is None or sib is None else parents_from_next_sibling(_rows(nxt, 0, B), _rows(sib, 0, B))
    part, _, kept = decode_tokens(rows(b), rows(c), rows(v), state_pool, gamma, slot_ids=_ids(_rows(slots, 0, B)),
                                  keep_states=True, check_slots=check_indices, parents=parents)
    o.unflatten(0, (B, K)).copy_(part.transpose(1, 2))
    return o, kept


def parents_from_next_sibling(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Each draft token's parent, ``(batch, k)`` int64 with token 0's −1, from EAGLE's tree encoding (SGLang
    ``retrive_next_token`` / ``retrive_next_sibling``, ``(batch, k)``: token i's first child and its next
    sibling, −1 for none; token 0 is the tree's root, the token verified from the slot's state).

    On the device, no sync: a first child's parent is the token that names it; a sibling's is its previous
    sibling's, propagated along each sibling list in k − 1 scatters (k is known on the host).  Entries that
    name no token (−1, or out of [0, k)) are dropped; a token nothing names keeps −1 (the root)."""
    for name, x in (("next_token", next_token), ("next_sibling", next_sibling)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 2-D int32/int64 tensor (batch, k), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if next_token.shape != next_sibling.shape:
        raise ValueError(f"next_token and next_sibling must have one shape, got {tuple(next_token.shape)} and "
                         f"{tuple(next_sibling.shape)}")
    B, K = next_token.shape
    dump = K  # a spare column that takes the writes of entries naming no token
    child = next_token.long()
    child = torch.where((child > 0) & (child < K), child, dump)
    sib = next_sibling.long()
    sib = torch.where((sib > 0) & (sib < K), sib, dump)
    par = torch.full((B, K + 1), -1, dtype=torch.long, device=next_token.device)
    par.scatter_(1, child, torch.arange(K, device=next_token.device).expand(B, K))
    for _ in range(K - 1):
        par[:, dump] = -1
        par.scatter_(1, sib, par[:, :K].clone())
    return _as_tree(par[:, :K])


def _as_tree(parents: torch.Tensor) -> torch.Tensor:
    """An engine's parent table as ``decode_tokens`` reads it, on the device: int64, token 0's parent −1, and
    any parent outside −1 … j − 1 (a padding row's leftovers) −1 (the root), the kernels' own rule, so
    that the PyTorch path (which refuses such values) and the kernels agree."""
    k = parents.shape[1]
    j = torch.arange(k, device=parents.device).view(1, k)
    p = parents.long()
    return torch.where((p >= -1) & (p < j), p, -1)
