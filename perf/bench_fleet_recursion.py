"""fleet_attention and recursion beside the best chunked method, in one run.

heads 32, r = d = 128, with decay (γ per head 0.969 … 0.996), float16 and float32; batch 1
with n ∈ {2048, 8192, 32768, 100000} and batch 16 with n ∈ {2048, 8192, 25600};
fleet_attention, recursion, lightning_attention and block_based.

* fleet_attention's multiply-adds are counted as the algorithm's **2·n·r·d per
  batch·head**: for every rank column k, position t and value column j, one for the
  decayed scan h ← γ·h + c_{t,k}·v_{t,j} and one for the weighted sum o ← o + b_{t,k}·h
  (the product c·v is folded into the first; this is the work the algorithm needs,
  not what a kernel spends).  The achieved rate (count ÷ median time) is compared with
  the GPU's float32 FMA rate, measured in this run by an FMA-bound Triton kernel (eight
  independent FMA chains per element); the datasheet figure is shown beside it as a
  lead.  The kernel computes the scans a block of BT rows at a time as tensor-core
  products (BT·n·r·d multiply-adds, methods/fleet_attention/kernels.py), not on CUDA cores as
  the row-by-row scan it replaced did, so the ratio can exceed what that scan could
  reach, and even 100%: it says how far the algorithm's work is from the CUDA-core
  limit, not how busy the tensor cores are.  Target: fleet_attention ≤ 10× the
  best chunked method at batch 1, n 8192.
* recursion is O(n log n · r·d): the table shows time ÷ (n·log2 n) and the exponent α
  of a least-squares fit time ∝ n^α over the batch-1 lengths.  Targets: within 3× of
  the best chunked method at batch 1, n 100000, and no OOM at batch 16, n 100000 (where
  the float32 inputs alone, 4 × 26 GB, may not fit the GPU: that is reported as such).

    python perf/bench_fleet_recursion.py            # on the GPU, ~2 minutes
    python perf/bench_fleet_recursion.py --quick    # fp16, batch 1, n 2048 / 8192 / 100000
"""
from __future__ import annotations

import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from leettriton import bench  # noqa: E402

NAME = "bench_fleet_recursion"
CHUNKED = ("lightning_attention", "block_based")
METHODS = ("fleet_attention", "recursion") + CHUNKED

# Published float32 (non-tensor) rates, as a lead: FMA/s = FLOPS / 2.
DATASHEET_FMA = {"h100": ("H100 SXM5: 66.9 TFLOPS fp32", 33.5e12), "h200": ("H200 SXM: 66.9 TFLOPS fp32", 33.5e12),
                 "a100": ("A100: 19.5 TFLOPS fp32", 9.75e12), "rtx-a6000": ("RTX A6000: 38.7 TFLOPS fp32", 19.4e12)}

FMA_CHAINS = 8


@triton.jit
def _fma_rate_kernel(x_ptr, out_ptr, n_iter, mul, add, BLOCK: tl.constexpr):
    # Eight independent chains per element so the FMA pipes, not latency, bound the loop.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    a0 = x
    a1 = x + 1.0
    a2 = x + 2.0
    a3 = x + 3.0
    a4 = x + 4.0
    a5 = x + 5.0
    a6 = x + 6.0
    a7 = x + 7.0
    for _ in range(n_iter):
        a0 = tl.fma(a0, mul, add)
        a1 = tl.fma(a1, mul, add)
        a2 = tl.fma(a2, mul, add)
        a3 = tl.fma(a3, mul, add)
        a4 = tl.fma(a4, mul, add)
        a5 = tl.fma(a5, mul, add)
        a6 = tl.fma(a6, mul, add)
        a7 = tl.fma(a7, mul, add)
    tl.store(out_ptr + offs, ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)))


def fma_rate(device, numel: int = 1 << 22, n_iter: int = 1024, block: int = 1024) -> float:
    """Measured float32 FMA/s of the device (CUDA only)."""
    x = torch.rand(numel, device=device)
    out = torch.empty_like(x)
    grid = (triton.cdiv(numel, block),)

    def run():
        _fma_rate_kernel[grid](x, out, n_iter, 0.9999, 0.0001, BLOCK=block, num_warps=4)

    med, _, _ = bench.time_ms(run, device=device)
    return numel * FMA_CHAINS * n_iter / (med * 1e-3)


