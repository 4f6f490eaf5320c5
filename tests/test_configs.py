"""Every config of every kernel, for the family of the machine the tests run on.

The property tests run each kernel with its family's first fitting config
(``LEETTRITON_AUTOTUNE=0``); here each config the autotuner may pick -- and a
heuristic file may pin -- runs once on an awkward shape, pinned through the
same path ``method="auto"`` uses, and is checked against the oracle.
On the CPU the family is the interpreter's, with one config per kernel: one run
pins them all.
"""
from __future__ import annotations

import pytest
import torch

import leettriton
from leettriton.methods import BUILTIN_METHODS
from leettriton.plan import run_problem
from leettriton.problem import make_problem
from leettriton.autotune import current_family, recording
from conftest import DEVICE, HAS_GPU
from helpers import Case, assert_close, tolerance

CASES = [
    Case(2, 2, 200, 40, 72, dtype=torch.float16, gamma="tensor", gammas=(0.97, 1.0), initial=True,
         return_state=True, seed=11),
    # r and d past 128: the interpreter's configs run three key tiles and two value tiles, the last of each
    # partial; n = 171 ends inside a chunk, a leaf and a segment, and gives block_based five segments (its scan)
    Case(1, 2, 171, 130, 129, dtype=torch.float32, layout="bnhd", gamma=0.9, initial=True, return_state=True,
         seed=12),
]
if HAS_GPU:
    # r > 128 in 16 bits: the walk's register-bound configs (4 warps with 64-wide value tiles, 8 warps
    # with 128-wide ones); too slow for the interpreter, which has one config per kernel anyway
    CASES.append(Case(1, 2, 333, 200, 264, dtype=torch.bfloat16, gamma="tensor", gammas=(0.9, 1.0), initial=True,
                      return_state=True, seed=14))


def kernels_of(method: str, case: Case):
    """The kernels ``method`` launches for ``case``, with the arguments of each launch."""
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    p, _ = make_problem(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=case.return_state)
    with recording() as log:
        run_problem(p, method)
    seen = {}
    for kernel, args in log:
        seen.setdefault(kernel.space.name, (kernel, args))
    return list(seen.values())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
@pytest.mark.parametrize("method", BUILTIN_METHODS)
def test_every_config(method, case):
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    ref, ref_state = leettriton.reference(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=True)
    family = current_family()
    tol = tolerance(case.dtype)
    launched = kernels_of(method, case)
    assert launched, f"{method} launched no kernel"
    usable = {}
    for kernel, args in launched:
        usable[kernel.space.name] = kernel.space.usable(family, args)
        assert usable[kernel.space.name], f"no config of {kernel.space.name} fits {family.name} for {case.id}"
    if all(len(configs) == 1 for configs in usable.values()):
        # one config a kernel (the interpreter's family): a run pinning each alone would launch the same
        # kernels with the same configs as one run pinning them all, as `auto` pins them
        pins = [{name: configs[0] for name, configs in usable.items()}]
    else:
        pins = [{name: cfg} for name, configs in usable.items() for cfg in configs]
    for pinned in pins:
        p, out = make_problem(b, c, v, gamma, layout=case.layout, initial_state=s0, return_state=True)
        run_problem(p, method, pinned)
        what = f"{method} with {', '.join(f'{name}={cfg}' for name, cfg in pinned.items())} [{case.id}]"
        assert_close(out, ref, tol, what + " output")
        assert_close(p.state, ref_state, tol, what + " state")
    if not HAS_GPU:
        assert family.name == "cpu" and len(pins) == 1


@pytest.fixture
def tuning_for_real(monkeypatch):
    """Autotuning on, the h200 family's config lists, and every trial run twice (no timing):
    also under the interpreter, each candidate config runs before the chosen one."""
    import leettriton.autotune.configs as configs
    from leettriton.autotune import FAMILIES, KERNELS

    def bench_twice(kernel_call, quantiles):
        kernel_call()
        kernel_call()
        return [1.0 for _ in quantiles]

    monkeypatch.setenv("LEETTRITON_AUTOTUNE", "1")
    monkeypatch.setattr(configs, "current_family", lambda *a: FAMILIES["h200"])
    monkeypatch.setattr(configs, "_do_bench", bench_twice)
    for kernel in KERNELS.values():
        monkeypatch.setattr(kernel, "_do_bench", bench_twice, raising=False)
        kernel.cache.clear()
    yield FAMILIES["h200"]
    for kernel in KERNELS.values():
        kernel.cache.clear()


