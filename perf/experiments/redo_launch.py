"""What float16's redo launch costs, as a programmatic dependent launch (the library's, on sm_90) and as a plain
one (docs/design.md §2.3).

    python perf/experiments/redo_launch.py [BxHxNxRxD ...]      # default: RetNet-1.3B's layer, 1 x 8192

For each shape (float16, then bfloat16 for reference), with b, c, v and the decay of ``perf/common.py``'s
``shape_inputs``, ``linear_attention(method="auto")`` in variants, each captured in a CUDA graph and its replay
timed (the kernels alone) in seven interleaved rounds:
  lib      the library's call, as it is (float16: the redo a dependent launch on sm_90)
  plain    the same with the redo a plain launch (``redo_by_pdl`` made to answer no)
  noredo   the checked walk without its redo launch (flags written, never read: not a correct call; the
           redo's cost is lib − noredo)
and fla's chunk_simple_gla on the same inputs; then ``lib``'s kernels in five replays from torch.profiler:
each kernel's GPU time and the gap before it.

An earlier form of this script (``redo_launch.patch``: a constexpr GDC in the walk, with a variant whose
float16 walk rounds the operand unchecked) measured the figures docs/design.md §2.3 quotes before the
library had the dependent launch.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

import leettriton
from leettriton import bench
from leettriton.autotune.configs import launch
from leettriton.bench import graph_replay, time_ms
from leettriton.bench.peers import peers
from leettriton.methods.lightning_attention import kernels as lk
from leettriton.plan import clear_plans

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402

MODE = {"v": "lib"}
_library_pdl = lk.redo_by_pdl
_library_launch_walk = lk._launch_walk


def _redo_by_pdl(p, flags):
    return _library_pdl(p, flags) and MODE["v"] == "lib"


def _launch_walk(kernel, grid, config, batch, args, redo):
    if MODE["v"] == "noredo":
        launch(kernel, grid, config, **args)
        return None
    return _library_launch_walk(kernel, grid, config, batch, args, redo)


lk.redo_by_pdl = _redo_by_pdl
lk._launch_walk = _launch_walk


def captured(variant, call):
    MODE["v"] = variant
    clear_plans()
    call()
    torch.cuda.synchronize()
    replay = graph_replay(call)
    MODE["v"] = "lib"
    return replay


def main():
    shapes = sys.argv[1:] or ["1x8x8192x256x512"]
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {__import__('triton').__version__}  "
          f"git {os.environ.get('LEETTRITON_GIT_SHA', '?')}", flush=True)
    for shape in shapes:
        for dtype in (torch.float16, torch.bfloat16):
            b, c, v, gamma = common.shape_inputs(shape, dtype)
            check = bench.oracle(b, c, v, gamma)

            def call():
                return leettriton.linear_attention(b, c, v, gamma, method="auto")

            variants = ["lib", "plain", "noredo"] if dtype == torch.float16 else ["lib"]
            fns, errs = {}, {}
            for name in variants:
                fns[name] = captured(name, call)
                out = None
                MODE["v"] = name
                clear_plans()
                out = call()
                torch.cuda.synchronize()
                MODE["v"] = "lib"
                errs[name] = check.error(out)
            fla = peers("cuda", ["fla_chunk_simple_gla"]).get("fla_chunk_simple_gla")
            if fla is not None:
                prep = fla(b, c, v, gamma)
                fns["fla"] = graph_replay(prep)
                errs["fla"] = check.error(prep.to_bhnd(prep()))
            clear_plans()
            times = {k: [] for k in fns}
            for _ in range(7):
                for k, f in fns.items():
                    times[k].append(time_ms(f, warm=False, rep_ms=150)[0])
            med = {k: sorted(t)[len(t) // 2] for k, t in times.items()}
            print(f"{shape} {str(dtype)[6:]}  replay medians of 7 rounds (ms):", flush=True)
            for k in fns:
                extra = f"  fla/this {med['fla'] / med[k]:.3f}" if "fla" in med and k != "fla" else ""
                print(f"  {k:10s} {med[k]:.4f}  (rounds {' '.join(f'{t:.4f}' for t in times[k])})  err {errs[k]:.1e}{extra}",
                      flush=True)
            # the library's call: every kernel's GPU time and the gaps between them, one call after warm-up
            from torch.profiler import ProfilerActivity, profile
            MODE["v"] = "lib"
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fns["lib"]()
                torch.cuda.synchronize()
            path = os.path.join(tempfile.mkdtemp(), "trace.json")
            prof.export_chrome_trace(path)
            events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
            events.sort(key=lambda e: e["ts"])
            t0 = events[0]["ts"]
            print("  lib's kernels in 5 replays (start µs from the first, duration µs, gap after the one before):")
            end = None
            for e in events:
                gap = "" if end is None else f"gap {e['ts'] - end:6.1f}"
                print(f"    {e['ts'] - t0:8.1f}  {e['dur']:7.1f}  {gap}  {e['name'][:40]}")
                end = e["ts"] + e["dur"]
            del b, c, v, check, fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
