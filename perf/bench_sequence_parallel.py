"""Sequence parallelism: prefill of one long sequence across the GPUs of a torchrun job, against one GPU.

Every rank holds n / N consecutive rows; ``leettriton.distributed.linear_attention`` runs its local
state pass, one all-gather of the float32 states and its output pass (docs/design.md §11; where the
slice's call is block_based over several segments, the output pass walks from the state pass's segment
states: ``leettriton.distributed.local_pass``).  Timed:

* the one-GPU call over all n rows (rank 0 alone, the other ranks waiting);
* the distributed call end to end, and its three phases one at a time: the state pass, the
  all-gather of the states, the output pass from a start state.  Each repetition starts at a
  barrier and counts the slowest rank; medians (p20, p80) over ``--reps``.

Speedup = one-GPU time ÷ distributed time; communication share = all-gather ÷ distributed time.

    torchrun --nproc-per-node N perf/bench_sequence_parallel.py --out perf/results
        # 1 M tokens, batch 1, heads 32, r = d = 128, bfloat16, decay per head, method auto
    torchrun --nproc-per-node N perf/bench_sequence_parallel.py --check --out perf/results
        # every rank against a one-GPU call on --check-n rows (65 536), output and final state
    python perf/bench_sequence_parallel.py --simulate 2,4,8 --out perf/results
        # one GPU, no torch.distributed: the ranks as slices, checked against one call; the cost
        # modelled as state pass + all-gather (bytes ÷ --link-gbs + --link-latency-us) + output pass
    torchrun --nproc-per-node 2 perf/bench_sequence_parallel.py --device cpu --quick
        # the script's logic on CPU with gloo at tiny sizes (not a measurement)

Results go to ``<out>/<gpu>-x<N>/bench_sequence_parallel[.check|.simulate].json`` (rank 0
writes it), with the command, the device, versions and git SHA.
"""
from __future__ import annotations

import os
import shlex
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
import leettriton.distributed as sp  # noqa: E402
from leettriton import bench, registry  # noqa: E402
from leettriton.problem import make_problem  # noqa: E402

NAME = "bench_sequence_parallel"


def parse(argv):
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1 << 20, help="total sequence length (default 1 048 576)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--r", type=int, default=128)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--method", default="auto", help="the local passes' method (default auto)")
    p.add_argument("--no-decay", action="store_true", help="γ = 1 (default: one γ per head, 0.969 … 0.996)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10, after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-single", action="store_true", help="skip the one-GPU call (when n does not fit one GPU)")
    p.add_argument("--check", action="store_true", help="correctness mode: every rank against a one-GPU call")
    p.add_argument("--trace", metavar="DIR", help="after the timing, profile three distributed calls and write the "
                   "first and last ranks' timelines to DIR/sp_x<N>_rank<K>.json (chrome trace)")
    p.add_argument("--check-n", type=int, default=65536, help="sequence length of --check (default 65 536)")
    p.add_argument("--simulate", metavar="N,N,...", help="one device: the ranks as slices, for these rank counts")
    p.add_argument("--link-gbs", type=float, default=150.0,
                   help="--simulate: all-gather bandwidth per rank in GB/s for the cost model (default 150)")
    p.add_argument("--link-latency-us", type=float, default=30.0,
                   help="--simulate: all-gather latency in µs for the cost model (default 30)")
    args = p.parse_args(argv)
    if args.quick or args.device == "cpu" or not torch.cuda.is_available():
        # the script's logic at tiny sizes (on a CPU: the PyTorch paths, float32)
        args.n, args.check_n = min(args.n, 4096), min(args.check_n, 1000)
        args.heads, args.r, args.d = min(args.heads, 4), min(args.r, 32), min(args.d, 32)
        args.reps, args.warmup = min(args.reps, 3), min(args.warmup, 1)
        if args.device == "cpu" or not torch.cuda.is_available():
            args.dtype = "float32"
    return args


