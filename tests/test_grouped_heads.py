"""Grouped heads (docs/design.md §1.7): b and c with H_k heads, v with H_v heads, one dividing the other.

Output head h reads b, c at head h // (H / H_k) and v at head h // (H / H_v), H = max(H_k, H_v); γ, the
per-token decay, the states and the output are per output head.  Every entry point is checked against the
float64 oracle on the *expanded* problem (each shared head repeated, ``repeat_interleave``), which is the
ungrouped operator the grouped call must equal; gradients of a shared tensor against float64 autograd
through that expansion (the sum over its group).
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from leettriton import registry
from leettriton.kernels import abi
from leettriton.kernels import decode as decode_kernels
from leettriton.methods import BUILTIN_METHODS
from leettriton.reference import reference

from conftest import DEVICE
from helpers import assert_close, tolerance

TOL = tolerance(torch.float32)
KERNELS = tuple(BUILTIN_METHODS)
TWINS = tuple(f"{m}_torch" for m in BUILTIN_METHODS)
# (H_k, H_v, layout): b and c shared by groups of heads (Mamba-2, GQA), and v shared (GVA), one layout each
# per method call below, both layouts over the file
CASES = [(1, 2, "bhnd"), (2, 1, "bnhd")]
NG = 12   # the gradient checks' sequence length
R, D, N = 8, 16, 48   # N crosses the segment and leaf lengths the CPU plans pick (block_based, recursion)


def _rand(*shape, seed: int):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _inputs(B, Hk, Hv, n, layout, seed=0):
    """b, c ``(B, H_k, n, R)``, v ``(B, H_v, n, D)`` in ``layout``."""
    b, c, v = _rand(B, Hk, n, R, seed=seed), _rand(B, Hk, n, R, seed=seed + 1), _rand(B, Hv, n, D, seed=seed + 2)
    if layout == "bnhd":
        b, c, v = (x.transpose(1, 2).contiguous() for x in (b, c, v))
    return b, c, v


def _heads_axis(layout):
    return 1 if layout == "bhnd" else 2


def _expand(x, H, axis):
    """The ungrouped tensor a grouped one stands for: each head repeated for the output heads that read it."""
    return x.repeat_interleave(H // x.shape[axis], dim=axis)


def _oracle(b, c, v, layout, **kw):
    """The float64 oracle of the expanded (ungrouped) problem."""
    axis = _heads_axis(layout)
    H = max(b.shape[axis], v.shape[axis])
    return reference(_expand(b, H, axis), _expand(c, H, axis), _expand(v, H, axis), layout=layout, **kw)


def _log_decay(B, H, n, layout, seed=5):
    a = -3.0 * torch.rand(B, H, n, generator=torch.Generator().manual_seed(seed))
    return (a if layout == "bhnd" else a.transpose(1, 2).contiguous()).to(DEVICE)


# --------------------------------------------------------------------------- forward, every method and twin

@pytest.mark.parametrize("method", KERNELS + TWINS)
def test_methods_grouped(method):
    """Every method function and its twin, both layouts, H_k | H_v and H_v | H_k, γ per output head, the
    initial and the returned state: equal to the oracle of the expanded problem."""
    fn = getattr(leettriton, method)
    n = 16 if method == "causal_dot_product" else N   # a recurrence: no segments to cross, and slow interpreted
    for i, (Hk, Hv, layout) in enumerate(CASES):
        H = max(Hk, Hv)
        b, c, v = _inputs(1, Hk, Hv, n, layout, seed=10 * i)
        gamma = (0.8 + 0.2 * torch.rand(H, generator=torch.Generator().manual_seed(i))).to(DEVICE)
        s0 = _rand(1, H, R, D, seed=7 + i)
        o, s = fn(b, c, v, gamma, layout=layout, initial_state=s0, return_state=True)
        ref, s_ref = _oracle(b, c, v, layout, gamma=gamma, initial_state=s0, return_state=True)
        axis = _heads_axis(layout)
        assert o.shape[axis] == H and s.shape == (1, H, R, D)
        assert_close(o, ref, TOL, f"{method} {layout} H_k={Hk} H_v={Hv} output")
        assert_close(s, s_ref, TOL, f"{method} {layout} H_k={Hk} H_v={Hv} state")


@pytest.mark.parametrize("method", sorted(set(registry.per_token_methods()) - {"auto"}))
def test_per_token_decay_grouped(method):
    """A per-token decay per output head with grouped b, c (and grouped v), every method that takes one."""
    for i, (Hk, Hv, layout) in enumerate(CASES):
        H = max(Hk, Hv)
        b, c, v = _inputs(1, Hk, Hv, 16, layout, seed=20 + i)
        a = _log_decay(1, H, 16, layout, seed=i)
        s0 = _rand(1, H, R, D, seed=3)
        o, s = leettriton.linear_attention(b, c, v, method=method, layout=layout, log_decay=a, initial_state=s0,
                                           return_state=True)
        ref, s_ref = _oracle(b, c, v, layout, log_decay=a, initial_state=s0, return_state=True)
        assert_close(o, ref, TOL, f"{method} per-token {layout} H_k={Hk} H_v={Hv}")
        assert_close(s, s_ref, TOL, f"{method} per-token {layout} state")


def test_oracle_grouped():
    """The oracle itself reads grouped heads as the expanded problem, and b and c may even differ in heads
    (each count dividing the most of them)."""
    b, c, v = _inputs(2, 2, 4, 9, "bhnd", seed=1)
    gamma = torch.tensor([0.9, 0.8, 0.7, 1.0], device=DEVICE)
    out, state = reference(b, c, v, gamma, return_state=True)
    exp_out, exp_state = reference(_expand(b, 4, 1), _expand(c, 4, 1), _expand(v, 4, 1), gamma, return_state=True)
    assert torch.equal(out, exp_out) and torch.equal(state, exp_state)
    c1 = c[:, :1]
    out = leettriton.linear_attention(b, c1, v, gamma, method="lightning_attention")
    assert_close(out, reference(b, _expand(c1, 4, 1), v, gamma), TOL, "b with 2 heads, c with 1, v with 4")


def test_recursion_head_blocks(monkeypatch):
    """recursion's blocks of heads (a tree too large for one block) are whole groups: their b, c, v are
    the groups' heads, and the result is the ungrouped one."""
    from leettriton.methods.recursion import kernels as rk
    from leettriton.plan import resolve
    from leettriton.problem import make_problem
    # at least two leaves (the plan's leaf length), and a tree of more than two heads' two leaves per block:
    # blocks of two heads, one group of b and c each
    leaf = resolve(make_problem(*_inputs(1, 2, 4, 48, "bhnd"), 0.9)[0], "recursion").schedule["leaf"]
    n = 48 if leaf < 48 else leaf + 16
    monkeypatch.setattr(rk.spaces, "TREE_BYTES", 2 * 2 * R * D * 4)
    b, c, v = _inputs(1, 2, 4, n, "bhnd", seed=4)
    blocks = []
    real = rk._block
    monkeypatch.setattr(rk, "_block", lambda p, *a: blocks.append(a) or real(p, *a))
    o, s = leettriton.recursion(b, c, v, 0.9, return_state=True)
    assert blocks == [(0, 1, 0, 2), (0, 1, 2, 4)]
    ref, s_ref = _oracle(b, c, v, "bhnd", gamma=0.9, return_state=True)
    assert_close(o, ref, TOL, "recursion in blocks of heads")
    assert_close(s, s_ref, TOL, "recursion in blocks of heads, state")


