"""Time the chunk walk with pinned configs, inside or outside its family's config space.

    python perf/walk_configs.py --configs '[{"BT": 32, "BK": 64, "BV": 64, "num_warps": 4, "num_stages": 4}]' \
        --programs-per-sm 1,2 --shapes 1x100000,1x32768,16x8192 [--heads 8 --r 256 --d 512] [--state-splits rule,1,4] \
        [--min-segments rule,512] [--replay]

For each config and each value of the segment rule's programs per SM (a cap: a config that leaves
room for fewer gets fewer, methods/block_based/space.py), ``block_based`` runs at
every shape (heads 32, r = d = 128 unless given, with decay unless ``--no-decay``, float16 by default) with its walk pinned to the
config (the segment-state kernel autotuned, or pinned to the entry's ``"state"`` config, and then
also timed alone), the state pass in the pieces per segment of each ``--state-splits`` value (``rule``:
``state_split``'s), the segments at least each ``--min-segments`` value long (``rule``: ``min_segment``'s;
a number: that for every width); the output is compared with the float64 oracle (on
a subset of heads for long sequences) and the call is timed with ``triton.testing.do_bench`` (from Python, or with ``--replay`` by the replay of its CUDA
graph: the kernels alone).
Configs the family's pruning would reject are run as given (that is the point: to measure
them).  Each config runs in its own process, so a faulting one cannot end the others.  The
first line of the output names the GPU and versions; then one line per (config, rule, shape).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch, triton
import leettriton
from leettriton import bench
from leettriton.plan import run_problem
from leettriton.problem import make_problem
import leettriton.autotune.configs as configs
from leettriton.methods.block_based import space as bb
from leettriton.kernels.segments import segment_local_states

cfg, pps_list, shapes, dtype = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
use_decay, precision = sys.argv[5] == "decay", sys.argv[6]
heads, r, d = json.loads(sys.argv[7])
splits = json.loads(sys.argv[8])
min_segments, replay = json.loads(sys.argv[9]), sys.argv[10] == "replay"
rule, min_rule = bb.state_split, (bb.MIN_SEGMENT, getattr(bb, "SHORT_MIN_SEGMENT", None))
configs._fits = lambda space, config, args: True   # run the config as given
dt = getattr(torch, dtype)
pps_list = cfg.pop("pps", pps_list)
state_cfg = cfg.pop("state", None)
for batch, n in shapes:
    g = torch.Generator(device="cuda").manual_seed(0)
    b, c = (torch.randn(batch, heads, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5 for _ in range(2))
    v = torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g)
    gamma = 1 - torch.exp2(-5 - 3 * torch.arange(heads, device="cuda") / (heads - 1)) if use_decay else None
    check = bench.oracle(b, c, v, gamma)
    p, out = make_problem(b, c, v, gamma, precision=precision if dt == torch.float32 else None)
    for pps, forced, mins in [(x, y, z) for x in pps_list for y in splits for z in min_segments]:
        bb.PROGRAMS_PER_SM = pps
        bb.MIN_SEGMENT, bb.SHORT_MIN_SEGMENT = min_rule if mins == "rule" else (mins, mins)
        bb.state_split = rule if forced == "rule" else (lambda *args, k=forced: k)
        seg, split = bb.segmenting(batch * heads, n, r, d, dt.itemsize, leettriton.autotune.current_family(), cfg)
        pinned = {"block_based.fwd": cfg, **({"segments.state": state_cfg} if state_cfg else {})}
        call = lambda: run_problem(p, "block_based", pinned)
        out.fill_(float("nan"))
        try:
            call(); torch.cuda.synchronize()
            err = check.error(out)
            timed = (lambda f: bench.graph_replay(f)) if replay else (lambda f: f)
            ms = triton.testing.do_bench(timed(call), warmup=25, rep=100, return_mode="median")
            res = dict(ms=ms, err=err)
            if seg < n:   # the segment-state pass alone (every segment but the last, in its pieces)
                count = (-(-n // seg) - 1) * split
                states = lambda: segment_local_states(p, seg // split, pinned, count=count)
                res["state_ms"] = triton.testing.do_bench(timed(states), warmup=25, rep=100, return_mode="median")
        except Exception as e:
            res = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        print("RESULT " + json.dumps(dict(pps=pps, batch=batch, n=n, seg=seg, split=split, mins=mins, **res)), flush=True)
    del b, c, v, p, out, check
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", required=True, help='JSON list of walk configs (a "pps" key: that '
                    "config's own list of programs per SM; a \"state\" key: the segment-state kernel's config)")
    ap.add_argument("--programs-per-sm", default="2", help="comma-separated values of the segment rule")
    ap.add_argument("--shapes", default="1x100000,1x32768,1x8192,16x8192", help="comma-separated BATCHxN")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--no-decay", action="store_true", help="γ = 1 (default: γ per head from 0.969 to 0.996)")
    ap.add_argument("--precision", default="ieee", choices=["ieee", "tf32"], help="float32 only")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per config")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--r", type=int, default=128)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--state-splits", default="rule", help="comma-separated pieces per segment of the state pass "
                    "(rule: the rule's)")
    ap.add_argument("--min-segments", default="rule", help="comma-separated fewest rows per segment of the "
                    "segment rule for every width (rule: the library's rule)")
    ap.add_argument("--replay", action="store_true", help="time each call by the replay of its CUDA graph "
                    "(the kernels alone; default: calls from Python)")
    opts = ap.parse_args(argv)

    import torch
    import triton
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"{opts.dtype}{'/' + opts.precision if opts.dtype == 'float32' else ''}, heads {opts.heads}, r = {opts.r}, "
          f"d = {opts.d}, "
          f"{'no decay' if opts.no_decay else 'decay'}", flush=True)
    shapes = [[int(x) for x in s.split("x")] for s in opts.shapes.split(",")]
    pps = [int(x) for x in opts.programs_per_sm.split(",")]
    for cfg in json.loads(opts.configs):
        cmd = [sys.executable, "-c", CHILD, json.dumps(cfg), json.dumps(pps), json.dumps(shapes), opts.dtype,
               "none" if opts.no_decay else "decay", opts.precision, json.dumps([opts.heads, opts.r, opts.d]),
               json.dumps([x if x == "rule" else int(x) for x in opts.state_splits.split(",")]),
               json.dumps([x if x == "rule" else int(x) for x in opts.min_segments.split(",")]),
               "replay" if opts.replay else "python"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout, env=dict(os.environ))
            lines = [json.loads(x[7:]) for x in res.stdout.splitlines() if x.startswith("RESULT ")]
            tail = [x for x in res.stderr.strip().splitlines() if x.strip()]
            if res.returncode and tail:
                lines.append(dict(error="exit: " + tail[-1][:200]))
        except subprocess.TimeoutExpired:
            lines = [dict(error="timeout")]
        for x in lines:
            where = (f"pps {x['pps']} {x['batch']:>2} x {x['n']:<6} seg {x['seg']:<6} split {x['split']:<2}"
                     + (f" min {x['mins']:<5}" if len(opts.min_segments.split(",")) > 1 else "")
                     if "pps" in x else "")
            what = f"{x['ms']:8.3f} ms  err {x['err']:.1e}" if "ms" in x else x["error"]
            if "state_ms" in x:
                what += f"  (segment states {x['state_ms']:.3f} ms)"
            print(f"{json.dumps(cfg):70s} {where} {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
