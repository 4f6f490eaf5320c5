"""Gradients: every method's backward against the float64 oracle's autograd (docs/design.md §10).

Each registered method (the Triton kernels -- under the interpreter on a CPU-only machine --, their
PyTorch versions, ``auto``) is differentiated on small problems and compared with the gradients
autograd takes through the float64 oracle, under the forward's tolerance table.  The loss weighs the
output and the final state with random weights (in the inputs' dtype, so 16-bit weights are exact):
a gradient that is flipped in time, transposed, or missing a term cannot pass.  Kept small, because
the CPU suite runs it in CI under Triton's interpreter.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import leettriton
from conftest import DEVICE, HAS_GPU
from helpers import Case, assert_close, magnitudes, tolerance
from leettriton.autograd import LinearAttentionFunction
from leettriton.autotune import current_family
from leettriton.kernels import reverse_space
from leettriton.kernels.reverse import reverse_rows
from leettriton.methods import BUILTIN_METHODS
from leettriton.plan import run_reversed
from leettriton.problem import Problem, make_problem, resolve_gamma, to_bhnd

METHODS = list(leettriton.METHODS)
MAX_N = 200 if HAS_GPU else 40
MAX_DIM = 130 if HAS_GPU else 20
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAMED_GAMMAS = [1.0, 0.999, 0.5, 0.01]
EXAMPLES = max(2, settings.default.max_examples // 4)
"""Hypothesis examples per method: a quarter of the profile's (each example runs four calls)."""
INPUTS = "bcvs"   # b, c, v, initial state


def loss_weights(case: Case, out_shape, seed: int):
    """Random weights of the output (in the inputs' dtype, exact in 16 bits) and of the final state (float32)."""
    g = torch.Generator().manual_seed(seed)
    w_out = torch.randn(out_shape, generator=g).to(device=DEVICE, dtype=case.dtype)
    w_state = torch.randn(case.B, case.H, case.r, case.d, generator=g).to(DEVICE)
    return w_out, w_state


def gradients(run, tensors: dict, needs: str, w_out, w_state, out_loss: bool, state_loss: bool, acc: torch.dtype):
    """Gradients of Σ w_out·o + Σ w_state·state (accumulated in ``acc``) for the inputs named in ``needs``."""
    leaves = {k: x.requires_grad_(k in needs) for k, x in tensors.items() if x is not None}
    out, state = run(**leaves)
    loss = torch.zeros((), dtype=acc, device=DEVICE)
    if out_loss:
        loss = loss + (out.to(acc) * w_out.to(acc)).sum()
    if state_loss:
        loss = loss + (state.to(acc) * w_state.to(acc)).sum()
    wanted = [k for k in INPUTS if k in needs and k in leaves]
    if not loss.requires_grad:  # the oracle's empty output (n = 0) is not in the graph: its gradients are zero
        return {k: torch.zeros_like(leaves[k]) for k in wanted}, out, state
    grads = torch.autograd.grad(loss, [leaves[k] for k in wanted], allow_unused=True, materialize_grads=True)
    return dict(zip(wanted, grads)), out, state


