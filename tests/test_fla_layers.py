"""leettriton.nn's Mamba2 and SimpleGatedLinearAttention against float64 recurrences of the same layers.

The float64 layers below are written from the layers' definitions (fla's ``fla.layers.Mamba2`` and
``fla.layers.SimpleGatedLinearAttention``): projections, the short causal convolution token by token, the
state updated one token at a time (S_t = exp(a_t) S_{t−1} + ..., in fla's orientation, value rows first),
the norms and gates.  They read the layer's parameters, so a layer that mixes up groups, heads, gates,
norm axes or states fails.  The expected parameter names and shapes are fla 0.6.0's, written out from its
source.  Tiny sizes: the kernels run in the interpreter on the CPU.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from leettriton.nn import LinearAttentionCache, Mamba2, MultiScaleRetention, SimpleGatedLinearAttention
from leettriton.reference import tolerance

from helpers import assert_close

TOL = tolerance(torch.float32)


def _randomise(layer, seed):
    """Every parameter drawn afresh (1-D ones away from their initial 1 or 0, so a missing weight shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)          # A from −0.37 to −2.7
            elif name == "dt_bias":
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 2)
            elif p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "conv" in name else 0.3))
    return layer


def mamba_layer(seed=0, **kw):
    # hidden 16, inner 32: 4 heads of dim 8, state 8
    config = dict(num_heads=4, head_dim=8, hidden_size=16, state_size=8, n_groups=1, layer_idx=0)
    config.update(kw)
    torch.manual_seed(seed)
    return _randomise(Mamba2(**config), seed)


def gla_layer(seed=0, **kw):
    # hidden 16, 2 heads, r = 8, d = 8 (expand_v 2: 16)
    config = dict(hidden_size=16, num_heads=2, layer_idx=0)
    config.update(kw)
    torch.manual_seed(seed)
    return _randomise(SimpleGatedLinearAttention(**config), seed)


