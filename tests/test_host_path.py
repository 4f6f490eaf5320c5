"""The per-signature fast paths of decode_step and linear_attention (docs/design.md §4.5).

A call whose signature was validated and launched before repeats the launch it made: these tests change,
between calls, everything such a repeat must not carry over -- strides, dtypes, γ's value, γ's tensor, the
layout, the initial state -- and compare every call with the float64 oracle; a new signature must be
validated again.  Under the interpreter the repeated launch goes through the same fixed argument tuple as on
the GPU (only the final launcher differs), so a stale argument shows here as a wrong result.
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from leettriton import api
from leettriton.autotune import configs
from leettriton.kernels import decode
from leettriton.methods.lightning_attention import kernels as lightning_attention
from conftest import DEVICE, HAS_GPU
from helpers import assert_close, tolerance

B, H, R, D = 2, 3, 8, 12


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=DEVICE, dtype=dtype)


def decode_oracle(b_t, c_t, v_t, state, gamma):
    """One step from the float64 oracle: (o_t, new state)."""
    o, s = leettriton.reference(b_t.unsqueeze(2), c_t.unsqueeze(2), v_t.unsqueeze(2), gamma, initial_state=state,
                                return_state=True)
    return o[:, :, 0], s


def checked_step(b_t, c_t, v_t, state, gamma, what, tol=1e-5):
    expect_o, expect_s = decode_oracle(b_t, c_t, v_t, state.clone(), gamma)
    o_t, same = leettriton.decode_step(b_t, c_t, v_t, state, gamma)
    assert same is state
    assert_close(o_t, expect_o, tol, f"{what}: output")
    assert_close(state, expect_s, tol, f"{what}: state")


@pytest.fixture
def count_checks(monkeypatch):
    """How often decode_step ran its tensor checks (once per new signature)."""
    calls = []
    real = api._check_decode_step
    monkeypatch.setattr(api, "_check_decode_step", lambda *a: (calls.append(1), real(*a))[1])
    return calls


def test_decode_repeats_only_what_the_signature_fixes(count_checks):
    api._DECODE_STEPS.clear()
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    state = rand(B, H, R, D, seed=1)
    b_t, c_t, v_t = rand(B, H, R, seed=2), rand(B, H, R, seed=3), rand(B, H, D, seed=4)
    checked_step(b_t, c_t, v_t, state, gamma, "first call")
    checked_step(rand(B, H, R, seed=5), rand(B, H, R, seed=6), rand(B, H, D, seed=7), state, gamma, "same signature")
    assert len(count_checks) == 1 and len(api._DECODE_STEPS) == 1    # the second call took the fast path
    # the same shapes, other strides: b_t, c_t sliced from wider rows, v_t transposed storage, the state too
    wide = rand(B, H, 2 * R, seed=8)
    v_cols = rand(D, H, B, seed=9).permute(2, 1, 0)
    state_t = state.transpose(-1, -2).contiguous().transpose(-1, -2)
    checked_step(wide[..., :R], wide[..., R:], v_cols, state_t, gamma, "other strides")
    assert len(count_checks) == 2
    # γ written in place (same tensor, same shape): the kernel reads the new values
    gamma.mul_(0.5)
    checked_step(b_t, c_t, v_t, state, gamma, "γ written in place")
    # another γ tensor of the same shape, dtype and device; a γ of another dtype; a float γ; no γ
    checked_step(b_t, c_t, v_t, state, torch.tensor([0.3, 0.99, 0.7], device=DEVICE), "another γ tensor")
    checked_step(b_t, c_t, v_t, state, gamma.to(torch.float64), "a float64 γ")
    checked_step(b_t, c_t, v_t, state, 0.75, "float γ")
    checked_step(b_t, c_t, v_t, state, 0.25, "another float γ")
    checked_step(b_t, c_t, v_t, state, None, "no γ")
    checked_step(b_t, c_t, v_t, state, None, "no γ again")
    checked_step(b_t, c_t, v_t, state, 0.75, "the first float γ again")
    # another dtype of the inputs, same shapes
    checked_step(b_t.half(), c_t.half(), v_t.half(), state, gamma, "float16 inputs", tol=tolerance(torch.float16))


def test_decode_fast_path_still_checks_gamma_values_and_new_signatures():
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    state = rand(B, H, R, D, seed=1)
    b_t, c_t, v_t = rand(B, H, R, seed=2), rand(B, H, R, seed=3), rand(B, H, D, seed=4)
    leettriton.decode_step(b_t, c_t, v_t, state, gamma)
    leettriton.decode_step(b_t, c_t, v_t, state, gamma)  # the signature is known now
    before = state.clone()
    gamma[1] = 1.5  # written in place: a new version, checked again before any work
    with pytest.raises(ValueError, match="gamma must hold values in"):
        leettriton.decode_step(b_t, c_t, v_t, state, gamma)
    with pytest.raises(ValueError, match="gamma must hold values in"):  # a new tensor of the known signature
        leettriton.decode_step(b_t, c_t, v_t, state, torch.tensor([0.5, float("nan"), 0.5], device=DEVICE))
    with pytest.raises(ValueError, match="gamma must lie in"):
        leettriton.decode_step(b_t, c_t, v_t, state, 1.5)
    with pytest.raises(TypeError, match="gamma must be None, a float or a tensor"):
        leettriton.decode_step(b_t, c_t, v_t, state, True)  # == 1.0 and hashes alike: its own signature
    with pytest.raises(ValueError, match="state must have shape"):
        leettriton.decode_step(b_t, c_t, v_t, state[:, :, :-1], 0.5)
    with pytest.raises(TypeError, match="state must be float32"):
        leettriton.decode_step(b_t, c_t, v_t, state.double(), 0.5)
    with pytest.raises(RuntimeError, match="decode_step computes the forward pass only"):
        leettriton.decode_step(b_t.requires_grad_(), c_t, v_t, state, 0.5)
    assert torch.equal(state, before)  # no call that raised touched the state


def attention_oracle(b, c, v, gamma, **kw):
    return leettriton.reference(b, c, v, gamma, **kw)


def checked_attention(b, c, v, gamma, what, tol=1e-5, **kw):
    kw.setdefault("method", "lightning_attention")
    method = kw.pop("method")
    out = leettriton.linear_attention(b, c, v, gamma, method=method, **kw)
    ref = attention_oracle(b, c, v, gamma, **{k: x for k, x in kw.items() if k != "precision"})
    if kw.get("return_state"):
        assert_close(out[0], ref[0], tol, f"{what}: output")
        assert_close(out[1], ref[1], tol, f"{what}: state")
    else:
        assert_close(out, ref, tol, f"{what}: output")


@pytest.mark.parametrize("method,n", [("lightning_attention", 40), ("block_based", 40), ("block_based", 121),
                                      ("vanilla", 40)],
                         ids=["lightning_attention", "block_based", "block_based-segments", "vanilla"])
def test_linear_attention_repeats_only_what_the_signature_fixes(method, n):
    """Repeated calls of a signature (the walk, and at 121 rows the segment-state, scan and segmented walk
    launches repeated as first made: four of the interpreter's 40-row segments, the last of one row; vanilla's
    launch and its redo) give the oracle's answer for new data, strides, γ and states."""
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    b, c, v = rand(B, H, n, R, seed=1), rand(B, H, n, R, seed=2), rand(B, H, n, D, seed=3)
    checked_attention(b, c, v, gamma, "first call", method=method)
    checked_attention(rand(B, H, n, R, seed=4), c, v, gamma, "same signature", method=method)
    # same shapes, other strides (and the bnhd layout of the same data)
    bt = rand(B, n, H, R, seed=5).transpose(1, 2)
    checked_attention(bt, c, v, gamma, "strided b", method=method)
    checked_attention(b.transpose(1, 2), c.transpose(1, 2), v.transpose(1, 2), gamma, "bnhd", layout="bnhd",
                      method=method)
    gamma.mul_(0.5)
    checked_attention(b, c, v, gamma, "γ written in place", method=method)
    checked_attention(b, c, v, torch.tensor([0.2, 0.8, 0.99], device=DEVICE), "another γ tensor", method=method)
    checked_attention(b, c, v, 0.6, "float γ", method=method)
    checked_attention(b, c, v, 0.7, "another float γ", method=method)
    checked_attention(b, c, v, None, "no γ", method=method)
    checked_attention(b, c, v, None, "no γ again", method=method)
    s0 = rand(B, H, R, D, seed=6)
    checked_attention(b, c, v, gamma, "initial state", initial_state=s0, method=method)
    checked_attention(b, c, v, gamma, "strided initial state", method=method,
                      initial_state=s0.transpose(-1, -2).contiguous().transpose(-1, -2))
    checked_attention(b, c, v, gamma, "returned state", return_state=True, method=method)
    checked_attention(b.half(), c.half(), v.half(), gamma, "float16", tol=tolerance(torch.float16), method=method)
    gamma[0] = 0.0
    with pytest.raises(ValueError, match="gamma must hold values in"):
        leettriton.linear_attention(b, c, v, gamma, method=method)
    with pytest.raises(ValueError, match="c must have the shape of b"):
        leettriton.linear_attention(b, c[:, :, :-1], v, 0.5, method=method)


