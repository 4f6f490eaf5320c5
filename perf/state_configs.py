"""Time the segment-state pass alone, with pinned configs, inside or outside its config space.

    python perf/state_configs.py --heads 8 --r 256 --d 512 --shapes 1x8192,1x32768 \
        --walk '{"BT": 32, "BK": 256, "BV": 128, "num_warps": 8, "num_stages": 3}' \
        --configs '[{"BT": 64, "BK": 128, "BV": 64, "num_warps": 4, "num_stages": 3}, ...]'

The segments are the ones ``block_based`` cuts for the pinned walk config (methods/block_based/space.py),
the state pass in the rule's pieces.  For each state config and shape: the local states of every segment
but the last (kernels/segments.py: ``segment_local_states``), their largest error relative to the largest
entry against the float64 sums, the median time of the pass alone (``triton.testing.do_bench``), and
``block_based`` as a whole with both configs pinned, its error against the float64 oracle.  One process
for every config (a config that fails prints its error and the next one runs).
"""
from __future__ import annotations

import argparse
import json
import sys


def local_states_f64(c, v, gamma, seg: int, count: int):
    """Σ_{j in s} γ^(e_s − 1 − j) c_jᵀ v_j in float64 for the first ``count`` segments of ``seg`` rows."""
    import torch
    out = []
    for s in range(count):
        cs, vs = c[:, :, s * seg:(s + 1) * seg].double(), v[:, :, s * seg:(s + 1) * seg].double()
        if gamma is not None:
            dist = torch.arange(cs.shape[2] - 1, -1, -1, device=c.device, dtype=torch.float64)
            vs = vs * gamma.double()[None, :, None, None] ** dist[None, None, :, None]
        out.append(cs.transpose(-1, -2) @ vs)
    return torch.stack(out, 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", required=True, help="JSON list of segment-state configs")
    ap.add_argument("--walk", required=True, help="the walk config block_based runs with (it sets the segments)")
    ap.add_argument("--shapes", default="1x8192,1x32768", help="comma-separated BATCHxN")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--r", type=int, default=256)
    ap.add_argument("--d", type=int, default=512)
    opts = ap.parse_args(argv)

    import torch
    import triton
    import leettriton
    from leettriton import bench
    from leettriton.plan import run_problem
    from leettriton.problem import make_problem
    import leettriton.autotune.configs as configs
    from leettriton.methods.block_based import space as bb
    from leettriton.kernels.segments import segment_local_states

    configs._fits = lambda space, config, args: True   # run the configs as given
    dt = getattr(torch, opts.dtype)
    walk = json.loads(opts.walk)
    heads, r, d = opts.heads, opts.r, opts.d
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  {opts.dtype}, "
          f"heads {heads}, r = {r}, d = {d}, decay; walk {json.dumps(walk)}", flush=True)
    for batch, n in [[int(x) for x in s.split("x")] for s in opts.shapes.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(0)
        b, c = (torch.randn(batch, heads, n, r, device="cuda", dtype=dt, generator=g) * r ** -0.5 for _ in range(2))
        v = torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g)
        gamma = 1 - torch.exp2(-5 - 3 * torch.arange(heads, device="cuda") / (heads - 1))
        check = bench.oracle(b, c, v, gamma)
        p, out = make_problem(b, c, v, gamma)
        seg, split = bb.segmenting(batch * heads, n, r, d, dt.itemsize, leettriton.autotune.current_family(), walk)
        if seg >= n:
            print(f"{batch} x {n}: one segment, no state pass", flush=True)
            continue
        piece = seg // split
        count = (-(-n // seg) - 1) * split
        want = local_states_f64(c, v, gamma, piece, count)
        scale = want.abs().max().item()
        for cfg in json.loads(opts.configs):
            pinned = {"block_based.fwd": walk, "segments.state": cfg}
            try:
                ws = segment_local_states(p, piece, pinned, count=count)
                state_err = (ws[:, :, :count].double() - want).abs().max().item() / scale
                state_ms = triton.testing.do_bench(lambda: segment_local_states(p, piece, pinned, count=count),
                                                   warmup=25, rep=100, return_mode="median")
                out.fill_(float("nan"))
                run_problem(p, "block_based", pinned)
                torch.cuda.synchronize()
                err = check.error(out)
                ms = triton.testing.do_bench(lambda: run_problem(p, "block_based", pinned), warmup=25, rep=100,
                                             return_mode="median")
                what = (f"state {state_ms:.4f} ms (err {state_err:.1e})  block_based {ms:.4f} ms (err {err:.1e})")
            except Exception as e:  # noqa: BLE001 - a config outside the space may fail to compile or launch
                what = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            print(f"{json.dumps(cfg):72s} {batch:>2} x {n:<6} seg {seg:<6} split {split:<2} {what}", flush=True)
        del b, c, v, p, out, check, want
    return 0


if __name__ == "__main__":
    sys.exit(main())
