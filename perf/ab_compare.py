"""A/B timing of two checkouts of leettriton through the public API only, in separate processes.

    python perf/ab_compare.py measure --label before --json /tmp/before.json   # with PYTHONPATH=<tree A>
    python perf/ab_compare.py measure --label after  --json /tmp/after.json    # with PYTHONPATH=<tree B>
    python perf/ab_compare.py compare /tmp/before.json /tmp/after.json /tmp/before2.json --md out.md

``measure`` times, with the leettriton found on ``sys.path`` (so any commit's tree can be
measured by the same script): ``linear_attention`` with ``auto``, ``block_based`` and
``lightning_attention`` at the chunked bench's batch-1 and batch-16 shapes (heads 32,
r = d = 128, float16 and bfloat16, decay 0.969 … 0.996 per head; ``--shapes`` and ``--layer``
replace them, e.g. ``--layer 8x256x512 --shapes 1x2048,1x8192`` for RetNet-1.3B's layer), and
``decode_step`` at batch 1 and 64 (not with ``--shapes``).  The shapes run in the order given,
so an autotuned explicit method tunes at the first that meets its kernels' key, as a caller's would.
Each cell is warmed up, then timed two ways:

* ``gpu``: the call captured once in a CUDA graph, the graph's replay timed with
  ``triton.testing.do_bench`` (median): the kernels' time alone, whatever the host does;
* ``wall``: wall-clock time per call over a loop of calls from Python with one sync at the
  end: what a caller sees, the host's time included (at short shapes, mostly the host's).

(``do_bench`` on the Python call itself mixes the two: it clears the L2 cache with a memset
before each call, and whether the host issues the call within that memset decides whether it
reports the kernels' time or the host's; at short shapes it swings between them from run to run.)
With ``LEETTRITON_AUTOTUNE=0`` (perf/ab_session.sh) both trees launch their family's first config for
the explicit methods; without, the explicit methods autotune as a caller's would (``auto`` launches
the heuristic file's either way).  ``compare`` prints after ÷ before per cell, and, given a
second "before" run, before₂ ÷ before₁: the noise between two runs of the same code.
"""
from __future__ import annotations

import argparse
import json
import sys

SHAPES = [(1, 2048), (1, 8192), (1, 32768), (1, 100000), (16, 2048), (16, 8192), (16, 25600)]
METHODS = ("auto", "block_based", "lightning_attention")
DECODE_BATCHES = (1, 64)
DECODE_ONLY_BATCHES = (1, 16, 64, 256)
HEADS, R, D = 32, 128, 128


