"""Hostile inputs through the public API: non-finite values, float16's range, strided indices, overlapping states.

Three groups of cases (docs/nonfinite.md; issue 68), one JSON row each, written to ``--out FILE`` (a result file
of perf/common.py's ``write_run``: the run's command, device, versions, commit and date), and a short
summary table printed last:

* ``causal``: a non-finite value (inf) at row k of b, c or v, for every method, k straddling the walk's chunks,
  both layouts, float16 / bfloat16 / float32.  Reports whether rows < k are all finite and equal (bit for bit)
  to the clean run's, and whether rows ≥ k are non-finite wherever the float64 oracle's are.
* ``range16``: float16 inputs whose exact output fits float16 but whose scores b·c (or products c·v) do not:
  every method, ``auto``, and fla's ``chunk_simple_gla`` (``fla.ops.simple_gla``, inputs [B, T, H, K],
  ``g_gamma = ln γ`` per head, ``scale=1.0``) where importable, on the same inputs: relative error against
  ``leettriton.reference`` (over the finite entries) and the count of non-finite outputs.
* ``indices``: strided ``slot_ids`` / ``cu_seqlens`` to ``linear_attention_varlen``, ``decode_step`` and
  ``decode_tokens`` (the result must equal the contiguous call's, and only the named slots change), and an
  expanded state or pool (a ``ValueError`` expected).  Pass / fail.

Run on the GPU::

    python perf/hostile_gpu.py --out perf/results/h100/hostile.json

and on the CPU (the Triton kernels under ``TRITON_INTERPRET=1``, small shapes)::

    python perf/hostile_gpu.py --device cpu --out /tmp/hostile.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys

KERNELS = ["vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention", "fleet_attention"]
RANGE_CASES = {
    "scores past 65504": (300.0, 300.0, 1e-3),
    "c v past 65504": (1e-4, 200.0, 200.0),
    "scores below 2^-14": (1e-3, 1e-3, 1e3),
}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", metavar="FILE", required=True, help="JSON rows go here")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (the interpreter)")
    p.add_argument("--groups", default="causal,range16,indices", help="comma-separated groups to run")
    return p.parse_args(argv)


def git_sha() -> str:
    sha = os.environ.get("LEETTRITON_GIT_SHA")
    if sha:
        return sha
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    args = parse(argv)
    cpu = args.device == "cpu"
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"       # before triton is imported
        os.environ.setdefault("LEETTRITON_AUTOTUNE", "0")
    import torch
    import triton

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = dict(device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
                torch=torch.__version__, triton=triton.__version__, git_sha=git_sha(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    groups = args.groups.split(",")
    rows = []

    def emit(row):
        row = {**row, **meta}
        rows.append(row)
        print(json.dumps(row), flush=True)

    if "causal" in groups:
        causal_cases(torch, device, cpu, emit)
    if "range16" in groups:
        range_cases(torch, device, cpu, emit)
    if "indices" in groups:
        index_cases(torch, device, emit)
    run_meta = dict(meta, device=meta["device_name"],
                    command=" ".join(["python", "perf/hostile_gpu.py", *map(shlex.quote, argv or sys.argv[1:])]))
    path = args.out[:-5] if args.out.endswith(".json") else args.out
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import write_run  # noqa: PLC0415  (it loads torch and triton: after TRITON_INTERPRET is set)

    write_run(path, run_meta, rows, title="Hostile inputs through the public API")
    summary(rows)
    return 0


def _call(fn):
    """fn() or the exception's one-line description."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 (a hostile case reports every failure as a row)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def causal_cases(torch, device, cpu, emit):
    import leettriton
    from leettriton.reference import reference

    n, r, d = (40, 8, 8) if cpu else (300, 64, 64)
    rows_k = [16, 21, n - 1] if cpu else [63, 64, 65, 127, 128, 200, n - 1]
    dtypes = [torch.float32] if cpu else [torch.float16, torch.bfloat16, torch.float32]
    layouts = ["bhnd"] if cpu else ["bhnd", "bnhd"]
    methods = KERNELS + ["auto"]
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, n, x, generator=g) for x in (r, r, d)]
    for dtype in dtypes:
        for layout in layouts:
            b, c, v = (x.to(device, dtype) for x in base)
            if layout == "bnhd":
                b, c, v = (x.transpose(1, 2).contiguous() for x in (b, c, v))

            def call(method, b, c, v):
                o = leettriton.linear_attention(b, c, v, 0.9, method=method, layout=layout)
                return o if layout == "bhnd" else o.transpose(1, 2)

            for method in methods:
                clean, err = _call(lambda: call(method, b, c, v))
                if err:
                    emit(dict(case="causal", method=method, dtype=str(dtype)[6:], layout=layout, error=err))
                    continue
                for name in "bcv":
                    for k in rows_k:
                        x = {"b": b, "c": c, "v": v}
                        x[name] = x[name].clone()
                        if layout == "bhnd":
                            x[name][0, 0, k, 0] = float("inf")
                        else:
                            x[name][0, k, 0, 0] = float("inf")
                        out, err = _call(lambda: call(method, x["b"], x["c"], x["v"]))
                        row = dict(case="causal", method=method, dtype=str(dtype)[6:], layout=layout, where=name,
                                   k=k, n=n, r=r, d=d)
                        if err:
                            emit({**row, "error": err})
                            continue
                        ref = reference(x["b"], x["c"], x["v"], 0.9, layout=layout)
                        ref = ref if layout == "bhnd" else ref.transpose(1, 2)
                        before, want = out[:, 0, :k], clean[:, 0, :k]
                        earlier_finite = bool(torch.isfinite(before).all())
                        earlier_equal = bool(torch.equal(before, want)) and bool(torch.equal(out[:, 1], clean[:, 1]))
                        missed = int((~torch.isfinite(ref) & torch.isfinite(out.double())).sum())
                        emit({**row, "earlier_rows_finite": earlier_finite, "earlier_rows_equal": earlier_equal,
                              "finite_where_oracle_is_not": missed,
                              "pass": earlier_finite and earlier_equal and missed == 0})


