"""decode_tokens(..., parents=...): trees of draft tokens, and their commit (docs/design.md §13.7).

Each node's output and state are checked against a float64 recurrence walking the node's path from the
root; a chain of parents against ``decode_tokens`` without them, bit for bit.  Both CPU paths run: the
interpreter (the Triton kernel) and the PyTorch path (CPU tensors outside the interpreter), on different
shapes so that no validated launch of one is repeated by the other.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import leettriton
from leettriton import serving

from conftest import DEVICE
from helpers import assert_close, tolerance

SLOTS = 6


@pytest.fixture(params=["kernels"] + (["torch"] if DEVICE == "cpu" else []))
def dims(request, monkeypatch):
    """(heads, r, d) per path; r over two key tiles and d over two value tiles on the kernel path."""
    if request.param == "torch":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        return 2, 8, 4
    return 2, 40, 36


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


def tokens(B, H, K, r, d, seed):
    return rand(B, H, K, r, seed=seed), rand(B, H, K, r, seed=seed + 1), rand(B, H, K, d, seed=seed + 2)


def ids(values):
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def reference(b, c, v, root, parents, gamma=None, log_decay=None):
    """Outputs (B, H, k, d) and node states (B, H, k + 1, r, d) in float64: node j's state by walking its path
    from the root, S ← decay · S + c_iᵀ v_i for each node i on it (root first)."""
    B, H, K, r = b.shape
    P = parents.tolist()
    out = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64)
    states = torch.zeros(B, H, K + 1, r, v.shape[-1], dtype=torch.float64)
    for i in range(B):
        states[i, :, 0] = root[i].double().cpu()
        for j in range(K):
            path, node = [], j
            while node >= 0:
                path.append(node)
                node = P[i][node]
            s = root[i].double().cpu()
            for n in reversed(path):
                if log_decay is not None:
                    f = torch.exp(log_decay[i, :, n].double().cpu()).view(H, 1, 1)
                else:
                    f = torch.ones(H, 1, 1, dtype=torch.float64) if gamma is None else \
                        torch.as_tensor(gamma, dtype=torch.float64).reshape(-1, 1, 1).expand(H, 1, 1)
                s = f * s + c[i, :, n].double().cpu().unsqueeze(-1) * v[i, :, n].double().cpu().unsqueeze(-2)
            states[i, :, j + 1] = s
            out[i, :, j] = (b[i, :, j].double().cpu().unsqueeze(-2) @ s).squeeze(-2)
    return out, states


def assert_near(x, ref, what):
    assert_close(x, ref, tolerance(torch.float32), what)


TREES = {
    "chain": [[-1, 0, 1, 2, 3]],
    "star": [[-1, -1, -1, -1, -1]],
    "binary": [[-1, 0, 0, 1, 1]],
    "two roots": [[-1, 0, -1, 2, 1]],
}


@pytest.mark.parametrize("tree", list(TREES))
def test_trees_match_each_path_in_float64(dims, tree):
    H, r, d = dims
    K = 5
    parents = ids(TREES[tree] * 2)
    b, c, v = tokens(2, H, K, r, d, seed=1)
    state = rand(2, H, r, d, seed=4)
    before = state.clone()
    gamma = torch.tensor([0.9, 0.75], device=DEVICE)
    o, s, kept = leettriton.decode_tokens(b, c, v, state, gamma, keep_states=True, parents=parents)
    assert s is state and torch.equal(state, before)   # the root is never written
    ref_o, ref_states = reference(b, c, v, before, parents, gamma=gamma.cpu())
    assert_near(o, ref_o, "outputs")
    assert_near(kept, ref_states, "node states")
    assert torch.equal(kept[:, :, 0], before)


def test_random_trees_with_per_token_decay_and_strided_parents(dims):
    H, r, d = dims
    B, K = 3, 6
    g = torch.Generator().manual_seed(9)
    table = torch.full((K, B), -1, dtype=torch.int32)
    for j in range(1, K):
        table[j] = torch.randint(-1, j, (B,), generator=g, dtype=torch.int32)
    parents = table.to(DEVICE).t()  # (B, K), strides (1, B): read as it is
    b, c, v = tokens(B, H, K, r, d, seed=11)
    log_decay = -torch.rand(B, K, H, generator=g).to(DEVICE).transpose(1, 2)  # (B, H, K), strided
    state = rand(B, H, r, d, seed=12)
    o, _, kept = leettriton.decode_tokens(b, c, v, state, keep_states=True, parents=parents, log_decay=log_decay)
    ref_o, ref_states = reference(b, c, v, state, parents, log_decay=log_decay)
    assert_near(o, ref_o, "outputs")
    assert_near(kept, ref_states, "node states")
    o2, _ = leettriton.decode_tokens(b, c, v, state, parents=parents, log_decay=log_decay)  # no states kept
    assert torch.equal(o2, o)


@pytest.mark.parametrize("per_token", [False, True])
def test_a_chain_is_decode_tokens_bit_for_bit(dims, per_token):
    """Parents j − 1 give exactly decode_tokens' outputs and kept states, on a pool with a padding row."""
    H, r, d = dims
    B, K = 3, 4
    b, c, v = tokens(B, H, K, r, d, seed=21)
    slots = ids([4, -1, 1])
    pool = rand(SLOTS, H, r, d, seed=22)
    chain = ids([list(range(-1, K - 1))] * B)
    kw = dict(log_decay=-rand(B, H, K, seed=23).abs()) if per_token else {}
    gamma = None if per_token else 0.9
    tree_pool = pool.clone()
    o, _, kept = leettriton.decode_tokens(b, c, v, tree_pool, gamma, slot_ids=slots, keep_states=True,
                                          parents=chain, **kw)
    o_ref, _, kept_ref = leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=slots, keep_states=True, **kw)
    assert torch.equal(o, o_ref) and torch.equal(kept, kept_ref)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.equal(kept[1], torch.zeros_like(kept[1]))
    assert torch.equal(tree_pool, rand(SLOTS, H, r, d, seed=22))  # the tree call wrote no slot