@pytest.mark.parametrize("method", BUILTIN_METHODS)
def test_autotuning_leaves_results_intact(method, tuning_for_real):
    """The autotuner runs every candidate config before the chosen one: kernels that update a
    workspace or state in place must be restored between trials, or the result is wrong.

    Here the GPU family's config list is tuned for real (each trial run twice), also under the
    interpreter, on a small problem.
    """
    # n = 70 crosses a 64-row chunk.  causal_dot_product's configs (narrow value tiles, each a program that walks
    # every row: slow under the interpreter) take 23 rows, in blocks of 2 or 4 rows with a partial last one
    n = 23 if method == "causal_dot_product" else 70
    case = Case(1, 1, n, 64, 40, dtype=torch.float16, gamma=0.9, initial=True, return_state=True, seed=13)
    b, c, v, gamma, s0 = case.tensors(DEVICE)
    ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
    out, state = leettriton.linear_attention(b, c, v, gamma, method=method, initial_state=s0, return_state=True)
    assert_close(out, ref, tolerance(case.dtype), f"{method} after autotuning")
    assert_close(state, ref_state, tolerance(case.dtype), f"{method} state after autotuning")


def test_autotuning_decode_step_leaves_state_intact(tuning_for_real):
    """decode_step updates the state in place: every candidate config of its kernel is tried
    (twice) before the chosen one runs, so the state must be restored between trials."""
    from leettriton.kernels import decode

    kernel = decode._decode_step_kernel
    assert len(kernel.space.usable(tuning_for_real, dict(R=64, D=40))) > 1, "nothing to tune: the test proves nothing"
    g = torch.Generator().manual_seed(3)
    b, c, v = (torch.randn(2, 3, 1, n, generator=g).to(DEVICE, torch.float16) for n in (64, 64, 40))
    s0 = torch.randn(2, 3, 64, 40, generator=g).to(DEVICE)
    gamma = torch.tensor([0.5, 0.9, 1.0], device=DEVICE)
    ref, ref_state = leettriton.reference(b, c, v, gamma, initial_state=s0, return_state=True)
    state = s0.clone()
    o_t, _ = leettriton.decode_step(b[:, :, 0], c[:, :, 0], v[:, :, 0], state, gamma)
    assert_close(o_t, ref[:, :, 0], tolerance(torch.float16), "decode_step after autotuning")
    assert_close(state, ref_state, tolerance(torch.float16), "decode_step state after autotuning")


def test_walk_flags_cover_every_walk_config():
    """Every walk writes one flag per program into a buffer sized for value tiles of MIN_BV columns
    (docs/numerics.md): no walk config of any family may have narrower tiles (more programs)."""
    from leettriton.autotune.families import FAMILIES
    from leettriton.methods.block_based import space as block_based
    from leettriton.kernels import walk as kernels, walk_space
    from leettriton.methods.lightning_attention import space as lightning
    widths = {c["BV"] for sp in (lightning.FWD, walk_space.VARLEN, block_based.FWD) for f in FAMILIES
              for c in sp.family_configs(f)}
    assert min(widths) >= kernels.MIN_BV, sorted(widths)
    assert kernels.MIN_BV > 0
    p, _ = make_problem(*(torch.zeros(2, 3, 40, 100, dtype=torch.float16) for _ in range(2)),
                        torch.zeros(2, 3, 40, 50, dtype=torch.float16))
    assert kernels.walk_flags(p, 5).numel() == -(-50 // kernels.MIN_BV) * 5 * 2 * 3
    for dtype, r in ((torch.bfloat16, 100), (torch.float16, 64), (torch.float32, 16)):  # every dtype and r
        p, _ = make_problem(*(torch.zeros(1, 1, 4, r, dtype=dtype) for _ in range(3)))
        assert kernels.walk_flags(p, 1).numel() == -(-r // kernels.MIN_BV)
