"""torch.compile with fullgraph=True over the entry points, the nn layers and the models (docs/design.md §4.6).

``fullgraph=True`` raises at the first graph break, so each compiled call here asserts zero graph breaks;
the results are compared with the eager calls'.  The ``aot_eager`` backend traces the forward and the
backward through AOTAutograd (the operators' fake implementations and autograd formula) without compiling
C++, and runs the operators' bodies, so the kernels run as they do eagerly (the interpreter on CPU).
Tiny sizes.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.library import opcheck

import leettriton
import leettriton.distributed
from leettriton.models import RetNetConfig, RetNetForCausalLM, TransNormerConfig, TransNormerForCausalLM
from leettriton.nn import LinearAttentionCache, MultiScaleRetention, NormLinearAttention
from leettriton.reference import tolerance

from conftest import DEVICE
from helpers import assert_close

OPS = torch.ops.leettriton
TOL = tolerance(torch.float32)
VOCAB = 64


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    torch._dynamo.reset()


def compiled(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_the_operator_forward_and_backward_compile_whole():
    B, H, n, r, d = 1, 2, 8, 4, 4
    b, c, v = (rand(B, n, H, dim, seed=i) for i, dim in enumerate((r, r, d)))     # layout bnhd
    s0 = rand(B, H, r, d, seed=3)
    gamma = torch.tensor([0.9, 0.7])

    def f(b, c, v, s0):
        o, s = leettriton.linear_attention(b, c, v, gamma, layout="bnhd", initial_state=s0, return_state=True)
        return o * 2, s

    with torch.no_grad():
        o, s = compiled(f)(b, c, v, s0)
        o_ref, s_ref = f(b, c, v, s0)
    assert o.shape == o_ref.shape and o.stride() == o_ref.stride()
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)

    def loss(f, *xs):
        leaves = [x.clone().requires_grad_() for x in xs]
        o, s = f(*leaves)
        (o.square().sum() + (s * s0).sum()).backward()
        return [x.grad for x in leaves]

    for got, want, name in zip(loss(compiled(f), b, c, v, s0), loss(f, b, c, v, s0), ("db", "dc", "dv", "ds0")):
        assert_close(got, want, TOL, name)


def test_a_float_gamma_and_the_method_functions_compile_whole():
    b, c, v = (rand(2, 2, 8, 4, seed=i) for i in range(3))
    o = compiled(lambda b, c, v: leettriton.vanilla(b, c, v, 0.8) + 1)(b, c, v)
    assert torch.equal(o, leettriton.vanilla(b, c, v, 0.8) + 1)
    o = compiled(lambda b, c, v: leettriton.linear_attention(b, c, v))(b, c, v)
    assert torch.equal(o, leettriton.linear_attention(b, c, v))
    f = compiled(lambda b, c, v, g: leettriton.linear_attention(b, c, v, g))
    for g in (0.9, 0.5):                                   # a float argument of the compiled function
        assert torch.equal(f(b, c, v, g), leettriton.linear_attention(b, c, v, g))


def test_a_float_gamma_first_met_while_tracing_serves_later_eager_calls():
    """A float γ is held as a tensor cached by value; the first call that meets it may be a trace, whose
    tensors are fake (no data): the cache must never keep one for the eager calls that follow."""
    b, c, v = (rand(1, 2, 8, 4, seed=i) for i in range(3))
    g = 0.8123456789                                      # a value no other test uses: first met here
    state = torch.ops.leettriton.slice_state
    s = compiled(lambda b, c, v: state(b, c, v, None, g, None, "vanilla", "bhnd", None))(b, c, v)
    _, s_ref = leettriton.vanilla(b, c, v, g, return_state=True)
    assert_close(s, s_ref, TOL, "the state pass's state")
    assert torch.equal(state(b, c, v, None, g, None, "vanilla", "bhnd", None), s)


def test_a_compiled_call_reads_no_gamma_value_but_its_kernels_guard():
    # on the kernels' device: CPU tensors on a GPU machine take the PyTorch twins, which check on the host
    b, c, v = (rand(1, 2, 8, 4, seed=i).to(DEVICE) for i in range(3))
    bad = torch.tensor([1.5, 0.9], device=DEVICE)
    with pytest.raises(ValueError, match="gamma"):
        leettriton.linear_attention(b, c, v, bad)          # eager: checked on the host
    o = compiled(lambda b, c, v, g: leettriton.linear_attention(b, c, v, g))(b, c, v, bad)
    assert torch.isnan(o[:, 0]).all()                      # the kernels' guard: the bad head's rows are NaN
    assert torch.equal(o[:, 1], leettriton.linear_attention(b, c, v, torch.tensor([0.5, 0.9], device=DEVICE))[:, 1])
    # metadata is still checked while tracing (fullgraph: dynamo's error names the ValueError)
    with pytest.raises(Exception, match=r"gamma must have shape \(2,\) or \(2, 1\)"):
        compiled(lambda b, c, v: leettriton.linear_attention(b, c, v, torch.ones(3, device=DEVICE)))(b, c, v)
    with pytest.raises(Exception, match=r"v must match b in batch, heads and n"):
        compiled(lambda b, c, v: leettriton.linear_attention(b, c, v[:, :, :3]))(b, c, v)
    with pytest.raises(Exception, match=r"state must have shape"):
        compiled(lambda b, c, v, s: leettriton.decode_step(b, c, v, s))(b[:, :, 0], c[:, :, 0], v[:, :, 0],
                                                                        torch.zeros(1, 2, 4, 5, device=DEVICE))


def test_decode_steps_with_a_slotted_pool_update_it_in_place():
    B, H, r, d = 3, 2, 4, 4
    bt, ct, vt = rand(B, H, r, seed=1), rand(B, H, r, seed=2), rand(B, H, d, seed=3)
    slots = torch.tensor([4, -1, 0])
    gamma = torch.tensor([0.9, 0.6])
    pool, pool_ref = rand(6, H, r, d, seed=4), rand(6, H, r, d, seed=4)

    def step(bt, ct, vt, pool, slots):
        o, p = leettriton.decode_step(bt, ct, vt, pool, gamma, slot_ids=slots)
        return o + 0, p

    o, returned = compiled(step)(bt, ct, vt, pool, slots)
    o_ref, _ = step(bt, ct, vt, pool_ref, slots)
    assert returned is pool
    assert torch.equal(o, o_ref) and torch.equal(pool, pool_ref)

    state, state_ref = rand(B, H, r, d, seed=5), rand(B, H, r, d, seed=5)
    o = compiled(lambda bt, ct, vt, s: leettriton.decode_step(bt, ct, vt, s, 0.9)[0])(bt, ct, vt, state)
    assert torch.equal(o, leettriton.decode_step(bt, ct, vt, state_ref, 0.9)[0]) and torch.equal(state, state_ref)

    b, c, v = rand(B, H, 2, r, seed=6), rand(B, H, 2, r, seed=7), rand(B, H, 2, d, seed=8)

    def tokens(b, c, v, pool, slots):
        o, p, kept = leettriton.decode_tokens(b, c, v, pool, gamma, slot_ids=slots, keep_states=True)
        return o, kept

    (o, kept), (o_ref, kept_ref) = compiled(tokens)(b, c, v, pool, slots), tokens(b, c, v, pool_ref, slots)
    assert torch.equal(o, o_ref) and torch.equal(kept, kept_ref) and torch.equal(pool, pool_ref)

    # rectangular: one state per row
    o = compiled(lambda b, c, v, s: leettriton.decode_tokens(b, c, v, s, 0.8)[0])(b, c, v, state)
    assert torch.equal(o, leettriton.decode_tokens(b, c, v, state_ref, 0.8)[0]) and torch.equal(state, state_ref)


def test_varlen_with_a_pool_updates_it_in_place():
    T, H, r, d = 7, 2, 4, 4
    b, c, v = rand(T, H, r, seed=1), rand(T, H, r, seed=2), rand(T, H, d, seed=3)
    cu, slots, starts = torch.tensor([0, 3, 3, 7]), torch.tensor([2, 0, -1]), torch.tensor([True, False, True])
    pool, pool_ref = rand(4, H, r, d, seed=4), rand(4, H, r, d, seed=4)

    def f(b, c, v, pool):
        return leettriton.linear_attention_varlen(b, c, v, cu, 0.9, state_pool=pool, slot_ids=slots,
                                                  has_initial_state=starts)

    o = compiled(f)(b, c, v, pool)
    assert torch.equal(o, f(b, c, v, pool_ref)) and torch.equal(pool, pool_ref)
    o, states = compiled(lambda b, c, v: leettriton.linear_attention_varlen(b, c, v, cu, return_state=True))(b, c, v)
    o_ref, states_ref = leettriton.linear_attention_varlen(b, c, v, cu, return_state=True)
    assert torch.equal(o, o_ref) and torch.equal(states, states_ref)


def layers():
    torch.manual_seed(0)
    return [MultiScaleRetention(32, 2, None, expand_k=0.5, expand_v=1.0, layer_idx=0),
            NormLinearAttention(32, 2, 32, layer_idx=0, num_layers=2, use_lrpe=True)]


@pytest.mark.parametrize("index", [0, 1], ids=["retention", "lightning"])
def test_each_layer_prefills_and_decodes_through_its_cache(index):
    layer = layers()[index]
    x = rand(2, 6, 32)

    def run(x, cache):
        y = layer(x[:, :-1], cache=cache)
        return y, layer(x[:, -1:], cache=cache)

    with torch.no_grad():
        cache, cache_ref = LinearAttentionCache(), LinearAttentionCache()
        (y, step), (y_ref, step_ref) = compiled(run)(x, cache), run(x, cache_ref)
    assert_close(y, y_ref, TOL, "prefill")
    assert_close(step, step_ref, TOL, "decode step")
    assert cache.get_seq_length(0) == cache_ref.get_seq_length(0) == 6
    assert_close(cache.get_state(0), cache_ref.get_state(0), TOL, "state")


def models():
    torch.manual_seed(0)
    retnet = RetNetForCausalLM(RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0,
                                            num_hidden_layers=2, vocab_size=VOCAB, intermediate_size=48,
                                            initializer_range=0.2))
    torch.manual_seed(0)
    transnormer = TransNormerForCausalLM(TransNormerConfig(hidden_size=32, num_heads=2, num_hidden_layers=2,
                                                           vocab_size=VOCAB, glu_dim=48, linear_use_lrpe_list=[1, 0],
                                                           init_std=0.2))
    return {"retnet": retnet, "transnormer": transnormer}


@pytest.mark.parametrize("kind", ["retnet", "transnormer"])
def test_the_models_prefill_train_and_decode(kind):
    model = models()[kind]
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))

    def loss(ids):
        return model(ids, labels=ids, use_cache=False).loss

    model.zero_grad()
    compiled(loss)(ids).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss(ids).backward()
    for name, p in model.named_parameters():
        assert_close(grads[name], p.grad, 1e-4, f"grad of {name}")

    def prefill_and_step(ids, cache):
        logits = model(ids[:, :-1], cache=cache, use_cache=True).logits
        return logits, model(ids[:, -1:], cache=cache, use_cache=True).logits

    with torch.no_grad():
        (logits, step), (logits_ref, step_ref) = (compiled(prefill_and_step)(ids, model.make_cache()),
                                                  prefill_and_step(ids, model.make_cache()))
        assert_close(logits, logits_ref, TOL, "prefill logits")
        assert_close(step, step_ref, TOL, "decode step logits")

        # the step a CUDA graph captures: one token through per-layer states held by the caller
        cache = model.make_cache()
        model(ids[:, :-1], cache=cache, use_cache=True)
        states = [cache.get_state(i).clone() for i in range(2)]
        states_ref = [s.clone() for s in states]
        position = torch.tensor([ids.shape[1] - 1])
        token_logits = compiled(model.decode_token)(ids[:, -1], states, position)
        token_ref = model.decode_token(ids[:, -1], states_ref, position)
    assert_close(token_logits, token_ref, TOL, "decode_token logits")
    assert_close(token_logits, step_ref[:, -1], TOL, "decode_token against the cache's step")
    for s, s_ref in zip(states, states_ref):
        assert_close(s, s_ref, TOL, "states updated in place")


@pytest.mark.parametrize("kind", ["retnet", "transnormer"])
def test_the_models_serving_entry_points_update_their_pools(kind):
    model = models()[kind].eval()
    ids, cu, positions = torch.tensor([5, 9, 2, 7, 7]), torch.tensor([0, 3, 5]), torch.tensor([0, 1, 2, 0, 1])
    slots = torch.tensor([3, 0])

    def serve(ids, pools):
        logits = model.prefill_packed(ids, cu, positions, pools, slots)
        return logits, model.decode_slotted(logits.argmax(-1), torch.tensor([3, 2]), pools, slots)

    pools, pools_ref = model.make_state_pools(4), model.make_state_pools(4)
    (logits, step), (logits_ref, step_ref) = compiled(serve)(ids, pools), serve(ids, pools_ref)
    assert_close(logits, logits_ref, TOL, "prefill_packed logits")
    assert_close(step, step_ref, TOL, "decode_slotted logits")
    for pool, pool_ref in zip(pools, pools_ref):
        assert pool.abs().sum() > 0
        assert_close(pool, pool_ref, TOL, "pool updated in place")


def test_opcheck_every_operator():
    b, c, v = (rand(1, 2, 8, 4, seed=i) for i in range(3))
    gamma, s0 = torch.tensor([0.9, 0.8]), rand(1, 2, 4, 4, seed=3)
    grad = [x.clone().requires_grad_() for x in (b, c, v, s0)]
    opcheck(OPS.linear_attention, (*grad[:3], None, 0.9, grad[3], "auto", "bhnd", True, None))
    opcheck(OPS.linear_attention_backward, (rand(1, 2, 8, 4, seed=4), rand(1, 2, 4, 4, seed=5), b, c, v, s0, gamma,
                                            None, "auto", "bhnd", None, True, True, True, True))
    pool, slots = rand(5, 2, 4, 4, seed=6), torch.tensor([3, -1, 0])
    opcheck(OPS.decode_step, (rand(3, 2, 4), rand(3, 2, 4, seed=1), rand(3, 2, 4, seed=2), pool, gamma, None, slots))
    opcheck(OPS.decode_tokens, (rand(3, 2, 2, 4), rand(3, 2, 2, 4, seed=1), rand(3, 2, 2, 4, seed=2), pool, None,
                                0.9, slots, True))
    T = 7
    opcheck(OPS.linear_attention_varlen, (rand(T, 2, 4), rand(T, 2, 4, seed=1), rand(T, 2, 4, seed=2),
                                          torch.tensor([0, 3, 3, 7]), gamma, None, "auto", pool, slots,
                                          torch.tensor([True, False, True]), True, None, None, None, None, None))
    opcheck(OPS.linear_attention_varlen, (rand(T, 2, 4), rand(T, 2, 4, seed=1), rand(T, 2, 4, seed=2),   # out=
                                          torch.tensor([0, 3, 3, 7]), gamma, None, "auto", pool, slots,
                                          torch.tensor([True, False, True]), False, None, None, rand(T, 2, 4), None,
                                          None))
    T = 70   # checkpoints (docs/design.md §13.9): sequence 1's after 64 rows to slot 2
    opcheck(OPS.linear_attention_varlen, (rand(T, 2, 4), rand(T, 2, 4, seed=1), rand(T, 2, 4, seed=2),
                                          torch.tensor([0, 3, 3, T]), gamma, None, "auto", pool, slots,
                                          torch.tensor([True, False, True]), False, None, None, None, 64,
                                          torch.tensor([[1], [4], [2]])))
    opcheck(OPS.slice_state, (*grad[:3], gamma, None, grad[3], "auto", "bhnd", None))        # distributed's
    opcheck(OPS.slice_state, (b.transpose(1, 2), c.transpose(1, 2), grad[2].transpose(1, 2), None, 0.9, None,
                              "vanilla_torch", "bnhd", None))
