"""Compile kernels for a GPU target without a GPU, and report their resources.

Triton's wheel carries LLVM and ptxas, so a kernel can be compiled to a cubin
for sm_90 (or sm_80, sm_86, sm_89) on any machine: that catches code the
interpreter accepts but the compiler rejects, and reports shared memory,
registers and spills per config before a GPU is ever used.

    python -m leettriton.autotune.compile             # every method, sm_90, fp16, r = d = 128
    python -m leettriton.autotune.compile --arch 86 --dtype float32 --methods vanilla --r 64 --d 64

It must run without ``TRITON_INTERPRET`` (interpreted kernels cannot be compiled).
A config that fails to compile, or needs more shared memory than its family
has, makes the command exit with status 1.

The shapes are taken from a real launch recorded on the CPU (tensors' dtypes,
strides' divisibility), so the compiled signature is the one the GPU would see.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import leettriton
from leettriton.autotune.record import record_decode, record_launches
from leettriton.autotune.families import FAMILIES



_POINTEE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
            torch.int32: "i32", torch.int64: "i64"}


def _signature(fn, args: dict):
    """Triton's signature, constants and attributes for a launch with ``args``, specialised as a launch
    would be; a tuple argument (the strides) is typed element by element, at paths (i, j)."""
    sig, constexprs, attrs = {}, {}, {}

    def typed(path, value, specialize):
        if isinstance(value, tuple):
            return tuple(typed(path + (j,), x, specialize) for j, x in enumerate(value))
        if isinstance(value, torch.Tensor):
            attrs[path] = [["tt.divisibility", 16]]
            return "*" + _POINTEE[value.dtype]
        if isinstance(value, bool):
            return "i1"
        if isinstance(value, int) and value == 1 and specialize:
            constexprs[path] = 1  # Triton specialises integer arguments equal to 1
            return "constexpr"
        if isinstance(value, int):
            if value % 16 == 0 and specialize and value != 0:
                attrs[path] = [["tt.divisibility", 16]]
            return "i32"
        if isinstance(value, float):
            return "fp32"
        raise TypeError(f"cannot type argument {fn.arg_names[path[0]]}={value!r}")

    for i, name in enumerate(fn.arg_names):
        value = args[name]
        if fn.params[i].is_constexpr:
            sig[name] = "constexpr"
            constexprs[(i,)] = value
        else:
            sig[name] = typed((i,), value, not fn.params[i].do_not_specialize)
    return sig, constexprs, attrs


_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) of a cubin, from ``cuobjdump --dump-resource-usage``.

    A non-zero stack means registers spilled to local memory.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True,
                             check=True)
    regs = int(re.search(r"REG:(\d+)", res.stdout).group(1))
    stack = int(re.search(r"STACK:(\d+)", res.stdout).group(1))
    return regs, stack


def compile_kernel(kernel, args: dict, config: dict, arch: int = 90):
    """Compile ``kernel`` (an autotuned leettriton kernel) for sm_``arch`` with ``config``.

    Returns a dict with shared memory bytes, registers and spill bytes.
    """
    fn = kernel.fn
    meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    sig, constexprs, attrs = _signature(fn, {**args, **meta})
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=config.get("num_warps", 4),
                                           num_stages=config.get("num_stages", 2)))
    regs, spill = resource_usage(compiled.asm["cubin"])
    return {"shared": compiled.metadata.shared, "regs": regs, "spill": spill}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability as 80, 86, 89, 90")
    ap.add_argument("--family", default=None, help="config list to check (default: from --arch)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--methods", default=",".join(leettriton.methods.BUILTIN_METHODS + ("decode",)),
                    help="comma-separated methods, and 'decode' for decode_step's kernel")
    ap.add_argument("--r", type=int, default=128)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--first", action="store_true", help="only each kernel's first fitting config")
    opts = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    family = FAMILIES[opts.family or {80: "a100", 86: "a6000", 89: "ada", 90: "h100"}[opts.arch]]
    dtype = getattr(torch, opts.dtype)
    failures = 0
    for method in opts.methods.split(","):
        # a long and a short sequence: single-segment paths compile code that never runs
        if method == "decode":  # the one-token step of leettriton.decode_step
            calls = record_decode(dtype, r=opts.r, d=opts.d)
        else:
            calls = [call for n in (256, 16)
                     for call in record_launches(method, dtype, n=n, r=opts.r, d=opts.d, family=family)]
        seen = set()
        for kernel, args in calls:
            variant = (kernel.space.name, tuple(sorted((k, str(getattr(v, "dtype", v))) for k, v in args.items()
                                                       if k.endswith("_ptr") or k.isupper())))
            if variant in seen:
                continue
            seen.add(variant)
            configs = kernel.space.usable(family, args)
            if opts.first:
                configs = configs[:1]
            print(f"{method} / {kernel.space.name}: {len(configs)} configs for {family.name}")
            for cfg in configs:
                try:
                    rep = compile_kernel(kernel, args, cfg, opts.arch)
                except Exception as e:  # report every failing config, keep going
                    failures += 1
                    print(f"  FAIL {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                est = kernel.space.smem(cfg, args)
                flag = " SPILL" if rep["spill"] else ""
                if rep["shared"] > family.smem_per_block:
                    flag += " OVER-SMEM"
                    failures += 1
                print(f"  {cfg}: shared {rep['shared']} B (estimate {est}), regs {rep['regs']}, "
                      f"stack {rep['spill']} B{flag}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
