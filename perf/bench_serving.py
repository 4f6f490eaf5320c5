"""Serving: packed variable-length prefill into a slot pool, and slotted decode (docs/design.md §13).

1. Prefill of 64 requests whose lengths are drawn log-uniformly from 16 to 16 384 tokens (fixed seed),
   heads 32, r = d = 128, decay per head, float16 and bfloat16, packed as (T, heads, dim) with
   cu_seqlens; each request's final state goes to its slot of a float32 pool.  Timed:
   * ``varlen``: ``leettriton.linear_attention_varlen(..., state_pool=pool, slot_ids=slots)``, one launch;
   * ``python loop``: one batch-1 ``linear_attention(..., return_state=True)`` per request, then the
     state copied into its slot (what vLLM's linear-attention layers do);
   * ``fla varlen``: fla's ``chunk_simple_gla(..., cu_seqlens=cu, output_final_state=True)`` (only when
     fla is installed; it returns the states, it does not write a pool);
   * ``rect padded``: our rectangular call on the batch padded to the longest request (64 × max length);
   * ``rect same tokens``: our rectangular call on 64 equal sequences of ⌈T / 64⌉ tokens (the same
     number of tokens as the packed batch).
   Targets: varlen faster than the loop and than fla; within 1.3× of ``rect same tokens``.
   The packed output and the pool slots are checked against the float64 oracle on a few requests.
2. Slotted decode, ``decode_step(..., slot_ids=slots)`` on a pool of 2 × batch slots (ids a random
   permutation, so rows read scattered slots), against the rectangular ``decode_step`` on a
   (batch, heads, r, d) state, at batch 1, 64, 256.  Target: within 10 %.

    python perf/bench_serving.py            # on the GPU
    python perf/bench_serving.py --quick    # float16 only
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

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402

NAME = "bench_serving"


def request_lengths(count: int, low: int, high: int, seed: int = 0) -> list[int]:
    """``count`` lengths drawn log-uniformly from [low, high] (a few long prompts among many short ones)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(count, generator=g, dtype=torch.float64)
    return [int(round(math.exp(math.log(low) + x * (math.log(high) - math.log(low))))) for x in u.tolist()]


def _fla_varlen():
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception:  # not installed, or fails to import on this machine
        return None
    return chunk_simple_gla


def _time(fn, device, rep_ms, budget_s):
    try:
        return bench.time_ms(fn, rep_ms=rep_ms, max_call_ms=budget_s * 1e3, device=device)
    except torch.cuda.OutOfMemoryError:
        bench.free_memory()
        return None


def _row(rep, section, method, dtype, timing, **extra):
    med, p20, p80 = timing if timing is not None else (None, None, None)
    row = dict(section=section, method=method, dtype=bench.dtype_name(dtype), median_ms=med, p20_ms=p20, p80_ms=p80,
               status="ok" if timing is not None else "OOM", **extra)
    rep.rows.append(row)
    return row


def _check_prefill(b, c, v, cu, gamma, out, pool, slots, picks) -> float:
    """Largest relative error of the packed output and the pool slots against the oracle on requests ``picks``."""
    worst = 0.0
    bounds = cu.tolist()
    for i in picks:
        s, e = bounds[i], bounds[i + 1]
        one = [x[s:e].permute(1, 0, 2).unsqueeze(0) for x in (b, c, v)]
        ref, ref_state = leettriton.reference(*one, gamma, return_state=True)
        got = out[s:e].permute(1, 0, 2).unsqueeze(0).double()
        worst = max(worst, ((got - ref).norm() / ref.norm()).item(),
                    ((pool[slots[i]].double() - ref_state[0]).norm() / ref_state.norm()).item())
    return worst