def check_gradients(method: str, case: Case, needs: str = INPUTS, out_loss: bool = True, state_loss: bool = True,
                    precision=None) -> None:
    """``method``'s gradients (and output and state) against the float64 oracle's, at the dtype's tolerance."""
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    return_state = state_loss or case.return_state
    w_out, w_state = loss_weights(case, v.shape, case.seed + 1)

    def ours(b, c, v, s=None):
        res = leettriton.linear_attention(b, c, v, gamma, method=method, layout=case.layout, initial_state=s,
                                          return_state=return_state, precision=precision)
        return res if return_state else (res, None)

    def oracle(b, c, v, s=None):
        return leettriton.reference(b, c, v, gamma, layout=case.layout, initial_state=s, return_state=True)

    got, out, state = gradients(ours, dict(b=b.detach(), c=c.detach(), v=v.detach(), s=s0), needs, w_out, w_state,
                                out_loss, state_loss, torch.float32)
    # the oracle gets float32 copies of 16-bit inputs (exact), so its gradients come back in float32
    ref_inputs = dict(b=b.detach().float(), c=c.detach().float(), v=v.detach().float(),
                      s=None if s0 is None else s0.detach().clone())
    want, ref_out, ref_state = gradients(oracle, ref_inputs, needs, w_out, w_state, out_loss, state_loss,
                                         torch.float64)
    tol = tolerance(case.dtype, precision)
    # TF32 rounds every operand: its error is bounded by the terms' magnitudes, every input and loss weight
    # taken positive (docs/design.md §2.5)
    terms, terms_out, terms_state = {}, None, None
    state16 = return_state and case.dtype != torch.float32   # 16-bit final states too (docs/design.md §2.5)
    if precision == "tf32" or state16:
        sizes = dict(zip(ref_inputs, magnitudes(*ref_inputs.values())))
        if precision == "tf32":
            terms, terms_out, terms_state = gradients(oracle, sizes, needs, w_out.abs(), w_state.abs(), out_loss,
                                                      state_loss, torch.float64)
        else:
            terms_state = oracle(**sizes)[1]
    assert out.grad_fn is not None, f"{method}: the output has no grad_fn [{case.id}]"
    assert_close(out, ref_out, tol, f"{method} output [{case.id}]", terms_out)
    if return_state:
        assert_close(state, ref_state, tol, f"{method} final state [{case.id}]", terms_state)
    for k, grad in got.items():
        x = dict(b=b, c=c, v=v, s=s0)[k]
        assert grad.dtype == x.dtype and grad.shape == x.shape, f"{method} d{k}: {grad.dtype} {tuple(grad.shape)}"
        assert_close(grad, want[k], tol, f"{method} d{k} [{case.id}, loss on {'o' if out_loss else ''}"
                                         f"{'S' if state_loss else ''}, grads of {needs}]", terms.get(k))


@st.composite
def grad_cases(draw, dtypes=DTYPES, max_n=MAX_N):
    H = draw(st.integers(1, 2))
    gamma = draw(st.one_of(st.none(), st.sampled_from(NAMED_GAMMAS), st.floats(0.01, 1.0), st.just("tensor")))
    gammas = tuple(draw(st.lists(st.one_of(st.sampled_from(NAMED_GAMMAS), st.floats(0.01, 1.0)),
                                 min_size=H, max_size=H))) if gamma == "tensor" else ()
    return Case(
        B=draw(st.integers(1, 2)), H=H,
        n=draw(st.one_of(st.sampled_from([0, 1, 2, 15, 16, 17, max_n]), st.integers(0, max_n))),
        r=draw(st.one_of(st.sampled_from([1, 3, 16, 17]), st.integers(1, MAX_DIM))),
        d=draw(st.one_of(st.sampled_from([1, 3, 16, 17]), st.integers(1, MAX_DIM))),
        dtype=draw(st.sampled_from(dtypes)), layout=draw(st.sampled_from(["bhnd", "bnhd"])),
        gamma=gamma, gammas=gammas, initial=draw(st.booleans()), return_state=draw(st.booleans()),
        noncontiguous=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=EXAMPLES)
@given(case=grad_cases(), needs=st.sets(st.sampled_from(INPUTS), min_size=1),
       losses=st.sampled_from([(True, False), (False, True), (True, True)]), tf32=st.booleans())
def test_gradients_match_oracle(method, case, needs, losses, tf32):
    assume(needs != {"s"} or case.initial)
    precision = "tf32" if (tf32 and case.dtype == torch.float32) else None
    check_gradients(method, case, "".join(sorted(needs)), *losses, precision=precision)


NAMED = [
    # every input non-contiguous in the FlashAttention layout, an initial state, per-head γ with 1 among them
    Case(1, 2, 33, 5, 7, layout="bnhd", gamma="tensor", gammas=(1.0, 0.9), initial=True, noncontiguous=True,
         seed=1),
    Case(1, 1, 20, 17, 3, dtype=torch.float16, gamma=0.999, initial=True, seed=2),
    Case(1, 1, 20, 6, 19, dtype=torch.bfloat16, layout="bnhd", gamma=0.5, initial=True, seed=3),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in NAMED])
@pytest.mark.parametrize("method", METHODS)
def test_named_gradients(method, case):
    check_gradients(method, case)


@pytest.mark.parametrize("gamma", NAMED_GAMMAS)
@pytest.mark.parametrize("method", ["lightning_attention", "lightning_attention_torch"])
def test_named_gammas(method, gamma):
    """γ from none at all to a decay that wipes the state within a few rows."""
    check_gradients(method, Case(1, 2, 40, 8, 6, gamma=gamma, initial=True, seed=4))