def _fla():
    try:
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla, None
    except Exception as e:  # noqa: BLE001
        return None, f"fla not importable ({type(e).__name__}: {e})"


def range_cases(torch, device, cpu, emit):
    import math

    import leettriton
    from leettriton.reference import reference, tolerance

    B, H, n, r, d = (1, 1, 40, 16, 16) if cpu else (2, 4, 1024, 128, 128)
    gamma = 0.9 if cpu else 0.99
    methods = KERNELS + ["auto"]
    fla, why = _fla()
    if fla is None:
        print(f"range16: {why}; fla rows are skipped", flush=True)
    for case, (sb, sc, sv) in RANGE_CASES.items():
        g = torch.Generator().manual_seed(1)
        b, c, v = ((torch.randn(B, H, n, x, generator=g) * s).to(device, torch.float16)
                   for x, s in ((r, sb), (r, sc), (d, sv)))
        ref = reference(b, c, v, gamma)
        fits = bool(ref.abs().max() < 65504)

        def report(method, out, err):
            row = dict(case="range16", input=case, method=method, dtype="float16", B=B, H=H, n=n, r=r, d=d,
                       exact_output_fits_float16=fits)
            if err:
                emit({**row, "error": err})
                return
            o = out.double()
            finite = torch.isfinite(o)
            rel = ((torch.where(finite, o, 0.0) - ref).norm() / ref.norm()).item()
            emit({**row, "nonfinite": int((~finite).sum()), "rel_error": rel,
                  "pass": bool(finite.all()) and rel <= tolerance(torch.float16)})

        for method in methods:
            out, err = _call(lambda: leettriton.linear_attention(b, c, v, gamma, method=method))
            report(method, out, err)
        if fla is not None and device.type == "cuda":
            g_gamma = torch.full((H,), math.log(gamma), device=device, dtype=torch.float32)

            def run_fla():
                q, k, vv = (x.transpose(1, 2).contiguous() for x in (b, c, v))   # [B, T, H, K]
                o = fla(q, k, vv, g_gamma=g_gamma, scale=1.0)
                o = o[0] if isinstance(o, tuple) else o
                return o.transpose(1, 2)

            out, err = _call(run_fla)
            report("fla.chunk_simple_gla", out, err)


