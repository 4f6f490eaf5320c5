"""The layers of leettriton.nn and their cache, against float64 implementations of the same layers.

The float64 layers below are written from the models' definitions (projections, rotary or LRPE
positions, decay per head, norms, gates) and compute the attention with :func:`leettriton.reference`,
so a layer that mixes up heads, positions, scales or states fails.  They take the layer's parameters
differentiably, so the layers' parameter gradients are checked against theirs too.  Tiny sizes: the CPU
suite runs the Triton kernels in the interpreter.
"""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import leettriton
from leettriton.methods import BUILTIN_METHODS
from leettriton.nn import LinearAttentionCache, MultiScaleRetention, NormLinearAttention
from leettriton.reference import tolerance

from helpers import assert_close

HIDDEN, HEADS = 32, 2
METHODS = ["auto"] + list(BUILTIN_METHODS) + [f"{m}_torch" for m in BUILTIN_METHODS]


def retention_layer(method="auto", kv_heads=None, seed=0, **kw):
    torch.manual_seed(seed)
    # r = 32 * 0.5 / 2 = 8, d = 32 * 1 / 2 = 16
    layer = MultiScaleRetention(HIDDEN, HEADS, kv_heads, expand_k=0.5, expand_v=1.0, layer_idx=0, method=method, **kw)
    with torch.no_grad():
        for p in layer.parameters():   # norm weights away from 1, so a missing weight fails
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0))
    return layer


def lightning_layer(method="auto", layer_idx=0, num_layers=3, use_lrpe=False, seed=0):
    torch.manual_seed(seed)
    # r = d = 16 (r = 32 with LRPE)
    layer = NormLinearAttention(HIDDEN, HEADS, HIDDEN, layer_idx=layer_idx, num_layers=num_layers, use_lrpe=use_lrpe,
                                method=method)
    with torch.no_grad():
        layer.qkvu_proj.weight.mul_(2.0)
    return layer


# ----------------------------------------------------------------------------- float64 layers

def _w(linear):
    return linear.weight.double()   # differentiable: gradients reach the layer's parameters (float32 .grad)


def retention64(layer: MultiScaleRetention, x: torch.Tensor, mask=None) -> torch.Tensor:
    """RetNet retention from its definition, float64 except the fp32 inputs of the oracle."""
    x = x.double()
    B, n, _ = x.shape
    H, Hkv = layer.num_heads, layer.num_kv_heads
    r, d = layer.head_k_dim, layer.head_v_dim
    q = (x @ _w(layer.q_proj).T).view(B, n, H, r)
    k = (x @ _w(layer.k_proj).T).view(B, n, Hkv, r)
    v = (x @ _w(layer.v_proj).T).view(B, n, Hkv, d)
    if mask is not None:
        v = v * mask[:, :, None, None].double()
    t = torch.arange(n, dtype=torch.float64)
    inv_freq = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    cos, sin = torch.cos(t[:, None] * inv_freq)[:, None], torch.sin(t[:, None] * inv_freq)[:, None]

    def rotate(z):
        z1, z2 = z[..., :r // 2], z[..., r // 2:]
        return torch.cat((z1 * cos - z2 * sin, z2 * cos + z1 * sin), -1)

    b, c = rotate(q) / math.sqrt(r), rotate(k)
    c, v = c.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=torch.float64)
    o = leettriton.reference(b.float(), c.float(), v.float(), gamma, layout="bnhd")
    norm = layer.g_norm_swish_gate if layer.fuse_norm_and_gate else layer.g_norm
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
    g = (x @ _w(layer.g_proj).T).view(B, n, H, d)
    o = o * g * torch.sigmoid(g)
    return o.reshape(B, n, H * d) @ _w(layer.o_proj).T