@pytest.mark.parametrize("method", ["vanilla", "vanilla_torch"])
def test_empty_sequence(method):
    """n = 0: no row ran, the final state is the initial state, so dS₀ = dS and the output still joins the graph."""
    check_gradients(method, Case(1, 2, 0, 3, 4, gamma=0.9, initial=True, return_state=True, seed=5))


@pytest.mark.parametrize("method", ["lightning_attention", "lightning_attention_torch"])
def test_two_piece_training_equals_one_piece(method):
    """Training on a sequence cut in two, the first piece's state passed to the second, gives the gradients
    of one call over the whole sequence: the state between the pieces carries them back."""
    case = Case(1, 2, 30, 6, 5, layout="bnhd", gamma="tensor", gammas=(0.95, 0.6), initial=True, seed=6)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    w_out, w_state = loss_weights(case, v.shape, 7)
    split, axis = 13, 1
    kw = dict(method=method, layout=case.layout, return_state=True)

    def one_piece(b, c, v, s):
        return leettriton.linear_attention(b, c, v, gamma, initial_state=s, **kw)

    def two_pieces(b, c, v, s):
        first, second = zip(*((x.narrow(axis, 0, split), x.narrow(axis, split, case.n - split)) for x in (b, c, v)))
        o1, s1 = leettriton.linear_attention(*first, gamma, initial_state=s, **kw)
        o2, s2 = leettriton.linear_attention(*second, gamma, initial_state=s1, **kw)
        return torch.cat([o1, o2], dim=axis), s2

    inputs = dict(b=b, c=c, v=v, s=s0)
    whole, _, _ = gradients(one_piece, {k: x.clone() for k, x in inputs.items()}, INPUTS, w_out, w_state, True, True,
                            torch.float32)
    pieces, _, _ = gradients(two_pieces, {k: x.clone() for k, x in inputs.items()}, INPUTS, w_out, w_state, True,
                             True, torch.float32)
    for k in INPUTS:
        assert_close(pieces[k], whole[k], tolerance(case.dtype), f"{method} d{k}: two pieces vs one")


@pytest.mark.parametrize("method", ["lightning_attention", "vanilla_torch", "auto"])
def test_gamma_that_requires_grad_gets_its_gradient(method):
    """A learnable γ: dγ_h = Σ_t da_t / γ_h (docs/gradients.md), against float64 autograd through the oracle
    with a_t = ln γ_h (tests/test_log_decay.py checks it further)."""
    b, c, v, _, _ = Case(1, 2, 9, 3, 4).tensors(DEVICE)
    gamma = torch.tensor([0.9, 0.8], device=DEVICE, requires_grad=True)
    for grad_of_b in (False, True):   # γ alone, then γ and b
        b.requires_grad_(grad_of_b)
        out = leettriton.linear_attention(b, c, v, gamma, method=method)
        go = torch.randn_like(out)
        (dg,) = torch.autograd.grad((out * go).sum(), gamma)
        a = torch.log(gamma).view(1, 2, 1).expand(1, 2, 9)
        ref = leettriton.reference(b, c, v, log_decay=a)
        (rg,) = torch.autograd.grad((ref * go.double()).sum(), gamma)
        assert torch.allclose(dg.double(), rg.double(), rtol=1e-4, atol=1e-5)
    out = leettriton.linear_attention(b, c, v, gamma.detach(), method=method)
    assert out.grad_fn is not None


def test_user_method_backward_calls_the_method():
    """A registered method's backward is three more calls of the same method (docs/design.md §10.2)."""
    calls = []

    def mine(b, c, v, gamma, *, initial_state=None, return_state=False):
        calls.append((tuple(b.shape), initial_state is not None, return_state))
        res = leettriton.reference(b, c, v, gamma, initial_state=initial_state, return_state=return_state)
        return (res[0].to(v.dtype), res[1].float()) if return_state else res.to(v.dtype)

    leettriton.register_method("mine_for_grad_test", mine)
    try:
        case = Case(1, 2, 11, 3, 4, gamma=0.8, initial=True, seed=8)
        check_gradients("mine_for_grad_test", case)
        # forward (b, c, v); db (do, v, c, S₀ᵀ); dc reversed (v, do, b); dv reversed (c, b, do) with its state
        assert calls == [((1, 2, 11, 3), True, True), ((1, 2, 11, 4), True, False), ((1, 2, 11, 4), False, False),
                         ((1, 2, 11, 3), False, True)]
    finally:
        leettriton.unregister_method("mine_for_grad_test")