def index_cases(torch, device, emit):
    import leettriton

    T, H, r, d = 20, 2, 6, 5
    g = torch.Generator().manual_seed(2)
    b, c, v = (torch.randn(T, H, x, generator=g).to(device) for x in (r, r, d))
    pool0 = torch.randn(7, H, r, d, generator=g).to(device)
    cu = torch.tensor([0, 4, 11, 20], dtype=torch.int32, device=device)
    ids = torch.tensor([3, 0, 5, 1, 6, 0], device=device)[::2]            # == [3, 5, 6], stride 2
    init = torch.ones(3, dtype=torch.bool, device=device)

    def row(name, ok, detail=""):
        emit({"case": "indices", "method": name, "dtype": "float32", "pass": bool(ok), "detail": detail})

    def varlen_slots():
        pool, want_pool = pool0.clone(), pool0.clone()
        out = leettriton.linear_attention_varlen(b, c, v, cu, 0.9, state_pool=pool, slot_ids=ids,
                                                 has_initial_state=init)
        want = leettriton.linear_attention_varlen(b, c, v, cu, 0.9, state_pool=want_pool,
                                                  slot_ids=ids.contiguous(), has_initial_state=init)
        changed = [k for k in range(7) if not torch.equal(pool[k], pool0[k])]
        return torch.equal(out, want) and torch.equal(pool, want_pool) and changed == [3, 5, 6], f"changed {changed}"

    def varlen_cu():
        wide = torch.tensor([0, 99, 4, 99, 11, 99, 20], dtype=torch.int32, device=device)[::2]
        out = leettriton.linear_attention_varlen(b, c, v, wide, 0.9)
        want = leettriton.linear_attention_varlen(b, c, v, cu, 0.9)
        return torch.equal(out, want), ""

    def decode(tokens):
        def case():
            bt, ct, vt = (torch.randn(3, H, 2, x, generator=g).to(device) for x in (r, r, d))
            if not tokens:
                bt, ct, vt = bt[:, :, 0], ct[:, :, 0], vt[:, :, 0]
            pool, want_pool = pool0.clone(), pool0.clone()
            fn = leettriton.decode_tokens if tokens else leettriton.decode_step
            out, _ = fn(bt, ct, vt, pool, 0.9, slot_ids=ids)
            want, _ = fn(bt, ct, vt, want_pool, 0.9, slot_ids=ids.contiguous())
            changed = [k for k in range(7) if not torch.equal(pool[k], pool0[k])]
            return torch.equal(out, want) and torch.equal(pool, want_pool) and changed == [3, 5, 6], \
                f"changed {changed}"
        return case

    def refused(fn):
        def case():
            try:
                fn()
            except ValueError as e:
                return True, f"ValueError: {str(e).splitlines()[0]}"
            except Exception as e:  # noqa: BLE001
                return False, f"{type(e).__name__} instead of ValueError: {str(e).splitlines()[0] if str(e) else ''}"
            return False, "accepted"
        return case

    def expanded_state():
        state = torch.randn(1, H, r, d, device=device).expand(3, H, r, d)
        bt, ct, vt = (torch.randn(3, H, x, device=device) for x in (r, r, d))
        leettriton.decode_step(bt, ct, vt, state, 0.9)

    def expanded_pool():
        pool = torch.randn(1, H, r, d, device=device).expand(7, H, r, d)
        leettriton.linear_attention_varlen(b, c, v, cu, 0.9, state_pool=pool, slot_ids=ids.contiguous(),
                                           has_initial_state=init)

    for name, case in (("linear_attention_varlen strided slot_ids", varlen_slots),
                       ("linear_attention_varlen strided cu_seqlens", varlen_cu),
                       ("decode_step strided slot_ids", decode(False)),
                       ("decode_tokens strided slot_ids", decode(True)),
                       ("decode_step expanded state", refused(expanded_state)),
                       ("linear_attention_varlen expanded state_pool", refused(expanded_pool))):
        res, err = _call(case)
        if err:
            row(name, False, err)
        else:
            row(name, *res)


def summary(rows):
    """A short table: per group and method, the cases that pass out of those run."""
    table = {}
    for row in rows:
        key = (row["case"], row["method"], row.get("dtype", ""))
        ok, total = table.get(key, (0, 0))
        table[key] = (ok + bool(row.get("pass")), total + 1)
    print(f"\n{'group':9s} {'method':45s} {'dtype':9s} pass")
    for (case, method, dtype), (ok, total) in sorted(table.items()):
        print(f"{case:9s} {method:45s} {dtype:9s} {ok}/{total}")
    for row in rows:
        if row["case"] == "range16":
            print(f"range16  {row['input']:20s} {row['method']:24s} "
                  + (f"error {row['error']}" if "error" in row else
                     f"nonfinite {row['nonfinite']:6d}  rel {row['rel_error']:.2e}"))


if __name__ == "__main__":
    sys.exit(main())