def _inputs(B=2, n=10, hidden=16, seed=1):
    return torch.randn(B, n, hidden, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- float64 layers

def _linear(x, linear):
    y = x @ linear.weight.double().T
    return y if linear.bias is None else y + linear.bias.double()


def _conv64(x, conv):
    """Causal depthwise convolution token by token: y_t = bias + Σ_k w[:, k] x_{t−K+1+k} (zeros before 0)."""
    B, n, C = x.shape
    w = conv.weight.double()[:, 0]                                        # [C, K]
    K = w.shape[1]
    padded = torch.cat([x.new_zeros(B, K - 1, C), x], 1)
    y = torch.stack([(padded[:, t:t + K] * w.T).sum(1) for t in range(n)], 1)
    return y if conv.bias is None else y + conv.bias.double()


def _silu(x):
    return x * torch.sigmoid(x)


def mamba64(layer: Mamba2, x: torch.Tensor, mask=None) -> torch.Tensor:
    """Mamba-2's mixer in float64, the SSM one token at a time with the state (heads, P, N)."""
    x = x.double()
    B, n, _ = x.shape
    H, P, N, G = layer.num_heads, layer.head_dim, layer.ssm_state_size, layer.n_groups
    inner = layer.intermediate_size
    z, xbc, dt = _linear(x, layer.in_proj).split([inner, layer.conv_dim, H], -1)
    m = None if mask is None else mask[:, :, None].double()
    if m is not None:
        xbc = xbc * m
    xbc = _silu(_conv64(xbc, layer.conv1d))
    if m is not None:
        xbc = xbc * m
    xs, Bm, Cm = xbc.split([inner, G * N, G * N], -1)
    xs, Bm, Cm = xs.reshape(B, n, H, P), Bm.reshape(B, n, G, N), Cm.reshape(B, n, G, N)
    dt = F.softplus(dt + layer.dt_bias.double()).clamp(*layer.dt_limit)   # [B, n, H]
    A = -torch.exp(layer.A_log.double())
    D = layer.D.double().reshape(H, P) if layer.D_has_hdim else layer.D.double()[:, None]
    group = [h * G // H for h in range(H)]                                  # head h reads group h // (H / G)
    S = torch.zeros(B, H, P, N, dtype=torch.float64)
    ys = []
    for t in range(n):
        Bt, Ct = Bm[:, t, group], Cm[:, t, group]                           # [B, H, N]
        S = torch.exp(dt[:, t] * A)[..., None, None] * S + (dt[:, t, :, None] * xs[:, t])[..., None] * Bt[:, :, None]
        ys.append((S * Ct[:, :, None]).sum(-1) + D * xs[:, t])              # [B, H, P]
    y = torch.stack(ys, 1).reshape(B, n, inner)
    if layer.rmsnorm:
        if not layer.norm_before_gate:
            y = y * _silu(z)
        grouped = y.reshape(B, n, G, inner // G)
        y = (grouped / torch.sqrt(grouped.pow(2).mean(-1, keepdim=True) + layer.norm_eps)).reshape(B, n, inner)
        y = y * layer.norm.weight.double()
        if layer.norm_before_gate:
            y = y * _silu(z)
    else:
        y = y * _silu(z)
    return _linear(y, layer.out_proj)


def gla64(layer: SimpleGatedLinearAttention, x: torch.Tensor, mask=None) -> torch.Tensor:
    """Simple GLA in float64, the state (heads, r, d) one token at a time."""
    x = x.double()
    B, n, _ = x.shape
    H, Hkv, r, d = layer.num_heads, layer.num_kv_heads, layer.head_k_dim, layer.head_v_dim
    q, k, v = _linear(x, layer.q_proj), _linear(x, layer.k_proj), _linear(x, layer.v_proj)
    m = None if mask is None else mask[:, :, None].double()
    if layer.use_short_conv:
        if m is not None:
            q, k, v = q * m, k * m, v * m
        q, k, v = (_silu(_conv64(z, conv)) for z, conv in ((q, layer.q_conv1d), (k, layer.k_conv1d),
                                                             (v, layer.v_conv1d)))
    if layer.feature_map_fn is not None:
        q, k = layer.feature_map_fn(q), layer.feature_map_fn(k)
    if m is not None:
        v = v * m
    a = F.logsigmoid(_linear(x, layer.gk_proj)) / layer.gate_logit_normalizer   # [B, n, H]
    if m is not None:
        a = a * m
    q, k, v = q.reshape(B, n, H, r), k.reshape(B, n, Hkv, r), v.reshape(B, n, Hkv, d)
    kv_head = [h * Hkv // H for h in range(H)]
    S = torch.zeros(B, H, r, d, dtype=torch.float64)
    outs = []
    for t in range(n):
        S = torch.exp(a[:, t])[..., None, None] * S + k[:, t, kv_head, :, None] * v[:, t, kv_head, None, :]
        outs.append((q[:, t, :, :, None] * r ** -0.5 * S).sum(-2))         # [B, H, d]
    o = torch.stack(outs, 1)
    norm = layer.g_norm_swish_gate if layer.fuse_norm_and_gate else layer.g_norm
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + norm.eps)
    if norm.weight is not None:
        o = o * norm.weight.double()
    g = _linear(x, layer.g_proj).reshape(B, n, H, d)
    o = o * (layer.gate_fn(g) if not layer.fuse_norm_and_gate else _silu(g))
    return _linear(o.reshape(B, n, H * d), layer.o_proj)


# ----------------------------------------------------------------------------- forward against float64

MAMBA_CASES = {
    "default": {},
    "groups2_dhdim_bias_norm_first": dict(n_groups=2, D_has_hdim=True, use_bias=True, norm_before_gate=True),
    "groups4_no_rmsnorm_dt_limit": dict(n_groups=4, rmsnorm=False, dt_limit=(0.05, 0.5), use_conv_bias=False,
                                        conv_kernel=3),
}


@pytest.mark.parametrize("case", sorted(MAMBA_CASES))
def test_mamba2_matches_float64_recurrence(case):
    layer = mamba_layer(**MAMBA_CASES[case])
    x = _inputs()
    with torch.no_grad():
        assert_close(layer(x), mamba64(layer, x), TOL, f"mamba2 {case}")


GLA_CASES = {
    "default": {},
    "kv_heads1_feature_map_wide_v": dict(num_kv_heads=1, feature_map="relu", expand_v=2.0, conv_bias=True),
    "no_conv_sigmoid_gate_no_affine": dict(use_short_conv=False, gate_fn="sigmoid", elementwise_affine=False,
                                           gate_logit_normalizer=4),
}


@pytest.mark.parametrize("case", sorted(GLA_CASES))
def test_simple_gla_matches_float64_recurrence(case):
    layer = gla_layer(**GLA_CASES[case])
    x = _inputs()
    with torch.no_grad():
        assert_close(layer(x), gla64(layer, x), TOL, f"simple gla {case}")


def test_bfloat16_layers_keep_their_dtype_and_float32_states():
    """bfloat16 weights and inputs: outputs in bfloat16 near the float64 layer (the projections and the
    convolution round to bfloat16 around the kernels), the SSM state float32, the convolution state bfloat16."""
    for name, layer, ref in (("mamba2", mamba_layer(n_groups=2), mamba64), ("gla", gla_layer(num_kv_heads=1), gla64)):
        layer = layer.to(torch.bfloat16)
        x = _inputs().bfloat16()
        cache = LinearAttentionCache()
        with torch.no_grad():
            y = layer(x, cache=cache)
        assert y.dtype == torch.bfloat16, name
        assert cache.get_state(0).dtype == torch.float32 and cache.get_conv_state(0).dtype == torch.bfloat16, name
        assert_close(y.float(), ref(layer, x), 2 * tolerance(torch.bfloat16), f"{name} bfloat16")


# ----------------------------------------------------------------------------- cache

LAYERS = {"mamba2": (lambda: mamba_layer(n_groups=2), mamba64), "gla": (lambda: gla_layer(num_kv_heads=1), gla64)}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_prefill_then_decode_equals_one_prefill(kind):
    """Prefill of 5 tokens, two one-token steps (decode_step with the token's decay, the convolution from its
    state), a prefill of 2 more from the cache, one more step: the float64 layer over all 10 tokens."""
    make, ref = LAYERS[kind]
    layer = make()
    x = _inputs()
    cache = LinearAttentionCache()
    outs, t0 = [], 0
    with torch.no_grad():
        for piece in (5, 1, 1, 2, 1):
            outs.append(layer(x[:, t0:t0 + piece], cache=cache))
            t0 += piece
    assert_close(torch.cat(outs, 1), ref(layer, x), TOL, f"{kind}: pieces (5, 1, 1, 2, 1)")
    conv = cache.get_conv_state(0)
    channels = layer.conv_dim if kind == "mamba2" else layer.key_dim + layer.key_dim_per_group + \
        layer.value_dim_per_group
    kernel = layer.conv_kernel_size if kind == "mamba2" else layer.conv_size
    assert cache.get_seq_length(0) == 10 and tuple(conv.shape) == (2, channels, kernel - 1)
    assert cache.get_state(0).dtype == torch.float32


def test_cache_reorder_crop_and_repeat_carry_the_convolution_state():
    """Beams reorder the convolution state with the SSM state; crop after recorded steps restores both."""
    layer = mamba_layer()
    x = _inputs(B=3, n=9)
    beams = torch.tensor([2, 0, 0])
    cache = LinearAttentionCache()
    with torch.no_grad():
        layer(x[:, :7], cache=cache)
        cache.reorder_cache(beams)
        cache.activate_past_recording()
        layer(_inputs(B=3, n=1, seed=5), cache=cache)          # a token to undo
        cache.crop(-1)
        y = torch.cat([layer(x[beams, 7:8], cache=cache), layer(x[beams, 8:9], cache=cache)], 1)
        cache.batch_repeat_interleave(2)
        assert tuple(cache.get_conv_state(0).shape)[0] == 6 and cache.batch_size == 6
    assert_close(y, mamba64(layer, x[beams])[:, 7:], TOL, "reordered, cropped")


def test_left_padding_adds_nothing():
    """A left-padded row gives its tokens' outputs, and the decode step after, as the row without padding (a
    padded token enters the convolution as zeros, adds nothing and does not decay the state)."""
    for name, layer, ref in (("mamba2", mamba_layer(n_groups=2), mamba64), ("gla", gla_layer(), gla64)):
        x = _inputs(B=2, n=9)
        mask = torch.ones(2, 9, dtype=torch.long)
        mask[1, :4] = 0
        cache, alone = LinearAttentionCache(), LinearAttentionCache()
        x_next = _inputs(B=2, n=1, seed=5)
        with torch.no_grad():
            y = layer(x, attention_mask=mask, cache=cache)
            y1 = layer(x[1:, 4:], cache=alone)
            step = layer(x_next, attention_mask=torch.ones(2, 10), cache=cache)
            step1 = layer(x_next[1:], cache=alone)
        assert_close(y[1, 4:], y1[0], TOL, f"{name}: padded row")
        assert_close(y, ref(layer, x, mask), TOL, f"{name}: padded batch")
        assert_close(step[1], step1[0], TOL, f"{name}: decode after padding")
        with pytest.raises(ValueError, match="left padding"):
            layer(x, attention_mask=torch.tensor([[1] * 9, [1] * 8 + [0]]))


@pytest.mark.parametrize("kind", ["mamba2", "gla"])
def test_gradients_match_float64(kind):
    """The gradient of a weighted sum of the output for the input and every parameter against autograd through
    the float64 layer: Mamba-2's A_log and dt_bias and simple GLA's gk_proj through the per-token decay,
    Mamba-2's B and C through the view shared by the heads, the convolutions' weights."""
    layer, ref = (mamba_layer(), mamba64) if kind == "mamba2" else (gla_layer(num_kv_heads=1), gla64)
    x = _inputs(n=8)
    weight = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(9))

    def grads(loss_of):
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        loss_of(xg).backward()
        return {"x": xg.grad, **{name: p.grad for name, p in layer.named_parameters()}}

    got = grads(lambda xg: (layer(xg) * weight).sum())
    want = grads(lambda xg: (ref(layer, xg) * weight.double()).sum())
    for name in want:
        assert got[name] is not None, name
        assert_close(got[name], want[name], TOL, f"{kind}: d loss / d {name}")


# ----------------------------------------------------------------------------- names, shapes, arguments

def test_parameter_names_and_shapes_are_fla_s():
    """fla 0.6.0's names and shapes (fla/layers/mamba2.py, simple_gla.py), for real sizes (on the meta device)."""
    mamba = Mamba2(num_heads=64, head_dim=64, hidden_size=2048, state_size=128, n_groups=8, layer_idx=0,
                   device="meta")
    conv_dim = 4096 + 2 * 8 * 128
    assert {k: tuple(v.shape) for k, v in mamba.state_dict().items()} == {
        "dt_bias": (64,), "A_log": (64,), "D": (64,), "conv1d.weight": (conv_dim, 1, 4), "conv1d.bias": (conv_dim,),
        "in_proj.weight": (4096 + conv_dim + 64, 2048), "norm.weight": (4096,), "out_proj.weight": (2048, 4096)}
    bare = Mamba2(head_dim=64, hidden_size=256, state_size=16, rmsnorm=False, use_conv_bias=False, use_bias=True,
                  D_has_hdim=True, device="meta")
    assert {k: tuple(v.shape) for k, v in bare.state_dict().items()} == {
        "dt_bias": (8,), "A_log": (8,), "D": (512,), "conv1d.weight": (544, 1, 4), "in_proj.weight": (1064, 256),
        "in_proj.bias": (1064,), "out_proj.weight": (256, 512), "out_proj.bias": (256,)}
    gla = SimpleGatedLinearAttention(hidden_size=2048, num_heads=16, num_kv_heads=4, conv_bias=True, device="meta")
    assert {k: tuple(v.shape) for k, v in gla.state_dict().items()} == {
        "q_proj.weight": (2048, 2048), "k_proj.weight": (512, 2048), "v_proj.weight": (512, 2048),
        "g_proj.weight": (2048, 2048), "q_conv1d.weight": (2048, 1, 4), "q_conv1d.bias": (2048,),
        "k_conv1d.weight": (512, 1, 4), "k_conv1d.bias": (512,), "v_conv1d.weight": (512, 1, 4),
        "v_conv1d.bias": (512,), "gk_proj.weight": (16, 2048), "gk_proj.bias": (16,),
        "g_norm_swish_gate.weight": (128,), "o_proj.weight": (2048, 2048)}
    plain = SimpleGatedLinearAttention(hidden_size=64, num_heads=4, use_short_conv=False, gate_fn="sigmoid",
                                       expand_k=0.5, device="meta")
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == {
        "q_proj.weight": (32, 64), "k_proj.weight": (32, 64), "v_proj.weight": (64, 64), "g_proj.weight": (64, 64),
        "gk_proj.weight": (4, 64), "gk_proj.bias": (4,), "g_norm.weight": (16,), "o_proj.weight": (64, 64)}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_groups"):
        Mamba2(head_dim=8, hidden_size=16, n_groups=3)
    with pytest.raises(ValueError, match="num_heads"):
        Mamba2(num_heads=5, head_dim=8, hidden_size=16)
    with pytest.raises(ValueError, match="dt_limit"):
        Mamba2(head_dim=8, hidden_size=16, dt_limit=(1.0, 0.5))
    with pytest.raises(ValueError, match="unknown method"):
        Mamba2(head_dim=8, hidden_size=16, method="flash")
    with pytest.raises(ValueError, match="num_kv_heads"):
        SimpleGatedLinearAttention(hidden_size=16, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="mode"):
        SimpleGatedLinearAttention(hidden_size=16, mode="parallel")
    with pytest.raises(ValueError, match="gate_fn"):
        SimpleGatedLinearAttention(hidden_size=16, gate_fn="tanhh")
    with pytest.raises(ValueError, match="layer_idx"):
        Mamba2(head_dim=8, hidden_size=16)(_inputs(n=2), cache=LinearAttentionCache())
    retention = MultiScaleRetention(16, 2, expand_k=0.5, expand_v=1.0, layer_idx=0)   # r = 4, d = 8
    cache = LinearAttentionCache()
    with torch.no_grad():
        retention(_inputs(n=3), cache=cache)
        with pytest.raises(ValueError, match="another model"):
            mamba_layer()(_inputs(n=3), cache=cache)


# ----------------------------------------------------------------------------- the perf script's logic check

def test_check_fla_layers_quick_on_cpu(tmp_path):
    """``perf/check_fla_layers.py --device cpu --quick`` (no fla): our layers' names against fla's list and
    prefill + steps against one prefill, every target passing, its run written."""
    path = os.path.join(os.path.dirname(__file__), "..", "perf", "check_fla_layers.py")
    spec = importlib.util.spec_from_file_location("perf_check_fla_layers", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    rep = mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--n", "4", "--decode-steps", "2",
                     "--methods", "causal_dot_product_torch"])
    data = json.loads((tmp_path / "cpu" / "check_fla_layers.quick.json").read_text())
    assert data["meta"]["command"].startswith("python perf/check_fla_layers.py --quick")
    assert len(data["rows"]) == 4 and all(t[-1] == "PASS" for t in data["meta"]["targets"]), data["meta"]["targets"]
    assert rep.rows[0]["split_rel_err_vs_one_prefill"] <= TOL


def test_short_convolution_chains_through_its_state():
    """Calls of 3, 0, 1 and 2 tokens from the state give one call's outputs (kernel 4 and kernel 1), the state
    is the last K − 1 inputs, and an empty call leaves it as it was."""
    from leettriton.nn import ShortConvolution
    x = _inputs(B=2, n=6, hidden=5)
    for K in (4, 1):
        conv = ShortConvolution(5, K, bias=True)
        with torch.no_grad():
            whole, _ = conv(x)
            outs, state, t0 = [], None, 0
            for piece in (3, 0, 1, 2):
                y, state = conv(x[:, t0:t0 + piece], state, return_state=True)
                outs.append(y)
                t0 += piece
            assert_close(whole, _silu(_conv64(x.double(), conv)), TOL, f"kernel {K}")
        assert_close(torch.cat(outs, 1), whole, TOL, f"kernel {K}: pieces")
        assert torch.equal(state, x[:, 6 - (K - 1):].transpose(1, 2)), K