# --------------------------------------------------------------------------- backward

@pytest.mark.parametrize("method,decay", [
    ("lightning_attention", "gamma"), ("lightning_attention", "learnable"), ("causal_dot_product", "log_decay"),
    ("fleet_attention", "gamma"), ("lightning_attention_torch", "log_decay"), ("vanilla_torch", "learnable"),
])
def test_gradients_grouped(method, decay):
    """The gradients of b, c, v (summed over each shared head's group), the initial state, a learnable γ and a
    per-token decay, against float64 autograd through the expanded problem; both layouts, both directions."""
    for i, (Hk, Hv, layout) in enumerate(CASES):
        H = max(Hk, Hv)
        b, c, v = _inputs(1, Hk, Hv, NG, layout, seed=30 + i)
        s0 = _rand(1, H, R, D, seed=9)
        gamma = (0.7 + 0.3 * torch.rand(H, generator=torch.Generator().manual_seed(i))).to(DEVICE)
        a = _log_decay(1, H, NG, layout, seed=i)
        mine = [x.clone().requires_grad_() for x in (b, c, v, s0, gamma, a)]
        theirs = [x.clone().requires_grad_() for x in (b, c, v, s0, gamma, a)]

        def kwargs(xs, oracle):
            g, ld = xs[4], xs[5]
            if decay == "gamma":
                return dict(gamma=g.detach())
            if decay == "log_decay":
                return dict(log_decay=ld)
            if not oracle:
                return dict(gamma=g)
            # the oracle's γ is a constant: a learnable γ is the per-token decay ln γ at every token
            full = torch.log(g).view(1, H, 1).expand(1, H, NG)
            return dict(log_decay=full if layout == "bhnd" else full.transpose(1, 2))

        o, s = leettriton.linear_attention(*mine[:3], method=method, layout=layout, initial_state=mine[3],
                                           return_state=True, **kwargs(mine, False))
        ref, s_ref = _oracle(*theirs[:3], layout, initial_state=theirs[3], return_state=True, **kwargs(theirs, True))
        go, gs = _rand(*ref.shape, seed=40).double(), _rand(*s_ref.shape, seed=41).double()
        ((o.double() * go).sum() + (s.double() * gs).sum()).backward()
        ((ref * go).sum() + (s_ref * gs).sum()).backward()
        names = ("b", "c", "v", "initial_state", "gamma", "log_decay")
        for name, x, y in zip(names, mine, theirs):
            if y.grad is None:
                assert x.grad is None, f"{name} got a gradient the oracle has none of"
                continue
            assert x.grad.shape == x.shape, f"{name}: gradient of shape {tuple(x.grad.shape)}"
            assert_close(x.grad, y.grad, 2 * TOL, f"{method} {decay} {layout} H_k={Hk} H_v={Hv} d{name}")
        assert (mine[4].grad is not None) == (decay == "learnable")
        assert (mine[5].grad is not None) == (decay == "log_decay")


