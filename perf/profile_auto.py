"""Per-kernel GPU time of ``linear_attention(method="auto")`` at model shapes, the call's CUDA-graph replay, and
its error against the definition in float64.

    python perf/profile_auto.py                                  # the default shapes, float16 and bfloat16
    python perf/profile_auto.py --dtypes float16 --shapes 1x8x8192x256x512,1x32x32768x128x128

For every shape (``BxHxNxRxD``), with decay per head (1 − 2^(−5 − 3h/(H−1)): 0.969 … 0.996) and b, c ~ N(0, 1/r),
v ~ N(0, 1): one line with the median time of the call's CUDA-graph replay (``triton.testing.do_bench``: the
kernels alone), each kernel's GPU time per call from ``torch.profiler`` over 20 calls, and ``err_tail``, the
relative error (Frobenius) of the last 256 rows against float64.  The tree of any commit from 2f612ee on (which
has ``leettriton.bench.graph_replay``) can be profiled by the same script (``PYTHONPATH=<tree>``).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import leettriton
from leettriton.bench import graph_replay, time_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPES = "1x8x8192x256x512,1x8x32768x256x512,2x8x8192x256x512,1x32x8192x128x128,1x32x32768x128x128," \
         "1x32x100000x128x128,1x16x8192x64x64"


def replay_ms(fn) -> float:
    """Median ms of ``fn``'s call captured in a CUDA graph and replayed (the kernels alone)."""
    return time_ms(graph_replay(fn), warm=False, rep_ms=300)[0]


def reference_tail(b, c, v, gamma, rows: int = 256) -> torch.Tensor:
    """The last ``rows`` output rows by the definition, in float64."""
    n = b.shape[2]
    i0 = n - rows
    scores = b[:, :, i0:].double() @ c.double().transpose(-1, -2)
    e = (torch.arange(i0, n, device=b.device)[:, None] - torch.arange(n, device=b.device)[None]).double()
    mask = torch.where(e >= 0, gamma.double().log()[:, None, None] * e.clamp(min=0),
                       torch.tensor(float("-inf"), device=b.device, dtype=torch.float64)).exp()
    return (scores * mask) @ v.double()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated BxHxNxRxD")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--label", default="", help="a word that starts every line (which tree)")
    opts = ap.parse_args(argv)
    for dt in (getattr(torch, x) for x in opts.dtypes.split(",")):
        for shape in opts.shapes.split(","):
            B, H, n, r, d = (int(x) for x in shape.split("x"))
            b, c, v, gamma = common.shape_inputs(shape, dt)
            fn = lambda: leettriton.linear_attention(b, c, v, gamma, method="auto")  # noqa: E731
            out = fn()
            ref = reference_tail(b, c, v, gamma)
            err = ((out[:, :, -256:].double() - ref).norm() / ref.norm()).item()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.key_averages():
                t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if t > 0:
                    kernels[e.key[:40]] = t / 20
            ms = replay_ms(fn)
            print(f"{opts.label} {str(dt)[6:]} {B}x{H}x{n} r{r} d{d} replay={ms * 1000:.1f}us err_tail={err:.2e} "
                  + " ".join(f"{k}={t:.1f}us" for k, t in sorted(kernels.items(), key=lambda x: -x[1])), flush=True)
            del b, c, v, out, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