def test_commit_writes_the_accepted_node(dims):
    """Commit each row's accepted node (a leaf, an inner node, none) into its slot: the state of the accepted
    path in float64; a padding row and the slots no row names stay bit-identical; a chain's commit by node
    equals commit_accepted by count."""
    H, r, d = dims
    B, K = 4, 4
    parents = ids([[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 2], [-1, 0, 0, 0]])
    slots = ids([3, 0, -1, 5])
    accepted = ids([3, 1, 2, -1])   # row 0: path 0-1-3; row 1: path 1; row 2: padding; row 3: nothing accepted
    b, c, v = tokens(B, H, K, r, d, seed=31)
    pool = rand(SLOTS, H, r, d, seed=32)
    before = pool.clone()
    _, _, kept = leettriton.decode_tokens(b, c, v, pool, 0.8, slot_ids=slots, keep_states=True, parents=parents)
    serving.commit_tree(pool, slots, kept, accepted)
    _, ref_states = reference(b, c, v, before[slots.clamp(min=0)], parents, gamma=0.8)
    assert torch.equal(pool[3], kept[0, :, 4]) and torch.equal(pool[0], kept[1, :, 2])
    assert torch.equal(pool[5], before[5])                       # the root: unchanged
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])       # no row's slot (and the padding row's)
    assert_near(pool[[3, 0]], ref_states[[0, 1], :, [4, 2]], "committed states")
    # a chain's commit by count is the same
    pool2 = before.clone()
    chain = ids([list(range(-1, K - 1))] * B)
    _, _, kept2 = leettriton.decode_tokens(b, c, v, pool2, 0.8, slot_ids=slots, keep_states=True, parents=chain)
    serving.commit_tree(pool2, slots, kept2, ids([1, 3, 0, -1]))
    pool3 = before.clone()
    _, _, kept3 = leettriton.decode_tokens(b, c, v, pool3, 0.8, slot_ids=slots, keep_states=True)
    serving.commit_accepted(pool3, slots, kept3, ids([2, 4, 1, 0]))
    assert torch.equal(pool2, pool3)


