"""Test setup: the interpreter on CPU-only machines, hypothesis profiles, poisoned outputs.

* Without a GPU, ``TRITON_INTERPRET=1`` is set before leettriton is imported, so
  the Triton kernels run (slowly) on the CPU; with a GPU they compile for real.
* ``LEETTRITON_AUTOTUNE=0`` (unless already set): each kernel runs its family's
  first fitting config instead of tuning every config at every new shape;
  ``test_configs.py`` runs every config of the family explicitly.
* Under pytest-xdist (``-n N``), each worker's PyTorch threads take its share of the cores.
* Hypothesis profiles: ``ci`` (default without a GPU: few, small examples),
  ``gpu`` (default with a GPU: more and larger), ``dev``.  Choose one with
  ``--hypothesis-profile=NAME``.
* Every output the package allocates is filled with NaN first, so an element a
  kernel forgets to write fails the comparison.
* A pinned config that is not one of its family's configs (``PinnedConfigWarning``) fails the test.
* A test that leaves ``LEETTRITON_AUTOTUNE`` changed fails (an error at its teardown).
* On a GPU, a test whose failure leaves the process's CUDA context unusable (a sticky CUDA error, such as an
  illegal address) is named in every later test of that process, which fails at once: a worker's log then
  says where its GPU was lost, even when only its last lines are kept.
"""
from __future__ import annotations

import os
import warnings

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("LEETTRITON_AUTOTUNE", "0")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # a worker of several (pytest-xdist's -n): PyTorch's threads on its share of the cores, not on every core
    # in contention with the other workers' threads
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import leettriton  # noqa: E402
import leettriton.problem  # noqa: E402
from leettriton.autotune.configs import PinnedConfigWarning  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"

settings.register_profile(
    "ci", max_examples=12, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "gpu", max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=40, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpu" if HAS_GPU else "ci"))


@pytest.fixture(autouse=True)
def autotuning_setting_kept():
    """A test that leaves the process's ``LEETTRITON_AUTOTUNE`` other than it found it fails (an error at its
    teardown): every later test of its process would tune each new shape's kernels, or stop tuning, so the
    suite's time and the configs it runs would depend on the order tests meet in a worker.  (Defined first of
    the autouse fixtures, so that monkeypatch's undoing comes before this check.)"""
    before = os.environ.get("LEETTRITON_AUTOTUNE")
    yield
    after = os.environ.get("LEETTRITON_AUTOTUNE")
    assert after == before, f"the test left LEETTRITON_AUTOTUNE={after!r} (it found {before!r})"


@pytest.fixture(autouse=True)
def pinned_configs_must_fit():
    """A pinned config that is not one of its family's configs is an error in the tests (a warning for users)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", PinnedConfigWarning)
        yield


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Fill every output tensor the package allocates with NaN."""
    real = leettriton.problem.new_empty

    def poisoned(shape, dtype, device):
        return real(shape, dtype, device).fill_(float("nan"))

    real_like = leettriton.problem.new_like

    def poisoned_like(template):
        return real_like(template).fill_(float("nan"))

    monkeypatch.setattr(leettriton.problem, "new_empty", poisoned)
    monkeypatch.setattr(leettriton.problem, "new_like", poisoned_like)
    yield


@pytest.fixture
def device():
    return DEVICE


_CUDA_LOST: list[str] = []
"""The test (and its error) after whose failure this process's CUDA context stopped working, once it has."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After a failing test on a GPU, check that the device still answers; if not, remember the test."""
    outcome = yield
    if not HAS_GPU or _CUDA_LOST or call.excinfo is None or not torch.cuda.is_initialized():
        return
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # a sticky error: every later CUDA call of this process fails too
        _CUDA_LOST.append(f"{item.nodeid} ({call.when}: {type(call.excinfo.value).__name__}: "
                          f"{str(call.excinfo.value)[:300]}; then {type(exc).__name__})")


@pytest.fixture(autouse=True)
def cuda_context_alive():
    """Fail at once, naming where, once an earlier test of this process lost the CUDA context."""
    if _CUDA_LOST:
        pytest.fail(f"this process lost its CUDA context in {_CUDA_LOST[0]}", pytrace=False)
    yield