def lightning64(layer: NormLinearAttention, x: torch.Tensor, mask=None) -> torch.Tensor:
    """TransNormerLLM's NormLinearAttention from its definition, float64 except the oracle's fp32 inputs."""
    x = x.double()
    B, n, _ = x.shape
    H, D = layer.num_heads, layer.head_dim
    q, k, v, u = (x @ _w(layer.qkvu_proj).T).chunk(4, -1)
    q, k, v = (z.reshape(B, n, H, D) for z in (q, k, v))
    q, k = F.silu(q), F.silu(k)
    if mask is not None:
        v = v * mask[:, :, None, None].double()
    if layer.use_lrpe:
        theta = layer.lrpe.theta.double()[:, 0]                          # [H, D]
        angle = torch.arange(n, dtype=torch.float64)[:, None, None] * theta
        q = torch.cat((q * torch.cos(angle), q * torch.sin(angle)), -1)
        k = torch.cat((k * torch.cos(angle), k * torch.sin(angle)), -1)
    slopes = [2.0 ** (-8 * (h + 1) / H) for h in range(H)]               # H a power of two
    depth = 1 - layer.layer_idx / (layer.num_layers - 1) + 1e-5
    gamma = torch.tensor([math.exp(-s * depth) for s in slopes], dtype=torch.float64)
    o = leettriton.reference(q.float(), k.float(), v.float(), gamma, layout="bnhd").reshape(B, n, H * D)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (u * o) @ _w(layer.out_proj).T


LAYERS = {"retention": (retention_layer, retention64), "lightning": (lightning_layer, lightning64)}


