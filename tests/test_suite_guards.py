"""The test suite's own guards (conftest.py), run in a pytest of their own."""
from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

# conftest.py as it is, then a stand-in GPU whose context a test can break: once broken, every later
# torch.cuda.synchronize() raises, as after a sticky CUDA error
_STAND_IN_GPU = '''
HAS_GPU = True
_broken = []


def _synchronize(*args):
    if _broken:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


torch.cuda.is_initialized = lambda: True
torch.cuda.synchronize = _synchronize
'''


def test_a_lost_cuda_context_is_named_by_every_later_test_and_a_plain_failure_is_not(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")   # the short summary's lines whole
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text() + _STAND_IN_GPU)
    pytester.makepyfile(test_guard='''
        import conftest

        def test_fails_and_keeps_the_gpu():
            assert False, "an ordinary failure"

        def test_after_the_ordinary_failure():
            pass

        def test_loses_the_gpu():
            conftest._broken.append(True)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def test_after_the_loss():
            pass

        def test_long_after_the_loss():
            pass
    ''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-rfE")
    result.assert_outcomes(passed=1, failed=2, errors=2)
    result.stdout.fnmatch_lines([
        "*FAILED test_guard.py::test_fails_and_keeps_the_gpu*",
        "*FAILED test_guard.py::test_loses_the_gpu*",
        "*ERROR test_guard.py::test_after_the_loss - Failed: this process lost its CUDA context in "
        "test_guard.py::test_loses_the_gpu (call: RuntimeError*",
        "*ERROR test_guard.py::test_long_after_the_loss - Failed: this process lost its CUDA context in "
        "test_guard.py::test_loses_the_gpu*",
    ])


def test_a_test_that_leaves_the_autotuning_setting_changed_fails(pytester, monkeypatch):
    """conftest.py's LEETTRITON_AUTOTUNE guard: a test that changes it and leaves it so errs at its teardown;
    one that changes it through monkeypatch (undone before the check) passes, and so does the test after."""
    monkeypatch.setenv("COLUMNS", "400")   # the short summary's lines whole
    monkeypatch.setenv("LEETTRITON_AUTOTUNE", "0")   # as conftest.py sets it unless set
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_guard='''
        import os

        def test_through_monkeypatch(monkeypatch):
            monkeypatch.setenv("LEETTRITON_AUTOTUNE", "1")

        def test_leaves_it_on():
            os.environ["LEETTRITON_AUTOTUNE"] = "1"

        def test_after_it():
            pass
    ''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-rfE")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR test_guard.py::test_leaves_it_on - AssertionError: the test left "
                                 "LEETTRITON_AUTOTUNE='1' (it found '0')*"])