def run_prefill(rep: common.Report, args, dtypes, count, low, high, heads, r, d, rep_ms) -> None:
    device = rep.device
    lens = request_lengths(count, low, high)
    T = sum(lens)
    n_same = -(-T // count)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    gamma = bench.decay_gammas(heads, device)
    fla = _fla_varlen() if device.type == "cuda" else None
    if fla is None:
        rep.note("fla's chunk_simple_gla is not available here: its column is empty")
    body = []
    for dt in dtypes:
        g = torch.Generator(device=device).manual_seed(1)
        b, c, v = (torch.randn(T, heads, x, generator=g, device=device).to(dt) / math.sqrt(x) for x in (r, r, d))
        pool = torch.zeros(2 * count, heads, r, d, device=device)
        slots = torch.randperm(2 * count, device=device)[:count]
        slot_list = slots.tolist()
        bounds = cu.tolist()

        def varlen():
            return leettriton.linear_attention_varlen(b, c, v, cu, gamma, state_pool=pool, slot_ids=slots)

        def loop():
            for i in range(count):  # vLLM's way: one batch-1 prefill per request, its state into its slot
                s, e = bounds[i], bounds[i + 1]
                one = [x[s:e].unsqueeze(0) for x in (b, c, v)]            # (1, n, heads, dim): layout bnhd
                o, st = leettriton.linear_attention(*one, gamma, layout="bnhd", return_state=True)
                pool[slot_list[i]].copy_(st[0])

        timings = {"varlen": _time(varlen, device, rep_ms, args.budget_s),
                   "python loop": _time(loop, device, rep_ms, args.budget_s)}
        if fla is not None:
            q, k, vv = (x.unsqueeze(0) for x in (b, c, v))                 # [1, T, H, K]: fla's varlen layout
            g_fla = torch.log(gamma.double()).float()
            cu_fla = cu.long()
            timings["fla varlen"] = _time(lambda: fla(q, k, vv, g_gamma=g_fla, scale=1.0, cu_seqlens=cu_fla,
                                                      output_final_state=True), device, rep_ms, args.budget_s)
        for label, n_rect, batch in (("rect padded", max(lens), count), ("rect same tokens", n_same, count)):
            try:
                rb, rc, rv = (torch.randn(batch, n_rect, heads, x, device=device, dtype=dt) for x in (r, r, d))
            except torch.cuda.OutOfMemoryError:
                bench.free_memory()
                timings[label] = None
                continue
            timings[label] = _time(lambda: leettriton.linear_attention(rb, rc, rv, gamma, layout="bnhd",
                                                                       return_state=True), device, rep_ms,
                                   args.budget_s)
            del rb, rc, rv
        # correctness of the packed call, on the shortest, a middle and the longest request
        pool.zero_()
        out = varlen()
        order = sorted(range(count), key=lambda i: lens[i])
        err = _check_prefill(b, c, v, cu, gamma, out, pool, slot_list, [order[0], order[count // 2], order[-1]])
        rows = {label: _row(rep, "prefill", label, dt, t, requests=count, tokens=T, heads=heads, r=r, d=d,
                            rel_err=err if label == "varlen" else None) for label, t in timings.items()}
        ours = rows["varlen"]["median_ms"]

        def ratio(label):
            other = rows.get(label, {}).get("median_ms")
            return None if other is None or ours is None else other / ours

        body.append([bench.dtype_name(dt), T, max(lens), common.cell(rows["varlen"]), common.fmt_err(err)]
                    + [common.cell(rows.get(k)) for k in ("python loop", "fla varlen", "rect padded",
                                                           "rect same tokens")]
                    + [("—" if ratio(k) is None else f"{ratio(k):.2f}×") for k in ("python loop", "fla varlen",
                                                                                   "rect same tokens")])
        on_gpu = device.type == "cuda"
        for label, goal, ok in (("python loop", "> 1× (varlen faster)", lambda x: x > 1),
                                ("fla varlen", "> 1× (varlen faster)", lambda x: x > 1),
                                ("rect same tokens", "≥ 1/1.3 = 0.77×", lambda x: x >= 1 / 1.3)):
            x = ratio(label)
            rep.target(f"prefill {bench.dtype_name(dt)}: {label} time / varlen time", "—" if x is None else
                       f"{x:.2f}×", goal, None if x is None or not on_gpu else ok(x))
        del b, c, v, pool
    rep.section(
        f"Packed prefill: {count} requests of {low}-{high} tokens (log-uniform, seed 0), heads {heads}, r = {r}, "
        f"d = {d}, decay per head",
        ["dtype", "T", "longest", "varlen ms", "varlen rel err", "python loop ms", "fla varlen ms", "rect padded ms",
         "rect same tokens ms", "loop / varlen", "fla / varlen", "rect same / varlen"], body,
        "varlen writes every final state into its pool slot; the loop copies each returned state into its slot; "
        "fla returns the states (N, H, K, V); the rectangular calls return the states. rel err: the packed output "
        "and the slots of the shortest, a middle and the longest request against the float64 oracle.")


def run_decode(rep: common.Report, args, dtypes, batches, heads, r, d, rep_ms) -> None:
    device = rep.device
    body = []
    for dt in dtypes:
        for batch in batches:
            g = torch.Generator(device=device).manual_seed(batch)
            b_t, c_t, v_t = (torch.randn(batch, heads, x, generator=g, device=device).to(dt) for x in (r, r, d))
            gamma = bench.decay_gammas(heads, device)
            state = torch.randn(batch, heads, r, d, generator=g, device=device)
            pool = torch.randn(2 * batch, heads, r, d, generator=g, device=device)
            slots = torch.randperm(2 * batch, device=device)[:batch].to(torch.int32)
            leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)  # checks the ids once
            expect = pool[slots.long()].clone()
            o_rect, _ = leettriton.decode_step(b_t, c_t, v_t, expect, gamma)
            o_slot, _ = leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)
            err = ((o_slot.double() - o_rect.double()).norm() / o_rect.double().norm()).item()
            t_rect = _time(lambda: leettriton.decode_step(b_t, c_t, v_t, state, gamma), device, rep_ms, args.budget_s)
            t_slot = _time(lambda: leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots), device,
                           rep_ms, args.budget_s)
            rect = _row(rep, "decode", "decode_step", dt, t_rect, batch=batch, heads=heads, r=r, d=d)
            slot = _row(rep, "decode", "decode_step slotted", dt, t_slot, batch=batch, heads=heads, r=r, d=d,
                        rel_err=err)
            x = None if not (rect["median_ms"] and slot["median_ms"]) else slot["median_ms"] / rect["median_ms"]
            body.append([bench.dtype_name(dt), batch, common.cell(rect), common.cell(slot),
                         "—" if x is None else f"{x:.2f}×", common.fmt_err(err)])
            rep.target(f"slotted decode {bench.dtype_name(dt)} B={batch}: slotted / rectangular",
                       "—" if x is None else f"{x:.2f}×", "≤ 1.10×",
                       None if x is None or device.type != "cuda" else x <= 1.10)
    rep.section(f"Slotted decode: heads {heads}, r = {r}, d = {d}, pool of 2 × batch slots, decay per head",
                ["dtype", "batch", "rectangular ms", "slotted ms", "slotted / rectangular",
                 "slotted vs rectangular rel err"], body,
                "Both update their states in place (each timed call is one more token); the error compares one "
                "slotted step with the rectangular step on the same states gathered beforehand.")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "Serving: packed prefill into a slot pool, slotted decode", common.cli_argv(argv),
                        device, args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        count, low, high, heads, r, d = 64, 16, 16384, 32, 128, 128
        dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
        batches = [1, 64, 256]
    else:
        count, low, high, heads, r, d = 6, 1, 40, 2, 16, 16
        dtypes = [torch.float32]
        batches = [1, 4]
    failed = None
    with torch.no_grad():
        try:
            run_prefill(rep, args, dtypes, count, low, high, heads, r, d, rep_ms)
            run_decode(rep, args, dtypes, batches, heads, r, d, rep_ms)
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