# --------------------------------------------------------------------------- varlen and decode

@pytest.mark.parametrize("method", ["auto", "lightning_attention_torch"])
def test_varlen_grouped_pool(method):
    """The packed prefill over grouped heads: each sequence as the expanded oracle from its pool slot (or zero),
    its final state in its slot, the other slots untouched."""
    for Hk, Hv in ((1, 2), (2, 1)):
        H = max(Hk, Hv)
        cu = torch.tensor([0, 7, 7, 19], dtype=torch.int32, device=DEVICE)
        T = 19
        b, c, v = _rand(T, Hk, R, seed=1), _rand(T, Hk, R, seed=2), _rand(T, Hv, D, seed=3)
        gamma = torch.tensor([0.9, 0.75], device=DEVICE)
        pool = _rand(5, H, R, D, seed=4)
        slots = torch.tensor([3, 0, 1], dtype=torch.int32, device=DEVICE)
        starts = torch.tensor([True, True, False], device=DEVICE)
        new_pool = pool.clone()
        o = leettriton.linear_attention_varlen(b, c, v, cu, gamma, method=method, state_pool=new_pool,
                                               slot_ids=slots, has_initial_state=starts)
        assert o.shape == (T, H, D)
        for i in range(3):
            lo, hi = int(cu[i]), int(cu[i + 1])
            s0 = pool[int(slots[i])].unsqueeze(0) if bool(starts[i]) else None
            if hi > lo:
                seq = [x[lo:hi].transpose(0, 1).unsqueeze(0) for x in (b, c, v)]
                ref, s_ref = _oracle(*seq, "bhnd", gamma=gamma, initial_state=s0, return_state=True)
                assert_close(o[lo:hi].transpose(0, 1).unsqueeze(0), ref, TOL, f"{method} sequence {i}")
            else:
                s_ref = s0
            assert_close(new_pool[int(slots[i])], s_ref[0], TOL, f"{method} slot of sequence {i}")
        for untouched in (2, 4):
            assert torch.equal(new_pool[untouched], pool[untouched])


