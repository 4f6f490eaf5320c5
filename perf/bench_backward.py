"""Training: forward + backward time, peak memory and gradient errors, ours against fla and lightning-attn.

1. Speed and memory: heads 32, r = d = 128 (``--model`` another layer's), decay per head (0.969 … 0.996, as
   every bench), float16 and bfloat16, batch 1 and 16, n ∈ {2048, 8192, 32768}.  For each implementation:
   the forward alone (no grad), and one training step, ``o = f(b, c, v)`` then
   ``torch.autograd.grad(o, (b, c, v), do)`` with a random ``do``, timed together (do_bench median); and the
   peak memory one training step allocates above what is allocated before it (the inputs and ``do``, and a
   peer's converted copies of them).  Ours: ``auto`` (the one judged) and ``lightning_attention``,
   ``block_based`` (each autotuned at the shape, for information; ``--methods`` changes the list).  Peers,
   measured in the same run when installed: fla ``chunk_simple_gla`` (``g_gamma = ln γ``, ``scale=1.0``;
   inputs and ``do`` converted to its ``[B, T, H, K]`` layout outside the timed region) and lightning-attn
   ``lightning_attn2`` (``s = −ln γ``).
   Targets (issue 21): ``auto``'s training step ≥ 1.5× faster than fla's at batch 16 and no slower at
   batch 1; its peak memory ≤ fla's.
2. Gradient errors: batch 1, heads 4, n = 8192, r = d = 128, with the per-head decay and without,
   float16, bfloat16 and float32: the relative errors of db, dc and dv against the gradients autograd
   takes through the float64 oracle (given float32 copies of the inputs), for every implementation
   of section 1.  Target: ``auto``'s worst ≤ fla's worst, per dtype (the peers' float32 goes through
   TF32).

    python perf/bench_backward.py              # on the GPU
    python perf/bench_backward.py --quick      # float16, 1 × 8192 and 16 × 8192, then the gradient errors
    python perf/bench_backward.py --grad-only  # the gradient errors alone (bench_backward_grad.*)
    python perf/bench_backward.py --speed-only --model 8,256,512 --shapes 1x8192   # RetNet-1.3B's layer

Without a GPU it runs the PyTorch versions on tiny shapes (a check of the script's logic, not a
measurement); the peers need CUDA.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402
from leettriton.autotune import KERNELS  # noqa: E402
from leettriton.bench.failures import first_line, is_fatal, is_oom  # noqa: E402

NAME = "bench_backward"
OURS = ("auto", "lightning_attention", "block_based")
JUDGED = "auto"
FLA, LA2 = "fla_chunk_simple_gla", "lightning_attn2"


# --------------------------------------------------------------------------- implementations

@dataclass
class Step:
    """One implementation on inputs prepared once: its forward alone, one training step, and how to read
    the step's gradients as ``(batch, heads, n, ·)``."""

    forward: Callable[[], Any]
    train: Callable[[], tuple]
    grads_bhnd: Callable[[tuple], tuple] = field(default=lambda grads: grads)


def ours(method: str, device) -> Callable[..., Step]:
    """``leettriton.linear_attention(..., method=method)`` (its PyTorch version off the GPU; ``auto`` as is)."""
    name = method if method == "auto" else common.run_name(method, device)

    def factory(b, c, v, gamma, do) -> Step:
        leaves = tuple(x.detach().requires_grad_() for x in (b, c, v))

        def forward():
            with torch.no_grad():
                return leettriton.linear_attention(b, c, v, gamma, method=name)

        def train():
            return torch.autograd.grad(leettriton.linear_attention(*leaves, gamma, method=name), leaves, do)

        return Step(forward, train)

    return factory


def fla_chunk_step(b, c, v, gamma, do) -> Step:
    """fla's ``chunk_simple_gla`` on ``[B, T, H, K]`` copies of the inputs and of ``do``."""
    from fla.ops.simple_gla import chunk_simple_gla

    q, k, vv = (x.transpose(1, 2).contiguous().requires_grad_() for x in (b, c, v))
    do_t = do.transpose(1, 2).contiguous()
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()     # ln γ per head, (H,)

    def forward():
        with torch.no_grad():
            return chunk_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0]

    def train():
        return torch.autograd.grad(chunk_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0], (q, k, vv), do_t)

    return Step(forward, train, lambda grads: tuple(x.transpose(1, 2) for x in grads))


