"""GPU families: which kind of device the kernels run on, decided lazily.

A *family* groups devices that share the limits the kernels are tuned against
(shared memory per block, multiprocessor count).  Families the project has not
run on are still declared here from their published limits, so that their
config lists exist and ``python -m leettriton.tune --gpu <family>`` works on
such a device.

Nothing here touches CUDA at import time: :func:`current_family` asks the
driver on first use and caches the answer.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

__all__ = ["Family", "FAMILIES", "current_family", "family_of_device", "is_interpreting"]


@dataclass(frozen=True)
class Family:
    """Limits of one GPU family.

    Attributes:
        name: the family's key (``"h100"``, ``"a6000"``, ...).
        capability: CUDA compute capability ``(major, minor)``; ``None`` for the interpreter.
        smem_per_block: shared memory one program may use, in bytes (the opt-in limit).
        num_sms: multiprocessors of the family's reference part.
        description: devices the family stands for.
    """

    name: str
    capability: tuple[int, int] | None
    smem_per_block: int
    num_sms: int
    description: str


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("cpu", None, 1 << 30, 1, "Triton interpreter (TRITON_INTERPRET=1): one config, no benchmarking"),
        Family("a6000", (8, 6), 101376, 84, "sm_86 parts with ~100 KB shared memory: RTX A6000, A40, RTX 3090"),
        Family("a100", (8, 0), 166912, 108, "sm_80: A100, A800"),
        Family("ada", (8, 9), 101376, 142, "sm_89: L40S, L40, RTX 6000 Ada, RTX 4090"),
        Family("h100", (9, 0), 232448, 132, "sm_90: H100, H800, GH200"),
        Family("h200", (9, 0), 232448, 132, "sm_90 with 141 GB HBM3e: H200"),
    )
}


def is_interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def family_of_device(name: str, capability: tuple[int, int], smem_optin: int | None = None,
                     num_sms: int | None = None) -> Family:
    """The family of a CUDA device, from its name and compute capability.

    A device of an architecture no family covers gets a family of its own,
    named ``sm_XY``, with its own shared-memory limit: it uses the config
    lists of the nearest declared family (by shared memory), pruned to what
    fits, and has no heuristic file until one is measured on it.
    """
    upper = name.upper()
    if capability == (9, 0):
        return FAMILIES["h200" if "H200" in upper else "h100"]
    for fam in FAMILIES.values():
        if fam.capability == capability:
            return fam
    if capability == (8, 7):  # Jetson Orin: sm_86-class shared memory
        return FAMILIES["a6000"]
    smem = smem_optin if smem_optin else 101376
    return Family(f"sm_{capability[0]}{capability[1]}", capability, smem, num_sms or 1,
                  f"undeclared architecture ({name})")


@functools.lru_cache(maxsize=None)
def _cuda_family(index: int) -> Family:
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return family_of_device(props.name, (props.major, props.minor), smem, props.multi_processor_count)


def current_family(device=None) -> Family:
    """The family the kernels are tuned for on ``device`` (default: the current CUDA device).

    Under the Triton interpreter this is always the ``cpu`` family.
    """
    if is_interpreting():
        return FAMILIES["cpu"]
    import torch

    if device is None:
        index = torch.cuda.current_device()
    else:
        device = torch.device(device)
        if device.type != "cuda":
            return FAMILIES["cpu"]
        index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_family(index)
