"""Instruction mix of the chunk walk's main loop, compiled for sm_90 without a GPU.

    python perf/walk_sass.py --r 256 --d 512 --dtype float16 \\
        --config '{"BT": 32, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 3}'
    python perf/walk_sass.py --method block_based --heads 8 --n 8192 --r 256 --d 512 --config '{...}'
    python perf/walk_sass.py --method block_based --kernel segments.state --heads 8 --n 8192 --r 256 --d 512 \\
        --config '{"BT": 64, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 3}'

Compiles ``lightning_attention``'s walk (the body ``block_based`` shares) for the launch the CPU
records at that r, d and dtype (or ``--method block_based``'s segmented walk, or with ``--kernel`` another
of its kernels, such as the state pass ``segments.state``, at batch 1 × ``--heads`` × ``--n``, the H100's
schedule), with the config pinned, disassembles the cubin with the ``nvdisasm``
of Triton's wheel, and counts the instructions of the kernel and of its largest loop (one chunk of
BT rows, per thread): warpgroup MMAs (``HGMMA``), warp MMAs (``HMMA``), conversions (``F2FP``),
float multiplies and maxima, shared-memory loads.  Static counts: a guide to where a chunk's issue
slots go, not a timing.  Must run without ``TRITON_INTERPRET``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import leettriton  # noqa: F401  (registers the kernels)
from leettriton.autotune.compile import _signature
from leettriton.autotune.families import FAMILIES
from leettriton.autotune.record import record_launches


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def instruction_mix(sass: str, top: int = 1) -> tuple[collections.Counter, list]:
    """(the kernel's opcode counts, those of its ``top`` largest loops, largest first: each a label and the
    farthest backward branch to it)."""
    insts, labels, pending = [], {}, None
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            pending = label.group(1)
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            insts.append((addr, m.group(2)))
            if pending:
                labels[pending], pending = addr, None
    loops = []
    for addr, text in insts:
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            loops.append((addr - labels[m.group(1)], labels[m.group(1)], addr))
    whole = collections.Counter(_opcode(t) for _, t in insts)
    widest = {}
    for size, start, end in loops:  # one loop per label: its farthest backward branch
        widest[start] = max(widest.get(start, (0, start, end)), (size, start, end))
    chosen = sorted(widest.values(), reverse=True)[:top] or [(0, 0, -1)]
    return whole, [collections.Counter(_opcode(t) for a, t in insts if start <= a <= end) for _, start, end in chosen]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--r", type=int, default=128)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--config", required=True, help="the kernel's config, JSON")
    ap.add_argument("--method", default="lightning_attention", choices=["lightning_attention", "block_based"])
    ap.add_argument("--kernel", default=None, help="the kernel's config space (default: the method's walk)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--loops", type=int, default=1, help="how many of the largest loops to count")
    opts = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    cfg = json.loads(opts.config)
    calls = record_launches(opts.method, getattr(torch, opts.dtype), H=opts.heads, n=opts.n, r=opts.r, d=opts.d,
                            state=False, family=FAMILIES["h100"])
    name = opts.kernel or f"{opts.method}.fwd"
    kernel, args = next(((k, a) for k, a in calls if k.space.name == name), (None, None))
    if kernel is None:
        ap.error(f"no launch of {name} among {[k.space.name for k, _ in calls]}")
    meta = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
    sig, constexprs, attrs = _signature(kernel.fn, {**args, **meta})
    compiled = triton.compile(ASTSource(fn=kernel.fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    whole, loops = instruction_mix(sass, opts.loops)
    regs = max((int(x) for x in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1
    flags = {k: args[k] for k in ("SEGMENTED", "PREFIX") if k in args}
    print(f"# triton {triton.__version__}, sm_90, {name}, {opts.dtype}, r = {opts.r}, d = {opts.d}, {json.dumps(cfg)}, "
          f"{flags}: shared {compiled.metadata.shared} B")
    print(f"kernel: {sum(whole.values())} instructions, registers R0..R{regs - 1}, "
          f"local loads {whole['LDL']} and stores {whole['STL']}")
    for loop in loops:
        print(f"loop (one chunk, per thread): {sum(loop.values())} instructions: "
              + " ".join(f"{k} {v}" for k, v in loop.most_common(16)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