# --------------------------------------------------------------------------- the row reversal (§10.3)

def reversal_inputs(layout: str, dtype: torch.dtype, n: int, seed: int):
    """Three tensors of one (batch 2, heads 3, n) in ``layout``, none of them contiguous: a strided column
    slice (odd dim 3), a view of the other layout's storage (dim 130: two column tiles), and an expanded
    one (stride 0 along heads, dim 17), as the backward meets them (a gradient may come expanded)."""
    g = torch.Generator().manual_seed(seed)

    def to_layout(x):  # logical (B, H, n, dim) -> layout
        return x if layout == "bhnd" else x.transpose(1, 2)

    sliced = to_layout(torch.randn(2, 3, n, 7, generator=g).to(DEVICE, dtype)[..., 1::2])
    storage = (2, n, 3, 130) if layout == "bhnd" else (2, 3, n, 130)           # the other layout's
    other = torch.randn(*storage, generator=g).to(DEVICE, dtype).transpose(1, 2)
    expanded = to_layout(torch.randn(2, 1, n, 17, generator=g).to(DEVICE, dtype).expand(2, 3, n, 17))
    tensors = [sliced, other, expanded]
    assert not any(x.is_contiguous() for x in tensors)
    return tensors


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_reverse_rows_equals_flip(dtype, layout):
    """One launch reverses 1, 2 or 3 tensors of different dims and strides, bit for bit as torch.flip,
    into new tensors contiguous in the layout (n = 37: blocks of rows with a partial last one); every
    config of the family (on the GPU: each the autotuner may pick)."""
    axis = 2 if layout == "bhnd" else 1
    tensors = reversal_inputs(layout, dtype, 37, seed=5)
    before = [x.clone() for x in tensors]
    family = current_family()
    configs = reverse_space.ROWS.family_configs(family)
    assert configs
    for cfg in configs:
        for group in (tensors, tensors[1:], tensors[2:]):
            got = reverse_rows(group, layout, config={reverse_space.ROWS.name: cfg})
            assert len(got) == len(group)
            for i, (x, y) in enumerate(zip(group, got)):
                what = f"tensor {i} of {len(group)}, {tuple(x.shape)} strides {x.stride()}, config {cfg}"
                assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous(), what
                if not torch.equal(y, x.flip(axis)):
                    bad = (y != x.flip(axis)).nonzero()[0].tolist()
                    raise AssertionError(f"{what}: differs from torch.flip, first at {bad}")
    for x, x0 in zip(tensors, before):
        assert torch.equal(x, x0), "an input was written"


@pytest.mark.parametrize("n", [0, 1, 2, 16])
def test_reverse_rows_short_sequences(n):
    """No rows, one row (its own reverse), two, and exactly one block of rows."""
    x, y = (torch.randn(1, 2, n, k).to(DEVICE, torch.float16) for k in (5, 16))
    got = reverse_rows([x, y])
    assert torch.equal(got[0], x.flip(2)) and torch.equal(got[1], y.flip(2))


def test_reverse_rows_refuses_bad_input():
    x = torch.zeros(1, 2, 5, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"tensors must hold 1 to 3 tensors, got 4"):
        reverse_rows([x, x, x, x])
    with pytest.raises(TypeError, match=r"tensors must be a list or tuple"):
        reverse_rows(x)
    with pytest.raises(ValueError, match=r"must share batch, heads, n and device"):
        reverse_rows([x, torch.zeros(1, 2, 6, 4, device=DEVICE)])
    with pytest.raises(ValueError, match=r"tensors\[0\] must be 4-D"):
        reverse_rows([x[0]])
    with pytest.raises(TypeError, match=r"tensors\[0\] must be float16, bfloat16, float32 or float64"):
        reverse_rows([x.int()])
    with pytest.raises(ValueError, match=r"layout must be 'bhnd' or 'bnhd'"):
        reverse_rows([x], "bhdn")


def count_reversals(monkeypatch) -> list:
    """The tensor counts of every ``reverse_rows`` call the backward makes from now on.  One call is one launch
    (test_reverse_rows_equals_flip); the calls are counted where the backward makes them, since on CUDA autograd
    runs the backward in a thread of its own, where a launch recorder (thread-local) would not see them."""
    counts = []

    def counting(tensors, *args, **kwargs):
        counts.append(len(tensors))
        return reverse_rows(tensors, *args, **kwargs)

    monkeypatch.setattr(leettriton.autograd, "reverse_rows", counting)
    return counts


