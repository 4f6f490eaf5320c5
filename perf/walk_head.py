"""Time block_based with its first rows walked beside the segment-state pass.

    python perf/walk_head.py --model 8,256,512 --shapes 1x8192,1x32768 --heads-rows 0,256,512,1024 \
        [--dtypes float16,bfloat16]

A segmented walk first computes the local states of its segments, then walks them; the walk of the
first segment needs no state from the pass.  Here the first ``H`` rows ("head") are walked as a
one-segment problem on a second stream, while the state pass of the remaining rows runs on the
first; the remaining rows are then walked in segments from the head's final state.  For each shape
and dtype: ``auto``'s plan (its method and configs from the heuristic file), ``auto`` itself, and
the headed run for every head length (the configs of ``auto``'s plan when it is ``block_based``,
else the heuristic file's at the shape), each checked against the float64 oracle and timed with
``leettriton.bench.time_ms`` (median); also each stage alone.  Prints one line per run and the
memory floor.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

import leettriton
from leettriton import bench
from leettriton.bench.timing import copy_bandwidth, memory_floor_ms, time_ms as _time_ms
from leettriton.methods.block_based import space as bb
from leettriton.methods.block_based.kernels import _block_based_fwd_kernel, local_states, walk_segments
from leettriton.methods.lightning_attention.kernels import launch_chunk_walk
from leettriton.plan import choose, resolve, run_problem
from leettriton.problem import make_problem

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def time_ms(fn) -> float:
    return _time_ms(fn)[0]


def stages(p, configs, head, side):
    """The three stages of a headed run of ``p`` (callables), and the rest's plan."""
    B, H, n, r, d = p.shape
    f0 = torch.empty((B, H, r, d), dtype=torch.float32, device=p.v.device)
    first = dataclasses.replace(p.rows(0, head), state=f0, memo=None)
    rest = dataclasses.replace(p.rows(head, n), initial_state=f0, memo=None)
    plan = resolve(rest, "block_based", configs)
    sched = plan.schedule
    if sched["seg_len"] >= n - head:
        raise ValueError(f"the rest ({n - head} rows) is one segment")
    local = lambda: local_states(rest, plan)  # noqa: E731
    walk_first = lambda: launch_chunk_walk(_block_based_fwd_kernel, bb.FWD, first, configs)  # noqa: E731

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            walk_first()
        ws = local()
        main.wait_stream(side)
        walk_segments(rest, plan, ws)

    def serial():
        walk_first()
        walk_segments(rest, plan, local())

    ws_keep = local()
    return dict(run=run, serial=serial, first=walk_first, local=local,
                walk=lambda: walk_segments(rest, plan, ws_keep if sched["prefix"] else ws_keep.clone())), sched


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=common.layer_arg, default="8,256,512", help="heads,r,d")
    ap.add_argument("--shapes", default="1x8192,1x32768")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--heads-rows", default="0,256,512,768,1024,1536,2048")
    ap.add_argument("--no-decay", action="store_true")
    ap.add_argument("--gamma-bits", type=float, default=5, help="γ per head from 1 − 2^-BITS to 1 − 2^-(BITS + 3)")
    opts = ap.parse_args(argv)
    heads, r, d = opts.model
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  leettriton {leettriton.__version__}  "
          f"heads {heads}, r {r}, d {d}, {'no decay' if opts.no_decay else f'decay from 1 - 2^-{opts.gamma_bits:g}'}, copy {bw / 1e9:.0f} GB/s",
          flush=True)
    side = torch.cuda.Stream()
    for dtype in opts.dtypes.split(","):
        dt = getattr(torch, dtype)
        for shape in opts.shapes.split(","):
            batch, n = (int(x) for x in shape.split("x"))
            g = torch.Generator(device="cuda").manual_seed(0)
            b, c = (torch.randn(batch, heads, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5
                    for _ in range(2))
            v = torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g)
            gamma = None if opts.no_decay else 1 - torch.exp2(-opts.gamma_bits - 3 * torch.arange(heads, device="cuda") / max(1, heads - 1))
            check = bench.oracle(b, c, v, gamma)
            p, out = make_problem(b, c, v, gamma)
            method, configs = choose(p)
            floor = memory_floor_ms(batch, heads, n, r, d, dtype, bw)
            ms = time_ms(lambda: run_problem(p, "auto"))
            print(f"{dtype} {batch}x{n}: auto = {method} {ms:.4f} ms ({ms / floor:.2f}x floor {floor:.4f}) "
                  f"err {check.error(out):.1e}  schedule {resolve(p, 'auto').schedule}", flush=True)
            if method != "block_based":
                configs = None
            for head in (int(x) for x in opts.heads_rows.split(",")):
                if head <= 0:
                    continue
                try:
                    fns, sched = stages(p, configs, head, side)
                except ValueError as e:
                    print(f"  head {head}: {e}")
                    continue
                out.fill_(float("nan"))
                fns["run"]()
                torch.cuda.synchronize()
                err = check.error(out)
                t = {k: time_ms(f) for k, f in fns.items()}
                print(f"  head {head:5d}: {t['run']:.4f} ms ({t['run'] / floor:.2f}x floor, {ms / t['run']:.3f}x auto) "
                      f"err {err:.1e}  serial {t['serial']:.4f}  first {t['first']:.4f}  states {t['local']:.4f}  "
                      f"walk {t['walk']:.4f}  rest seg {sched['seg_len']} split {sched.get('split', 1)} "
                      f"prefix {sched['prefix']}", flush=True)
            del b, c, v, p, out, check
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
