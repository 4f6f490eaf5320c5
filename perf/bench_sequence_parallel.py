"""Sequence parallelism: one long sequence across the GPUs of a torchrun job, against one GPU.

Every rank holds n / W consecutive rows; ``leettriton.distributed.linear_attention`` runs its local
state pass, one all-gather of the float32 states and its output pass (docs/design.md §11; where the
slice's call is block_based over several segments, the output pass walks from the state pass's segment
states: ``leettriton.distributed.local_pass``); a training step adds the backward across the ranks (§11.4):
each rank's reversed calls (dc, dv and its start state's gradient), one all-gather of those gradients, the
db call (overlapping the gather) and the state terms added to dc and dv.  Timed, for every dtype of
``--dtypes``, the forward and the training step (``--modes``):

* the one-GPU call over all n rows (rank 0 alone, the other ranks waiting), where n fits one GPU (an
  estimate of the call's memory against the device's; ``--no-baseline`` skips it);
* the distributed call end to end on W' of the launched ranks, for every W' of ``--ranks`` (default 2, 4, …
  up to the launched W, each where its slices fit): the scaling, against one GPU where it ran, else
  against the fewest ranks measured;
* its phases one at a time: the state pass, the all-gather of the states, the output pass from a start
  state; for the training step also the reversed calls, the gradients' all-gather, the db call and the
  state terms.  Each repetition starts at a barrier and counts the slowest rank; medians (p20, p80);
* the ranks' skew: each rank's arrival at each collective of the call (on a GPU, the moment its stream
  reaches the collective: a CUDA event from a host-clock start; on a CPU, the host's call), relative to the
  earliest rank, gathered to rank 0; the median and the max over the repetitions of the latest rank's lag.

Speedup = baseline time ÷ distributed time; communication share = all-gather ÷ distributed time.

    torchrun --nproc-per-node W perf/bench_sequence_parallel.py --dtypes bfloat16,float16 --out perf/results
        # 1 M tokens, batch 1, heads 32, r = d = 128, decay per head, method auto, forward and training step
    torchrun --nproc-per-node 8 perf/bench_sequence_parallel.py --n 8388608 --no-baseline --check
        # 8 M tokens (no one-GPU call), then every rank against a one-GPU call on --check-n rows
    torchrun --nproc-per-node W perf/bench_sequence_parallel.py --check-only
        # correctness only: forward outputs, final state, and the training step's gradients of b, c, v
    python perf/bench_sequence_parallel.py --simulate 2,4,8 --out perf/results
        # one GPU, no torch.distributed: the ranks as slices, checked against one call; the cost
        # modelled as state pass + all-gather (bytes ÷ --link-gbs + --link-latency-us) + output pass
    torchrun --nproc-per-node 2 perf/bench_sequence_parallel.py --device cpu --quick
        # the script's logic on CPU with gloo at tiny sizes (not a measurement)

Results go to ``<out>/<gpu>-x<W>/bench_sequence_parallel[.check|.simulate].json`` (rank 0
writes it), with the command, the device, versions and git SHA.
"""
from __future__ import annotations

import os
import shlex
import statistics
import sys
import time
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
import leettriton.distributed as sp  # noqa: E402
from leettriton import bench, registry  # noqa: E402
from leettriton.autograd import add_state_term, log2_gamma, output_grads  # noqa: E402
from leettriton.problem import make_problem  # noqa: E402

NAME = "bench_sequence_parallel"
MODES = ("forward", "train")
# the share of the device's memory a call may be estimated to take and still be run
MEMORY_SHARE = 0.85


