"""What a piece's scores in two parts cost (kernels/pieces.py: with r > 256 and 16-bit inputs the chunk walk
makes each piece's masked scores' product with v in two parts, ``PIECE``): the walk's two methods timed with
it and with one part (``scores_in_two_parts`` patched to False), each mode in processes of its own (a
signature's launches are kept for its next call, so one process cannot switch), in alternating rounds.

    PYTHONPATH=. python perf/piece_scores.py [--shapes BxHxNxRxD,...] [--dtypes float16,bfloat16] [--rounds 2]
                                             [--methods lightning_attention,block_based]

Prints each cell's time as it is measured, then a table of each cell's median over the rounds, two parts ÷
one part.  Each process compiles (and, with no heuristic point near, autotunes) its cells' kernels first: on
an H100 its first three cells took 114 s, so allow a few minutes per process, or time fewer cells (e.g.
``--shapes 1x8x8192x512x512 --dtypes float16 --methods block_based``).  Without a GPU it stops with a message.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

METHODS = ("lightning_attention", "block_based")


def one_process(shapes, dtypes, methods, two_parts: bool) -> dict:
    """Median ms of each (shape, dtype, method) in this process, the scores in two parts or one."""
    import torch

    import leettriton
    from leettriton.bench.timing import time_ms
    from leettriton.methods.lightning_attention import kernels

    if not two_parts:
        kernels.scores_in_two_parts = lambda p: False
    out = {}
    for shape in shapes:
        B, H, n, r, d = shape
        for dt in dtypes:
            g = torch.Generator(device="cuda").manual_seed(n)
            b, c = (torch.randn(B, H, n, r, device="cuda", generator=g, dtype=getattr(torch, dt)) / r ** 0.5
                    for _ in range(2))
            v = torch.randn(B, H, n, d, device="cuda", generator=g, dtype=getattr(torch, dt))
            gamma = torch.full((H,), 0.99, device="cuda")
            for m in methods:
                cell = f"{'x'.join(map(str, shape))} {dt} {m}"
                out[cell] = time_ms(lambda: leettriton.linear_attention(b, c, v, gamma, method=m), rep_ms=100)[0]
                print(f"  {cell}: {out[cell]:.3f} ms", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x8x8192x512x512,4x16x2048x384x128")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS), help="of " + ", ".join(METHODS))
    ap.add_argument("--one", choices=("two", "one"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in opts.shapes.split(",")]
    if any(len(s) != 5 for s in shapes):
        raise SystemExit(f"--shapes takes BxHxNxRxD,..., not {opts.shapes!r}")
    dtypes = opts.dtypes.split(",")
    methods = opts.methods.split(",")
    if not set(methods) <= set(METHODS):
        raise SystemExit(f"--methods takes some of {','.join(METHODS)}, not {opts.methods!r}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("piece_scores.py needs a CUDA device")
    if opts.one:
        with open(opts.result, "w") as f:
            json.dump(one_process(shapes, dtypes, methods, opts.one == "two"), f)
        return 0
    runs = {"two": [], "one": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(opts.rounds):
            for mode in (("two", "one") if i % 2 == 0 else ("one", "two")):
                # each cell's time is printed as it comes (a run cut off by a time limit keeps them)
                print(f"round {i}, scores in {mode} part(s):", flush=True)
                result = os.path.join(tmp, f"{i}-{mode}.json")
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--shapes", opts.shapes,
                                       "--dtypes", opts.dtypes, "--methods", opts.methods, "--one", mode,
                                       "--result", result])
                if done.returncode != 0:
                    raise SystemExit(f"round {i} ({mode} part(s)) failed: exit status {done.returncode}")
                with open(result) as f:
                    runs[mode].append(json.load(f))

    def median(xs):
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    print("\n| shape B×H×n×r×d, dtype, method | one part (ms) | two parts (ms) | two ÷ one |\n|---|---|---|---|")
    for cell in runs["two"][0]:
        one, two = median([r[cell] for r in runs["one"]]), median([r[cell] for r in runs["two"]])
        print(f"| {cell} | {one:.3f} | {two:.3f} | {two / one:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