def backward_of(method: str, needs: str, layout: str = "bhnd", counts_from=None, grad=None):
    """The gradients of ``needs`` of one call of ``method`` (float16, decay, returned state) for the output
    gradient ``grad(out)`` (default: ones); ``counts_from(...)`` starts counting just before the backward."""
    case = Case(1, 2, 19, 5, 6, dtype=torch.float16, layout=layout, gamma=0.9, initial="s" in needs, seed=3)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    leaves = dict(b=b, c=c, v=v, s=s0)
    for k, x in leaves.items():
        if x is not None:
            x.requires_grad_(k in needs)
    out = leettriton.linear_attention(b, c, v, gamma, method=method, layout=layout, initial_state=s0,
                                      return_state=True)[0]
    counts = counts_from() if counts_from is not None else None
    out.backward(torch.ones_like(out) if grad is None else grad(out))
    return {k: leaves[k].grad for k in needs}, counts


@pytest.mark.parametrize("needs", ["bcv", "c", "v", "bs"])
@pytest.mark.parametrize("method", list(BUILTIN_METHODS) + ["auto"])
def test_backward_makes_no_reversed_copies(method, needs, monkeypatch):
    """The Triton methods run the reversed calls on the tensors as they are (reversed problems, docs/design.md
    §10.3): the backward makes no reversal launch at all."""
    _, counts = backward_of(method, needs, counts_from=lambda: count_reversals(monkeypatch))
    assert counts == [], f"{method}, grads of {needs}: reversal launches of {counts} tensors, expected none"


@pytest.mark.parametrize("needs", ["bcv", "c", "v", "bs"])
def test_copy_path_reverses_with_one_launch_per_group(needs, monkeypatch):
    """A method that cannot address reversed rows (here a user method) gets reversed copies from the reversal
    kernel (no torch.flip): v, b and do by one launch, c by one, each output back by one; without dc, b and do
    by one.  Its gradients equal those of the built-in walk, which makes no copies."""
    def mine(b, c, v, gamma, *, initial_state=None, return_state=False):
        res = leettriton.reference(b, c, v, gamma, initial_state=initial_state, return_state=return_state)
        return (res[0].to(v.dtype), res[1].float()) if return_state else res.to(v.dtype)

    leettriton.register_method("mine_for_copy_test", mine)
    try:
        got, counts = backward_of("mine_for_copy_test", needs, counts_from=lambda: count_reversals(monkeypatch))
    finally:
        leettriton.unregister_method("mine_for_copy_test")
    want = {"bcv": [3, 1, 1, 1], "c": [3, 1], "v": [2, 1, 1], "bs": [2, 1]}[needs]
    assert counts == want, f"grads of {needs}: reversal launches of {counts} tensors, expected {want}"
    walk, _ = backward_of("lightning_attention", needs)
    for k in needs:
        assert_close(got[k], walk[k].float(), tolerance(torch.float16), f"d{k}: copies (reference) vs reversed walk")


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_reversed_calls_read_an_expanded_gradient(method, layout):
    """An output gradient expanded from one value (stride 0 everywhere: ``out.sum().backward()``) is read as it
    is by the reversed calls; the gradients are bit for bit those of the same gradient made contiguous."""
    expanded, _ = backward_of(method, "bcvs", layout, grad=lambda out: torch.ones(1, dtype=out.dtype,
                                                                                device=out.device).expand_as(out))
    dense, _ = backward_of(method, "bcvs", layout)
    for k in "bcvs":
        assert torch.equal(expanded[k], dense[k]), f"{method} d{k}: expanded gradient differs from a contiguous one"


# --------------------------------------------------------------------------- reversed problems (§10.3)