def lightning_attn2_step(b, c, v, gamma, do) -> Step:
    """lightning-attn's ``lightning_attn2`` (``lightning_attn2_no_decay`` without decay), (b, h, n, d) as ours."""
    from lightning_attn.ops.triton import lightning_attn2 as la2, lightning_attn2_no_decay

    q, k, vv = (x.detach().contiguous().requires_grad_() for x in (b, c, v))
    if gamma is None:
        def run():
            return lightning_attn2_no_decay(q, k, vv)
    else:
        s = (-torch.log(gamma.double())).float().view(-1, 1, 1).contiguous()             # s = −ln γ, (h, 1, 1)

        def run():
            return la2(q, k, vv, s)

    def forward():
        with torch.no_grad():
            return run()

    def train():
        return torch.autograd.grad(run(), (q, k, vv), do)

    return Step(forward, train)


PEER_FACTORIES = {FLA: fla_chunk_step, LA2: lightning_attn2_step}


def implementations(rep: common.Report, methods) -> dict[str, Callable[..., Step]]:
    """Label → factory(b, c, v, gamma, do) of ours and of the peers installed (each missing one is a note)."""
    found = {m: ours(m, rep.device) for m in methods}
    for name in bench.peers(rep.device, bench.CHUNKED_PEERS, rep.notes):
        found[name] = PEER_FACTORIES[name]
    return found


# --------------------------------------------------------------------------- measuring

def attempt(fn: Callable[[], Any]) -> tuple[Any, str, str]:
    """(result, status, note) of ``fn()``: ``ok``, ``n/a``, ``OOM`` or ``error``; a kernel fault raises
    :class:`bench.DeviceFailure` (the CUDA context is gone)."""
    try:
        return fn(), "ok", ""
    except NotImplementedError as exc:
        return None, "n/a", first_line(exc)
    except Exception as exc:  # noqa: BLE001  (one failing cell must not end the run)
        if is_fatal(exc):
            raise bench.DeviceFailure(first_line(exc)) from exc
        status = "OOM" if is_oom(exc) else "error"
        bench.free_memory()
        return None, status, first_line(exc)


def peak_bytes(prepare: Callable[[], Step], device) -> tuple[Optional[int], str, str]:
    """Peak memory of one training step above what is allocated before it (CUDA only: None elsewhere).

    The step runs once first (compilation and autotuning allocate too), then once measured."""
    if device.type != "cuda":
        return None, "n/a", "needs CUDA"

    def run() -> int:
        step = prepare()
        step.train()
        bench.sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step.train()
        bench.sync(device)
        return torch.cuda.max_memory_allocated(device) - before

    result = attempt(run)
    bench.free_memory()
    return result


def fmt_mib(nbytes: Optional[int]) -> str:
    return "—" if nbytes is None else f"{nbytes / 2**20:,.0f}"