def test_a_repeated_segmented_call_makes_every_launch_from_its_memo(monkeypatch):
    """A repeated ``block_based`` call over segments (the segment-state pass, the scan, the walk and its redo)
    launches nothing through ``CompiledLaunches.launch``: each kernel's Launch comes from the signature's memo
    (kernels/segments.py for the two segment kernels).  New data each call, against the oracle."""
    from leettriton.kernels import segments
    from leettriton.plan import clear_plans

    clear_plans()   # forget the signatures earlier tests made: the first call of each is a first call here
    made = []
    real = configs.CompiledLaunches.launch
    monkeypatch.setattr(configs.CompiledLaunches, "launch",
                        lambda self, *a, **k: (made.append(self.kernel.space.name), real(self, *a, **k))[1])
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    # more segments than the walk sums itself, so the scan runs too: the interpreter's 40-row segments (four), a
    # GPU's of 1024 rows at least (twelve)
    n = 12288 if HAS_GPU else 150
    for seed, return_state in ((1, False), (4, False), (7, False), (10, True), (13, True)):
        made.clear()
        b, c, v = rand(B, H, n, R, seed=seed), rand(B, H, n, R, seed=seed + 1), rand(B, H, n, D, seed=seed + 2)
        checked_attention(b, c, v, gamma, f"seed {seed}", method="block_based", return_state=return_state)
        if seed in (1, 10):  # the first call of each signature makes all three, and the walk's redo
            assert sorted(made) == sorted([segments.spaces.STATE.name, segments.spaces.SCAN.name, "block_based.fwd",
                                           "block_based.fwd"])
        else:
            assert made == [], f"a repeated call launched {made} through CompiledLaunches.launch"