def fleet_fmas(batch: int, heads: int, n: int, r: int, d: int) -> int:
    """Multiply-adds fleet_attention needs: 2·n·r·d per batch·head (scan + weighted sum)."""
    return 2 * batch * heads * n * r * d


def _rate(rate) -> str:
    if rate is None:
        return "—"
    return f"{rate / 1e12:.2f} T/s" if rate >= 1e11 else f"{rate / 1e9:.3g} G/s"


def fit_exponent(points) -> float | None:
    """α of the least-squares fit log t = α log n + c, or None with fewer than two points."""
    if len(points) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else None


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    args = p.parse_args(argv)
    device = common.device_of(args)
    rep = common.Report(NAME, "fleet_attention and recursion", common.cli_argv(argv), device, args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if device.type == "cuda":
        heads, r, d = 32, 128, 128
        dtypes = [torch.float16] if args.quick else [torch.float16, torch.float32]
        shapes = {1: [2048, 8192, 100000] if args.quick else [2048, 8192, 32768, 100000],
                  16: [] if args.quick else [2048, 8192, 25600]}
        big = (16, 100000)
    else:
        heads, r, d = 2, 16, 16
        dtypes = [torch.float16, torch.float32]
        shapes = {1: [64, 256, 1024], 2: [128]}
        big = (2, 2048)
    gpu = device.type == "cuda"                             # timing targets are judged on a GPU only
    ref_n = 8192 if device.type == "cuda" else 256          # fleet target shape (batch 1)
    long_n = 100000 if device.type == "cuda" else 1024      # recursion target shape (batch 1)

    entries = [common.entry(m, device) for m in METHODS]
    rows = []
    failed, peak, big_rows = None, None, []
    with torch.no_grad():
        if device.type == "cuda":
            peak = fma_rate(device)
            sheet = DATASHEET_FMA.get(rep.meta["device_slug"])
            rep.note(f"float32 FMA rate measured by an FMA-bound Triton kernel: {peak / 1e12:.1f} T FMA/s"
                     + (f" (datasheet, as a lead: {sheet[0]} = {sheet[1] / 1e12:.1f} T FMA/s)" if sheet else ""))
            rep.meta["fma_rate_measured"] = peak
        else:
            rep.note("float32 FMA rate: not measured (the FMA-bound kernel needs a GPU)")
        try:
            for batch, ns in shapes.items():
                if ns:
                    rows += bench.run_grid(entries, dtypes=dtypes, batches=[batch], seqlens=ns, decays=[True],
                                           heads=heads, r=r, d=d, device=device, budget_s=args.budget_s,
                                           rep_ms=rep_ms, bandwidth=rep.bandwidth)
            big_rows = bench.run_grid([common.entry("recursion", device)], dtypes=dtypes, batches=[big[0]],
                                      seqlens=[big[1]], decays=[True], heads=heads, r=r, d=d, device=device,
                                      budget_s=args.budget_s, rep_ms=rep_ms, bandwidth=rep.bandwidth)
        except bench.DeviceFailure as exc:
            rows += exc.rows
            failed = common.stopped(rep, exc)
        for row in big_rows:
            row["section"] = "recursion_large"
        rows += big_rows
    rep.rows.extend(rows)

    def get(method, dt, batch, n):
        return common.find(rows, method=method, dtype=bench.dtype_name(dt), batch=batch, n=n)

    def best_chunked(dt, batch, n):
        ok = [x for x in (get(m, dt, batch, n) for m in CHUNKED) if x and x["status"] == "ok" and x["median_ms"]]
        return min(ok, key=lambda x: x["median_ms"]) if ok else None

    # fleet_attention
    body = []
    for dt in dtypes:
        for batch, ns in shapes.items():
            for n in ns:
                fa, ch = get("fleet_attention", dt, batch, n), best_chunked(dt, batch, n)
                fmas = fleet_fmas(batch, heads, n, r, d)
                rate = None if not (fa and fa["median_ms"]) else fmas / (fa["median_ms"] * 1e-3)
                rel = None if not (fa and fa["median_ms"] and ch) else fa["median_ms"] / ch["median_ms"]
                if fa is not None:
                    fa["fmas"], fa["fma_rate"] = fmas, rate
                body.append([bench.dtype_name(dt), f"{batch} × {n}", common.cell(fa), f"{fmas:.3g}", _rate(rate),
                             "—" if rate is None or peak is None else f"{rate / peak:.0%}",
                             common.cell(ch), "—" if ch is None else ch["method"],
                             "—" if rel is None else f"{rel:.1f}×", common.fmt_err(fa and fa["rel_err"])])
                if batch == 1 and n == ref_n:
                    rep.target(f"fleet_attention {bench.dtype_name(dt)} B=1 n={n} vs best chunked",
                               "—" if rel is None else f"{rel:.1f}×", "≤ 10×",
                               None if rel is None or not gpu else rel <= 10)
    rep.section(f"fleet_attention: heads {heads}, r = {r}, d = {d}, decay per head",
                ["dtype", "batch × n", "fleet ms", "FMAs (2·B·H·n·r·d)", "achieved", "of measured fp32 FMA rate",
                 "best chunked ms", "chunked method", "fleet / chunked", "fleet rel err"], body,
                "" if peak is None else f"Measured float32 FMA rate: {peak / 1e12:.1f} T FMA/s.")

    # recursion
    body = []
    for dt in dtypes:
        pts = []
        for batch, ns in shapes.items():
            for n in ns:
                rc, ch = get("recursion", dt, batch, n), best_chunked(dt, batch, n)
                norm = None
                if rc and rc["median_ms"]:
                    norm = rc["median_ms"] * 1e6 / (batch * n * math.log2(n))
                    rc["ns_per_nlogn"] = norm
                    if batch == 1:
                        pts.append((n, rc["median_ms"]))
                rel = None if not (rc and rc["median_ms"] and ch) else rc["median_ms"] / ch["median_ms"]
                body.append([bench.dtype_name(dt), f"{batch} × {n}", common.cell(rc),
                             "—" if norm is None else f"{norm:.3f}", common.cell(ch),
                             "—" if rel is None else f"{rel:.2f}×", common.fmt_err(rc and rc["rel_err"])])
                if batch == 1 and n == long_n:
                    rep.target(f"recursion {bench.dtype_name(dt)} B=1 n={n} vs best chunked",
                               "—" if rel is None else f"{rel:.2f}×", "≤ 3×",
                               None if rel is None or not gpu else rel <= 3)
        alpha = fit_exponent(pts)
        fit = f"time ∝ n^{alpha:.2f}" if alpha else "—"
        body.append([bench.dtype_name(dt), "fit over batch 1", fit, "", "", "", ""])
        big_row = common.find(big_rows, dtype=bench.dtype_name(dt))
        body.append([bench.dtype_name(dt), f"{big[0]} × {big[1]}", common.cell(big_row), "", "", "",
                     common.fmt_err(big_row and big_row["rel_err"])])
        inputs_only = big_row is not None and big_row["status"] == "OOM" and "inputs do not fit" in big_row["note"]
        rep.target(f"recursion {bench.dtype_name(dt)} B={big[0]} n={big[1]}: no OOM",
                   "inputs alone do not fit" if inputs_only else (big_row["status"] if big_row else "—"),
                   "no OOM", None if (big_row is None or inputs_only or big_row["status"] in ("n/a", "skipped"))
                   else big_row["status"] not in ("OOM", "error"))
    rep.section(f"recursion: heads {heads}, r = {r}, d = {d}, decay per head",
                ["dtype", "batch × n", "recursion ms", "ns / (B·n·log2 n)", "best chunked ms", "recursion / chunked",
                 "rel err"], body,
                "An O(n log n) method keeps ns / (B·n·log2 n) roughly flat and fits α a little above 1.")
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