def run_speed(rep: common.Report, args, impls, dtypes, shapes, heads, r, d, rep_ms) -> None:
    device = rep.device
    budget_ms = args.budget_s * 1e3
    rows = []
    for batch, n in shapes:
        # our kernels tune themselves at each shape (their autotune key has no n)
        for kernel in KERNELS.values():
            kernel.cache.clear()
        for dt in dtypes:
            b, c, v = bench.make_inputs(batch, heads, n, r, d, dt, device, seed=n + batch)
            gen = torch.Generator(device=device).manual_seed(3)
            do = torch.randn(v.shape, generator=gen, device=device, dtype=dt)
            gamma = bench.decay_gammas(heads, device)
            for label, factory in impls.items():
                def prepare(factory=factory):
                    return factory(b, c, v, gamma, do)

                fwd = bench.measure(lambda: prepare().forward, device=device, rep_ms=rep_ms, budget_ms=budget_ms)
                train = bench.measure(lambda: prepare().train, device=device, rep_ms=rep_ms, budget_ms=budget_ms)
                peak, peak_status, peak_note = peak_bytes(prepare, device)
                row = dict(section="speed", method=label, kind="peer" if label in PEER_FACTORIES else "ours",
                           dtype=bench.dtype_name(dt), batch=batch, heads=heads, n=n, r=r, d=d, decay=True,
                           fwd_ms=fwd.median_ms, median_ms=train.median_ms, p20_ms=train.p20_ms, p80_ms=train.p80_ms,
                           peak_bytes=peak, status=train.status,
                           note="; ".join(x for x in (fwd.note and f"forward: {fwd.status} {fwd.note}", train.note,
                                                      peak_status not in ("ok", "n/a") and f"peak: {peak_status} {peak_note}")
                                          if x))
                rows.append(row)
                print(f"{row['dtype']:<8} {batch:>2} × {n:<6} {label:<22} fwd {common.fmt_ms(fwd.median_ms):>8} ms  "
                      f"fwd+bwd {common.cell(row):>8} ms  peak {fmt_mib(peak):>8} MiB  {row['status']} {row['note']}",
                      flush=True)
            del b, c, v, do
            bench.free_memory()
    rep.rows.extend(rows)

    labels = list(impls)
    for dt in dtypes:
        dname = bench.dtype_name(dt)
        body = []
        speedups: dict[int, list] = {}
        memory: list = []
        for batch, n in shapes:
            get = {x: common.find(rows, method=x, dtype=dname, batch=batch, n=n) for x in labels}
            judged, fla = get.get(JUDGED), get.get(FLA)
            speed = mem = None
            if judged and fla and judged["median_ms"] and fla["median_ms"]:
                speed = fla["median_ms"] / judged["median_ms"]
                speedups.setdefault(batch, []).append(speed)
            if judged and fla and judged["peak_bytes"] and fla["peak_bytes"]:
                mem = judged["peak_bytes"] / fla["peak_bytes"]
                memory.append(mem)
            train_over_fwd = None if not (judged and judged["median_ms"] and judged["fwd_ms"]) else \
                judged["median_ms"] / judged["fwd_ms"]
            body.append([f"{batch} × {n}", *(common.cell(get[x]) for x in labels),
                         "—" if speed is None else f"{speed:.2f}×",
                         "—" if train_over_fwd is None else f"{train_over_fwd:.1f}×",
                         *(fmt_mib(get[x] and get[x]["peak_bytes"]) for x in labels),
                         "—" if mem is None else f"{mem:.2f}"])
        rep.section(f"Forward + backward, {dname}, decay per head — heads {heads}, r = {r}, d = {d}",
                    ["batch × n", *(f"{x} ms" for x in labels), f"fla / {JUDGED}", f"{JUDGED} step / fwd",
                     *(f"{x} peak MiB" for x in labels), f"{JUDGED} / fla peak"], body,
                    "Median ms of one training step (forward, then torch.autograd.grad of b, c, v with a random "
                    "do; do_bench, p20/p80 and the forward alone in the JSON rows). 'fla / auto' > 1 means ours "
                    "is faster. Peak: memory allocated during one step above what was allocated before it (the "
                    "inputs, do, and a peer's converted copies).")
        gpu = device.type == "cuda"
        for batch, goal, limit in ((16, "≥ 1.5×", 1.5), (1, "≥ 1.0× (no slower)", 1.0)):
            got = speedups.get(batch, [])
            rep.target(f"{JUDGED} fwd+bwd vs fla chunk_simple_gla, {dname}, batch {batch} (worst n)",
                       "—" if not got else f"{min(got):.2f}× (best {max(got):.2f}×)", goal,
                       None if not got or not gpu else min(got) >= limit)
        rep.target(f"{JUDGED} peak memory ÷ fla's, {dname} (worst shape)",
                   "—" if not memory else f"{max(memory):.2f}", "≤ 1", None if not memory or not gpu else
                   max(memory) <= 1.0)


def oracle_gradients(b, c, v, gamma, do) -> tuple:
    """db, dc, dv (float64) that autograd takes through the float64 oracle, given float32 copies of b, c, v."""
    leaves = tuple(x.detach().float().requires_grad_() for x in (b, c, v))
    out = leettriton.reference(*leaves, gamma)
    return tuple(g.double() for g in torch.autograd.grad(out, leaves, do.double()))


def run_gradients(rep: common.Report, impls, dtypes, n, heads, r, d) -> None:
    device = rep.device
    names = ("db", "dc", "dv")
    body = []
    worst: dict[tuple, list] = {}
    for dt in dtypes:
        b, c, v = bench.make_inputs(1, heads, n, r, d, dt, device, seed=21)
        gen = torch.Generator(device=device).manual_seed(22)
        do = torch.randn(v.shape, generator=gen, device=device, dtype=dt)
        for decay in (True, False):
            gamma = bench.decay_gammas(heads, device) if decay else None
            ref = oracle_gradients(b, c, v, gamma, do)
            for label, factory in impls.items():
                def grads(factory=factory):
                    step = factory(b, c, v, gamma, do)
                    return step.grads_bhnd(step.train())

                got, status, note = attempt(grads)
                errs = None if got is None else [bench.rel_error(g, want) for g, want in zip(got, ref)]
                del got
                rep.rows.append(dict(section="gradients", method=label, dtype=bench.dtype_name(dt), batch=1,
                                     heads=heads, n=n, r=r, d=d, decay=decay, status=status, note=note,
                                     **({} if errs is None else {f"rel_err_{k}": e for k, e in zip(names, errs)})))
                worst.setdefault((label, dt), []).append(None if errs is None else max(errs))
                body.append([bench.dtype_name(dt), "per head" if decay else "none", label,
                             *(status if errs is None else common.fmt_err(e) for e in (errs or [None] * 3))])
                print(f"gradients {bench.dtype_name(dt):<8} decay={decay!s:<5} {label:<22} "
                      f"{'  '.join(f'{k} {common.fmt_err(e)}' for k, e in zip(names, errs or [None] * 3))} "
                      f"{status} {note}", flush=True)
            del ref
            bench.free_memory()
        del b, c, v, do
        bench.free_memory()
    rep.section(f"Gradient errors: batch 1, heads {heads}, n = {n}, r = {r}, d = {d}, relative to the float64 oracle",
                ["dtype", "decay", "implementation", *names], body,
                "‖grad − oracle‖ / ‖oracle‖ per tensor; the oracle's gradients are autograd's through the float64 "
                "oracle given float32 copies of the inputs. The forward's tolerances, for scale: float16 2e-3, "
                "bfloat16 1e-2, float32 1e-5 (TF32 2e-3; the peers' float32 goes through TF32).")
    for dt in dtypes:
        ours_errs, fla_errs = worst.get((JUDGED, dt), []), worst.get((FLA, dt), [])

        def top(errs):
            return None if not errs or any(e is None for e in errs) else max(errs)

        mine, theirs = top(ours_errs), top(fla_errs)
        rep.target(f"{JUDGED} gradient rel err vs fla, {bench.dtype_name(dt)} (worst of db, dc, dv and decays)",
                   f"{common.fmt_err(mine)} (fla {common.fmt_err(theirs)})", "≤ fla's",
                   None if mine is None or theirs is None else mine <= theirs)