def test_a_repeated_vanilla_call_makes_both_launches_from_its_memo(monkeypatch):
    """A repeated ``vanilla`` call (its launch and the redo) launches nothing through ``CompiledLaunches.launch``,
    with a constant γ and with per-token decays: new data and new decays each call, against the oracle."""
    from leettriton.plan import clear_plans

    clear_plans()
    made = []
    real = configs.CompiledLaunches.launch
    monkeypatch.setattr(configs.CompiledLaunches, "launch",
                        lambda self, *a, **k: (made.append(self.kernel.space.name), real(self, *a, **k))[1])
    n = 40
    for per_token in (False, True):
        for seed in (1, 4, 7):
            made.clear()
            b, c, v = rand(B, H, n, R, seed=seed), rand(B, H, n, R, seed=seed + 1), rand(B, H, n, D, seed=seed + 2)
            if per_token:
                a = -torch.rand(B, H, n, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
                out = leettriton.linear_attention(b, c, v, method="vanilla", log_decay=a)
                ref = leettriton.reference(b, c, v, log_decay=a)
            else:
                out = leettriton.linear_attention(b, c, v, 0.9, method="vanilla")
                ref = leettriton.reference(b, c, v, 0.9)
            assert_close(out, ref, tolerance(torch.float32), f"per-token {per_token}, seed {seed}")
            if seed == 1:   # the first call of each signature makes the launch and its redo
                assert made == ["vanilla.fwd", "vanilla.fwd"]
            else:
                assert made == [], f"a repeated call launched {made} through CompiledLaunches.launch"


@pytest.mark.parametrize("method", ["lightning_attention", "block_based", "vanilla"])
def test_a_launch_kept_for_one_shape_is_not_repeated_on_another_sharing_the_memo(method):
    """A launcher's mark names the shape it launched (B, H, n, r, d), not only what the memo's signature fixes:
    a problem of more batch elements sharing the memo launches anew.  Repeated there, the kept launch's grid
    would cover the first batch element only, and the second's output would stay as allocated (NaN)."""
    from leettriton.plan import run_problem
    from leettriton.problem import make_problem

    n, memo = 150, {}   # the interpreter's segments: 40 rows, so block_based runs its segment kernels too
    for batch, seed in ((1, 20), (2, 23)):
        b, c, v = rand(batch, H, n, R, seed=seed), rand(batch, H, n, R, seed=seed + 1), rand(batch, H, n, D, seed=seed + 2)
        p, out = make_problem(b, c, v, 0.9)
        p.memo = memo
        run_problem(p, method)
        assert_close(out, leettriton.reference(b, c, v, 0.9), tolerance(torch.float32), f"{method}, batch {batch}")


def test_every_kernel_argument_is_keyed_or_handed_over():
    """A CompiledLaunches key holds every argument that is not a tensor by value, and each tensor by dtype:
    no argument of the kernel is left out (a left-out one would be launched stale)."""
    from leettriton.methods.block_based import kernels as block_based
    from leettriton.methods.vanilla import kernels as vanilla

    from leettriton.kernels import segments

    for launches in (decode._LAUNCHES, decode._TOKEN_LAUNCHES, lightning_attention._lightning_attention_fwd_kernel.launches,
                     block_based._block_based_fwd_kernel.launches, segments._STATE_LAUNCHES, segments._SCAN_LAUNCHES,
                     vanilla._vanilla_fwd_kernel.launches):
        meta = {k for k in launches.kernel.space.cpu if k not in ("num_warps", "num_stages")}
        assert set(launches.by_value) | set(launches.pointers) | meta == set(launches.arg_names)
        assert not set(launches.by_value) & set(launches.pointers)


class _Compiled:
    """A stand-in for a compiled kernel: its launcher records what it is given."""
    function, packed_metadata = 7, (4, 1, 0)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, *args):
        return None


