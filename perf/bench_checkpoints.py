"""State checkpoints in the packed prefill: their cost over the plain prefill (docs/design.md §13.9).

The packed prefill of bench_serving.py (64 requests of 16 to 16 384 tokens, log-uniform, seed 0; heads 32,
r = d = 128, decay per head, float16 and bfloat16, each final state into its pool slot), timed:

* ``plain``: ``linear_attention_varlen(..., state_pool=pool, slot_ids=slots)``;
* ``K = 1024 / 256 / 64``: the same call with ``checkpoint_every=K`` and every checkpoint a sequence reaches
  written to a slot of its own (the table's other entries −1);
* ``K = 64, all −1``: the checkpoint path with nothing to write (the loop's extra work alone).

Each checkpoint writes one float32 state per head, r·d·4 bytes: the table gives the bytes written and their
time at the copy bandwidth, the floor of what checkpointing can cost.  Target: K = 256 within 5 % of plain.
One checkpoint per K of a few requests is checked against the float64 oracle of its prefix.

    python perf/bench_checkpoints.py            # on the GPU
    python perf/bench_checkpoints.py --quick    # float16 only

On a machine without CUDA the script runs tiny shapes through the PyTorch paths: a check of its logic,
not a measurement.
"""
from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_serving import request_lengths  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402

NAME = "bench_checkpoints"


def _time(fn, device, rep_ms, budget_s):
    try:
        return bench.time_ms(fn, rep_ms=rep_ms, max_call_ms=budget_s * 1e3, device=device)
    except torch.cuda.OutOfMemoryError:
        bench.free_memory()
        return None


def checkpoint_table(lens, every, first_slot, device, write=True):
    """(N, M) slots: sequence i's checkpoints j < len_i // every get consecutive slots from ``first_slot`` on
    (all −1 unless ``write``); M the most any sequence reaches.  Returns the table and the slots it names."""
    counts = [n // every for n in lens]
    m = max(1, max(counts))
    table = torch.full((len(lens), m), -1, dtype=torch.int32)
    nxt = first_slot
    for i, k in enumerate(counts):
        if write and k:
            table[i, :k] = torch.arange(nxt, nxt + k, dtype=torch.int32)
            nxt += k
    return table.to(device), nxt - first_slot


def _check(b, c, v, cu, gamma, pool, table, every, picks) -> float:
    """Largest relative error of the checkpoints of requests ``picks`` (their first and last) against the oracle."""
    worst = 0.0
    bounds = cu.tolist()
    rows = table.tolist()
    for i in picks:
        s = bounds[i]
        for j in sorted({0, (bounds[i + 1] - s) // every - 1}):
            if j < 0 or rows[i][j] < 0:
                continue
            n = (j + 1) * every
            one = [x[s:s + n].permute(1, 0, 2).unsqueeze(0) for x in (b, c, v)]
            _, ref = leettriton.reference(*one, gamma, return_state=True)
            got = pool[rows[i][j]].double()
            worst = max(worst, ((got - ref[0]).norm() / ref[0].norm()).item())
    return worst


def run(rep: common.Report, args, dtypes, count, low, high, heads, r, d, everies, rep_ms) -> None:
    device = rep.device
    lens = request_lengths(count, low, high)
    T = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    gamma = bench.decay_gammas(heads, device)
    slots = torch.arange(count, device=device, dtype=torch.int32)
    state_bytes = heads * r * d * 4
    most = max(sum(n // k for n in lens) for k in everies)
    body = []
    for dt in dtypes:
        g = torch.Generator(device=device).manual_seed(1)
        b, c, v = (torch.randn(T, heads, x, generator=g, device=device).to(dt) / math.sqrt(x) for x in (r, r, d))
        try:
            pool = torch.zeros(count + most, heads, r, d, device=device)
        except torch.cuda.OutOfMemoryError:
            bench.free_memory()
            rep.note(f"{bench.dtype_name(dt)}: a pool of {count + most} states does not fit")
            continue
        plain = _time(lambda: leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slots),
                      device, rep_ms, args.budget_s)
        base = _row(rep, dt, "plain", plain, 0, 0, None, T)
        cells = [("plain", base, 0, None)]
        for every, write in [(k, True) for k in everies] + [(min(everies), False)]:
            table, written = checkpoint_table(lens, every, count, device, write)
            label = f"K = {every}" + ("" if write else ", all −1")

            def call():
                return leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slots,
                                                          checkpoint_every=every, checkpoint_slots=table)

            call()   # checks the table once
            timing = _time(call, device, rep_ms, args.budget_s)
            err = None
            if write:
                pool.zero_()
                call()
                order = sorted(range(count), key=lambda i: lens[i])
                err = _check(b, c, v, cu, gamma, pool, table, every, [order[count // 2], order[-1]])
            cells.append((label, _row(rep, dt, label, timing, every, written, err, T), written, err))
        ours = base["median_ms"]
        for label, row, written, err in cells:
            t = row["median_ms"]
            ratio = None if t is None or not ours else t / ours
            floor_ms = written * state_bytes / rep.bandwidth * 1e3
            body.append([bench.dtype_name(dt), label, common.cell(row), "—" if ratio is None else f"{ratio:.3f}×",
                         written, f"{written * state_bytes / 2**30:.2f}", f"{floor_ms:.3f}", common.fmt_err(err)])
            if label == "K = 256":
                rep.target(f"{bench.dtype_name(dt)}: checkpoints every 256 tokens / plain prefill",
                           "—" if ratio is None else f"{ratio:.3f}×", "≤ 1.05×",
                           None if ratio is None or device.type != "cuda" else ratio <= 1.05)
        del b, c, v, pool
    rep.section(
        f"Checkpointing in the packed prefill: {count} requests of {low}-{high} tokens (log-uniform, seed 0), "
        f"T = {T}, heads {heads}, r = {r}, d = {d}, decay per head",
        ["dtype", "call", "ms", "/ plain", "checkpoints", "GiB written", "floor ms (copy bandwidth)", "rel err"],
        body,
        "Every call also writes each request's final state to its slot. The floor: the checkpoints' bytes at the "
        "measured copy bandwidth. rel err: the first and last checkpoint of the median and the longest request "
        "against the float64 oracle of their prefix.")


def _row(rep, dt, label, timing, every, written, err, tokens):
    med, p20, p80 = timing if timing is not None else (None, None, None)
    row = dict(section="checkpoints", label=label, dtype=bench.dtype_name(dt), checkpoint_every=every,
               checkpoints=written, tokens=tokens, median_ms=med, p20_ms=p20, p80_ms=p80, rel_err=err,
               status="ok" if timing is not None else "OOM")
    rep.rows.append(row)
    return row


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "Checkpoints in the packed prefill: their cost", common.cli_argv(argv), device,
                        args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        count, low, high, heads, r, d = 64, 16, 16384, 32, 128, 128
        dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
        everies = [1024, 256, 64]
    else:
        count, low, high, heads, r, d = 4, 40, 200, 2, 16, 16
        dtypes = [torch.float32]
        everies = [128, 64]
    failed = None
    with torch.no_grad():
        try:
            run(rep, args, dtypes, count, low, high, heads, r, d, everies, rep_ms)
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