REVERSED_CASES = [
    # odd n, every input a strided slice in the FlashAttention layout, an initial state, per-head γ with 1 among them
    Case(2, 2, 37, 5, 7, layout="bnhd", gamma="tensor", gammas=(1.0, 0.9), initial=True, noncontiguous=True,
         seed=11),
    # fewer rows than one chunk; one row; none
    Case(1, 2, 5, 3, 4, dtype=torch.float16, gamma=0.9, seed=12),
    Case(1, 1, 1, 3, 4, dtype=torch.bfloat16, layout="bnhd", gamma=0.5, initial=True, seed=13),
    Case(1, 2, 0, 3, 4, gamma=0.9, initial=True, seed=14),
    # several segments (under the interpreter 40 rows each: three, summed by each walk program, and five, by the
    # scan; on a GPU segments are 1024 rows or more), odd n, strided
    Case(1, 2, 101 if not HAS_GPU else 2500, 4, 6, dtype=torch.float16, layout="bnhd", gamma=0.95, initial=True,
         noncontiguous=True, seed=15),
    Case(1, 1, 163 if not HAS_GPU else 5001, 3, 5, gamma=0.99, initial=True, noncontiguous=True, seed=16),
]


def reversed_forward(method: str, case: Case, b, c, v, gamma, s0):
    """The output and final state of ``method`` run on the reversed problem of (b, c, v)."""
    p, out = make_problem(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=True, reverse=True)
    assert run_reversed(p, method), f"{method}: refused a reversed problem"
    return out, p.state


def assert_reversed_equals_flipped(method: str, case: Case, b, c, v, gamma, s0) -> None:
    """``method`` on the reversed problem of (b, c, v) equals, bit for bit, ``method`` on flipped copies of them
    with its output flipped back (the same rows in the same order reach the kernels), and its final state."""
    axis = 2 if case.layout == "bhnd" else 1
    out, state = reversed_forward(method, case, b, c, v, gamma, s0)
    want, want_state = leettriton.linear_attention(b.flip(axis), c.flip(axis), v.flip(axis), gamma, method=method,
                                                   layout=case.layout, initial_state=s0, return_state=True)
    want = want.flip(axis)
    for what, x, y in (("output", out, want), ("final state", state, want_state)):
        if not torch.equal(x, y):
            bad = (x != y).nonzero()[0].tolist()   # NaN (an element left unwritten) differs from everything
            raise AssertionError(f"{method} [{case.id}]: the reversed problem's {what} differs from the forward on "
                                 f"flipped copies, first at {bad}: {x[tuple(bad)].item()} vs {y[tuple(bad)].item()}")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in REVERSED_CASES])
@pytest.mark.parametrize("method", BUILTIN_METHODS)
def test_reversed_problem_equals_forward_on_flipped_copies(method, case):
    assert_reversed_equals_flipped(method, case, *case.tensors(DEVICE))


@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_reversed_problem_in_pieces_of_r(method):
    """r past the walk's 256 keys: pieces of r (kernels/pieces.py) over one float32 buffer, each reversed."""
    case = Case(1, 1, 45 if not HAS_GPU else 3000, 260, 3, dtype=torch.float16, gamma=0.9, initial=True, seed=17)
    assert_reversed_equals_flipped(method, case, *case.tensors(DEVICE))


def test_reversed_recurrence_in_pieces_of_rows(monkeypatch):
    """causal_dot_product cuts a sequence whose 32-bit row offsets would overflow into pieces chained through the
    state; a reversed problem's pieces are its own rows (``Problem.rows``).  The bound is lowered here so that
    a 50-row sequence runs as pieces of 9 rows."""
    from leettriton.methods.causal_dot_product import kernels as cdp, space as cdp_space

    case = Case(1, 2, 50, 4, 6, layout="bnhd", gamma=0.9, initial=True, noncontiguous=True, seed=18)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    row_stride = max(x.stride(1) for x in (b, c, v))     # bnhd: the row stride (the output's is smaller)
    monkeypatch.setattr(cdp, "_MAX_OFFSET", row_stride * (9 + 2 * cdp_space.MAX_BT))
    launches = []
    real = cdp._launch
    monkeypatch.setattr(cdp, "_launch", lambda p, config: (launches.append(p.shape[2]), real(p, config)))
    assert_reversed_equals_flipped("causal_dot_product", case, b, c, v, gamma, s0)
    # the reversed call's pieces, then the flipped call's: each call's pieces cover its 50 rows, in several
    # pieces (their length depends on the largest row stride of the call's tensors, its output's included)
    reversed_pieces = []
    while sum(reversed_pieces) < 50:
        reversed_pieces.append(launches[len(reversed_pieces)])
    assert sum(reversed_pieces) == 50 and len(reversed_pieces) > 1 and sum(launches) == 100, launches