def test_decode_grouped():
    """decode_step (with and without slot ids, γ and a per-token decay) and decode_tokens (kept states) over
    grouped heads: the expanded oracle's rows and final state."""
    B, K = 3, 2
    for Hk, Hv in ((1, 2), (2, 1)):
        H = max(Hk, Hv)
        b, c, v = _rand(B, Hk, K, R, seed=1), _rand(B, Hk, K, R, seed=2), _rand(B, Hv, K, D, seed=3)
        s0 = _rand(B, H, R, D, seed=4)
        gamma = torch.tensor([0.95, 0.8], device=DEVICE)
        a = _log_decay(B, H, K, "bhnd")
        ref, s_ref = _oracle(b, c, v, "bhnd", gamma=gamma, initial_state=s0, return_state=True)
        ref_a, s_ref_a = _oracle(b, c, v, "bhnd", log_decay=a, initial_state=s0, return_state=True)

        state = s0.clone()
        rows = [leettriton.decode_step(b[:, :, k], c[:, :, k], v[:, :, k], state, gamma)[0] for k in range(K)]
        assert_close(torch.stack(rows, 2), ref, TOL, f"decode_step H_k={Hk} H_v={Hv}")
        assert_close(state, s_ref, TOL, "decode_step state")

        state = s0.clone()
        rows = [leettriton.decode_step(b[:, :, k], c[:, :, k], v[:, :, k], state, log_decay=a[:, :, k])[0]
                for k in range(K)]
        assert_close(torch.stack(rows, 2), ref_a, TOL, "decode_step per-token")
        assert_close(state, s_ref_a, TOL, "decode_step per-token state")

        pool = _rand(4, H, R, D, seed=5)
        pool[2], pool[0] = s0[0], s0[2]
        before = pool.clone()
        ids = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEVICE)
        rows = [leettriton.decode_step(b[:, :, k], c[:, :, k], v[:, :, k], pool, gamma, slot_ids=ids)[0]
                for k in range(K)]
        out = torch.stack(rows, 2)
        assert_close(out[0], ref[0], TOL, "slotted decode_step row 0")
        assert_close(out[2], ref[2], TOL, "slotted decode_step row 2")
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert_close(pool[2], s_ref[0], TOL, "slot 2")
        assert_close(pool[0], s_ref[2], TOL, "slot 0")
        assert torch.equal(pool[1], before[1]) and torch.equal(pool[3], before[3])

        state = s0.clone()
        o, _, kept = leettriton.decode_tokens(b, c, v, state, gamma, keep_states=True)
        assert_close(o, ref, TOL, "decode_tokens")
        assert_close(state, s_ref, TOL, "decode_tokens state")
        assert torch.equal(kept[:, :, 0], s0) and kept.shape == (B, H, K + 1, R, D)
        state = s0.clone()
        o, _ = leettriton.decode_tokens(b, c, v, state, log_decay=a)
        assert_close(o, ref_a, TOL, "decode_tokens per-token")
        assert_close(state, s_ref_a, TOL, "decode_tokens per-token state")