def _inputs(B=2, n=24, seed=1):
    return torch.randn(B, n, HIDDEN, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_matches_float64_layer(kind, method):
    make, ref = LAYERS[kind]
    layer = make(method)
    x = _inputs()
    with torch.no_grad():
        assert_close(layer(x), ref(layer, x), tolerance(torch.float32), f"{kind} {method}")


@pytest.mark.parametrize("case", ["grouped_kv", "lrpe", "last_layer", "bfloat16"])
def test_layer_variants(case):
    x = _inputs()
    tol = tolerance(torch.float32)
    if case == "grouped_kv":
        layer, ref = retention_layer(kv_heads=1), retention64
    elif case == "lrpe":
        layer, ref = lightning_layer(use_lrpe=True), lightning64
    elif case == "last_layer":
        layer, ref = lightning_layer(layer_idx=2), lightning64
    else:
        layer, ref = retention_layer().to(torch.bfloat16), retention64
        x, tol = x.bfloat16(), 2 * tolerance(torch.bfloat16)   # bfloat16 projections and norms around the kernels
    with torch.no_grad():
        assert_close(layer(x).float(), ref(layer, x), tol, case)


GRAD_METHODS = ["lightning_attention", "block_based_torch"]   # a kernel (the interpreter on CPU), a torch path


def _gradients(layer, x, loss_of):
    """d loss / d x and d loss / d every parameter, after a fresh backward of ``loss_of(layer, x)``."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    loss_of(layer, x).backward()
    return {"x": x.grad, **{name: p.grad for name, p in layer.named_parameters()}}


@pytest.mark.parametrize("method", GRAD_METHODS)
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_gradients_match_float64_layer(kind, method):
    """The gradients of a weighted sum of the layer's output, for the input and every parameter (projections,
    norm weights, LRPE frequencies), against autograd through the float64 layer and the float64 oracle."""
    make, ref = LAYERS[kind]
    layer = make(method, use_lrpe=True) if kind == "lightning" else make(method)
    x = _inputs(n=20)
    weight = torch.randn(2, 20, HIDDEN, generator=torch.Generator().manual_seed(9))   # loss Σ W ⊙ y
    got = _gradients(layer, x, lambda m, x: (m(x) * weight).sum())
    want = _gradients(layer, x, lambda m, x: (ref(m, x) * weight.double()).sum())
    assert set(got) == set(want) and all(g is not None for g in got.values()), sorted(got)
    for name in want:
        assert_close(got[name], want[name], tolerance(torch.float32), f"{kind} {method}: d loss / d {name}")


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_one_token_call_that_needs_a_gradient_is_differentiable(kind):
    """With grad on, prefill + one-token call through a cache: the gradients of one prefill (decode_step has no
    backward, so that token runs as a one-row linear_attention call from the cached state)."""
    make, ref = LAYERS[kind]
    layer = make("block_based_torch")
    x = _inputs(n=7)
    weight = torch.randn(2, 7, HIDDEN, generator=torch.Generator().manual_seed(9))

    def pieces(m, x):
        cache = LinearAttentionCache()
        y = torch.cat([m(x[:, :6], cache=cache), m(x[:, 6:], cache=cache)], 1)
        assert cache.get_seq_length(0) == 7
        return (y * weight).sum()

    got = _gradients(layer, x, pieces)
    want = _gradients(layer, x, lambda m, x: (ref(m, x) * weight.double()).sum())
    for name in want:
        assert_close(got[name], want[name], tolerance(torch.float32), f"{kind}: d loss / d {name}")


@pytest.mark.parametrize("kind", sorted(LAYERS))
@pytest.mark.parametrize("pieces", [(24,), (9, 1, 1, 1), (7, 10, 1, 1, 5), (1, 1, 22)])
def test_prefill_chunks_and_decode_equal_one_prefill(kind, pieces):
    """Any split of the sequence into prefill calls (several tokens) and decode steps (one token)."""
    make, ref = LAYERS[kind]
    layer = make(use_lrpe=True) if kind == "lightning" else make()
    x = _inputs(n=sum(pieces))
    cache = LinearAttentionCache()
    outs, t0 = [], 0
    with torch.no_grad():
        for p in pieces:
            outs.append(layer(x[:, t0:t0 + p], cache=cache))
            t0 += p
        assert_close(torch.cat(outs, 1), ref(layer, x), tolerance(torch.float32), f"{kind} {pieces}")
    assert cache.get_seq_length(0) == t0 and cache.get_state(0).dtype == torch.float32


@pytest.mark.parametrize("case", ["retention", "retention_grouped_kv", "lightning_lrpe"])
def test_decode_token_with_a_state_buffer_equals_the_cache_path_and_one_prefill(case):
    """``decode_token`` (a caller's state updated in place, the position a device tensor): after a prefill, each
    token gives the one-token call through the cache's output and state, and the float64 layer's last row."""
    if case == "lightning_lrpe":
        layer, ref = lightning_layer(use_lrpe=True), lightning64
    else:
        layer, ref = retention_layer(kv_heads=1 if case == "retention_grouped_kv" else None), retention64
    x = _inputs(B=2, n=12)
    cache = LinearAttentionCache()
    with torch.no_grad():
        layer(x[:, :9], cache=cache)
        state = cache.get_state(0).clone()
        position = torch.tensor([9])
        for t in range(9, 12):
            y = layer.decode_token(x[:, t], state, position)
            position += 1
            y_cache = layer(x[:, t:t + 1], cache=cache)
            assert_close(y, y_cache[:, 0], tolerance(torch.float32), f"{case}: token {t}, decode_token vs cache")
            assert_close(state, cache.get_state(0), tolerance(torch.float32), f"{case}: state after token {t}")
            assert_close(y, ref(layer, x[:, :t + 1])[:, -1], tolerance(torch.float32), f"{case}: token {t} vs float64")


def test_left_padding_adds_nothing():
    """A 0 in attention_mask (left padding) leaves the other tokens' outputs and the state as without it."""
    layer = retention_layer()
    x = _inputs(B=2, n=12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    cache, alone = LinearAttentionCache(), LinearAttentionCache()
    with torch.no_grad():
        y = layer(x, attention_mask=mask, cache=cache)
        y1 = layer(x[1:, 5:], cache=alone)
        assert_close(y[1, 5:], y1[0], tolerance(torch.float32), "padded row")
        assert_close(y, retention64(layer, x, mask), tolerance(torch.float32), "padded batch")
        x_next = _inputs(B=2, n=1, seed=5)
        step = layer(x_next, attention_mask=torch.ones(2, 13), cache=cache)
        step1 = layer(x_next[1:], cache=alone)
    assert_close(step[1], step1[0], tolerance(torch.float32), "decode after padding")


def test_reorder_cache_follows_beams():
    layer = lightning_layer()
    x = _inputs(B=3, n=10)
    beams = torch.tensor([2, 0, 0])
    x_next = _inputs(B=3, n=1, seed=7)
    cache = LinearAttentionCache()
    with torch.no_grad():
        layer(x, cache=cache)
        cache.reorder_cache(beams)
        y = layer(x_next, cache=cache)
        full = torch.cat([x[beams], x_next], 1)
    assert_close(y[:, 0], lightning64(layer, full)[:, -1], tolerance(torch.float32), "reordered")


def test_reset_crop_and_repeat():
    layer = retention_layer()
    x = _inputs(B=2, n=8)
    cache = LinearAttentionCache()
    with torch.no_grad():
        layer(_inputs(B=2, n=5, seed=3), cache=cache)
        cache.reset()
        assert cache.get_seq_length() == 0 and cache.get_state(0) is None
        layer(x[:, :6], cache=cache)
        cache.activate_past_recording()
        layer(_inputs(B=2, n=1, seed=4), cache=cache)        # two tokens to undo
        layer(_inputs(B=2, n=1, seed=5), cache=cache)
        cache.crop(-2)
        assert cache.get_seq_length() == 6
        y = torch.cat([layer(x[:, 6:7], cache=cache), layer(x[:, 7:], cache=cache)], 1)
        assert_close(y, retention64(layer, x)[:, 6:], tolerance(torch.float32), "after crop")
        cache.crop(8)                                         # the current length: nothing to do
        fresh = LinearAttentionCache()
        layer(x, cache=fresh)
        with pytest.raises(ValueError, match="cannot be rolled back"):
            fresh.crop(3)
        fresh.batch_repeat_interleave(2)
        assert fresh.batch_size == 4
        fresh.crop(0 - fresh.get_seq_length())               # back to nothing
        assert fresh.get_state(0) is None


def test_set_method_switches_and_bad_arguments_are_named():
    layer = retention_layer("lightning_attention")
    layer.set_method("lightningAttention2")                  # the paper's spelling
    assert layer.method == "lightning_attention"
    with pytest.raises(ValueError, match="unknown method"):
        layer.set_method("flash")
    with pytest.raises(ValueError, match="unknown method"):
        NormLinearAttention(HIDDEN, HEADS, method="nope")
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiScaleRetention(HIDDEN, 4, 3)
    with pytest.raises(ValueError, match="split into"):
        MultiScaleRetention(30, 4, expand_k=1.0)
    with pytest.raises(ValueError, match="feature_map"):
        MultiScaleRetention(HIDDEN, HEADS, feature_map="tanhh")
    with pytest.raises(ValueError, match="layer_idx"):
        MultiScaleRetention(HIDDEN, HEADS)(_inputs(n=2), cache=LinearAttentionCache())
    other = lightning_layer()                                 # r = d = 16: not this layer's state
    cache = LinearAttentionCache()
    with torch.no_grad():
        other(_inputs(n=3), cache=cache)
        with pytest.raises(ValueError, match="another model"):
            layer(_inputs(n=3), cache=cache)


def test_real_head_sizes_are_accepted():
    """RetNet-1.3B: hidden 2048, 8 heads, r = 256, d = 512 (built on the meta device: no memory)."""
    layer = MultiScaleRetention(2048, 8, expand_k=1.0, expand_v=2.0, layer_idx=0, device="meta")
    assert (layer.head_k_dim, layer.head_v_dim) == (256, 512)
    assert layer.gammas[0] == 1 - 2 ** -5 and layer.gammas[7] == 1 - 2 ** -12
    lightning = NormLinearAttention(4096, 32, layer_idx=0, num_layers=30, device="meta")
    assert lightning.head_dim == 128 and all(0 < g < 1 for g in lightning.gammas)


def test_importing_the_layers_needs_no_transformers():
    code = "import sys, leettriton, leettriton.nn; print([m for m in sys.modules if m.startswith('transformers')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