def test_reversed_problem_rows_are_its_own():
    """Rows [a, z) of a reversed problem are rows [a, z) of the flipped tensors, still reversed."""
    b, c, v, _, _ = Case(1, 2, 11, 3, 4, seed=19).tensors(DEVICE)
    p, _ = make_problem(b, c, v, reverse=True)
    piece = p.rows(2, 7)
    assert piece.reverse and piece.shape[2] == 5
    for x, whole in ((piece.b, b), (piece.c, c), (piece.v, v)):
        assert torch.equal(x.flip(2), whole.flip(2)[:, :, 2:7])


@pytest.mark.parametrize("method", ["lightning_attention_torch", "user"])
def test_reversed_problem_refused_where_rows_are_not_addressed(method, monkeypatch):
    """A method whose rows are not addressed through the kernel ABI (a PyTorch method, a user method) runs
    nothing on a reversed problem: ``run_reversed`` says so and the backward makes copies instead."""
    def mine(b, c, v, gamma, *, initial_state=None, return_state=False):
        raise AssertionError("a user method was called on a reversed problem")

    if method == "user":
        leettriton.register_method("mine_for_reversal", mine)
        method = "mine_for_reversal"
    try:
        b, c, v, _, _ = Case(1, 2, 11, 3, 4, seed=20).tensors(DEVICE)
        p, out = make_problem(b, c, v, 0.9, reverse=True)
        assert not run_reversed(p, method)
        assert out.isnan().all(), "an output was written"
        with pytest.raises(ValueError, match="run_reversed takes a reversed problem"):
            run_reversed(make_problem(b, c, v)[0], "lightning_attention")
    finally:
        if method == "mine_for_reversal":
            leettriton.unregister_method(method)


@pytest.mark.parametrize("method", ["block_based", "fleet_attention", "recursion"])
def test_gradients_over_several_segments(method):
    """The backward of the methods that cut the sequence into segments (or leaves), with sequences long enough
    for several of them: the reversed calls' segment states run on the reversed rows too."""
    n = 130 if not HAS_GPU else 5000
    check_gradients(method, Case(1, 2, n, 5, 6, dtype=torch.float16, layout="bnhd", gamma="tensor",
                                 gammas=(0.99, 0.8), initial=True, noncontiguous=True, seed=21))


# --------------------------------------------------------------------------- two-part bfloat16 operands

def _rel(x, ref) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_two_part_bfloat16_operands(method, reverse):
    """The backward's problems (``two_part``): in bfloat16 the state before its product with b and the decayed
    values before each state update go in as hi + lo, so the output and the final state come closer to the
    float64 oracle than with one rounding each; block_based's segment states too (launches counted).  float16
    problems ignore the flag (bit for bit)."""
    from leettriton.autotune import recording
    from leettriton.kernels import segments
    from leettriton.plan import run_problem

    g = torch.Generator().manual_seed(5)
    B, H, n, r, d = 1, 2, 200 if not HAS_GPU else 3000, 32, 40
    b, c, v = (torch.randn(B, H, n, k, generator=g).to(DEVICE, torch.bfloat16) for k in (r, r, d))
    s0 = torch.randn(B, H, r, d, generator=g).to(DEVICE)
    gamma = torch.tensor([0.9, 0.99], device=DEVICE)
    rows = (lambda x: x.flip(2)) if reverse else (lambda x: x)
    ref, ref_state = leettriton.reference(rows(b), rows(c), rows(v), gamma, initial_state=s0, return_state=True)
    ref = rows(ref)

    def run(x, two_part):
        p, out = make_problem(x[0], x[1], x[2], gamma, initial_state=s0, return_state=True, reverse=reverse,
                              two_part=two_part)
        with recording() as log:
            assert run_reversed(p, method) if reverse else run_problem(p, method) is None
        segment_launches = sum(kernel is segments._segment_state_kernel for kernel, _ in log)
        return out, p.state, segment_launches

    (o1, s1, seg1), (o2, s2, seg2) = run((b, c, v), False), run((b, c, v), True)
    if method == "block_based":
        assert seg1 > 0 and seg2 > 0, "the sequence is not cut into segments: the segment kernel is not tested"
    err = [(_rel(o, ref), _rel(st, ref_state)) for o, st in ((o1, s1), (o2, s2))]
    assert err[1][0] < 0.8 * err[0][0], f"output: two parts {err[1][0]:.2e}, one rounding {err[0][0]:.2e}"
    assert err[1][1] < 0.01 * err[0][1], f"final state: two parts {err[1][1]:.2e}, one rounding {err[0][1]:.2e}"
    assert err[1][0] < tolerance(torch.bfloat16)
    half = tuple(x.to(torch.float16) for x in (b, c, v))
    (h1, hs1, _), (h2, hs2, _) = run(half, False), run(half, True)
    assert torch.equal(h1, h2) and torch.equal(hs1, hs2), "float16 must ignore two_part"


