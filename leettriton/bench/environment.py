"""Where a measurement was taken: the device, the versions, the git SHA, the date."""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from typing import Any, Optional

import torch

from ..autotune.families import current_family, is_interpreting
from .inputs import resolve_device

__all__ = ["environment", "gpu_slug"]


def _git(*args) -> Optional[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        res = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def gpu_slug(name: str) -> str:
    """A short folder name for a device: ``"NVIDIA H100 80GB HBM3"`` → ``"h100"``, ``"cpu"`` → ``"cpu"``."""
    tokens = [t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in ("nvidia", "geforce", "tesla", "quadro")]
    if not tokens:
        return "unknown"
    if re.search(r"\d", tokens[0]) or len(tokens) == 1:
        return tokens[0]
    return f"{tokens[0]}-{tokens[1]}"


def environment(device=None) -> dict:
    """Where a measurement was taken: device, versions, git SHA, date (no host name).

    Keys: ``device`` (GPU name or ``"cpu"``), ``device_slug``, ``capability``, ``sm_count``,
    ``memory_gib``, ``family``, ``torch``, ``triton``, ``cuda``, ``python``, ``leettriton``,
    ``git_sha`` (``LEETTRITON_GIT_SHA`` when set: a tree copied without its git metadata), ``git_dirty``, ``date`` (UTC, ISO 8601), ``interpreter``, ``platform``.
    """
    import triton

    from .._version import __version__

    device = resolve_device(device)
    env: dict[str, Any] = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2 ** 30, 1))
    else:
        env.update(device="cpu", capability=None, sm_count=None, memory_gib=None,
                   cpu=platform.processor() or platform.machine(), cpu_threads=torch.get_num_threads())
    env["device_slug"] = gpu_slug(env["device"])
    try:
        env["family"] = current_family(device).name
    except Exception:  # noqa: BLE001  (the family is informative only)
        env["family"] = None
    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    if os.environ.get("LEETTRITON_GIT_SHA"):
        # a copy of the tree made elsewhere (a benchmark machine), whose git metadata, if any,
        # is not that of the code: the caller names the commit
        sha, dirty = os.environ["LEETTRITON_GIT_SHA"], None
    env.update(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
               python=platform.python_version(), leettriton=__version__, git_sha=sha,
               git_dirty=None if dirty is None else bool(dirty),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               interpreter=is_interpreting(), platform=f"{platform.system()} {platform.machine()}")
    return env
