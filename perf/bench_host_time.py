"""Host time per call: decode_step and short prefills from Python, beside the GPU time of the same call.

1. ``leettriton.decode_step`` (float16, heads 32, r = d = 128, decay per head, one token) at batch
   1, 16, 64, 256: the time per call from Python (wall clock over a loop of calls, one sync at the
   end: what a generation loop without a CUDA graph sees), the GPU time of the call (its CUDA-graph
   replay timed with ``do_bench``, median), the memory floor (the float32 state read and written,
   2·B·H·r·d·4 bytes, at the copy bandwidth measured in this run) and the share of the copy bandwidth
   each reaches; fla's ``fused_recurrent_simple_gla`` on one token (``initial_state``,
   ``output_final_state=True``) beside it when fla imports.
2. ``linear_attention(method="auto")`` (float16, same heads and sizes) at batch 1, 16, 64, 256 ×
   n 2048 and 1 × 8192: the same two times, and fla's ``chunk_simple_gla`` GPU time beside it.
3. The host time of leettriton's own Python per call with the launches stubbed out
   (``perf/host_overhead.py --device cpu``, in a process of its own), for ``decode_step`` and
   ``auto`` at 1 × 2048.

A call is host-bound when its time from Python exceeds its GPU time: there, a CUDA graph (or a
larger batch per call) pays; where the two agree, the GPU is the limit and a graph gains nothing.
Every output is checked against float64.

    python perf/bench_host_time.py --out perf/results          # on the GPU, ~2 minutes
    python perf/bench_host_time.py --device cpu                # tiny shapes: a check of the logic
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_decode import decode_reference  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402

NAME = "bench_host_time"
HERE = os.path.dirname(os.path.abspath(__file__))


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def wall_ms(fn, device, rep_ms: float, blocks: int = 3) -> float:
    """Milliseconds per call from Python: calls back to back for ``rep_ms`` (at least 20), one sync at the end;
    the median of ``blocks`` such loops."""
    for _ in range(3):
        fn()
    sync(device)
    per_call = []
    for _ in range(blocks):
        calls, start = 0, time.perf_counter()
        while calls < 20 or time.perf_counter() - start < rep_ms / 1e3:
            fn()
            calls += 1
        sync(device)
        per_call.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(per_call)


def graph_ms(fn, device, rep_ms: float, notes: list, what: str):
    """The call captured once in a CUDA graph, the replay timed with ``do_bench`` (median ms): the GPU time
    alone.  None off CUDA, or (with a note) when the call cannot be captured."""
    if device.type != "cuda":
        return None
    import triton

    try:
        replay = bench.graph_replay(fn)
        return triton.testing.do_bench(replay, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])[0]
    except Exception as exc:  # noqa: BLE001  (reported; the time from Python still counts)
        notes.append(f"{what}: no CUDA graph ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        torch.cuda.synchronize()
        return None


def us(ms) -> str:
    return "—" if ms is None else f"{ms * 1e3:.1f}"


def pct(x) -> str:
    return "—" if x is None else f"{x:.0%}"


def run_decode(rep: common.Report, batches, heads, r, d, rep_ms) -> None:
    device = rep.device
    fla = bench.peer_decode(device, rep.notes)
    body = []
    for batch in batches:
        b, c, v = bench.make_inputs(batch, heads, 1, r, d, torch.float16, device, seed=batch)
        b_t, c_t, v_t = (x.squeeze(2) for x in (b, c, v))
        gamma = bench.decay_gammas(heads, device)
        state0 = torch.randn(batch, heads, r, d, generator=torch.Generator(device=device).manual_seed(7),
                             device=device)
        expect = decode_reference(b_t, c_t, v_t, state0, gamma)
        state = state0.clone()
        err = bench.rel_error(leettriton.decode_step(b_t, c_t, v_t, state, gamma)[0], expect)

        def ours():
            return leettriton.decode_step(b_t, c_t, v_t, state, gamma)

        floor = 2 * batch * heads * r * d * 4 / rep.bandwidth * 1e3
        row = dict(section="decode", method="decode_step", dtype="float16", batch=batch, heads=heads, n=1, r=r, d=d,
                   wall_ms=wall_ms(ours, device, rep_ms), gpu_ms=graph_ms(ours, device, rep_ms, rep.notes,
                                                                         f"decode_step B={batch}"),
                   floor_ms=floor, rel_err=err)
        row["wall_bandwidth_frac"] = floor / row["wall_ms"]
        row["gpu_bandwidth_frac"] = None if row["gpu_ms"] is None else floor / row["gpu_ms"]
        row["status"] = "ok" if err <= bench.tolerance(torch.float16) else "WRONG"
        rep.rows.append(row)
        peer = None
        if fla is not None:
            call = fla(b_t, c_t, v_t, state0.clone(), gamma)
            gpu = graph_ms(call, device, rep_ms, rep.notes, f"fla decode B={batch}")
            if gpu is None:  # fla could not be captured: do_bench of the call itself
                gpu = bench.time_ms(call, rep_ms=rep_ms, device=device)[0]
            peer = dict(section="decode", method="fla_fused_recurrent (1 token)", dtype="float16", batch=batch,
                        heads=heads, n=1, r=r, d=d, wall_ms=wall_ms(call, device, rep_ms), gpu_ms=gpu, floor_ms=floor,
                        rel_err=bench.rel_error(call.to_bhnd(call()), expect))
            peer["status"] = "ok" if peer["rel_err"] <= bench.tolerance(torch.float32, "tf32") else "WRONG"
            rep.rows.append(peer)
        body.append([batch, us(row["wall_ms"]), us(row["gpu_ms"]), us(floor), pct(row["wall_bandwidth_frac"]),
                     pct(row["gpu_bandwidth_frac"]), common.fmt_err(err) + ("" if row["status"] == "ok" else " WRONG"),
                     us(peer and peer["wall_ms"]), us(peer and peer["gpu_ms"])])
        print(f"decode B={batch:<4} from Python {us(row['wall_ms'])} µs  GPU {us(row['gpu_ms'])} µs  "
              f"floor {us(floor)} µs  err {common.fmt_err(err)}", flush=True)
        if batch == 1:
            rep.target("decode_step B=1: time per call from Python (no graph)", f"{us(row['wall_ms'])} µs",
                       "≤ 15 µs", None if device.type != "cuda" else row["wall_ms"] <= 0.015)
        if batch == 16:
            rep.target("decode_step B=16 from Python (no graph): share of the copy bandwidth",
                       pct(row["wall_bandwidth_frac"]), "≥ 70%",
                       None if device.type != "cuda" else row["wall_bandwidth_frac"] >= 0.7)
        del b, c, v, b_t, c_t, v_t, state, state0
    rep.section(
        f"decode_step: one token, float16, heads {heads}, r = {r}, d = {d}, decay per head (µs per call)",
        ["batch", "from Python", "GPU (graph replay)", "floor", "% of copy (from Python)", "% of copy (GPU)",
         "rel err", "fla from Python", "fla GPU (graph replay)"], body,
        f"From Python: wall clock over a loop of calls, one sync at the end (no CUDA graph). GPU: the call captured "
        f"in a CUDA graph, the replay timed with do_bench (median). Floor: the float32 state read and written "
        f"(2·B·H·r·d·4 bytes) at the copy bandwidth measured in this run ({rep.bandwidth / 1e9:.0f} GB/s). fla: "
        f"fused_recurrent_simple_gla on one token with initial_state and output_final_state=True (its GPU time: the "
        f"graph replay, or do_bench of the call where it cannot be captured).")


def run_prefill(rep: common.Report, shapes, heads, r, d, rep_ms) -> None:
    device = rep.device
    fla = bench.peers(device, ["fla_chunk_simple_gla"], rep.notes).get("fla_chunk_simple_gla")
    body = []
    for batch, n in shapes:
        b, c, v = bench.make_inputs(batch, heads, n, r, d, torch.float16, device, seed=n + batch)
        gamma = bench.decay_gammas(heads, device)
        check = bench.oracle(b, c, v, gamma)

        def ours():
            return leettriton.linear_attention(b, c, v, gamma)

        err = check.error(ours())
        row = dict(section="prefill", method="auto", dtype="float16", batch=batch, heads=heads, n=n, r=r, d=d,
                   wall_ms=wall_ms(ours, device, rep_ms),
                   gpu_ms=graph_ms(ours, device, rep_ms, rep.notes, f"auto {batch}×{n}"), rel_err=err,
                   status="ok" if err <= bench.tolerance(torch.float16) else "WRONG")
        rep.rows.append(row)
        peer = None
        if fla is not None:
            call = fla(b, c, v, gamma)
            gpu = graph_ms(call, device, rep_ms, rep.notes, f"fla chunk {batch}×{n}")
            if gpu is None:  # fla could not be captured: do_bench of the call itself
                gpu = bench.time_ms(call, rep_ms=rep_ms, device=device)[0]
            peer = dict(section="prefill", method="fla_chunk_simple_gla", dtype="float16", batch=batch, heads=heads,
                        n=n, r=r, d=d, wall_ms=wall_ms(call, device, rep_ms), gpu_ms=gpu,
                        rel_err=check.error(call.to_bhnd(call())))
            peer["status"] = "ok" if peer["rel_err"] <= bench.tolerance(torch.float16) else "WRONG"
            rep.rows.append(peer)
            del call
        speed = None if not (peer and row["gpu_ms"]) else peer["gpu_ms"] / row["gpu_ms"]
        body.append([f"{batch} × {n}", us(row["wall_ms"]), us(row["gpu_ms"]),
                     common.fmt_err(err) + ("" if row["status"] == "ok" else " WRONG"), us(peer and peer["wall_ms"]),
                     us(peer and peer["gpu_ms"]), "—" if speed is None else f"{speed:.2f}×"])
        print(f"auto {batch}×{n}: from Python {us(row['wall_ms'])} µs  GPU {us(row['gpu_ms'])} µs  "
              f"err {common.fmt_err(err)}", flush=True)
        del b, c, v, check
        bench.free_memory()
    rep.section(
        f"linear_attention(method='auto'): float16, heads {heads}, r = {r}, d = {d}, decay per head (µs per call)",
        ["batch × n", "from Python", "GPU (graph replay)", "rel err", "fla chunk from Python", "fla chunk GPU",
         "fla GPU / ours GPU"], body,
        "fla chunk GPU: chunk_simple_gla's CUDA-graph replay (or, where it cannot be captured, do_bench of the call). "
        "Relative error against the float64 oracle on a subset of (batch, head) pairs.")


def run_stubbed(rep: common.Report, calls: int, repeat: int) -> None:
    """perf/host_overhead.py --device cpu in a process of its own (it replaces the launchers)."""
    cmd = [sys.executable, os.path.join(HERE, "host_overhead.py"), "--device", "cpu", "--n", "2048", "--calls",
           str(calls), "--repeat", str(repeat), "--methods", "decode_step", "auto"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    found = dict(re.findall(r"^\s+(\w+)\s+([\d.]+) µs$", res.stdout, flags=re.M))
    body = [[name, found.get(name, "—")] for name in ("decode_step", "auto")]
    for name, value in found.items():
        rep.rows.append(dict(section="stubbed host time", method=name, batch=1, n=1 if name == "decode_step" else 2048,
                             heads=32, r=128, d=128, host_us=float(value), status="ok"))
    if res.returncode != 0:
        rep.note(f"perf/host_overhead.py failed: {res.stderr.strip().splitlines()[-1:]}")
    auto = found.get("auto")
    rep.target("linear_attention auto 1×2048: host time per call, launches stubbed",
               "—" if auto is None else f"{auto} µs", "≤ 40 µs", None if auto is None else float(auto) <= 40)
    rep.section(
        "leettriton's own Python per call, launches stubbed (µs; heads 32, r = d = 128, float16, decay)",
        ["call", "µs per call"], body,
        f"`{' '.join(['python', 'perf/host_overhead.py'] + cmd[2:])}` (the fastest of {repeat} loops of {calls} "
        f"calls; the compiled kernels' launcher and Triton's launch path stubbed out, so this is validation, "
        f"dispatch and argument building alone, on this machine's CPU).")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "host time per call: decode_step and short prefills", common.cli_argv(argv), device,
                        args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        heads, r, d = 32, 128, 128
        batches = [1, 16] if args.quick else [1, 16, 64, 256]
        shapes = [(1, 2048), (16, 2048)] if args.quick else [(1, 2048), (16, 2048), (64, 2048), (256, 2048),
                                                             (1, 8192)]
        calls, repeat = 2000, 5
    else:
        heads, r, d = 2, 16, 16
        batches, shapes = [1, 4], [(1, 64)]
        calls, repeat = 50, 2
    failed = None
    with torch.no_grad():
        try:
            run_decode(rep, batches, heads, r, d, rep_ms)
            rep.save(args.out)
            run_prefill(rep, shapes, heads, r, d, rep_ms)
            rep.save(args.out)
        except bench.DeviceFailure as exc:
            failed = common.stopped(rep, exc)
    run_stubbed(rep, calls, repeat)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