# --------------------------------------------------------------------------- bad head counts, no copies

def test_heads_that_do_not_divide():
    """Head counts that do not divide one another: a ValueError naming them, at every entry point, before any
    work (nothing written)."""
    b, c, v = _inputs(1, 2, 3, 5, "bhnd")
    for call in (lambda: leettriton.linear_attention(b, c, v, 0.9),
                 lambda: leettriton.lightning_attention(b, c, v),
                 lambda: reference(b, c, v)):
        with pytest.raises(ValueError, match=r"v must match b.*b with 2 heads, c with 2 and v with 3"):
            call()
    with pytest.raises(ValueError, match=r"c must have the shape of b.*b with 2 heads, c with 3 and v with 3"):
        leettriton.linear_attention(b, _rand(1, 3, 5, R, seed=0), v)
    with pytest.raises(ValueError, match=r"v must match b in batch, heads and n \(batch, n, heads, dim\)"):
        leettriton.linear_attention(b.transpose(1, 2), c.transpose(1, 2), v.transpose(1, 2), layout="bnhd")
    # varlen and decode
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    pool = torch.zeros(2, 3, R, D, device=DEVICE)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"v must match b.*b with 2 heads, c with 2 and v with 3"):
        leettriton.linear_attention_varlen(b[0].transpose(0, 1), c[0].transpose(0, 1), v[0].transpose(0, 1), cu,
                                           state_pool=pool, slot_ids=torch.zeros(1, dtype=torch.int32,
                                                                                 device=DEVICE))
    state = torch.zeros(1, 3, R, D, device=DEVICE)
    with pytest.raises(ValueError, match=r"v_t must match b_t in batch and heads.*b_t with 2 heads"):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state)
    with pytest.raises(ValueError, match=r"v_t must match b_t.*b_t with 2 heads, c_t with 2 and v_t with 3"):
        leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], pool, slot_ids=torch.zeros(
            1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"v must match b in batch, heads and k.*b with 2 heads"):
        leettriton.decode_tokens(b, c, v, state)
    assert torch.equal(pool, before) and not state.any()
    # a state of the expanded heads is wanted, not of b's
    b, c, v = _inputs(1, 1, 2, 5, "bhnd")
    with pytest.raises(ValueError, match=r"initial_state must have shape \(batch, heads, r, d\) = \(1, 2, 8, 16\)"):
        leettriton.linear_attention(b, c, v, initial_state=torch.zeros(1, 1, R, D, device=DEVICE))
    with pytest.raises(ValueError, match=r"gamma must have shape \(2,\)"):
        leettriton.linear_attention(b, c, v, torch.full((1,), 0.9, device=DEVICE))


def test_kernels_read_shared_heads_without_copies(monkeypatch):
    """The kernels get the caller's b, c and v themselves (their memory, their head counts), with the group in
    the strides; no tensor is expanded (``repeat_interleave`` is the PyTorch paths' alone)."""
    seen = []

    def recording(module):
        real = module.group_strides

        def group_strides(x, heads):
            seen.append((x.data_ptr(), x.shape[1], heads))
            return real(x, heads)
        monkeypatch.setattr(module, "group_strides", group_strides)

    recording(abi)
    recording(decode_kernels)

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was expanded on a kernel path")
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    monkeypatch.setattr(torch, "repeat_interleave", refuse)

    b, c, v = _inputs(1, 1, 4, 16, "bnhd")
    for method in ("lightning_attention", "causal_dot_product"):
        seen.clear()
        leettriton.linear_attention(b, c, v, 0.9, method=method, layout="bnhd")
        assert (b.data_ptr(), 1, 4) in seen and (c.data_ptr(), 1, 4) in seen and (v.data_ptr(), 4, 4) in seen
        assert {entry[1] for entry in seen} <= {1, 4}
    seen.clear()
    leettriton.decode_step(b[:, 0], c[:, 0], v[:, 0], torch.zeros(1, 4, R, D, device=DEVICE), 0.9)
    assert (b.data_ptr(), 1, 4) in seen and (v.data_ptr(), 4, 4) in seen
    # the group entry ends each of b's, c's and v's stride tuples; an ungrouped tensor's is 1
    assert abi.group_strides(b.transpose(1, 2), 4) == tuple(b.transpose(1, 2).stride()) + (4,)
    assert abi.group_strides(v.transpose(1, 2), 4)[-1] == 1


