"""The first hour of a user: every Python block of README.md runs as written, and the commands it shows
say what they print and write where they should.

Each fenced ```python block runs on its own, in a fresh namespace and an empty working directory, on
the CPU (the Triton kernels in the interpreter, as ``tests/conftest.py`` sets up).  A block whose first
line is ``# needs a GPU`` is skipped without one; every other block must run.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
NEEDS_GPU = "# needs a GPU"
MIN_BLOCKS = 10
"""The README has at least this many Python blocks that run on a CPU (a block dropped by a broken fence,
or marked as needing a GPU without need, fails :func:`test_readme_blocks_are_found`)."""


def python_blocks() -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced ```python block of README.md."""
    blocks, code, start = [], None, 0
    with open(README, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if code is None:
                if line.strip() == "```python":
                    code, start = [], number + 1
            elif line.strip() == "```":
                blocks.append((start, "".join(code)))
                code = None
            else:
                code.append(line)
    assert code is None, f"README.md: the ```python block from line {start} is never closed"
    return blocks


BLOCKS = python_blocks()


def needs_gpu(code: str) -> bool:
    return code.lstrip().startswith(NEEDS_GPU)


def test_readme_blocks_are_found():
    on_cpu = [line for line, code in BLOCKS if not needs_gpu(code)]
    assert len(on_cpu) >= MIN_BLOCKS, f"README.md: only {len(on_cpu)} Python blocks run on a CPU: {on_cpu}"


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, code, tmp_path, monkeypatch):
    if needs_gpu(code) and not torch.cuda.is_available():
        pytest.skip(f"README.md line {line}: {NEEDS_GPU}")
    monkeypatch.chdir(tmp_path)                       # what a block saves lands here
    for key, value in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port()).items():
        monkeypatch.setenv(key, value)                # the torchrun variables, restored after the block
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    finally:
        torch.set_num_threads(threads)
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():   # a block that failed before its own clean-up
            dist.destroy_process_group()


# ------------------------------------------------------------------------------ the commands it shows

def test_quick_bench_on_cpu_prints_no_memory_floor(capsys):
    """On a CPU the memory floor and the ratio to it mean nothing: neither is printed; the error is labelled."""
    from leettriton.bench import cli

    cli.main(["--quick", "--device", "cpu", "--heads", "2", "--r", "8", "--d", "8", "--n", "16,40",
              "--methods", "vanilla_torch,auto", "--rep-ms", "5", "--warmup-ms", "1"])
    out = capsys.readouterr().out
    assert "[4/4]" in out and "err vs fp64" in out, out
    assert "floor" not in out and "bandwidth" not in out, out
    assert "(all)" not in out, out
    assert "| median " in out and "×" not in out.split("| median ", 1)[1].split("Relative error", 1)[0], out


def _serve(args):
    from leettriton.models import serving

    return serving.main(["--model", "retnet", "--requests", "2", "--prompt-min", "1", "--prompt-max", "3",
                         "--new-tokens", "2", "--slots", "2", "--no-warmup", "--device", "cpu", *args])


def test_serving_command_writes_under_its_own_gpu_family(tmp_path, capsys):
    """``--out DIR`` writes ``DIR/<family>/`` of the device it ran on: ``cpu`` here, never another GPU's folder."""
    result = _serve(["--out", str(tmp_path / "results")])
    path = tmp_path / "results" / "cpu" / "serving_retnet.json"
    assert json.loads(path.read_text())["summary"] == result["summary"]
    assert path.with_suffix(".md").exists() and sorted(os.listdir(tmp_path / "results")) == ["cpu"]
    assert f"wrote {path}" in capsys.readouterr().out


def test_serving_command_refuses_another_gpus_folder(tmp_path):
    with pytest.raises(SystemExit, match=re.escape("holds h100's results, but this runs on cpu")):
        _serve(["--json", str(tmp_path / "perf" / "results" / "h100" / "serving_retnet.json")])
    with pytest.raises(SystemExit, match="not both"):
        _serve(["--out", str(tmp_path), "--json", str(tmp_path / "x.json")])
    assert not any(tmp_path.rglob("*.json"))


def test_version_follows_the_changelog():
    """pyproject.toml and ``leettriton.__version__`` agree; a development version has an [Unreleased] section,
    a release its own heading in CHANGELOG.md."""
    import leettriton

    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        declared = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert declared == leettriton.__version__
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        headings = re.findall(r"^## \[([^\]]+)\]", f.read(), re.M)
    if ".dev" in declared:
        assert headings[0] == "Unreleased", headings
        assert declared.split(".dev")[0] not in headings, (declared, headings)   # not released yet
    else:
        assert declared in headings, (declared, headings)