class _Wrapper:
    """A stand-in for Triton's launcher object: its Python ``__call__`` puts its flags and the two scratch
    pointers (none) in front of its arguments and calls the C function ``launch``."""

    def __init__(self, global_scratch=0, profile_scratch=0):
        self.calls, self.wrapped = [], 0
        self.global_scratch_size, self.profile_scratch_size = global_scratch, profile_scratch
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def launch(self, *args):
        self.calls.append(args)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.wrapped += 1
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None,
                    *args)


def _decode_launch_inputs(monkeypatch):
    """The arguments, tensors (in launch order) and grid of a decode step on device 0, stream 99 (stand-ins)."""
    monkeypatch.setattr(configs, "_current_device", lambda: 0)
    monkeypatch.setattr(configs, "_current_stream", lambda device: 99)
    state = torch.zeros(B, H, R, D)
    b_t, c_t, v_t, out = torch.randn(B, H, R), torch.randn(B, H, R), torch.randn(B, H, D), torch.empty(B, H, D)
    gamma = torch.full((H,), 0.5)
    args = decode.decode_args(b_t, c_t, v_t, state, gamma, out)
    grid = lambda meta: (-(-D // meta["BV"]) * B * H,)  # noqa: E731
    # the state stands in for the slot ids of a slotted step
    return args, (b_t, c_t, v_t, out, gamma, state, state), grid


@pytest.mark.parametrize("form", ["known", "unknown", "global scratch", "profile scratch"])
def test_a_direct_launch_skips_a_known_launcher_wrapper(form, monkeypatch):
    """A launcher whose ``__call__`` is of a known form (its source's hash) and whose kernel has no scratch is
    called through its C function, with exactly the arguments its wrapper would hand it; any other
    launcher is called as it is."""
    from leettriton.autotune import launcher

    if form != "unknown":
        monkeypatch.setattr(launcher, "KNOWN_FORMS", launcher.KNOWN_FORMS | {launcher.call_form(_Wrapper)})
    args, tensors, grid = _decode_launch_inputs(monkeypatch)
    wrapper = _Wrapper(global_scratch=64 if form == "global scratch" else 0,
                       profile_scratch=64 if form == "profile scratch" else 0)
    compiled = _Compiled()
    compiled.run = wrapper
    launch = configs.Launch(decode._LAUNCHES, args, grid, dict(BK=16, BV=8, num_warps=2, num_stages=1), compiled,
                            device=0)
    assert launch(tensors)
    (direct,) = wrapper.calls
    assert wrapper.wrapped == (0 if form == "known" else 1), "the wrapper ran where it should not, or not where it should"
    wrapper(*direct[:5], *direct[9:])           # the wrapper itself, on the same arguments
    assert wrapper.calls[1] == direct
    assert direct[5:9] == (False, True, None, None) and direct[9:13] == ((4, 1, 0), None, None, None)


def test_a_direct_launch_hands_every_argument_in_order(monkeypatch):
    """The compiled path's argument tuple: the grid, the stream, the tensors' addresses and every other
    argument in the kernel's order; nothing launched for pointers not 16-byte aligned, another device or
    while a recorder listens."""
    args, tensors, grid = _decode_launch_inputs(monkeypatch)
    config = dict(BK=16, BV=8, num_warps=2, num_stages=1)
    compiled = _Compiled()
    launch = configs.Launch(decode._LAUNCHES, args, grid, config, compiled, device=0)
    assert launch(tensors)
    (call,) = compiled.calls
    assert call[:9] == (2 * B * H, 1, 1, 99, 7, (4, 1, 0), None, None, None)
    expect = {**args, "BK": 16, "BV": 8, **{k: x.data_ptr() for k, x in zip(decode._LAUNCHES.pointers, tensors)}}
    assert call[9:] == tuple(expect[name] for name in decode._LAUNCHES.arg_names)
    odd = torch.randn(B * H * R + 1)[1:].view(B, H, R)  # 4 bytes past a 16-byte boundary
    assert not launch((odd,) + tensors[1:])
    monkeypatch.setattr(configs, "_current_device", lambda: 1)
    assert not launch(tensors)
    monkeypatch.setattr(configs, "_current_device", lambda: 0)
    with configs.recording():
        assert not launch(tensors)
    assert len(compiled.calls) == 1


def test_slotted_decode_repeats_only_what_the_signature_fixes():
    """The slotted step's fast path: new slot ids (and their values) each call, a pool of other strides, γ in
    place; the slot ids' values still checked per version, check_slots still a bool."""
    api._TOKEN_STEPS.clear()
    pool = rand(6, H, R, D, seed=1)
    gamma = torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    b_t, c_t, v_t = rand(B, H, R, seed=2), rand(B, H, R, seed=3), rand(B, H, D, seed=4)

    def checked(pool, slots, gamma, what):
        rows = [int(i) for i in slots.tolist()]
        expect_o, expect_s = decode_oracle(b_t, c_t, v_t, pool[rows].clone(), gamma)
        untouched = [i for i in range(pool.shape[0]) if i not in rows]
        before = pool[untouched].clone()
        o_t, same = leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)
        assert same is pool
        assert_close(o_t, expect_o, 1e-5, f"{what}: output")
        assert_close(pool[rows], expect_s, 1e-5, f"{what}: updated slots")
        assert torch.equal(pool[untouched], before), f"{what}: a slot no row names was written"

    checked(pool, torch.tensor([4, 1], device=DEVICE), gamma, "first call")
    checked(pool, torch.tensor([0, 5], device=DEVICE), gamma, "other slots, same signature")
    assert len(api._TOKEN_STEPS) == 1
    slots = torch.tensor([2, 3], device=DEVICE)
    checked(pool, slots, gamma, "a third slot tensor")
    slots[0] = 5                                            # in place: a new version, checked and read again
    checked(pool, slots, gamma, "slot ids written in place")
    gamma.mul_(0.5)
    checked(pool, slots, gamma, "γ written in place")
    wide = rand(6, H, D, R, seed=5).transpose(-1, -2)       # the same shape, other strides
    checked(wide, slots, gamma, "a pool of other strides")
    checked(pool, slots.to(torch.int32), gamma, "int32 slot ids")
    slots[1] = 5
    with pytest.raises(ValueError, match="slot_ids must not repeat a slot"):
        leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)
    with pytest.raises(TypeError, match="check_slots must be a bool"):
        leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=torch.tensor([0, 1], device=DEVICE),
                               check_slots=1)