def test_invalid_parents(dims, monkeypatch):
    """Values: checked on the PyTorch path (ValueError), read as the root by the kernel (no host read)."""
    H, r, d = dims
    K = 3
    b, c, v = tokens(2, H, K, r, d, seed=41)
    state = rand(2, H, r, d, seed=42)
    for bad in ([[-1, 1, 0], [-1, 0, 1]], [[-1, 0, -2], [-1, 0, 1]], [[0, 0, 1], [-1, 0, 1]]):
        if dims[1] == 8:   # the PyTorch path
            with pytest.raises(ValueError, match=r"parents\[0, \d\] must lie in"):
                leettriton.decode_tokens(b, c, v, state, 0.9, parents=ids(bad))
        else:
            fixed = [[p if -1 <= p < j else -1 for j, p in enumerate(row)] for row in bad]
            o, _, kept = leettriton.decode_tokens(b, c, v, state, 0.9, parents=ids(bad), keep_states=True)
            o_ref, _, kept_ref = leettriton.decode_tokens(b, c, v, state, 0.9, parents=ids(fixed), keep_states=True)
            assert torch.equal(o, o_ref) and torch.equal(kept, kept_ref)
    with pytest.raises(TypeError, match="parents must be int32 or int64"):
        leettriton.decode_tokens(b, c, v, state, 0.9, parents=ids([[-1, 0, 1]] * 2).float())
    with pytest.raises(ValueError, match=r"parents must have shape \(batch, k\) = \(2, 3\)"):
        leettriton.decode_tokens(b, c, v, state, 0.9, parents=ids([[-1, 0]] * 2))
    with pytest.raises(ValueError, match=r"accepted_node \(batch,\)"):
        serving.commit_tree(state, ids([0, 1]), torch.zeros(2, H, K + 1, r, d), ids([0]))


