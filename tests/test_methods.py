"""Property tests: every registered method against the float64 oracle.

Each property runs for every method in ``leettriton.METHODS`` (the Triton
kernels -- under the interpreter on a CPU-only machine -- their PyTorch
versions, and ``auto``), so a method that joins the registry joins these tests
with no change here.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leettriton
from leettriton.kernels.pieces import in_r_pieces
from leettriton.problem import make_problem
from conftest import DEVICE, HAS_GPU
from helpers import Case, assert_close, magnitudes, tolerance

METHODS = [m for m in leettriton.METHODS]
MAX_N = 600 if HAS_GPU else 200
MAX_DIM = 256 if HAS_GPU else 130
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
AWKWARD_N = [0, 1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129]
AWKWARD_DIM = [1, 3, 16, 17, 31, 33, 64, 100, 128]
NAMED_GAMMAS = [1.0, 0.999, 0.5, 0.01]


@st.composite
def cases(draw, dtypes=DTYPES, min_n=0, max_n=MAX_N, max_dim=MAX_DIM):
    H = draw(st.integers(1, 3))
    gamma = draw(st.one_of(st.none(), st.sampled_from(NAMED_GAMMAS), st.floats(0.01, 1.0), st.just("tensor")))
    gammas = tuple(draw(st.lists(st.one_of(st.sampled_from(NAMED_GAMMAS), st.floats(0.01, 1.0)),
                                 min_size=H, max_size=H))) if gamma == "tensor" else ()
    return Case(
        B=draw(st.integers(1, 2)),
        H=H,
        n=draw(st.one_of(st.sampled_from([n for n in AWKWARD_N if min_n <= n <= max_n]),
                         st.integers(min_n, max_n))),
        r=draw(st.one_of(st.sampled_from([x for x in AWKWARD_DIM if x <= max_dim]), st.integers(1, max_dim))),
        d=draw(st.one_of(st.sampled_from([x for x in AWKWARD_DIM if x <= max_dim]), st.integers(1, max_dim))),
        dtype=draw(st.sampled_from(dtypes)),
        layout=draw(st.sampled_from(["bhnd", "bnhd"])),
        gamma=gamma,
        gammas=gammas,
        initial=draw(st.booleans()),
        return_state=draw(st.booleans()),
        noncontiguous=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def check_against_oracle(method: str, case: Case, precision=None) -> None:
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    tol = tolerance(case.dtype, precision)
    result = leettriton.linear_attention(b, c, v, gamma, method=method, layout=case.layout, initial_state=s0,
                                         return_state=case.return_state, precision=precision)
    ref = leettriton.reference(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=True)
    # measured against the terms' magnitudes (docs/design.md §2.5): TF32's outputs and states (it rounds every
    # operand), and 16-bit inputs' final states (a sum over time of decayed values each rounded on its own)
    tf32, sixteen = precision == "tf32", case.dtype != torch.float32
    terms = (leettriton.reference(*magnitudes(b, c, v), gamma, layout=case.layout, initial_state=magnitudes(s0)[0],
                                  return_state=True) if tf32 or (sixteen and case.return_state) else (None, None))
    out = result[0] if case.return_state else result
    assert out.dtype == v.dtype and out.shape == v.shape
    assert_close(out, ref[0], tol, f"{method} output [{case.id}]", terms[0] if tf32 else None)
    if case.return_state:
        state = result[1]
        assert state.dtype == torch.float32 and state.shape == (case.B, case.H, case.r, case.d)
        assert_close(state, ref[1], tol, f"{method} final state [{case.id}]", terms[1])


@pytest.mark.parametrize("method", METHODS)
@given(case=cases(), tf32=st.booleans())
def test_matches_oracle(method, case, tf32):
    precision = "tf32" if (tf32 and case.dtype == torch.float32) else None
    check_against_oracle(method, case, precision)


NAMED = [
    Case(1, 1, 1, 1, 1, gamma=0.5),
    Case(1, 2, 65, 17, 33, gamma=0.999, initial=True, return_state=True),
    Case(2, 1, 129, 3, 100, dtype=torch.float16, layout="bnhd", gamma=0.01),
    Case(1, 2, 100, 130, 7, dtype=torch.bfloat16, gamma="tensor", gammas=(1.0, 0.9), initial=True,
         return_state=True),
    Case(1, 1, 40, 256, 256, gamma=0.9, initial=True, return_state=True),
    Case(2, 3, 64, 64, 64, dtype=torch.float16, noncontiguous=True, layout="bnhd", gamma=1.0, return_state=True),
    Case(1, 2, 300, 32, 48, dtype=torch.float16, gamma=None, initial=True, return_state=True),
    Case(1, 1, 0, 8, 8, gamma=0.9, initial=True, return_state=True),
    # a float16 state of 0.623 from terms of magnitude 11.2: vanilla errs by 1.3e-3, 2.1e-3 of the state
    Case(1, 1, 65, 1, 1, dtype=torch.float16, gamma=0.875, return_state=True, seed=1),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in NAMED])
@pytest.mark.parametrize("method", METHODS)
def test_named_cases(method, case):
    check_against_oracle(method, case)


WIDE = [
    Case(1, 1, 12, 300, 40, gamma=0.9, initial=True, return_state=True),   # r past the walk's 256: two pieces
    Case(1, 2, 10, 24, 600, dtype=torch.float16, layout="bnhd", gamma="tensor", gammas=(0.99, 0.5)),
    Case(1, 1, 9, 513, 130, dtype=torch.bfloat16, noncontiguous=True, gamma=1.0, initial=True,
         return_state=True),                                                 # three pieces, the last 1 wide
    # three pieces of 256: the first two write float32 buffers of one shape and strides, the last the strided output
    Case(1, 2, 7, 768, 9, layout="bnhd", gamma=0.95, initial=True, return_state=True),
    Case(1, 2, 16 if not HAS_GPU else 300, 256, 512, dtype=torch.float16, gamma="tensor", gammas=(0.97, 0.999),
         initial=True, return_state=True),                                   # RetNet-1.3B's head
    # on a GPU, RetNet-1.3B's layer at 1 × 8 heads × 2048: block_based's 8-warp walk in four segments of 512 rows (a
    # large state's shortest, methods/block_based/space.py), each walk summing up to three start states itself (the
    # interpreter's segments are 40 rows whatever the widths: the case above covers them there)
    # and in bfloat16, where `auto` runs the point of h200.json measured apart (`block_based`'s 8-warp walk in 32-row
    # chunks with all of r as one tile, three stages, in the rule's four segments)
    *([Case(1, 8, 2048, 256, 512, dtype=dt, gamma="tensor",
            gammas=(0.97, 0.99, 0.995, 0.999, 0.9, 0.999, 0.98, 1.0), return_state=True)
       for dt in (torch.float16, torch.bfloat16)] if HAS_GPU else []),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in WIDE])
@pytest.mark.parametrize("method", METHODS)
def test_wide_dims(method, case):
    """r and d past 256 (up to problem.MAX_DIM): the walk runs r in pieces, the others tile it."""
    check_against_oracle(method, case)


@pytest.mark.parametrize("r, widths", [(200, [200]), (300, [256, 44]), (700, [256, 256, 188]), (1024, [256] * 4)])
def test_pieces_of_r_chain_through_float32_partials(r, widths):
    """kernels/pieces.py's schedule, with a stand-in launch: the pieces' widths; the first adds no partial
    sum, each later one the previous piece's float32 output; only the last writes the caller's output; and
    no launch reads the buffer it writes (a launch run again, as an autotuning trial runs it, gives the
    same result)."""
    case = Case(1, 2, 5, r, 3, dtype=torch.float16, gamma=0.9, initial=True, return_state=True)
    b, c, v, _, s0 = case.tensors(DEVICE)
    p, out = make_problem(b, c, v, 0.9, initial_state=s0, return_state=True)
    seen = []
    in_r_pieces(p, 256, lambda piece, partial: seen.append((piece, partial)))
    assert [piece.b.shape[-1] for piece, _ in seen] == widths
    assert [piece.c.shape[-1] for piece, _ in seen] == widths
    assert [piece.state.shape[2] for piece, _ in seen] == widths
    assert seen[0][1] is None
    assert seen[-1][0].out is p.out
    for (before, _), (piece, partial) in zip(seen, seen[1:]):
        assert partial is before.out and partial.dtype == torch.float32 and partial.shape == p.out.shape
        assert piece.out.data_ptr() != partial.data_ptr()
    for piece, _ in seen[:-1]:
        assert piece.out.dtype == torch.float32 and piece.out.data_ptr() != p.out.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("path", ["lightning_attention", "block_based", "varlen"])
def test_pieces_of_r_keep_scores_that_cancel_between_them(path, dtype):
    """r = 512 in two pieces whose scores cancel: b = [x, x], c = [y, ε z − y] (ε = 1/32), so each piece's
    scores are about 1/ε times the whole score's.  Rounded once per piece to the input dtype they err by the
    dtype's precision of the pieces (8.3e-3 in float16, 7.8e-2 in bfloat16: 4 and 8 times the tolerance); the
    walk makes a piece's product with v in two parts (kernels/pieces.py).  n stays inside one chunk, so every
    output comes from the scores alone (past it the state enters through its product with b, whose operand
    is rounded per element, pieces or not)."""
    g = torch.Generator().manual_seed(3)
    n, W, d = 16, 256, 8
    x, y, z = (torch.randn(1, 2, n, W, generator=g) for _ in range(3))
    b = torch.cat([x, x], -1).to(DEVICE, dtype)
    c = torch.cat([y, z / 32 - y], -1).to(DEVICE, dtype)
    v = torch.randn(1, 2, n, d, generator=g).to(DEVICE, dtype)
    ref = leettriton.reference(b, c, v, 0.9)
    if path == "varlen":  # the packed walk: the same rows as one sequence, and an empty one after it
        cu = torch.tensor([0, n, n], dtype=torch.int32, device=DEVICE)
        out = leettriton.linear_attention_varlen(b[0].transpose(0, 1), c[0].transpose(0, 1), v[0].transpose(0, 1),
                                                 cu, 0.9).transpose(0, 1)[None]
    else:
        out = leettriton.linear_attention(b, c, v, 0.9, method=path)
    assert_close(out, ref, tolerance(dtype), f"{path} with cancelling pieces of r")


@settings(max_examples=2 if not HAS_GPU else 10)
@pytest.mark.parametrize("method", METHODS)
@given(case=cases(max_n=12 if not HAS_GPU else MAX_N), r=st.integers(257, 1024), d=st.integers(257, 1024))
def test_wide_dims_match_oracle(method, case, r, d):
    check_against_oracle(method, dataclasses.replace(case, B=1, H=1, gamma=None if case.gamma == "tensor" else case.gamma,
                                                     gammas=(), r=r, d=d))


# The chaining and linearity properties are structural: on the CPU (the interpreter) they draw shorter and
# narrower cases (n still crosses chunk edges; every width is covered by test_matches_oracle), so that no single
# CPU test runs past a minute; on a GPU they draw the full ranges.
PROPERTY_N = MAX_N if HAS_GPU else 130
PROPERTY_DIM = MAX_DIM if HAS_GPU else 64


def property_n(method: str) -> int:
    """The longest sequence the chaining and linearity properties draw for ``method``.  causal_dot_product walks
    the rows in blocks of 4 (its interpreter config), one loop step of every program a block, slow under the
    interpreter: on the CPU its cases stop at 64 rows (16 blocks, the last one partial where n is not a multiple
    of 4)."""
    return 64 if method == "causal_dot_product" and not HAS_GPU else PROPERTY_N


@pytest.mark.parametrize("method", METHODS)
@given(data=st.data())
def test_two_pieces_equal_one(method, data):
    """Running n rows in two pieces, chaining the state, gives the one-piece output and state."""
    case = data.draw(cases(min_n=2, max_n=property_n(method), max_dim=PROPERTY_DIM), label="case")
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    split = data.draw(st.integers(1, case.n - 1), label="split")
    axis = 2 if case.layout == "bhnd" else 1  # the sequence axis
    first, second = zip(*((x.narrow(axis, 0, split), x.narrow(axis, split, case.n - split)) for x in (b, c, v)))
    kw = dict(method=method, layout=case.layout)
    whole, state = leettriton.linear_attention(b, c, v, gamma, initial_state=s0, return_state=True, **kw)
    o1, s1 = leettriton.linear_attention(first[0], first[1], first[2], gamma, initial_state=s0, return_state=True,
                                         **kw)
    o2, s2 = leettriton.linear_attention(second[0], second[1], second[2], gamma, initial_state=s1,
                                         return_state=True, **kw)
    tol = tolerance(case.dtype)
    assert_close(torch.cat([o1, o2], dim=axis), whole, tol, f"{method} two pieces vs one [{case.id}]")
    assert_close(s2, state, tol, f"{method} chained state [{case.id}]")


@pytest.mark.parametrize("method", METHODS)
@given(data=st.data(), alpha=st.floats(-3.0, 3.0))
def test_linear_in_v(method, data, alpha):
    """o(b, c, v1 + α v2) = o(b, c, v1) + α o(b, c, v2) (no initial state)."""
    case = data.draw(cases(dtypes=[torch.float32], min_n=1, max_n=property_n(method), max_dim=PROPERTY_DIM),
                     label="case")
    b, c, v, gamma, _ = case.tensors(DEVICE)
    v2 = torch.randn(v.shape, generator=torch.Generator().manual_seed(case.seed + 1)).to(v.device)
    kw = dict(method=method, layout=case.layout)
    lhs = leettriton.linear_attention(b, c, v + alpha * v2, gamma, **kw)
    rhs = leettriton.linear_attention(b, c, v, gamma, **kw) + alpha * leettriton.linear_attention(b, c, v2, gamma,
                                                                                                  **kw)
    assert_close(lhs, rhs, tolerance(torch.float32), f"{method} linearity in v [{case.id}]")


@pytest.mark.parametrize("method", METHODS)
def test_methods_agree(method):
    """Fast methods are also checked against each other (fp32, one mid-size problem)."""
    case = Case(2, 2, 257, 40, 72, gamma="tensor", gammas=(0.97, 1.0), initial=True, return_state=True, seed=7)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    o, s = leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0, return_state=True)
    o_ref, s_ref = leettriton.linear_attention(b, c, v, gamma, method="vanilla_torch", initial_state=s0,
                                               return_state=True)
    assert_close(o, o_ref, 2e-5, f"{method} vs vanilla_torch output")
    assert_close(s, s_ref, 2e-5, f"{method} vs vanilla_torch state")


def test_fleet_attention_is_bitwise_deterministic():
    """Two runs on the same input give the same bits, across blocks and several segments: each
    program owns its output tiles and loops over the rank itself (no atomics, no races)."""
    from leettriton.autotune import current_family
    from leettriton.methods.fleet_attention import space as spaces

    n = 3000 if HAS_GPU else 300
    case = Case(1, 2, n, 33, 80, gamma="tensor", gammas=(0.99, 0.9), initial=True, return_state=True, seed=11)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    assert spaces.segment_length(2, n, 80, current_family(v.device)) < n   # the multi-segment path runs
    runs = [leettriton.fleet_attention(b, c, v, gamma, initial_state=s0, return_state=True) for _ in range(3)]
    for o, s in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(s, runs[0][1])
    ref = leettriton.reference(b, c, v, gamma, initial_state=s0)
    assert_close(runs[0][0], ref, tolerance(case.dtype), "fleet_attention output [deterministic case]")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("seg_len,split,prefix", [(40, 1, True), (40, 1, False), (40, 2, False), (48, 4, False)])
def test_block_based_schedules(dtype, seg_len, split, prefix):
    """block_based under each schedule its rule can give: the walk summing its start states itself, or the
    scan over whole segments, or over pieces of segments (the state pass cut finer than the walk: 2 or 4
    pieces per segment, the walk reading every 2nd or 4th start state); 150 rows end in a short segment,
    and a short last piece.  With and without an initial and a final state (without one, the state pass
    skips the last segment's pieces)."""
    from leettriton.methods.block_based.kernels import block_based_fwd
    from leettriton.methods.spec import Plan
    from leettriton.problem import make_problem

    plan = Plan("block_based", block_based_fwd, schedule=dict(seg_len=seg_len, split=split, prefix=prefix))
    for initial, return_state in [(True, True), (False, False)]:
        case = Case(2, 2, 150, 20, 36, dtype=dtype, gamma="tensor", gammas=(0.98, 0.9), initial=initial,
                    return_state=return_state, seed=seg_len + split)
        b, c, v, gamma, s0 = case.tensors(DEVICE)
        p, out = make_problem(b, c, v, gamma, initial_state=s0, return_state=return_state)
        block_based_fwd(p, plan)
        ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
        what = f"block_based seg {seg_len} split {split} prefix {prefix} [{case.id}]"
        assert_close(out, ref, tolerance(dtype), what + " output")
        if return_state:
            assert_close(p.state, ref_state, tolerance(dtype), what + " final state")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_fleet_attention_segments_with_sliced_carries(dtype):
    """Several segments, an initial and a final state, r wider than one BK slice of the carry
    update and d wider than one value tile (both cut short): agreement with the oracle."""
    from leettriton.autotune import current_family
    from leettriton.methods.fleet_attention import space as spaces

    case = Case(1, 1, 300, 200, 150, dtype=dtype, gamma=0.95, initial=True, return_state=True, seed=17)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    family = current_family(v.device)
    first = spaces.FWD.family_configs(family)[0]
    assert spaces.segment_length(1, case.n, case.d, family) < case.n      # the multi-segment path runs
    assert case.r > first["BK"] and case.r % first["BK"] and case.d > first["BV"]
    check_against_oracle("fleet_attention", case)


def cancelling_ranks(n: int, r: int, d: int, seed: int, dtype=torch.float16):
    """b, c, v (1 × 1 × n) whose scores b_i · c_j cancel over the ranks: every row of c is one
    vector c₀, and the last entry of every row of b is set so that b_i · c₀ = 0.25 (in the 16-bit
    values) while its terms b_ik c₀k are of size 1."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(1, 1, n, r, generator=g)
    c0 = torch.randn(r, generator=g).to(dtype).float()
    v = torch.randn(1, 1, n, d, generator=g)
    rest = (b[..., :-1].to(dtype).float() * c0[:-1]).sum(-1)
    b[..., -1] = (0.25 - rest) / c0[-1]
    return b.to(dtype), c0.expand(1, 1, n, r).to(dtype).contiguous(), v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("n, r, d, gamma", [(1, 212, 1, None), (1, 212, 16, None), (70, 212, 8, 0.9),
                                            (140, 100, 8, 0.97)], ids=["n1-r212-d1", "n1-r212-d16",
                                                                       "n70-r212-d8-g0.9", "n140-r100-d8-g0.97"])
def test_fleet_attention_scores_that_cancel_over_ranks(n, r, d, gamma, dtype):
    """16-bit inputs with outputs far below the terms they sum (0.25 against terms of size 1 over r
    ranks): fleet_attention takes each rank's c ⊙ v exactly, not rounded once per rank (whose
    errors would add up over the ranks: float16 gave 8e-3 to 2e-2 on these cases), within the
    carries and the segment start states too (n past a block and a segment under the interpreter)."""
    b, c, v = cancelling_ranks(n, r, d, seed=n + r, dtype=dtype)
    out = leettriton.fleet_attention(b.to(DEVICE), c.to(DEVICE), v.to(DEVICE), gamma)
    ref = leettriton.reference(b, c, v, gamma)
    assert_close(out, ref, tolerance(dtype), f"fleet_attention output [n{n}-r{r}-d{d}-g{gamma}-{dtype}]")


@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
@pytest.mark.parametrize("gamma", [1.0, 0.999])
@pytest.mark.parametrize("r", [24, 100], ids=["scaled", "checked"])
def test_float16_state_beyond_float16_range(method, gamma, r):
    """The chunk walk rounds its float32 state to float16 for the product with b, each row scaled by a
    power of two first (r = 24), or as it is with a redo, scaled, where a row's copy overflows (r = 100):
    a state far past 65 504 (positive c and v, γ near 1, a large initial state) with a small b (so that
    the output itself fits float16) stays finite and accurate."""
    g = torch.Generator().manual_seed(5)
    B, H, n, d = 1, 2, 150, 40
    b = (torch.rand(B, H, n, r, generator=g) * 1e-4).to(torch.float16)
    c, v = ((torch.rand(B, H, n, x, generator=g) * 30).to(torch.float16) for x in (r, d))
    s0 = torch.rand(B, H, r, d, generator=g) * 1e6
    b, c, v, s0 = (x.to(DEVICE) for x in (b, c, v, s0))
    out, state = leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0, return_state=True)
    ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
    assert ref_state.abs().max() > 4 * 65504 and ref.abs().max() < 6e4   # the state, not the output, is out of range
    assert_close(out, ref, tolerance(torch.float16), f"{method} float16, state beyond float16's range")
    assert_close(state, ref_state, tolerance(torch.float16), f"{method} float16 state")


@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
@pytest.mark.parametrize("scales", [(1e4, 1e-3, 1e-3), (1.0, 1.0, 1.0)], ids=["tiny-state", "one-tiny-column"])
@pytest.mark.parametrize("r", [64, 100], ids=["scaled", "checked"])
def test_float16_state_below_float16_normals(method, scales, r):
    """float16's walk rounds the state as it is unless a row's copy leaves float16's normal range
    (docs/design.md §2.3).  A state of about 1e-6 (c and v scaled by 1e-3, b by 1e4, so the output is
    normal) is all subnormals in float16: rounded as it is, the output errs by about 2e-2, so this fails
    unless the check sends the walk round again, scaled.  With one value column 1e-3 times the others (only
    that column's rows fail, so only its value tile walks again) the output, that column and the state hold
    too.  r = 64 runs the scaled walk, r = 100 the checked walk and its redo."""
    g = torch.Generator().manual_seed(7)
    # d: several value tiles, the last one partial, for every walk config (the interpreter's are 32 wide)
    B, H, n, d = 1, 2, 200, (200 if HAS_GPU else 72)
    sb, sc, sv = scales
    b = (torch.randn(B, H, n, r, generator=g) * r ** -0.5 * sb).to(torch.float16)
    c = (torch.randn(B, H, n, r, generator=g) * r ** -0.5 * sc).to(torch.float16)
    v = torch.randn(B, H, n, d, generator=g) * sv
    if sv == 1.0:
        v[..., 3] *= 1e-3
    v = v.to(torch.float16)
    b, c, v = (x.to(DEVICE) for x in (b, c, v))
    gamma = torch.tensor([0.97, 0.999], device=DEVICE)
    out, state = leettriton.linear_attention(b, c, v, gamma, method=method, return_state=True)
    ref, ref_state = leettriton.reference(b, c, v, gamma, return_state=True)
    if sv != 1.0:
        assert ref_state.abs().max() < 2 ** -14 and ref.abs().max() > 0.01  # subnormal state, normal output
    assert_close(out, ref, tolerance(torch.float16), f"{method} float16, state below float16's normals")
    assert_close(state, ref_state, tolerance(torch.float16), f"{method} float16 state")
    if sv == 1.0:
        col = ref[..., 3]  # the tiny column alone, to its own magnitude
        assert_close(out[..., 3], col, tolerance(torch.float16), f"{method} float16, the tiny value column")


@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_float16_redo_is_a_dependent_launch_on_sm90(method):
    """float16's checked walk (r > 64) is followed by its redo, the same grid with REDO (docs/design.md §2.3).
    Compiled for sm_90 or later, the redo is a programmatic dependent launch: the walk lets it in (``PDL``, its
    programs trigger their dependents) and the redo, launched with Triton's ``launch_pdl``, waits for the
    walk before it reads a flag.  The interpreter and older devices have no ``griddepcontrol``: both launches
    plain.  Either way the call, with a state whose float16 copy overflows (so programs are flagged and the
    redo walks them again), matches the definition."""
    from leettriton.autotune import recording
    from leettriton.kernels.walk import redo_args
    g = torch.Generator().manual_seed(11)
    B, H, n, r, d = 1, 2, 150, 128, 40
    b = (torch.rand(B, H, n, r, generator=g) * 1e-4).to(torch.float16)
    c, v = ((torch.rand(B, H, n, x, generator=g) * 30).to(torch.float16) for x in (r, d))
    s0 = torch.rand(B, H, r, d, generator=g) * 1e6
    b, c, v, s0 = (x.to(DEVICE) for x in (b, c, v, s0))
    with recording() as log:
        out = leettriton.linear_attention(b, c, v, 0.999, method=method, initial_state=s0)
    walks = [args for kernel, args in log if kernel.space.name == f"{method}.fwd"]
    pdl = HAS_GPU and torch.cuda.get_device_capability()[0] >= 9
    assert [a["REDO"] for a in walks] == [False, True]
    assert [a["PDL"] for a in walks] == [pdl, pdl]
    assert ["launch_pdl" in a for a in walks] == [False, pdl]
    assert all(a.get("launch_pdl", True) for a in walks)
    assert redo_args({"PDL": True, "REDO": False}) == {"PDL": True, "REDO": True, "launch_pdl": True}
    assert redo_args({"PDL": False, "REDO": False}) == {"PDL": False, "REDO": True}
    ref = leettriton.reference(b, c, v, 0.999, initial_state=s0)
    assert_close(out, ref, tolerance(torch.float16), f"{method} float16 with its redo")


_DESCRIPTORS = (leettriton.kernels.walk.DESCRIPTORS
                and (not HAS_GPU or torch.cuda.get_device_capability()[0] >= 9))
"""Whether the walk may read through tensor descriptors here: a Triton that builds them, and the interpreter or
sm_90 and later."""


def _walk(method, b, c, v, gamma):
    """``method``'s output; block_based in segments of 40 rows, which end inside a chunk on any device."""
    if method != "block_based":
        return leettriton.linear_attention(b, c, v, gamma, method=method)
    from leettriton.methods.block_based.kernels import block_based_fwd
    from leettriton.methods.spec import Plan

    p, out = make_problem(b, c, v, gamma)
    block_based_fwd(p, Plan("block_based", block_based_fwd, schedule=dict(seg_len=40, split=1, prefix=True)))
    return out


def _walk_by_pointer(monkeypatch, method, b, c, v, gamma):
    """:func:`_walk` with the walk reading through pointers (the descriptors' rule switched off)."""
    from leettriton.kernels import walk
    from leettriton.plan import clear_plans

    asked = []
    with monkeypatch.context() as m:
        m.setattr(walk, "reads_by_descriptor", lambda p, segments=1: asked.append(p) or False)
        clear_plans()  # a call of this signature made before would replay its launches, descriptors and all
        try:
            out = _walk(method, b, c, v, gamma)
        finally:
            clear_plans()  # nor may a later call replay these
    assert asked, "the walk's launch was replayed, not decided again"
    return out


@pytest.fixture
def one_sm_walk(monkeypatch):
    """The walk's kernels module, its descriptor rule seeing a family of one multiprocessor (a GPU's count of
    programs would send a test's few heads through pointers: docs/design.md §3.4), and no plan of another call
    to replay, before the test or after it (a repeated signature replays its launches, descriptors and all)."""
    from leettriton.kernels import walk

    family = dataclasses.replace(walk.current_family(DEVICE), num_sms=1)
    monkeypatch.setattr(walk, "current_family", lambda device=None: family)
    leettriton.plan.clear_plans()
    yield walk
    leettriton.plan.clear_plans()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the interpreter's NumPy, on the
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")  # infinities the test puts in
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_walk_reads_by_descriptor_as_by_pointer(monkeypatch, one_sm_walk, method, dtype):
    """At r > 128 the walk reads b, c and v through tensor descriptors (docs/design.md §3.4): the outputs are
    bitwise those of the pointer reads, for r = 200 (a descriptor reads the columns past r as zero), n not a
    multiple of the chunk, and (block_based) segments of 40 rows, which end inside a chunk.  A descriptor
    would read the next segment's rows there: an infinity in c, then in v, just past a segment's end leaves
    the outputs before it as the pointer reads give them (finite), not NaN."""
    walk = one_sm_walk
    case = Case(1, 2, 60, 200, 40, dtype=dtype, gamma="tensor", gammas=(0.98, 0.9), seed=21)
    b, c, v, gamma, _ = case.tensors(DEVICE)
    assert walk.reads_by_descriptor(make_problem(b, c, v, gamma)[0]) == _DESCRIPTORS
    out = _walk(method, b, c, v, gamma)
    assert_close(out, leettriton.reference(b, c, v, gamma), tolerance(dtype), f"{method} by descriptor [{case.id}]")
    assert torch.equal(out, _walk_by_pointer(monkeypatch, method, b, c, v, gamma))
    for name in ("c", "v"):
        x = dict(b=b, c=c, v=v)
        x[name] = x[name].clone()
        x[name][:, :, 41] = float("inf")
        out = _walk(method, x["b"], x["c"], x["v"], gamma)
        torch.testing.assert_close(out, _walk_by_pointer(monkeypatch, method, x["b"], x["c"], x["v"], gamma),
                                   rtol=0, atol=0, equal_nan=True)
        if method == "block_based":
            assert torch.isfinite(out[:, :, :40]).all(), f"{name}: an infinity past the segment's end reached it"


def test_reads_by_descriptor_only_where_a_descriptor_can_read_the_rows(monkeypatch):
    """The walk's rule for tensor descriptors: 16-bit, r > 128, unit column stride, every other stride a multiple
    of 16 bytes, 16-byte aligned, rows forward, and more than half the multiprocessors with a program (counted
    with 128-wide value tiles); anything else reads through pointers (and still matches the oracle)."""
    from leettriton.autotune.families import FAMILIES
    from leettriton.kernels import walk
    from leettriton.kernels.walk import reads_by_descriptor

    def problem(b, c, v, **kw):
        return make_problem(b, c, v, 0.95, **kw)[0]

    many = 1 << 20  # segments: programs enough for any GPU, so that only the rows decide
    case = Case(1, 1, 40, 200, 16, dtype=torch.float16, seed=3)
    b, c, v, _, _ = case.tensors(DEVICE)
    assert reads_by_descriptor(problem(b, c, v), many) == _DESCRIPTORS
    assert not reads_by_descriptor(problem(b[..., :128], c[..., :128], v), many)               # r = 128
    assert not reads_by_descriptor(problem(b.float(), c.float(), v.float()), many)             # float32
    assert not reads_by_descriptor(make_problem(b, c, v, 0.95, reverse=True)[0], many)         # rows backwards
    wide = torch.zeros(1, 1, 40, 208, dtype=b.dtype, device=DEVICE)
    wide[..., 1:201] = b
    assert not reads_by_descriptor(problem(wide[..., 1:201], c, v), many)                      # 2-byte aligned
    odd = torch.zeros(1, 1, 40, 204, dtype=b.dtype, device=DEVICE)
    odd[..., :200] = b
    assert not reads_by_descriptor(problem(odd[..., :200], c, v), many)                        # rows 408 bytes apart
    cols = b.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not reads_by_descriptor(problem(cols, c, v), many)                                  # column stride 40
    # the count of programs takes the widest value tile of the walk's sm_90 configs: the fewest programs
    from leettriton.methods.lightning_attention import space as walk_spaces
    assert walk.TMA_PROGRAM_BV == max(cfg["BV"] for cfg in walk_spaces.FWD.family_configs("h100"))
    if _DESCRIPTORS:  # on a family of 132 multiprocessors: 1 head, d = 16, so one program a segment
        with monkeypatch.context() as m:
            m.setattr(walk, "current_family", lambda device=None: FAMILIES["h100"])
            assert not reads_by_descriptor(problem(b, c, v), segments=66)                # 66 of 132
            assert reads_by_descriptor(problem(b, c, v), segments=67)
            v2 = torch.cat([v] * 9, dim=-1)                                              # d = 144: two
            assert reads_by_descriptor(problem(b, c, v2), segments=34)
            assert not reads_by_descriptor(problem(b, c, v2), segments=33)
    ref = leettriton.reference(b, c, v, 0.95)
    for bb in (wide[..., 1:201], odd[..., :200], cols):
        out = leettriton.linear_attention(bb, c, v, 0.95, method="lightning_attention")
        assert_close(out, ref, tolerance(torch.float16), "lightning_attention read through pointers")


@pytest.mark.skipif(not _DESCRIPTORS, reason="this Triton or device builds no tensor descriptors")
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in (
    [c for c in WIDE if (c.r, c.d, c.dtype) == (256, 512, torch.float16)][-1],   # RetNet-1.3B's head (float16)
    Case(1, 1, 9, 640, 136, dtype=torch.bfloat16, gamma=1.0, initial=True, return_state=True),  # pieces 256, 256, 128
)])
@pytest.mark.parametrize("method", ["lightning_attention", "block_based"])
def test_wide_dims_by_descriptor(monkeypatch, one_sm_walk, method, case):
    """r and d past 256 in 16 bits with the walk reading through tensor descriptors wherever the rows allow: a
    GPU's count of programs would send these few heads through pointers (docs/design.md §3.4), so the rule sees
    a family of one multiprocessor; every piece of r past 128 then reads by descriptor (rows of b, c
    and v 16-byte multiples, pieces starting at 512-byte offsets), the last piece of 128 through pointers."""
    walk = one_sm_walk
    rule, decided = walk.reads_by_descriptor, []
    monkeypatch.setattr(walk, "reads_by_descriptor",
                        lambda p, segments=1: decided.append((p.shape[3], rule(p, segments))) or decided[-1][1])
    check_against_oracle(method, case)
    assert decided and all(tma == (r > 128) for r, tma in decided), decided