@pytest.mark.parametrize("shape", [(1, 32, 128), (2, 3, 12), (1, 1, 1), (0, 3, 4), (1, 5, 1, 7), (4, 1, 5, 1),
                                   (1, 1, 1, 1), (2, 3, 40, 12), (2, 3, 2, 8, 12)], ids=str)
def test_a_repeated_calls_output_has_the_strides_of_a_first_calls(shape):
    """new_like of an output template: torch.empty's shape, strides, dtype and device (the caller's output of a
    repeated call is laid out as that of the call that was checked), and never the template's storage."""
    for dtype in (torch.float16, torch.float32):
        template = leettriton.problem.output_template(shape, dtype, DEVICE)
        out, fresh = leettriton.problem.new_like(template), torch.empty(shape, dtype=dtype, device=DEVICE)
        assert (out.shape, out.stride(), out.dtype, out.device) == (fresh.shape, fresh.stride(), dtype, fresh.device)
        assert out.numel() == 0 or out.data_ptr() != template.data_ptr()
        assert not out.requires_grad


def test_slotted_decode_repeats_through_the_pytorch_step(monkeypatch):
    """CPU tensors outside the interpreter repeat the PyTorch step; a one-token repeat hands it b_t, c_t, v_t
    and the output without their token axis."""
    monkeypatch.setattr(decode, "is_interpreting", lambda: False)
    api._TOKEN_STEPS.clear()
    cpu = lambda x: x.cpu()  # noqa: E731  (the suite's device may be CUDA: this is the CPU path)
    pool = cpu(rand(4, H, R, D, seed=1))
    gamma = torch.tensor([0.9, 0.5, 1.0])
    for seed, rows in ((2, [3, -1]), (5, [0, 2]), (8, [1, 3])):
        slots = torch.tensor(rows)
        b_t, c_t, v_t = (cpu(rand(B, H, R, seed=seed)), cpu(rand(B, H, R, seed=seed + 1)),
                         cpu(rand(B, H, D, seed=seed + 2)))
        live = [i for i, s in enumerate(rows) if s >= 0]
        used = [rows[i] for i in live]
        expect_o, expect_s = decode_oracle(b_t[live], c_t[live], v_t[live], pool[used].clone(), gamma)
        o_t, same = leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)
        assert same is pool and o_t.shape == (B, H, D) and o_t.is_contiguous()
        assert_close(o_t[live], expect_o, 1e-5, f"slots {rows}: output")
        assert_close(pool[used], expect_s, 1e-5, f"slots {rows}: updated slots")
        padding = [i for i in range(B) if i not in live]
        assert torch.equal(o_t[padding], torch.zeros(len(padding), H, D, dtype=o_t.dtype)), f"slots {rows}: padding"
    assert len(api._TOKEN_STEPS) == 1


