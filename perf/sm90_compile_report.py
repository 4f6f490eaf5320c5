"""Compile a method's forward kernel for sm_90 on a machine without a GPU: its registers, spills and
ptxas's warnings, for a tree of the package (this one, or an export of another revision to compare).

    python perf/sm90_compile_report.py --method lightning_attention --dtype bfloat16 --decay
    python perf/sm90_compile_report.py --tree /tmp/old --method vanilla --dtype bfloat16 \\
        --config '{"BT": 64, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}'

It needs a Triton whose NVIDIA backend can compile (any recent wheel carries ptxas) and a torch that imports
without a driver.  Triton's active driver is replaced by a stand-in that names an sm_90 target, and every
kernel call is compiled without being launched (Triton's ``warmup``); the package's family is pinned to
``h100`` so its config checks pass.  The method's launcher runs on CPU tensors that are never read.  Each
kernel the launcher compiles is reported: ptxas ``-v`` per function (the kernel and any function it calls),
and the number of ``wgmma`` instructions.  What it shows is the code the GPU would run, not its speed:
spills and serialised ``wgmma`` (ptxas warning C7514) are the things to look for; timings need the GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def stand_in_sm90() -> tuple[list, list]:
    """Replace Triton's active driver by a stand-in that names an sm_90 target, and make every kernel call
    compile without launching (Triton's ``warmup``).  Returns two lists: each kernel call that compiled (or
    found its kernel compiled) is appended to the first, as ``(name, kernel)``; a kernel that fails to compile raises from the call, as on the GPU."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class Sm90:
        """Triton's driver, as far as compiling needs one."""
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def is_active(self):
            return True

    driver.set_active(Sm90())
    compiled, failed = [], []
    run = JITFunction.run

    def compile_only(self, *a, grid, warmup, **k):
        try:
            kernel = run(self, *a, grid=grid, warmup=True, **k)
        except Exception as exc:
            failed.append((self._fn_name, exc))
            raise
        compiled.append((self._fn_name, kernel))
        return kernel

    JITFunction.run = compile_only
    return compiled, failed


def pin_family(family) -> None:
    """Every leettriton module's ``current_family`` answers ``family`` (its config checks pass on the CPU)."""
    for m in list(sys.modules.values()):   # every module's own reference to current_family
        if getattr(m, "__name__", "").startswith("leettriton") and hasattr(m, "current_family"):
            m.current_family = lambda device=None: family


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   help="folder holding the leettriton package to compile (default: this checkout)")
    p.add_argument("--method", default="lightning_attention")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--decay", action="store_true", help="a constant γ per head (default: none)")
    p.add_argument("--shape", default="1,32,8192,128,128", help="B,H,n,r,d (default 1,32,8192,128,128)")
    p.add_argument("--config", default='{"BT": 64, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}',
                   help="the kernel's config (JSON), pinned")
    p.add_argument("--schedule", default="{}", help="the plan's schedule (JSON), for methods that read one")
    args = p.parse_args()

    sys.path.insert(0, os.path.abspath(args.tree))
    compiled, _ = stand_in_sm90()
    import torch
    import triton

    import leettriton
    import leettriton.autotune.families as families
    from leettriton.methods.spec import Plan
    from leettriton.problem import make_problem
    if not os.path.abspath(leettriton.__file__).startswith(os.path.abspath(args.tree)):
        raise SystemExit(f"imported {leettriton.__file__}, not the tree {args.tree}")
    module = __import__(f"leettriton.methods.{args.method}.kernels", fromlist=["_"])
    pin_family(families.FAMILIES["h100"])

    B, H, n, r, d = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    b, c, v = (torch.zeros(B, H, n, k, dtype=dtype) for k in (r, r, d))
    problem, _ = make_problem(b, c, v, torch.full((H,), 0.99) if args.decay else None)
    plan = Plan(method=args.method, run=None, configs={f"{args.method}.fwd": json.loads(args.config)},
                schedule=json.loads(args.schedule))
    try:
        getattr(module, f"{args.method}_fwd")(problem, plan)
    except Exception as exc:   # after the compile: the stand-in driver launches nothing
        if not compiled:
            raise
        print(f"(the launcher stopped after compiling: {type(exc).__name__})")
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    for name, kernel in compiled:
        ptx = kernel.asm["ptx"]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
        os.unlink(f.name)
        print(f"{name}: {ptx.count('wgmma.mma_async')} wgmma, shared memory {kernel.metadata.shared} bytes")
        for line in res.stderr.splitlines():
            if any(w in line for w in ("Compiling", "Function properties", "registers", "spill", "C7514", "error")):
                print("   ", line.split("info    : ")[-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