def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--grad-only", action="store_true", help="only the gradient errors (their own files)")
    p.add_argument("--speed-only", action="store_true", help="only the speed and memory tables")
    p.add_argument("--methods", default=",".join(OURS),
                   help=f"comma-separated methods of ours (default {','.join(OURS)}; '{JUDGED}' is the one judged)")
    p.add_argument("--shapes", help="comma-separated BATCHxN pairs of the speed section, e.g. 1x8192,16x2048")
    p.add_argument("--model", type=common.layer_arg, help="HEADS,R,D of the speed section in place of 32,128,128, e.g. 8,256,512 "
                   "(RetNet-1.3B's layer); its files are named after it")
    p.add_argument("--grad-n", type=int, help="sequence length of the gradient section (default 8192; CPU 256)")
    p.add_argument("--grad-dtypes", default="float16,bfloat16,float32",
                   help="comma-separated dtypes of the gradient section")
    args = p.parse_args(argv)
    if args.grad_only and args.speed_only:
        p.error("--grad-only and --speed-only exclude each other")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in leettriton.METHODS]
    if not methods or unknown:
        p.error(f"--methods must name registered methods, got {args.methods!r}")
    grad_names = [x for x in args.grad_dtypes.split(",") if x]
    if not grad_names or any(x not in ("float16", "bfloat16", "float32") for x in grad_names):
        p.error(f"--grad-dtypes must name float16, bfloat16 or float32, got {args.grad_dtypes!r}")
    shapes = None
    if args.shapes:
        try:
            shapes = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]
        except ValueError:
            p.error(f"--shapes takes BATCHxN pairs such as 1x8192,16x2048, got {args.shapes!r}")
        if not shapes or any(len(x) != 2 or min(x) < 1 for x in shapes):
            p.error(f"--shapes takes BATCHxN pairs such as 1x8192,16x2048, got {args.shapes!r}")

    model = args.model
    device = common.device_of(args)
    rep = common.Report(NAME, "Forward + backward against fla and lightning-attn", common.cli_argv(argv), device,
                        args.quick)
    if args.grad_only:
        rep.name += "_grad"       # its own files: a full run's tables are not overwritten
    if args.shapes:
        rep.name += "_shapes"
    if model:
        rep.name += "_h{}_r{}_d{}".format(*model)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        heads, r, d = 32, 128, 128
        dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
        default_shapes = [(1, 8192), (16, 8192)] if args.quick else \
            [(1, 2048), (1, 8192), (1, 32768), (16, 2048), (16, 8192), (16, 32768)]
        grad_n, grad_heads = args.grad_n or 8192, 4
    else:
        heads, r, d = 2, 16, 16
        dtypes = [torch.float16]
        default_shapes = [(1, 64), (2, 128)]
        grad_n, grad_heads = args.grad_n or 256, 2
    if model:
        heads, r, d = model
    impls = implementations(rep, methods)
    failed = None
    try:
        if not args.grad_only:
            run_speed(rep, args, impls, dtypes, shapes or default_shapes, heads, r, d, rep_ms)
            rep.finish(args.out)  # the speed tables on disk now: the gradient section may be cut off
        if not args.speed_only:
            run_gradients(rep, impls, [getattr(torch, x) for x in grad_names], grad_n, grad_heads, r, d)
    except bench.DeviceFailure as exc:
        failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