def test_walk_spec_gives_every_mode_of_the_walk():
    """The walk's launchers set no mode by hand: :class:`WalkSpec` holds every constexpr of the kernel but its
    config (a constexpr added to the kernel without the spec fails here), and :func:`walk_spec` derives them
    from the problem and the launch: segments from the workspace read a start state and store none, whole
    sequences and prefix sums follow the problem's states, a piece after the first adds its partial sum."""
    import dataclasses
    import inspect

    from leettriton.kernels import walk as chunk_walk
    from leettriton.problem import make_problem

    params = inspect.signature(chunk_walk._chunk_walk_fwd_kernel).parameters
    constexprs = {name for name, prm in params.items() if prm.annotation == "tl.constexpr"}
    assert {f.name for f in dataclasses.fields(chunk_walk.WalkSpec)} == constexprs - {"BT", "BK", "BV"}
    assert set(chunk_walk.KEY) <= constexprs | {"R", "D"}

    b, c, v = (torch.zeros(1, 2, 40, x, dtype=torch.bfloat16) for x in (24, 24, 8))
    p, _ = make_problem(b, c, v, 0.9, return_state=True)
    whole = chunk_walk.walk_spec(p)
    assert (whole.HAS_DECAY, whole.HAS_INITIAL, whole.STORE_STATE, whole.SEGMENTED, whole.PREFIX) == \
        (True, False, True, False, False)
    assert (whole.VARLEN, whole.SLOTS, whole.RP, whole.ACC, whole.REDO) == (False, False, 32, False, False)
    from_ws = chunk_walk.walk_spec(p, seg_len=16)
    assert (from_ws.HAS_INITIAL, from_ws.STORE_STATE, from_ws.SEGMENTED, from_ws.PREFIX) == (True, False, True, False)
    prefix = chunk_walk.walk_spec(p, seg_len=16, prefix=True, partial=torch.zeros(1))
    assert (prefix.HAS_INITIAL, prefix.STORE_STATE, prefix.PREFIX, prefix.ACC) == (False, True, True, True)
    assert whole.constexprs()["DOT_PRECISION"] == "tf32" and len(whole.constexprs()) == len(constexprs) - 3