def parse(argv):
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1 << 20, help="total sequence length (default 1 048 576)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--r", type=int, default=128)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dtypes", "--dtype", dest="dtypes", default="bfloat16",
                   help="comma-separated: bfloat16,float16 (default bfloat16)")
    p.add_argument("--modes", default="forward,train", help="forward, train (forward + backward) or both (default)")
    p.add_argument("--ranks", help="rank counts to time, each a group of the first W' launched ranks "
                   "(default: 2, 4, … and the launched W)")
    p.add_argument("--method", default="auto", help="the local passes' method (default auto)")
    p.add_argument("--no-decay", action="store_true", help="γ = 1 (default: one γ per head, 0.969 … 0.996)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10, after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-baseline", "--no-single", dest="no_baseline", action="store_true",
                   help="skip the one-GPU call (it is also skipped where n is estimated not to fit one GPU)")
    p.add_argument("--assume-fits", action="store_true",
                   help="run every call the memory estimate would skip (one that does not fit then fails)")
    p.add_argument("--check", action="store_true", help="after the timing, every rank against a one-GPU call")
    p.add_argument("--check-only", action="store_true", help="the check alone, no timing")
    p.add_argument("--trace", metavar="DIR", help="after the timing, profile three distributed calls and write the "
                   "first and last ranks' timelines to DIR/sp_x<N>_rank<K>.json (chrome trace)")
    p.add_argument("--check-n", type=int, default=65536, help="sequence length of --check (default 65 536)")
    p.add_argument("--simulate", metavar="N,N,...", help="one device: the ranks as slices, for these rank counts")
    p.add_argument("--link-gbs", type=float, default=150.0,
                   help="--simulate: all-gather bandwidth per rank in GB/s for the cost model (default 150)")
    p.add_argument("--link-latency-us", type=float, default=30.0,
                   help="--simulate: all-gather latency in µs for the cost model (default 30)")
    args = p.parse_args(argv)
    args.dtypes = [bench.dtype_name(bench.parse_dtype(x)) for x in args.dtypes.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in args.modes):
        p.error(f"--modes: each of {MODES}, got {args.modes}")
    if args.quick or args.device == "cpu" or not torch.cuda.is_available():
        # the script's logic at tiny sizes (on a CPU: the PyTorch paths, float32)
        args.n, args.check_n = min(args.n, 4096), min(args.check_n, 1000)
        args.heads, args.r, args.d = min(args.heads, 4), min(args.r, 32), min(args.d, 32)
        args.reps, args.warmup = min(args.reps, 3), min(args.warmup, 1)
        if args.device == "cpu" or not torch.cuda.is_available():
            args.dtypes = ["float32"]
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
        self.groups = {}

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

    def group(self, world: int):
        """The group of the first ``world`` ranks (None: the default group); made on every rank, once."""
        if world == self.world:
            return None
        if world not in self.groups:
            self.groups[world] = self.dist.new_group(list(range(world)))
        return self.groups[world]

    @property
    def comm(self):
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def rows_of(n: int, world: int, rank: int) -> slice:
    """Rank ``rank``'s rows of n over ``world`` ranks: an even split (empty beyond the group)."""
    if rank >= world:
        return slice(0, 0)
    return slice(rank * n // world, (rank + 1) * n // world)


def timed(job: Job, fn, reps: int, warmup: int, member: bool = True) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn`` over the ranks that run it (``member``): every rank takes part in
    the barrier before each repetition, the members run ``fn`` the same number of times (so that its
    collectives match) and each repetition counts the slowest member."""
    if member:
        for _ in range(warmup):
            fn()
    samples = []
    for _ in range(reps):
        job.barrier()
        bench.sync(job.device)
        t0 = time.perf_counter()
        if member:
            fn()
        bench.sync(job.device)
        samples.append((time.perf_counter() - t0) * 1e3 if member else float("nan"))
    if job.on:
        cols = zip(*job.gather(samples))
        samples = [max(x for x in col if x == x) for col in cols]
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
    return statistics.median(samples), q[1], q[7]


def arrivals(job: Job, fn, reps: int, member: bool, world: int) -> list[dict]:
    """Each collective's skew over ``reps`` calls of ``fn``: for the k-th all-gather of a call, the latest of
    the ``world`` members' arrivals less the earliest, in ms: {"median_ms", "max_ms", "lag_ms" (per rank,
    median)}.  A rank arrives when its stream reaches the collective (CUDA: an event recorded there, timed
    from an event at a host-clock start on an idle device) or, on a CPU, when its host calls it."""
    dist, cuda = job.dist, job.device.type == "cuda"
    per_rep = []
    real = dist.all_gather
    for _ in range(reps):
        marks = []

        def recorded(*a, **k):
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                marks.append(e)
            else:
                marks.append(time.perf_counter())
            return real(*a, **k)

        job.barrier()
        bench.sync(job.device)
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        if member:
            dist.all_gather = recorded
            try:
                fn()
            finally:
                dist.all_gather = real
        bench.sync(job.device)
        times = [(t0 * 1e3 + start.elapsed_time(m)) if cuda else m * 1e3 for m in marks]
        per_rep.append(times)
    count = max(len(t) for t in per_rep)
    if job.on:   # the ranks outside the group recorded nothing: every rank sends as many values
        count = int(max(x[0] for x in job.gather([count])))
    flat = [x for t in per_rep for x in (t + [float("nan")] * (count - len(t)))]
    everyone = job.gather(flat) if job.on else [flat]
    if job.rank != 0:
        return []
    out = []
    for k in range(count):
        spreads, lags = [], [[] for _ in range(world)]
        for i in range(reps):
            at = [everyone[rank][i * count + k] for rank in range(world)]
            first = min(at)
            spreads.append(max(at) - first)
            for rank in range(world):
                lags[rank].append(at[rank] - first)
        out.append(dict(median_ms=statistics.median(spreads), max_ms=max(spreads),
                        lag_ms=[statistics.median(x) for x in lags]))
    return out


def inputs(args, n: int, dtype, device, seed: int = 0):
    b, c, v = bench.make_inputs(args.batch, args.heads, n, args.r, args.d, dtype, device, seed=seed)
    gamma = None if args.no_decay else bench.decay_gammas(args.heads, device)
    return b, c, v, gamma


def estimate_bytes(args, rows: int, dtype, mode: str) -> int:
    """An estimate of one call's memory on ``rows`` rows: b, c, v and the output, a quarter more for the
    method's workspace; a training step also the gradients (db, dc, dv, the output's gradient) and float32
    temporaries of dc and dv."""
    per_row = args.batch * args.heads * (2 * args.r + 2 * args.d)
    forward = per_row * rows * dtype.itemsize * 5 // 4
    if mode == "forward":
        return forward
    return 2 * forward + args.batch * args.heads * (args.r + args.d) * rows * 4


def fits(job: Job, args, rows: int, dtype, mode: str) -> bool:
    if job.device.type != "cuda" or args.assume_fits:
        return True
    return estimate_bytes(args, rows, dtype, mode) <= MEMORY_SHARE * torch.cuda.mem_get_info(job.device)[1]


def report(job: Job, args, argv, suffix: str, title: str):
    rep = common.Report(NAME + suffix, title, argv, job.device, args.quick)
    launcher = f"torchrun --nproc-per-node {job.world}" if job.on else "python"
    rep.meta["command"] = " ".join([launcher, f"perf/{NAME}.py", *map(shlex.quote, argv)])
    rep.meta["world_size"] = job.world
    if job.world > 1:
        rep.meta["device_slug"] += f"-x{job.world}"
    rep.meta["backend"] = job.dist.get_backend() if job.on else None
    return rep


def rank_counts(job: Job, args) -> list[int]:
    if args.ranks:
        counts = sorted({int(x) for x in args.ranks.split(",")})
        if any(w < 2 or w > job.world for w in counts):
            raise SystemExit(f"--ranks: each between 2 and the launched {job.world}, got {counts}")
        return counts
    counts, w = [], 2
    while w < job.world:
        counts.append(w)
        w *= 2
    return counts + ([job.world] if job.world > 1 else [])


def train_step(fn, b, c, v, grad_out):
    """One training step: ``fn``'s forward, then its backward from ``grad_out`` (the gradients of b, c, v)."""
    with torch.enable_grad():
        out = fn(b, c, v)
        return torch.autograd.grad(out, (b, c, v), grad_out)