def _time(fn, rep_ms: int) -> dict:
    """``gpu``: median ms of the call's CUDA-graph replay; ``wall``: ms per call from Python, host included.
    (The capture is written out here, not taken from ``leettriton.bench.graph_replay``: this script measures
    trees of any commit, older ones without that helper.  As that helper does, it refuses a capture that
    recorded no work, which torch only warns of: its replay would be timed at nothing.)"""
    import time
    import warnings

    import torch
    import triton

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn()                                   # on the capture stream once, as torch asks
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph, stream=stream):
                    fn()
        torch.cuda.current_stream().wait_stream(stream)
        for w in caught:
            if "The CUDA Graph is empty" in str(w.message):
                raise RuntimeError("the capture recorded no work: its replay would be timed at nothing")
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        q = triton.testing.do_bench(graph.replay, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    except Exception as exc:  # noqa: BLE001  (reported in the row; the wall-clock time still counts)
        print(f"graph capture failed: {type(exc).__name__}: {exc}", flush=True)
        q = [None, None, None]
    calls = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < rep_ms / 1000 or calls < 20:
        fn()
        calls += 1
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls * 1000
    del graph
    return dict(gpu_ms=q[0], gpu_p20=q[1], gpu_p80=q[2], wall_ms=wall, calls=calls)


def measure(label: str, path: str, rep_ms: int, decode_only: bool = False, shapes=None, layer=None) -> None:
    import torch
    import triton

    import leettriton

    dev = "cuda"
    heads, r, d = layer or (HEADS, R, D)
    gamma = 1 - torch.exp2(-5 - torch.arange(heads, device=dev, dtype=torch.float32) * 3 / max(1, heads - 1))
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for batch, n in ([] if decode_only else shapes or SHAPES):
            gen = torch.Generator(device=dev).manual_seed(n + batch)
            b, c = (torch.randn(batch, heads, n, r, device=dev, generator=gen, dtype=dtype) * r ** -0.5
                    for _ in range(2))
            v = torch.randn(batch, heads, n, d, device=dev, generator=gen, dtype=dtype)
            for method in METHODS:
                fn = lambda: leettriton.linear_attention(b, c, v, gamma, method=method)  # noqa: E731
                rows.append(dict(kind="prefill", dtype=str(dtype)[6:], batch=batch, n=n, method=method,
                                 **({} if layer is None else dict(heads=heads, r=r, d=d)), **_time(fn, rep_ms)))
                print(f"{label} {rows[-1]}", flush=True)
            del b, c, v
        if shapes is not None:
            continue
        for batch in (DECODE_ONLY_BATCHES if decode_only else DECODE_BATCHES):
            gen = torch.Generator(device=dev).manual_seed(batch)
            b_t, c_t = (torch.randn(batch, HEADS, R, device=dev, generator=gen, dtype=dtype) * R ** -0.5
                        for _ in range(2))
            v_t = torch.randn(batch, HEADS, D, device=dev, generator=gen, dtype=dtype)
            state = torch.zeros(batch, HEADS, R, D, device=dev)
            fn = lambda: leettriton.decode_step(b_t, c_t, v_t, state, gamma)  # noqa: E731
            rows.append(dict(kind="decode", dtype=str(dtype)[6:], batch=batch, n=1, method="decode_step",
                             **_time(fn, rep_ms)))
            print(f"{label} {rows[-1]}", flush=True)
    env = dict(label=label, leettriton=leettriton.__file__, torch=torch.__version__, triton=triton.__version__,
               device=torch.cuda.get_device_name())
    with open(path, "w") as f:
        json.dump(dict(env=env, rows=rows), f, indent=1)


def _cells(path: str, what: str) -> tuple[dict, dict]:
    with open(path) as f:
        data = json.load(f)
    return data["env"], {(r["kind"], r["dtype"], r.get("heads", HEADS), r.get("r", R), r.get("d", D), r["batch"],
                          r["n"], r["method"]): r[what] for r in data["rows"]}


def compare(before: str, after: str, before2: str | None, md: str | None) -> None:
    text = []
    for what, title in (("gpu_ms", "GPU time of the call (CUDA-graph replay, do_bench median)"),
                        ("wall_ms", "time per call from Python, host included (wall clock over a loop)")):
        env_b, b = _cells(before, what)
        env_a, a = _cells(after, what)
        b2 = _cells(before2, what)[1] if before2 else None
        lines = [f"### {title}", "",
                 f"{env_a['device']} (torch {env_a['torch']}, triton {env_a['triton']}): before = {env_b['label']}, "
                 f"after = {env_a['label']}" + (", before₂ = a second run of before" if b2 else ""), "",
                 "| kind | dtype | heads × r × d | batch × n | method | before ms | after ms | after ÷ before |"
                 + (" before₂ ÷ before |" if b2 else ""),
                 "|---|---|---|---|---|---|---|---|" + ("---|" if b2 else "")]
        ratios, noise = [], []
        for key in b:
            if key not in a or a[key] is None or b[key] is None:
                continue
            kind, dtype, heads, r, d, batch, n, method = key
            ratio = a[key] / b[key]
            ratios.append(ratio)
            row = (f"| {kind} | {dtype} | {heads} × {r} × {d} | {batch} × {n} | {method} | {b[key]:.4f} | "
                   f"{a[key]:.4f} | {ratio:.3f} |")
            if b2 and b2.get(key) is not None:
                noise.append(b2[key] / b[key])
                row += f" {noise[-1]:.3f} |"
            lines.append(row)
        lines += ["", f"after ÷ before: min {min(ratios):.3f}, median {sorted(ratios)[len(ratios) // 2]:.3f}, "
                      f"max {max(ratios):.3f} over {len(ratios)} cells"]
        if noise:
            lines.append(f"before₂ ÷ before (noise): min {min(noise):.3f}, "
                         f"median {sorted(noise)[len(noise) // 2]:.3f}, max {max(noise):.3f}")
        text += lines + [""]
    print("\n".join(text))
    if md:
        with open(md, "w") as f:
            f.write("\n".join(text))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--label", required=True)
    m.add_argument("--json", required=True)
    m.add_argument("--rep-ms", type=int, default=200)
    m.add_argument("--decode-only", action="store_true", help="decode_step alone, at batch 1, 16, 64 and 256")
    m.add_argument("--shapes", help="batch × n list, e.g. 1x2048,1x8192, in the order to run (no decode_step)")
    m.add_argument("--layer", help="heads × r × d, e.g. 8x256x512 (default 32x128x128)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("before2", nargs="?")
    c.add_argument("--md")
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        shapes = None if not args.shapes else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        layer = None if not args.layer else tuple(int(x) for x in args.layer.split("x"))
        measure(args.label, args.json, args.rep_ms, args.decode_only, shapes, layer)
    else:
        compare(args.before, args.after, args.before2, args.md)


if __name__ == "__main__":
    main(sys.argv[1:])