def _per_token_oracle(b, c, v, state, a):
    """k steps with a per-token decay in float64: S ← exp(a_t) S + c_tᵀ v_t, o_t = b_t S (b, c, v: (B, H, k, ·),
    a: (B, H, k), state (B, H, r, d)); returns (o, S)."""
    s = state.double()
    outs = []
    for t in range(b.shape[2]):
        s = torch.exp(a[:, :, t].double())[..., None, None] * s + c[:, :, t, :, None].double() * v[:, :, t, None, :].double()
        outs.append(torch.einsum("bhr,bhrd->bhd", b[:, :, t].double(), s))
    return torch.stack(outs, 2), s


@pytest.mark.parametrize("one_token", [True, False], ids=["decode_step", "decode_tokens"])
def test_per_token_decode_repeats_only_what_the_signature_fixes(one_token):
    """A per-token decay's step repeats its launch for a signature met before: new b, c, v, decays and slot ids
    each call (the decays written in place too), each result the oracle's; the decay's memory apart from the
    pool's still checked on a repeated call."""
    api._TOKEN_STEPS.clear()
    K = 1 if one_token else 3
    pool = rand(6, H, R, D, seed=1)

    def checked(seed, rows, a=None):
        b, c, v = rand(B, H, K, R, seed=seed), rand(B, H, K, R, seed=seed + 1), rand(B, H, K, D, seed=seed + 2)
        a = -torch.rand(B, H, K, generator=torch.Generator().manual_seed(seed)).to(DEVICE) if a is None else a
        slots = torch.tensor(rows, device=DEVICE)
        expect_o, expect_s = _per_token_oracle(b, c, v, pool[rows].clone(), a)
        if one_token:
            o, same = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], pool, log_decay=a[:, :, 0],
                                             slot_ids=slots)
            o = o.unsqueeze(2)
        else:
            o, same = leettriton.decode_tokens(b, c, v, pool, log_decay=a, slot_ids=slots)
        assert same is pool
        assert_close(o, expect_o, 1e-5, f"seed {seed}: output")
        assert_close(pool[rows], expect_s, 1e-5, f"seed {seed}: updated slots")
        return a

    checked(2, [4, 1])
    a = checked(5, [0, 5])
    assert len(api._TOKEN_STEPS) == 1                    # the second call repeated the first's launch
    a.mul_(3.0)                                          # in place: the kernel reads the new values
    checked(8, [2, 3], a=a)
    assert len(api._TOKEN_STEPS) == 1
    inside = pool.view(-1)[:B * H * K].view(B, H, K)     # a decay in the pool's memory: refused on a repeat too
    inside.fill_(-0.5)
    b, c, v = rand(B, H, K, R, seed=11), rand(B, H, K, R, seed=12), rand(B, H, K, D, seed=13)
    with pytest.raises(ValueError, match="log_decay"):
        if one_token:
            leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], pool, log_decay=inside[:, :, 0],
                                   slot_ids=torch.tensor([1, 2], device=DEVICE))
        else:
            leettriton.decode_tokens(b, c, v, pool, log_decay=inside, slot_ids=torch.tensor([1, 2], device=DEVICE))


