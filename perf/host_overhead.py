"""Host time of one call: leettriton's own Python per ``linear_attention`` call, per method.

    python perf/host_overhead.py                 # CUDA when present, else the CPU measurement
    python perf/host_overhead.py --device cpu    # no GPU needed
    python perf/host_overhead.py --device cpu --backward   # the backward's host time per training step

When a kernel's GPU time is short (batch 1, a few thousand tokens), the time of a call
is that of the host: validating the inputs, choosing the method and config, building
the launch arguments, and Triton's launcher for each kernel.  This measures it.

* ``--device cuda``: tiny inputs (one head, n = 64), many calls back to back without a
  sync; the wall time per call is the host's (the GPU finishes each kernel sooner than
  the next launch comes).  Triton's launcher is included.
* ``--device cpu``: the Triton kernels' launches are replaced by a stub that evaluates
  the grid and returns, on the family given by ``--family`` with its heuristic file,
  so the figure is leettriton's Python alone (validation, dispatch, configs, arguments),
  without Triton's launcher.  Kernels launched through ``CompiledLaunches`` take their
  compiled path (docs/design.md §4.5) with a stub for the compiled kernel's launcher (and
  device 0, stream 0), as on the GPU.  Runs anywhere; sets ``TRITON_INTERPRET=1`` itself.
* ``decode_step_slots``: ``decode_step`` with ``slot_ids`` (one row, slot 2 of a pool of 4 states); on
  the CPU the slot ids count as checked (on CUDA they are checked once per version of the tensor).
* ``--backward``: per method, the host time of the forward with inputs that require grad
  (the autograd node) and of its backward, ``torch.autograd.grad(o, (b, c, v), do)``:
  three calls of the operator and the reversed copies of docs/design.md §10.3.  With
  ``--device cpu`` the reversals are stubbed launches too.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

METHODS = ("auto", "vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention",
           "fleet_attention", "decode_step", "decode_step_slots")


def _stub_launches(family_name: str) -> None:
    """Launches evaluate their grid and return; the family is ``family_name`` (CPU measurement)."""
    from leettriton.autotune import configs, families

    family = families.FAMILIES[family_name]

    def family_of(*_a, **_k):
        return family

    first: dict = {}

    class Compiled:
        """What a compiled kernel offers a direct launch; its launcher does nothing."""
        function, packed_metadata = 0, (4, 1, 0)

        def run(self, *args):
            return None

        def launch_metadata(self, *args):
            return None

    compiled = Compiled()

    def stub(kernel, grid, config, **args):
        # what launch() does before Triton's launcher; an autotuned launch (config None) would
        # look its key up in Triton's autotuner, which is not measured here: the family's first
        # config is the autotuner's choice (and stays in its cache, as a tuned choice does)
        if config is not None and not configs._fits(kernel.space, config, args):
            config = configs._replace_misfit(kernel.space, config, args)  # as launch() does
        if config is None:
            if kernel.space.name not in first:
                first[kernel.space.name] = configs._to_triton(kernel.space.usable(family, args)[0])
            kernel.best_config = first[kernel.space.name]
            kernel.cache["stub"] = kernel.best_config
            config = configs.config_dict(kernel.best_config)
        grid(dict(config)) if callable(grid) else grid
        return compiled

    import leettriton  # noqa: F401  (every module that launches a kernel is imported with the package)

    # launches kept by CompiledLaunches take the compiled path (docs/design.md §4.5), with the stub's kernel
    if hasattr(configs, "ALL_COMPILED_LAUNCHES"):   # (a tree from before it goes through launch() instead)
        configs.COMPILED_DEVICE = "cpu"
        configs._current_device = lambda: 0
        configs._current_stream = lambda device: 0
        for launches in configs.ALL_COMPILED_LAUNCHES:
            launches.interpreted = False

    real_launch, real_family = configs.launch, families.current_family
    for name, mod in list(sys.modules.items()):
        if not name.startswith("leettriton"):
            continue
        if getattr(mod, "launch", None) is real_launch:
            mod.launch = stub
        if getattr(mod, "current_family", None) is real_family:
            mod.current_family = family_of
    families.current_family = family_of


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--family", default="h100", help="CPU measurement: the family whose configs and heuristic "
                    "file are used (default h100)")
    ap.add_argument("--n", type=int, default=None, help="sequence length (default: cuda 64, cpu 8192)")
    ap.add_argument("--heads", type=int, default=None, help="heads (default: cuda 1, cpu 32)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=1, help="time the calls this many times and report the "
                    "fastest (a machine shared with other work)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--backward", action="store_true", help="time the backward of a training step instead "
                    "(forward with the autograd node, then the gradients of b, c, v)")
    ap.add_argument("--profile", action="store_true", help="also run each method's calls under cProfile and "
                    "print the functions with the most own time")
    ap.add_argument("--out", metavar="DIR", help="also write the rows to DIR/<gpu>/host_overhead.json through "
                    "perf/common.py's writer (perf/results for a GPU's; a CPU's figures are not results to keep)")
    opts = ap.parse_args(argv)
    rows = _measure(opts)
    if opts.out:
        _write(opts, rows, argv if argv is not None else sys.argv[1:])
    return rows


def _write(opts, rows: list[dict], argv) -> None:
    """The run's rows, command and environment through perf/common.py's one writer."""
    import shlex

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common
    from leettriton import bench

    meta = dict(bench.environment(opts.measured_on), command=" ".join(["python", "perf/host_overhead.py",
                                                                       *map(shlex.quote, argv)]))
    what = "forward_us" if opts.backward else "us_per_call"
    headers = ["method", "forward µs", "backward µs"] if opts.backward else ["method", "µs per call"]
    body = [[r["method"], f"{r['forward_us']:.1f}", f"{r['backward_us']:.1f}"] if opts.backward
            else [r["method"], f"{r[what]:.1f}"] for r in rows]
    title = ("Host time per training step" if opts.backward else "Host time per call") + \
        (f", launches stubbed (family {opts.family})" if opts.measured_on == "cpu" else "")
    path = common.write_run(os.path.join(opts.out, meta["device_slug"], "host_overhead"), meta, rows, title=title,
                            tables=[{"title": title, "headers": headers, "body": body, "text": ""}])
    print(f"wrote {path}")


def _measure(opts) -> list[dict]:
    if opts.device == "cpu" or opts.device is None and not _cuda():
        os.environ["TRITON_INTERPRET"] = "1"   # before leettriton is imported: the Triton path on CPU tensors
    import torch

    import leettriton

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    opts.measured_on = device
    n = opts.n or (64 if device == "cuda" else 8192)
    heads = opts.heads or (1 if device == "cuda" else 32)
    if device == "cpu":
        _stub_launches(opts.family)
        path = os.path.join(os.path.dirname(leettriton.__file__), "autotune", "heuristics", f"{opts.family}.json")
        if os.path.exists(path):
            leettriton.load_heuristics(path, opts.family)
    g = torch.Generator(device=device).manual_seed(0)
    b, c, v = (torch.randn(1, heads, n, 128, device=device, dtype=torch.float16, generator=g) for _ in range(3))
    gamma = torch.full((heads,), 0.99, device=device)
    print(f"host time per linear_attention call: device {device}, batch 1, heads {heads}, n {n}, r = d = 128, "
          f"float16, with decay" + (f" (launches stubbed, family {opts.family})" if device == "cpu" else ""))
    if opts.backward:
        return _backward_rows(opts, b, c, v, gamma, device)
    rows = []
    with torch.no_grad():
        for method in opts.methods:
            if method == "decode_step":   # one token at batch 1: b_t, c_t (1, heads, 128), v_t (1, heads, 128)
                state = torch.zeros(1, heads, 128, 128, device=device)
                b_t, c_t, v_t = b[:, :, 0], c[:, :, 0], v[:, :, 0]   # sliced once: the step's time alone

                def call():
                    return leettriton.decode_step(b_t, c_t, v_t, state, gamma)
            elif method == "decode_step_slots":   # the same token, its state slot 2 of a pool of 4
                pool = torch.zeros(4, heads, 128, 128, device=device)
                slots = torch.tensor([2], device=device)
                b_t, c_t, v_t = b[:, :, 0], c[:, :, 0], v[:, :, 0]
                if device == "cpu":
                    # on CUDA the slot ids' values are checked once per version of the tensor; on CPU, on
                    # every call: count them as checked here, so that the CPU figure is that of the CUDA path
                    from leettriton import problem

                    indices = problem._CHECKED_INDICES
                    real_seen = type(indices).seen.__get__(indices)
                    indices.seen = lambda g, context=None: g is slots or real_seen(g, context)

                def call():
                    return leettriton.decode_step(b_t, c_t, v_t, pool, gamma, slot_ids=slots)
            else:
                def call():
                    return leettriton.linear_attention(b, c, v, gamma, method=method)

            for _ in range(20):
                call()
            if device == "cuda":
                torch.cuda.synchronize()
            blocks = []
            for _ in range(opts.repeat):
                start = time.perf_counter()
                for _ in range(opts.calls):
                    call()
                if device == "cuda":
                    torch.cuda.synchronize()
                blocks.append((time.perf_counter() - start) / opts.calls * 1e6)
            us = min(blocks)
            rows.append(dict(method=method, us_per_call=us))
            print(f"  {method:<20} {us:7.1f} µs", flush=True)
            if opts.profile:
                _profile(call, opts.calls, device)
    return rows


def _backward_rows(opts, b, c, v, gamma, device: str) -> list[dict]:
    """Host time of a training step's forward (the autograd node) and of its backward, per method."""
    import torch

    import leettriton

    b, c, v = (x.clone().requires_grad_() for x in (b, c, v))
    do = torch.randn_like(v).detach()
    if device == "cpu":
        # on CUDA a γ tensor's values are checked once per version of it; on CPU, on every call: count it
        # as checked here, so that the CPU figure is that of the CUDA path
        from leettriton import problem

        checked, real_seen = problem._CHECKED, problem._CHECKED.seen
        checked.seen = lambda g, context=None: g is gamma or real_seen(g, context)
    rows = []
    print("  method               forward  backward (µs per training step)")
    for method in opts.methods:
        if method == "decode_step":
            continue

        def forward():
            return leettriton.linear_attention(b, c, v, gamma, method=method)

        def step():
            return torch.autograd.grad(forward(), (b, c, v), do)

        times = []
        for call in (forward, step):
            for _ in range(5):
                call()
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(opts.calls):
                call()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / opts.calls * 1e6)
        fwd_us, bwd_us = times[0], times[1] - times[0]
        rows.append(dict(method=method, forward_us=fwd_us, backward_us=bwd_us))
        print(f"  {method:<20} {fwd_us:7.1f} {bwd_us:9.1f}", flush=True)
        if opts.profile:
            _profile(step, opts.calls, device)
    return rows


def _profile(call, calls: int, device: str) -> None:
    """The functions with the most own time over ``calls`` calls (µs per call)."""
    import cProfile
    import io
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    if device == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
    out = io.StringIO()
    for (path, line, name), (_cc, ncalls, tottime, cumtime, _callers) in rows:
        where = f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}:{line}"
        out.write(f"      {tottime / calls * 1e6:7.2f} µs own {cumtime / calls * 1e6:8.2f} µs cum "
                  f"{ncalls / calls:5.1f}× {name} ({where})\n")
    print(out.getvalue(), end="", flush=True)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main(sys.argv[1:])