def test_backward_calls_run_two_part_problems(monkeypatch):
    """The three calls of a bfloat16 backward build ``two_part`` problems (the db call and both reversed
    calls); the forward does not."""
    import leettriton.autograd as autograd_module

    made = []
    real = autograd_module.make_problem

    def spy(*args, **kwargs):
        made.append(kwargs.get("two_part", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(autograd_module, "make_problem", spy)
    g = torch.Generator().manual_seed(6)
    b, c, v = (torch.randn(1, 2, 40, 8, generator=g).to(DEVICE, torch.bfloat16).requires_grad_() for _ in range(3))
    o = leettriton.linear_attention(b, c, v, 0.9, method="lightning_attention")
    assert made == []
    torch.autograd.grad(o, (b, c, v), torch.randn_like(o))
    assert made == [True, True, True]


# --------------------------------------------------------------------------- gradcheck in float64

def float64_problem(b, c, v, gamma, initial_state, layout: str, return_state: bool):
    """A float64 Problem built directly (the public functions take 16- and 32-bit inputs only), its output view
    and its output in ``layout``."""
    bb, cc, vv = (to_bhnd(x, layout) for x in (b, c, v))
    B, H, n, r = bb.shape
    d = vv.shape[-1]
    out = torch.empty((B, H, n, d) if layout == "bhnd" else (B, n, H, d), dtype=torch.float64, device=DEVICE)
    state = torch.empty(B, H, r, d, dtype=torch.float64, device=DEVICE) if return_state else None
    p = Problem(bb, cc, vv, resolve_gamma(gamma, H, vv.device), initial_state, to_bhnd(out, layout), state, "ieee")
    return p, out


def float64_operator(name: str, layout: str):
    """The PyTorch method ``name`` as the backward's operator, in float64."""
    twin = leettriton.registry.torch_method(name)

    def op(b, c, v, gamma, *, initial_state=None, return_state=False):
        p, out = float64_problem(b, c, v, gamma, initial_state, layout, return_state)
        twin(p)
        return (out, p.state) if return_state else out

    return op


def float64_inputs(B, H, n, r, d, layout, seed):
    g = torch.Generator().manual_seed(seed)

    def make(k):
        x = torch.randn(B, H, n, k, generator=g, dtype=torch.float64)
        return (x if layout == "bhnd" else x.transpose(1, 2).contiguous()).to(DEVICE).requires_grad_()

    s0 = torch.randn(B, H, r, d, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    return make(r), make(r), make(d), s0


@pytest.mark.parametrize("name", [f"{m}_torch" for m in BUILTIN_METHODS])
def test_torch_methods_pass_gradcheck(name):
    """The PyTorch methods are differentiated by autograd itself; in float64 its gradients are the true ones
    (n = 70 crosses every method's blocks of rows)."""
    gamma = torch.tensor([0.97, 0.6], dtype=torch.float64, device=DEVICE)
    op = float64_operator(name, "bhnd")
    inputs = float64_inputs(1, 2, 70, 3, 2, "bhnd", 9)
    assert torch.autograd.gradcheck(lambda b, c, v, s: op(b, c, v, gamma, initial_state=s, return_state=True),
                                    inputs, fast_mode=True)


@pytest.mark.parametrize("gamma", [None, 0.7], ids=["no_decay", "decay"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_backward_formulas_pass_gradcheck(layout, gamma):
    """The autograd node's backward (three calls of the operator, the final-state terms, dS₀), run in float64
    with a PyTorch method as the operator, against finite differences."""
    op = float64_operator("vanilla_torch", layout)
    inputs = float64_inputs(1, 2, 7, 3, 2, layout, 10)

    def fn(b, c, v, s):
        return LinearAttentionFunction.apply(b, c, v, s, gamma, op, layout, True)

    assert torch.autograd.gradcheck(fn, inputs)