@pytest.mark.parametrize("one_token", [True, False], ids=["decode_step", "decode_tokens"])
def test_per_token_decode_without_a_repeatable_launch(one_token, monkeypatch):
    """A per-token step whose first launch gave nothing to repeat (None: a launch the compiled path cannot key,
    as on CUDA before a config is chosen) runs the whole path again on its next call, each result the oracle's."""
    api._TOKEN_STEPS.clear()
    real = api.decode_tokens_impl
    monkeypatch.setattr(api, "decode_tokens_impl", lambda *a, **k: (real(*a, **k), None)[1])
    K = 1 if one_token else 2
    state = rand(B, H, R, D, seed=3)
    for seed in (20, 30):
        b, c, v = rand(B, H, K, R, seed=seed), rand(B, H, K, R, seed=seed + 1), rand(B, H, K, D, seed=seed + 2)
        a = -torch.rand(B, H, K, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        expect_o, expect_s = _per_token_oracle(b, c, v, state.clone(), a)
        if one_token:
            o, _ = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, log_decay=a[:, :, 0])
            o = o.unsqueeze(2)
        else:
            o, _ = leettriton.decode_tokens(b, c, v, state, log_decay=a)
        assert_close(o, expect_o, 1e-5, f"seed {seed}: output")
        assert_close(state, expect_s, 1e-5, f"seed {seed}: state")
    assert len(api._TOKEN_STEPS) == 1   # the second call found the signature, and its None launch