class Job:
    """This process's place in the job: torchrun's environment, or one process without torch.distributed."""

    def __init__(self, device_arg):
        import torch.distributed as dist

        self.dist = dist
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        wants_cuda = device_arg != "cpu" and torch.cuda.is_available()
        if wants_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.on = self.world > 1
        if self.on:
            dist.init_process_group("nccl" if wants_cuda else "gloo")

    def barrier(self):
        if self.on:
            self.dist.barrier()

    def gather(self, values) -> list:
        """Every rank's list of floats, in rank order (the list itself when alone)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.comm)
        if not self.on:
            return [t.tolist()]
        out = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t)
        return [x.tolist() for x in out]

    @property
    def comm(self):
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def slice_of(self, n: int) -> slice:
        """This rank's rows of n: an even split, the remainder on the first ranks."""
        return slice(self.rank * n // self.world, (self.rank + 1) * n // self.world)


def timed(job: Job, fn, reps: int, warmup: int, together: bool = True) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn``; ``together``: every rank runs it, each repetition starts at a
    barrier and counts the slowest rank (the same number of calls on every rank, so collectives match)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if together:
            job.barrier()
        bench.sync(job.device)
        t0 = time.perf_counter()
        fn()
        bench.sync(job.device)
        samples.append((time.perf_counter() - t0) * 1e3)
    if together and job.on:
        samples = [max(col) for col in zip(*job.gather(samples))]
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
    return statistics.median(samples), q[1], q[7]


def inputs(args, n: int, device, seed: int = 0):
    dtype = bench.parse_dtype(args.dtype)
    b, c, v = bench.make_inputs(args.batch, args.heads, n, args.r, args.d, dtype, device, seed=seed)
    gamma = None if args.no_decay else bench.decay_gammas(args.heads, device)
    return b, c, v, gamma


def report(job: Job, args, argv, suffix: str, title: str):
    rep = common.Report(NAME + suffix, title, argv, job.device, args.quick)
    launcher = f"torchrun --nproc-per-node {job.world}" if job.on else "python"
    rep.meta["command"] = " ".join([launcher, f"perf/{NAME}.py", *map(shlex.quote, argv)])
    rep.meta["world_size"] = job.world
    if job.world > 1:
        rep.meta["device_slug"] += f"-x{job.world}"
    rep.meta["backend"] = job.dist.get_backend() if job.on else None
    return rep


def run_timing(job: Job, args, argv) -> None:
    dtype = bench.parse_dtype(args.dtype)
    shape = dict(batch=args.batch, heads=args.heads, n=args.n, r=args.r, d=args.d, dtype=bench.dtype_name(dtype),
                 decay=not args.no_decay, method=args.method, world=job.world)
    single = (None, None, None)
    if not args.no_single:
        if job.rank == 0:
            b, c, v, gamma = inputs(args, args.n, job.device)
            single = timed(job, lambda: leettriton.linear_attention(b, c, v, gamma, method=args.method),
                           args.reps, args.warmup, together=False)
            del b, c, v
            bench.free_memory()
        job.barrier()

    rows = job.slice_of(args.n)
    b, c, v, gamma = inputs(args, rows.stop - rows.start, job.device, seed=1 + job.rank)
    name = registry.canonical_method(args.method)
    p, _ = make_problem(b, c, v, gamma)
    local, output_pass = sp.local_pass(p, name)
    start = local / max(1.0, local.abs().max().item())       # a float32 start state of a sensible size
    gathered = [torch.empty_like(local, device=job.comm) for _ in range(job.world)]
    whole = timed(job, lambda: sp.linear_attention(b, c, v, gamma, method=args.method), args.reps, args.warmup)
    state = timed(job, lambda: sp.local_pass(p, name), args.reps, args.warmup)
    gather = (timed(job, lambda: job.dist.all_gather(gathered, local.to(job.comm)), args.reps, args.warmup)
              if job.on else (0.0, 0.0, 0.0))
    # the output pass as the call runs it: from the state pass's segment states where it shares them
    # (repeated here on one workspace: the timing, not the values, counts)
    output = timed(job, lambda: output_pass(start), args.reps, args.warmup)
    single = job.gather(list(single) if single[0] is not None else [float("nan")] * 3)[0]
    if args.trace:
        trace(job, args.trace, lambda: sp.linear_attention(b, c, v, gamma, method=args.method))
    if job.rank != 0:
        return

    rep = report(job, args, argv, "", f"Sequence parallelism over {job.world} rank(s)")
    speed = single[0] / whole[0] if single[0] == single[0] else None
    share = gather[0] / whole[0]
    row = dict(shape, rows_per_rank=rows.stop - rows.start, single_ms=single[0], single_p20_ms=single[1],
               single_p80_ms=single[2], median_ms=whole[0], p20_ms=whole[1], p80_ms=whole[2],
               state_ms=state[0], gather_ms=gather[0], output_ms=output[0], speedup=speed, comm_share=share,
               state_bytes_per_rank=args.batch * args.heads * args.r * args.d * 4, status="ok")
    rep.rows.append(row)
    rep.section(
        f"{job.world} rank(s): n = {args.n}, batch {args.batch}, heads {args.heads}, r = {args.r}, d = {args.d}, "
        f"{bench.dtype_name(dtype)}, {'decay per head' if not args.no_decay else 'no decay'}, method {args.method}",
        ["ranks", "rows per rank", "one GPU ms", "distributed ms (p20–p80)", "speedup", "state pass ms",
         "all-gather ms", "output pass ms", "phases sum ms", "communication share"],
        [[job.world, rows.stop - rows.start, common.fmt_ms(single[0] if speed else None),
          f"{common.fmt_ms(whole[0])} ({common.fmt_ms(whole[1])}–{common.fmt_ms(whole[2])})",
          "—" if speed is None else f"{speed:.2f}×", common.fmt_ms(state[0]), common.fmt_ms(gather[0]),
          common.fmt_ms(output[0]), common.fmt_ms(state[0] + gather[0] + output[0]), f"{share:.1%}"]],
        "Each phase timed alone (every rank, a barrier before each repetition, the slowest rank counted); the "
        "all-gather moves batch·heads·r·d float32 per rank. The critical path is state pass → all-gather → "
        "output pass on ranks > 0 (rank 0's output pass overlaps the all-gather).")
    on_gpu = job.device.type == "cuda"
    goal = {2: 1.8, 4: 3.2}.get(job.world)
    if goal:
        rep.target(f"speedup on {job.world} GPUs at n = {args.n}", "—" if speed is None else f"{speed:.2f}×",
                   f"≥ {goal}×", None if speed is None or not on_gpu else speed >= goal)
    rep.target("communication share", f"{share:.1%}", "≤ 10%", share <= 0.10 if on_gpu and job.on else None)
    rep.finish(args.out)


def trace(job: Job, folder: str, fn) -> None:
    """Three calls of ``fn`` on every rank under torch.profiler (each after a barrier); the first and last
    ranks write their timelines (host calls and kernels) as chrome traces into ``folder``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            job.barrier()
            fn()
            bench.sync(job.device)
    if job.rank in (0, job.world - 1):
        os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(folder, f"sp_x{job.world}_rank{job.rank}.json"))


def run_check(job: Job, args, argv) -> None:
    dtype = bench.parse_dtype(args.dtype)
    b, c, v, gamma = inputs(args, args.check_n, job.device)
    ref, ref_state = leettriton.linear_attention(b, c, v, gamma, method=args.method, return_state=True)
    rows = job.slice_of(args.check_n)
    out, state = sp.linear_attention(b[:, :, rows], c[:, :, rows], v[:, :, rows], gamma, method=args.method,
                                     return_state=True)
    errors = job.gather([bench.rel_error(out, ref[:, :, rows]), bench.rel_error(state, ref_state)])
    if job.rank != 0:
        return
    rep = report(job, args, argv, ".check", f"Sequence parallelism over {job.world} rank(s): correctness")
    tol = bench.tolerance(dtype)
    body = []
    for k, (e_out, e_state) in enumerate(errors):
        ok = e_out <= tol and e_state <= tol
        rep.rows.append(dict(rank=k, n=args.check_n, dtype=bench.dtype_name(dtype), method=args.method,
                             rel_err=e_out, state_rel_err=e_state, tolerance=tol, status="ok" if ok else "WRONG"))
        body.append([k, common.fmt_err(e_out), common.fmt_err(e_state), "PASS" if ok else "FAIL"])
    rep.section(f"Every rank against a one-GPU call: n = {args.check_n}, heads {args.heads}, r = {args.r}, "
                f"d = {args.d}, {bench.dtype_name(dtype)}, method {args.method}",
                ["rank", "output rel. difference", "final state rel. difference", "verdict"], body,
                f"Relative Frobenius difference from the one-GPU call's rows (and final state); bound: the dtype's "
                f"tolerance {tol:g}.")
    passed = all(r["status"] == "ok" for r in rep.rows)
    rep.target(f"every rank matches the one-GPU call ({job.world} ranks)", "PASS" if passed else "FAIL",
               f"≤ {tol:g}", passed)
    rep.finish(args.out)
    if not passed:
        raise SystemExit(1)


def run_simulate(job: Job, args, argv) -> None:
    dtype = bench.parse_dtype(args.dtype)
    worlds = [int(x) for x in args.simulate.split(",")]
    b, c, v, gamma = inputs(args, args.n, job.device)
    name = registry.canonical_method(args.method)
    single = timed(job, lambda: leettriton.linear_attention(b, c, v, gamma, method=args.method), args.reps,
                   args.warmup, together=False)
    ref = leettriton.linear_attention(b, c, v, gamma, method=args.method)
    rep = report(job, args, argv, ".simulate", "Sequence parallelism simulated on one device")
    tol = bench.tolerance(dtype)
    state_bytes = args.batch * args.heads * args.r * args.d * 4
    body = []
    for world in worlds:
        lengths = [(k + 1) * args.n // world - k * args.n // world for k in range(world)]
        err = bench.rel_error(sp.simulate(b, c, v, gamma, lengths=lengths, method=args.method), ref)
        p, _ = make_problem(b[:, :, :lengths[0]], c[:, :, :lengths[0]], v[:, :, :lengths[0]], gamma)
        start, output_pass = sp.local_pass(p, name)
        start = start / max(1.0, start.abs().max().item())
        state = timed(job, lambda: sp.local_pass(p, name), args.reps, args.warmup, together=False)
        output = timed(job, lambda: output_pass(start), args.reps, args.warmup, together=False)
        gather_ms = (world - 1) * state_bytes / (args.link_gbs * 1e9) * 1e3 + args.link_latency_us * 1e-3
        model = state[0] + gather_ms + output[0]
        rep.rows.append(dict(world=world, n=args.n, rows_per_rank=lengths[0], dtype=bench.dtype_name(dtype),
                             method=args.method, rel_err=err, single_ms=single[0], state_ms=state[0],
                             output_ms=output[0], gather_model_ms=gather_ms, model_ms=model,
                             model_speedup=single[0] / model, status="ok" if err <= tol else "WRONG"))
        body.append([world, lengths[0], common.fmt_err(err), common.fmt_ms(single[0]), common.fmt_ms(state[0]),
                     common.fmt_ms(gather_ms), common.fmt_ms(output[0]), common.fmt_ms(model),
                     f"{single[0] / model:.2f}×", f"{gather_ms / model:.1%}"])
        rep.target(f"{world} slices match one call", common.fmt_err(err), f"≤ {tol:g}", err <= tol)
    rep.section(f"Ranks as slices on one device: n = {args.n}, batch {args.batch}, heads {args.heads}, r = {args.r}, "
                f"d = {args.d}, {bench.dtype_name(dtype)}, method {args.method}",
                ["ranks", "rows per rank", "rel. difference from one call", "one call ms", "state pass ms",
                 "all-gather ms (model)", "output pass ms", "modelled ms", "modelled speedup",
                 "modelled communication share"], body,
                f"The output of `leettriton.distributed.simulate` (the ranks' algorithm, slice by slice) against one "
                f"call. Modelled time per rank = state pass + all-gather + output pass on one slice, the phases "
                f"timed here on one device; the all-gather modelled as (ranks − 1) · {state_bytes} B ÷ "
                f"{args.link_gbs:g} GB/s + {args.link_latency_us:g} µs.")
    rep.finish(args.out)
    if any(r["status"] != "ok" for r in rep.rows):
        raise SystemExit(1)


def main(argv=None) -> None:
    argv = common.cli_argv(argv)
    args = parse(argv)
    job = Job(args.device)
    with torch.no_grad():
        try:
            if args.simulate:
                if job.on:
                    raise SystemExit("--simulate runs in one process: start it with python, not torchrun")
                run_simulate(job, args, argv)
            elif args.check:
                run_check(job, args, argv)
            else:
                run_timing(job, args, argv)
        finally:
            if job.on:
                job.dist.destroy_process_group()


if __name__ == "__main__":
    main()
