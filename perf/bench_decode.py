"""decode_step and causal_dot_product against flash-linear-attention's fused recurrent kernel.

1. ``leettriton.decode_step(b_t, c_t, v_t, state, gamma)`` (one token, state updated in
   place), heads 32, r = d = 128, float16 and bfloat16, batch 1, 8, 64, 256, decay per
   head (0.969 … 0.996).  A step must read and write the float32 state once, so its
   bytes are ``2·B·H·r·d·4`` (state) ``+ B·H·(2r + d)·e`` (b_t, c_t, v_t) ``+ B·H·d·e``
   (o_t); the achieved bandwidth (bytes ÷ median time) is compared with the copy
   bandwidth measured in the same run: target ≥ 70 % at batch ≥ 64.  fla's
   ``fused_recurrent_simple_gla`` on one token with ``initial_state`` (its ``[B, H, K, V]``
   float32 layout is ours) and ``output_final_state=True`` is timed beside it.
2. ``causal_dot_product`` (the row-by-row recurrence over a whole sequence) at batch 16,
   n ∈ {128, 2048, 8192}, against ``fused_recurrent_simple_gla`` over the sequence.

Every output is checked against float64 (the one-step formula, or the oracle).

    python perf/bench_decode.py            # on the GPU, ~1 minute
    python perf/bench_decode.py --quick    # fp16, batch 1 and 64, n 2048
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402

NAME = "bench_decode"


def decode_bytes(batch: int, heads: int, r: int, d: int, dtype: torch.dtype) -> int:
    """Bytes one step must move: the float32 state read and written, b_t, c_t, v_t read, o_t written."""
    e = torch.empty((), dtype=dtype).element_size()
    return batch * heads * (2 * r * d * 4 + (2 * r + d) * e + d * e)


def decode_reference(b_t, c_t, v_t, state, gamma) -> torch.Tensor:
    """o_t = b_t (γ S + c_tᵀ v_t) in float64."""
    b, c, v, s = (x.double() for x in (b_t, c_t, v_t, state))
    g = torch.ones(b.shape[1], dtype=torch.float64, device=b.device) if gamma is None else gamma.double()
    new = g.view(1, -1, 1, 1) * s + c.unsqueeze(-1) * v.unsqueeze(-2)
    return torch.einsum("bhr,bhrd->bhd", b, new)


def run_decode(rep: common.Report, args, dtypes, batches, heads, r, d, rep_ms) -> None:
    device = rep.device
    fla = bench.peer_decode(device, rep.notes)
    body = []
    for dt in dtypes:
        for batch in batches:
            b, c, v = bench.make_inputs(batch, heads, 1, r, d, dt, device, seed=batch)
            b_t, c_t, v_t = (x.squeeze(2) for x in (b, c, v))               # (B, H, r) and (B, H, d)
            gen = torch.Generator(device=device).manual_seed(7)
            state0 = torch.randn(batch, heads, r, d, generator=gen, device=device)
            gamma = bench.decay_gammas(heads, device)
            check = bench.Oracle(decode_reference(b_t, c_t, v_t, state0, gamma), list(range(batch)),
                                 list(range(heads)), "all")
            nbytes = decode_bytes(batch, heads, r, d, dt)
            floor = nbytes / rep.bandwidth * 1e3
            tol = bench.tolerance(dt)

            def ours():
                st = state0.clone()
                return lambda: leettriton.decode_step(b_t, c_t, v_t, st, gamma)[0]

            results = {"decode_step": bench.measure(ours, check=check, tol=tol, device=device, rep_ms=rep_ms,
                                                    budget_ms=args.budget_s * 1e3)}
            if fla is not None:
                results["fla_fused_recurrent (1 token)"] = bench.measure(
                    lambda: fla(b_t, c_t, v_t, state0.clone(), gamma), check=check,
                    tol=bench.tolerance(torch.float32, "tf32"),
                    device=device, rep_ms=rep_ms, budget_ms=args.budget_s * 1e3)
            for label, m in results.items():
                bw = None if m.median_ms is None else nbytes / (m.median_ms * 1e-3)
                row = dict(section="decode", method=label, dtype=bench.dtype_name(dt), batch=batch, heads=heads, n=1,
                           r=r, d=d, decay=True, median_ms=m.median_ms, p20_ms=m.p20_ms, p80_ms=m.p80_ms,
                           floor_ms=floor, ratio=None if m.median_ms is None else m.median_ms / floor,
                           bytes=nbytes, bandwidth_gbs=None if bw is None else bw / 1e9,
                           bandwidth_frac=None if bw is None else bw / rep.bandwidth, rel_err=m.rel_err,
                           status=m.status, note=m.note)
                rep.rows.append(row)
                print(f"decode {row['dtype']:<8} B={batch:<4} {label:<30} {common.cell(row):>10} ms  "
                      f"{'' if bw is None else f'{bw / 1e9:7.0f} GB/s ({bw / rep.bandwidth:5.1%} of copy)'}  "
                      f"err {common.fmt_err(m.rel_err)}  {m.status} {m.note}", flush=True)
            ours_row = common.find(rep.rows, section="decode", method="decode_step", dtype=bench.dtype_name(dt),
                                   batch=batch)
            peer_row = common.find(rep.rows, section="decode", method="fla_fused_recurrent (1 token)",
                                   dtype=bench.dtype_name(dt), batch=batch)
            speed = None
            if peer_row and ours_row and peer_row["median_ms"] and ours_row["median_ms"]:
                speed = peer_row["median_ms"] / ours_row["median_ms"]
            frac = ours_row["bandwidth_frac"]
            body.append([bench.dtype_name(dt), batch, common.cell(ours_row),
                         "—" if frac is None else f"{ours_row['bandwidth_gbs']:.0f} GB/s ({frac:.0%})",
                         common.fmt_err(ours_row["rel_err"]), common.cell(peer_row),
                         f"{peer_row['bandwidth_frac']:.0%}" if peer_row and peer_row["bandwidth_frac"] else "—",
                         "—" if speed is None else f"{speed:.2f}×", common.fmt_ms(floor)])
            if batch >= 64 or device.type != "cuda":
                rep.target(f"decode_step {bench.dtype_name(dt)} B={batch}: bandwidth vs copy",
                           "—" if frac is None else f"{frac:.0%}", "≥ 70% (batch ≥ 64)",
                           None if frac is None or device.type != "cuda" else frac >= 0.7)
            del b, c, v, b_t, c_t, v_t, state0
    rep.section(
        f"decode_step: one token, heads {heads}, r = {r}, d = {d}, decay per head",
        ["dtype", "batch", "ours ms", "ours bandwidth (% of copy)", "ours rel err", "fla 1-token ms", "fla % of copy",
         "fla / ours", "floor ms"], body,
        f"Bytes per step: 2·B·H·r·d·4 (float32 state read + written) + B·H·(2r + d)·e (inputs) + B·H·d·e "
        f"(output); "
        f"copy bandwidth {rep.bandwidth / 1e9:.0f} GB/s measured in this run. fla: fused_recurrent_simple_gla on one "
        f"token with initial_state and output_final_state=True (it writes a new state; ours updates in place).")


def run_causal(rep: common.Report, args, dtypes, batch, seqlens, heads, r, d, rep_ms) -> None:
    device = rep.device
    entries = [common.entry("causal_dot_product", device)]
    for name, factory in bench.peers(device, ["fla_fused_recurrent_simple_gla"], rep.notes).items():
        entries.append(bench.peer_entry(name, factory))
    rows = bench.run_grid(entries, dtypes=dtypes, batches=[batch], seqlens=seqlens, decays=[True], heads=heads, r=r,
                          d=d, device=device, budget_s=args.budget_s, rep_ms=rep_ms, bandwidth=rep.bandwidth)
    for row in rows:
        row["section"] = "causal_dot_product"
    rep.rows.extend(rows)
    body = []
    for dt in dtypes:
        for n in seqlens:
            ours = common.find(rows, method="causal_dot_product", dtype=bench.dtype_name(dt), n=n)
            peer = common.find(rows, method="fla_fused_recurrent_simple_gla", dtype=bench.dtype_name(dt), n=n)
            speed = None
            if ours and peer and ours["median_ms"] and peer["median_ms"]:
                speed = peer["median_ms"] / ours["median_ms"]
            body.append([bench.dtype_name(dt), n, common.cell(ours), common.fmt_err(ours and ours["rel_err"]),
                         "—" if not (ours and ours["ratio"]) else f"{ours['ratio']:.1f}×", common.cell(peer),
                         common.fmt_err(peer and peer["rel_err"]), "—" if speed is None else f"{speed:.2f}×",
                         common.fmt_ms(ours["floor_ms"]) if ours else "—"])
            rep.target(f"causal_dot_product {bench.dtype_name(dt)} B={batch} n={n} vs fla fused_recurrent",
                       "—" if speed is None else f"{speed:.2f}× faster", "informative", None)
    rep.section(f"causal_dot_product over a sequence: batch {batch}, heads {heads}, r = {r}, d = {d}, decay per head",
                ["dtype", "n", "ours ms", "ours rel err", "ours × floor", "fla fused_recurrent ms", "fla rel err",
                 "fla / ours", "floor ms"], body,
                "Relative error against the float64 oracle (on a subset of (batch, head) pairs when large: see the "
                "JSON rows' err_scope).")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "decode_step and causal_dot_product", common.cli_argv(argv), device, args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        heads, r, d = 32, 128, 128
        dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
        batches = [1, 64] if args.quick else [1, 8, 64, 256]
        cdp_batch, cdp_n = 16, ([2048] if args.quick else [128, 2048, 8192])
    else:
        heads, r, d = 2, 16, 16
        dtypes = [torch.float16, torch.bfloat16]
        batches = [1, 4]
        cdp_batch, cdp_n = 2, [16, 64]
    failed = None
    with torch.no_grad():
        try:
            run_decode(rep, args, dtypes, batches, heads, r, d, rep_ms)
            run_causal(rep, args, dtypes, cdp_batch, cdp_n, heads, r, d, rep_ms)
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