def test_ungrouped_group_is_a_constant():
    """Triton specialises the group 1 of an ungrouped tensor as the constant 1 (so ``h // 1`` folds away and the
    kernels compile as without the entry), and a group > 1 as an integer argument."""
    from triton.runtime.jit import mangle_type
    x = torch.empty(2, 4, 64, 32)
    kinds = mangle_type(abi.group_strides(x, 4), True)
    assert kinds[-1] == "constexpr" and kinds[0] == "i32"
    kinds = mangle_type(abi.group_strides(x[:, :1], 4), True)
    assert kinds[-1] == "i32"


def test_serving_adapter_grouped():
    """An engine adapter (vLLM's mixed batch: decodes first, then a prefill) over grouped heads: the output and
    pool of the expanded call."""
    from dataclasses import dataclass

    import leettriton.serving as serving

    @dataclass
    class Meta:   # vllm/v1/attention/backends/linear_attn.py LinearAttentionMetadata
        num_prefills: int
        num_prefill_tokens: int
        num_decodes: int
        num_decode_tokens: int
        query_start_loc: torch.Tensor
        seq_lens: torch.Tensor
        state_indices_tensor: torch.Tensor

    ids = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)  # noqa: E731
    meta = Meta(1, 5, 1, 1, ids([0, 1, 6]), ids([4, 5]), ids([3, 1]))
    b, c, v = _rand(6, 2, R, seed=1), _rand(6, 2, R, seed=2), _rand(6, 1, D, seed=3)   # shared values
    pool = _rand(4, 2, R, D, seed=4)
    grouped_pool, expanded_pool = pool.clone(), pool.clone()
    o = serving.vllm_forward(b, c, v, grouped_pool, meta, 0.9)
    ref = serving.vllm_forward(b, c, _expand(v, 2, 1), expanded_pool, meta, 0.9)
    assert o.shape == (6, 2, D)
    assert_close(o, ref, TOL, "vllm_forward grouped")
    assert_close(grouped_pool, expanded_pool, TOL, "vllm_forward grouped pool")


def test_repeated_calls_grouped():
    """A repeated call of one signature (the fast paths that repeat a validated launch, docs/design.md §4.5)
    keeps reading the groups: each call equal to the expanded oracle on its own values."""
    for seed in (0, 1):
        b, c, v = _inputs(1, 2, 1, 24, "bnhd", seed=seed)
        o = leettriton.linear_attention(b, c, v, 0.9, method="lightning_attention", layout="bnhd")
        assert_close(o, _oracle(b, c, v, "bnhd", gamma=0.9), TOL, f"repeated linear_attention, call {seed}")
        bt, ct, vt = _rand(2, 1, 2, R, seed=seed), _rand(2, 1, 2, R, seed=seed + 5), _rand(2, 2, 2, D, seed=seed + 9)
        pool = _rand(3, 2, R, D, seed=seed)
        before = pool.clone()
        o, _ = leettriton.decode_tokens(bt, ct, vt, pool, 0.9, slot_ids=torch.tensor([2, 0], dtype=torch.int32,
                                                                                      device=DEVICE))
        ref, s_ref = _oracle(bt, ct, vt, "bhnd", gamma=0.9, initial_state=before[[2, 0]], return_state=True)
        assert_close(o, ref, TOL, f"repeated decode_tokens, call {seed}")
        assert_close(pool[[2, 0]], s_ref, TOL, f"repeated decode_tokens pool, call {seed}")