def measure_world(job: Job, args, dtype, world: int, mode: str) -> dict:
    """The distributed call on the first ``world`` ranks: end to end, per phase, and the skew (on rank 0)."""
    member = job.rank < world
    group = job.group(world)
    rows = rows_of(args.n, world, job.rank)
    n_k = rows.stop - rows.start
    b, c, v, gamma = inputs(args, n_k if member else 0, dtype, job.device, seed=1 + job.rank)
    name = registry.canonical_method(args.method)
    call = partial(sp.linear_attention, gamma=gamma, group=group, method=args.method)
    p, _ = make_problem(b, c, v, gamma)
    local, output_pass = sp.local_pass(p, name)
    start = local / max(1.0, local.abs().max().item())       # a float32 start state of a sensible size
    gathered = [torch.empty_like(local, device=job.comm) for _ in range(world)]
    gather_fn = partial(job.dist.all_gather, gathered, local.to(job.comm), group=group)
    row = dict(world=world, rows_per_rank=args.n // world)
    if mode == "forward":
        whole_fn = partial(call, b, c, v)
        row["median_ms"], row["p20_ms"], row["p80_ms"] = timed(job, whole_fn, args.reps, args.warmup, member)
        row["state_ms"] = timed(job, lambda: sp.local_pass(p, name), args.reps, args.warmup, member)[0]
        row["gather_ms"] = timed(job, gather_fn, args.reps, args.warmup, member)[0]
        # the output pass as the call runs it: from the state pass's segment states where it shares them
        # (repeated here on one workspace: the timing, not the values, counts)
        row["output_ms"] = timed(job, lambda: output_pass(start), args.reps, args.warmup, member)[0]
        skew = arrivals(job, whole_fn, args.reps, member, world)
    else:
        leaves = [x.detach().requires_grad_() for x in (b, c, v)]
        grad_out = torch.randn_like(v)
        whole_fn = partial(train_step, call, *leaves, grad_out)
        row["median_ms"], row["p20_ms"], row["p80_ms"] = timed(job, whole_fn, args.reps, args.warmup, member)
        # the backward's phases as distributed._backward runs them
        op = partial(leettriton.linear_attention, method=name)
        lam = log2_gamma(gamma, args.heads, job.device)
        reverse = partial(output_grads, op, b, c, v, None, gamma, grad_out, "bhnd", need_b=False, need_c=True,
                          need_v=True, need_state=True)
        _, dc, dv, _ = reverse() if member else (None, None, None, None)
        row["reverse_ms"] = timed(job, reverse, args.reps, args.warmup, member)[0]
        row["grad_gather_ms"] = timed(job, gather_fn, args.reps, args.warmup, member)[0]
        row["db_ms"] = timed(job, partial(output_grads, op, b, c, v, start, gamma, grad_out, "bhnd", need_b=True,
                                          need_c=False, need_v=False, need_state=False),
                             args.reps, args.warmup, member)[0]
        row["state_terms_ms"] = timed(job, lambda: (add_state_term(dc, v, start.transpose(-1, -2), lam, "bhnd",
                                                                   c.dtype),
                                                    add_state_term(dv, c, start, lam, "bhnd", v.dtype)),
                                      args.reps, args.warmup, member)[0]
        skew = arrivals(job, whole_fn, args.reps, member, world)
    row["skew"] = skew
    del b, c, v, p, local, output_pass, start, gathered
    bench.free_memory()
    return row


def measure_single(job: Job, args, dtype, mode: str):
    """(median, p20, p80) ms of the one-GPU call over all n rows on rank 0, or None where it is skipped."""
    result = [float("nan")] * 3
    if not args.no_baseline and fits(job, args, args.n, dtype, mode) and job.rank == 0:
        b, c, v, gamma = inputs(args, args.n, dtype, job.device)
        fn = partial(leettriton.linear_attention, gamma=gamma, method=args.method)
        if mode == "forward":
            result = single_timed(job, partial(fn, b, c, v), args)
        else:
            leaves = [x.detach().requires_grad_() for x in (b, c, v)]
            result = single_timed(job, partial(train_step, fn, *leaves, torch.randn_like(v)), args)
        del b, c, v
        bench.free_memory()
    job.barrier()
    got = job.gather(list(result))[0]
    return None if got[0] != got[0] else got


def single_timed(job: Job, fn, args) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn`` on this rank alone (no barrier: the other ranks wait at the next)."""
    for _ in range(args.warmup):
        fn()
    samples = []
    for _ in range(args.reps):
        bench.sync(job.device)
        t0 = time.perf_counter()
        fn()
        bench.sync(job.device)
        samples.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
    return statistics.median(samples), q[1], q[7]


def run_timing(job: Job, args, argv) -> None:
    counts = rank_counts(job, args)
    rep = report(job, args, argv, "", f"Sequence parallelism over {job.world} rank(s)") if job.rank == 0 else None
    on_gpu = job.device.type == "cuda"
    for dtype_name in args.dtypes:
        dtype = bench.parse_dtype(dtype_name)
        for mode in args.modes:
            single = measure_single(job, args, dtype, mode)
            rows = []
            for world in counts or [1]:
                if world == 1:
                    continue
                if not fits(job, args, -(-args.n // world), dtype, mode):
                    if rep:
                        rep.note(f"{dtype_name} {mode}: {args.n} rows over {world} ranks are estimated not to fit "
                                 f"one device ({estimate_bytes(args, -(-args.n // world), dtype, mode) / 2**30:.1f} "
                                 f"GiB per rank): skipped")
                    continue
                rows.append(measure_world(job, args, dtype, world, mode))
            if rep:
                section(rep, args, dtype_name, mode, single, rows, on_gpu)
                rep.save(args.out)
    if args.trace:
        rows = rows_of(args.n, job.world, job.rank)
        b, c, v, gamma = inputs(args, rows.stop - rows.start, bench.parse_dtype(args.dtypes[0]), job.device,
                                seed=1 + job.rank)
        trace(job, args.trace, lambda: sp.linear_attention(b, c, v, gamma, method=args.method))
    if rep:
        rep.finish(args.out)


def spread(skew) -> str:
    """"median / max" ms of one collective's skew, or a dash."""
    return "—" if skew is None else f"{common.fmt_ms(skew['median_ms'])} / {common.fmt_ms(skew['max_ms'])}"


def section(rep, args, dtype_name: str, mode: str, single, rows: list, on_gpu: bool) -> None:
    """One table per dtype and mode: a line per rank count, the scaling against one GPU (or the fewest ranks)."""
    base = single[0] if single else (rows[0]["median_ms"] * rows[0]["world"] if rows else None)
    against = "one GPU" if single else (f"{rows[0]['world']} ranks × {rows[0]['world']}" if rows else "—")
    phases = (["state_ms", "gather_ms", "output_ms"] if mode == "forward"
              else ["reverse_ms", "grad_gather_ms", "db_ms", "state_terms_ms"])
    heads = (["state pass ms", "all-gather ms", "output pass ms"] if mode == "forward"
             else ["reversed calls ms", "gradients' all-gather ms", "db call ms", "state terms ms"])
    body = []
    for row in rows:
        speed = base / row["median_ms"] if base else None
        gather = row["gather_ms" if mode == "forward" else "grad_gather_ms"]
        first = row["skew"][0] if row["skew"] else None
        worst = max(row["skew"], key=lambda s: s["median_ms"]) if row["skew"] else None
        row.update(batch=args.batch, heads=args.heads, n=args.n, r=args.r, d=args.d, dtype=dtype_name, mode=mode,
                   decay=not args.no_decay, method=args.method, single_ms=single[0] if single else None,
                   single_p20_ms=single[1] if single else None, single_p80_ms=single[2] if single else None,
                   speedup=speed if single else None, scaling=speed, scaling_against=against,
                   comm_share=gather / row["median_ms"], status="ok",
                   state_bytes_per_rank=args.batch * args.heads * args.r * args.d * 4)
        rep.rows.append(row)
        body.append([row["world"], row["rows_per_rank"], common.fmt_ms(single[0] if single else None),
                     f"{common.fmt_ms(row['median_ms'])} ({common.fmt_ms(row['p20_ms'])}–"
                     f"{common.fmt_ms(row['p80_ms'])})", "—" if speed is None else f"{speed:.2f}×",
                     *[common.fmt_ms(row[k]) for k in phases], common.fmt_ms(sum(row[k] for k in phases)),
                     f"{row['comm_share']:.1%}",
                     spread(first), spread(worst)])
        goal = {2: 1.8, 4: 3.2, 8: 7.0 if mode == "forward" else 6.0}.get(row["world"])
        if goal and single:
            rep.target(f"{mode} {dtype_name} speedup on {row['world']} GPUs at n = {args.n}", f"{speed:.2f}×",
                       f"≥ {goal}×", speed >= goal if on_gpu else None)
    rep.section(
        f"{mode}, {dtype_name}: n = {args.n}, batch {args.batch}, heads {args.heads}, r = {args.r}, d = {args.d}, "
        f"{'decay per head' if not args.no_decay else 'no decay'}, method {args.method}",
        ["ranks", "rows per rank", "one GPU ms", "distributed ms (p20–p80)", f"speedup (against {against})",
         *heads, "phases sum ms", "communication share", "skew at the first collective ms (median / max)",
         "largest skew ms (median / max)"], body,
        "Each phase timed alone (every rank, a barrier before each repetition, the slowest rank counted); the "
        "all-gathers move batch·heads·r·d float32 per rank. Skew: the latest rank's arrival at a collective less "
        "the earliest's, over the repetitions; the first collective is the metadata's, the largest is usually "
        "the states'. " + ("Forward critical path: state pass → all-gather → output pass on ranks > 0."
                           if mode == "forward" else
                           "Backward critical path: reversed calls → all-gather → state terms (db overlaps the "
                           "gather)."))


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
    """Every rank against a one-GPU call on ``--check-n`` rows, for every dtype: the forward's rows and final
    state; the training step's gradients of b, c, v (each rank's loss on its rows of the output and, on rank 0,
    the final state; the one-GPU loss their sum)."""
    rows = rows_of(args.check_n, job.world, job.rank)
    rep = report(job, args, argv, ".check", f"Sequence parallelism over {job.world} rank(s): correctness") \
        if job.rank == 0 else None
    body = []
    for dtype_name in args.dtypes:
        dtype = bench.parse_dtype(dtype_name)
        b, c, v, gamma = inputs(args, args.check_n, dtype, job.device)
        g = torch.Generator(device=job.device).manual_seed(11)
        w_out = torch.randn(v.shape, generator=g, device=job.device, dtype=torch.float32)
        w_state = torch.randn((args.batch, args.heads, args.r, args.d), generator=g, device=job.device)
        with torch.enable_grad():
            whole = [x.detach().requires_grad_() for x in (b, c, v)]
            ref, ref_state = leettriton.linear_attention(*whole, gamma, method=args.method, return_state=True)
            ref_grads = torch.autograd.grad((ref.float() * w_out).sum() + (ref_state * w_state).sum(), whole)
            mine = [x[:, :, rows].detach().requires_grad_() for x in (b, c, v)]
            out, state = sp.linear_attention(*mine, gamma, method=args.method, return_state=True)
            loss = (out.float() * w_out[:, :, rows]).sum() + (state * w_state).sum() * (job.rank == 0)
            grads = torch.autograd.grad(loss, mine)
        errors = [bench.rel_error(out.detach(), ref.detach()[:, :, rows]),
                  bench.rel_error(state.detach(), ref_state.detach())]
        errors += [bench.rel_error(x, y[:, :, rows]) if x.numel() else 0.0 for x, y in zip(grads, ref_grads)]
        everyone = job.gather(errors)
        del b, c, v, whole, ref, ref_state, ref_grads, mine, out, state, grads
        bench.free_memory()
        if rep is None:
            continue
        tol = bench.tolerance(dtype)
        for k, errs in enumerate(everyone):
            ok = all(e <= tol for e in errs)
            rep.rows.append(dict(rank=k, n=args.check_n, rows=rows_of(args.check_n, job.world, k).stop
                                 - rows_of(args.check_n, job.world, k).start, dtype=dtype_name, method=args.method,
                                 rel_err=errs[0], state_rel_err=errs[1], db_rel_err=errs[2], dc_rel_err=errs[3],
                                 dv_rel_err=errs[4], tolerance=tol, status="ok" if ok else "WRONG"))
            body.append([dtype_name, k, *map(common.fmt_err, errs), "PASS" if ok else "FAIL"])
    if rep is None:
        return
    rep.section(f"Every rank against a one-GPU call: n = {args.check_n}, heads {args.heads}, r = {args.r}, "
                f"d = {args.d}, method {args.method}",
                ["dtype", "rank", "output rel. difference", "final state rel. difference", "db", "dc", "dv",
                 "verdict"], body,
                "Relative Frobenius difference from the one-GPU call's rows (the final state, and the gradients of "
                "the rank's b, c, v after a training step: each rank's loss weighs its rows of the output, rank 0's "
                "also the final state; the one-GPU loss is their sum); bound: the dtype's tolerance.")
    passed = all(r["status"] == "ok" for r in rep.rows)
    rep.target(f"every rank matches the one-GPU call ({job.world} ranks)", "PASS" if passed else "FAIL",
               "≤ the dtype's tolerance", passed)
    rep.finish(args.out)
    if not passed:
        raise SystemExit(1)


def run_simulate(job: Job, args, argv) -> None:
    dtype = bench.parse_dtype(args.dtypes[0])
    worlds = [int(x) for x in args.simulate.split(",")]
    b, c, v, gamma = inputs(args, args.n, dtype, job.device)
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
            else:
                if not args.check_only:
                    run_timing(job, args, argv)
                if args.check or args.check_only:
                    run_check(job, args, argv)
        finally:
            if job.on:
                job.dist.destroy_process_group()


if __name__ == "__main__":
    main()