@pytest.mark.parametrize("bc_heads, v_heads", [(1, 4), (4, 2)], ids=["shared-bc", "shared-v"])
def test_grouped_heads_read_in_place_equal_the_expanded_call(bc_heads, v_heads):
    """Grouped heads (docs/semantics.md §1.7): b, c or v shared by groups of the state's heads give the call on
    tensors expanded to one head per state head, bit for bit (the same arithmetic on the same values)."""
    g = torch.Generator().manual_seed(11)
    B, H, K, r, d = 2, 4, 4, 8, 8
    b, c = (torch.randn(B, bc_heads, K, r, generator=g).to(DEVICE) for _ in range(2))
    v = torch.randn(B, v_heads, K, d, generator=g).to(DEVICE)
    pool = torch.randn(5, H, r, d, generator=g).to(DEVICE)
    slots = torch.tensor([3, -1], device=DEVICE)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, -1, 1, 2]], device=DEVICE)
    o, _, kept = leettriton.decode_tokens(b, c, v, pool, 0.9, slot_ids=slots, parents=parents, keep_states=True)
    wide = [x.repeat_interleave(H // x.shape[1], 1) for x in (b, c, v)]
    o_ref, _, kept_ref = leettriton.decode_tokens(*wide, pool, 0.9, slot_ids=slots, parents=parents,
                                                  keep_states=True)
    assert o.shape == (B, H, K, d) and torch.equal(o, o_ref) and torch.equal(kept, kept_ref)


def test_kernel_path_reads_no_parent_on_the_host(monkeypatch):
    H, r, d = 1, 16, 16
    b, c, v = tokens(2, H, 2, r, d, seed=51)
    state = rand(2, H, r, d, seed=52)
    parents = ids([[-1, 0], [-1, -1]])

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    leettriton.decode_tokens(b, c, v, state, 0.9, parents=parents, keep_states=True)


def test_compiled_call_equals_eager():
    torch._dynamo.reset()
    H, r, d, K = 2, 16, 16, 3
    b, c, v = tokens(2, H, K, r, d, seed=61)
    pool = rand(4, H, r, d, seed=62)
    slots, parents = ids([2, -1]), ids([[-1, 0, 0], [-1, -1, 1]])

    def verify(b, c, v, pool, slots, parents):
        o, _, kept = leettriton.decode_tokens(b, c, v, pool, 0.9, slot_ids=slots, keep_states=True, parents=parents)
        return o, kept

    compiled = torch.compile(verify, backend="aot_eager", fullgraph=True)
    o, kept = compiled(b, c, v, pool, slots, parents)
    o_ref, kept_ref = verify(b, c, v, pool, slots, parents)
    assert torch.equal(o, o_ref) and torch.equal(kept, kept_ref)
    torch._dynamo.reset()
    # the operator's schema, fake implementation and registration, with parents
    torch.library.opcheck(torch.ops.leettriton.decode_tokens, (b, c, v, pool, None, 0.9, slots, True, None, parents))


# --------------------------------------------------------------------------- the engines' tree metadata


def test_parents_from_eagle_next_token_and_sibling():
    """SGLang's encoding (retrive_next_token: first child, retrive_next_sibling: next sibling; the example of
    its Mamba verify kernel's comment in row 0, a sibling list of three in row 1)."""
    nxt = ids([[1, 3, -1, -1, -1], [1, -1, 4, -1, -1]]).int()
    sib = ids([[-1, 2, -1, 4, -1], [-1, 2, 3, -1, -1]]).int()
    assert serving.parents_from_next_sibling(nxt, sib).tolist() == [[-1, 0, 0, 1, 1], [-1, 0, 0, 0, 2]]


def test_engine_adapters_verify_trees(dims):
    from types import SimpleNamespace

    H, r, d = dims
    B, K = 2, 4
    b, c, v = (x.transpose(1, 2).flatten(0, 1) for x in tokens(B, H, K, r, d, seed=71))  # (B·k, H, dim)
    rows = lambda x: x.unflatten(0, (B, K)).transpose(1, 2)  # noqa: E731
    pool = rand(12, H, r, d, seed=72)
    before = pool.clone()
    # SGLang: parents derived from the EAGLE encoding; the slot is not written
    meta = SimpleNamespace(mamba_cache_indices=ids([5, -1]), retrieve_next_token=ids([[1, 3, -1, -1]] * 2),
                           retrieve_next_sibling=ids([[-1, 2, -1, -1]] * 2))
    o, kept = serving.sglang_target_verify(b, c, v, pool, meta, 0.9, draft_token_num=K)
    parents = ids([[-1, 0, 0, 1]] * 2)
    o_ref, _, kept_ref = leettriton.decode_tokens(rows(b), rows(c), rows(v), before.clone(), 0.9, slot_ids=ids([5, -1]),
                                                  keep_states=True, parents=parents)
    assert torch.equal(rows(o), o_ref) and torch.equal(kept, kept_ref) and torch.equal(pool, before)
    # vLLM: start from slot [i, accepted - 1], token t from its parent's state, slot [i, j] <- token j's state
    spec = ids([[0, 1, 2, 3], [-1, -1, -1, -1]])
    meta = SimpleNamespace(spec_state_indices_tensor=spec, num_accepted_tokens=ids([3, 1]),
                           retrieve_parent_token=ids([[7, 0, 0, 1], [0, 9, -3, 7]]))  # padding: leftovers
    o = serving.vllm_spec_decode(b, c, v, pool, meta, 0.9)
    o_ref, _, kept_ref = leettriton.decode_tokens(rows(b), rows(c), rows(v), before.clone(), 0.9, slot_ids=ids([2, -1]),
                                                  keep_states=True, parents=parents)
    assert torch.equal(rows(o), o_ref)
    assert torch.equal(pool[:4], kept_ref[0, :, 1:].transpose(0, 1)) and torch.equal(pool[4:], before[4:])


def test_every_gpu_config_of_the_tree_kernel():
    """Each (BK, BV) tile of the H100 family's configs for this shape, pinned, on the kernel path: the value
    tiles that the interpreter's one config does not run (one key tile over all of r, partial tiles of d)."""
    from leettriton.autotune import FAMILIES
    from leettriton.kernels import tree

    H, r, d, K = 2, 40, 36, 3
    b, c, v = tokens(2, H, K, r, d, seed=81)
    pool = rand(3, H, r, d, seed=82)
    slots, parents = ids([2, 0]), ids([[-1, 0, 0], [-1, -1, 1]])
    gamma = torch.tensor([0.9, 0.6], device=DEVICE)
    ref_o, ref_states = reference(b, c, v, pool[slots], parents, gamma=gamma.cpu())
    args = dict(R=r, D=d, v_ptr=v)
    tiles = {(cfg["BK"], cfg["BV"]): cfg for cfg in tree.spaces.TREE.usable(FAMILIES["h100"], args)}
    assert len(tiles) >= 3, f"too few configs to prove anything: {sorted(tiles)}"
    for (bk, bv), cfg in sorted(tiles.items()):
        out = torch.full((2, H, K, d), float("nan"), device=DEVICE)
        kept = torch.full((2, H, K + 1, r, d), float("nan"), device=DEVICE)
        tree.decode_tree_impl(b, c, v, pool, gamma, out, slots, kept, parents, config={"decode.tree": cfg})
        assert_near(out, ref_o, f"outputs, BK={bk} BV={bv}")
        assert_near(kept, ref_states, f"node states, BK={bk} BV={bv}")


def test_bench_tree_quick_on_cpu(tmp_path, monkeypatch):
    """perf/bench_tree.py's logic on tiny shapes (no GPU; each call run once, not timed): the calls checked
    against float64, its JSON."""
    import json
    import os

    from leettriton import bench

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "perf"))
    import bench_tree

    if DEVICE != "cpu":
        pytest.skip("the GPU run is the benchmark itself")
    monkeypatch.setattr(bench, "time_ms", lambda fn, **kwargs: (fn(), (1.0, 1.0, 1.0))[1])
    monkeypatch.setattr(bench, "copy_bandwidth", lambda *args, **kwargs: 1e9)
    rep = bench_tree.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "5"])
    data = json.loads((tmp_path / "cpu" / "bench_tree.quick.json").read_text())
    assert data["meta"]["command"].startswith("python perf/bench_tree.py --quick")
    assert {r["call"] for r in data["rows"]} == {"tree + commit", "tree", "chain + commit", "accepted path alone"}
    assert [t[3] for t in rep.targets] == ["n/a", "PASS"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_tree_verify_and_commit_are_captured_in_a_cuda_graph():
    """No sync and fixed sizes: verify + commit captured once, then replayed with new parents, slots and
    accepted nodes written into the same buffers, equal the eager calls on those values."""
    H, r, d, K = 2, 64, 64, 4
    b, c, v = tokens(3, H, K, r, d, seed=91)
    pool = rand(8, H, r, d, seed=92)
    slots, parents, accepted = ids([5, -1, 2]), ids([[-1, 0, 0, 1]] * 3), ids([3, 0, 1])

    def step():
        o, _, kept = leettriton.decode_tokens(b, c, v, pool, 0.9, slot_ids=slots, keep_states=True, parents=parents,
                                              check_slots=False)
        serving.commit_tree(pool, slots, kept, accepted)
        return o

    step()   # compiles, tunes and validates once, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = step()
    start = rand(8, H, r, d, seed=93)
    for new_slots, new_parents, new_accepted in (([1, 4, -1], [[-1, -1, 1, 2]] * 3, [2, -1, 0]),
                                                 ([0, 7, 3], [[-1, 0, 1, 2]] * 3, [3, 1, -1])):
        slots.copy_(ids(new_slots))
        parents.copy_(ids(new_parents))
        accepted.copy_(ids(new_accepted))
        pool.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        replayed, o_replayed = pool.clone(), o_graph.clone()
        pool.copy_(start)
        assert torch.equal(step(), o_replayed) and torch.equal(pool, replayed)
