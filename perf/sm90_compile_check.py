"""Compile every forward kernel config the heuristic files name, for sm_90, on a machine without a GPU: a
kernel that fails to compile with this Triton fails the check.

    python perf/sm90_compile_check.py                      # every family's file, constant γ and none
    python perf/sm90_compile_check.py --families h100 --per-token

The lent GPUs run an older Triton than CI's; a kernel change can compile under one and fail under the other
(Triton's software pipeliner refusing a loop, ptxas running out of registers).  Run under that Triton
(``pip install triton==<the GPU's>`` beside the CPU build of torch; .ci/run does) this finds such a failure
before a GPU does.  Each point of each file gives its shape (batch 1, ``bh`` heads, n, r, d), dtype and
decay; each method config of the point is compiled as the method's launcher would launch it (its schedule
from the pinned configs), through perf/sm90_compile_report.py's stand-in driver.  ``--per-token`` compiles
the per-token-decay form of the methods that have one as well, at the points with decay.  Kernels compiled
once are not compiled again (Triton's own cache by specialisation).  Prints one line per failure and a
count; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

PERF = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PERF)
sys.path.insert(0, PERF)
from sm90_compile_report import pin_family, stand_in_sm90  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=ROOT, help="folder holding the leettriton package (default: this checkout)")
    ap.add_argument("--families", default=None, help="comma-separated heuristic files (default: every one)")
    ap.add_argument("--methods", default=None, help="comma-separated methods (default: every one a file names)")
    ap.add_argument("--per-token", action="store_true", help="also the per-token-decay form, at points with decay")
    args = ap.parse_args(argv)

    sys.path.insert(0, os.path.abspath(args.tree))
    compiled, failed = stand_in_sm90()
    import torch
    import triton

    import leettriton
    from leettriton import registry
    from leettriton.autotune import families
    from leettriton.methods.spec import Plan
    from leettriton.problem import make_problem
    if not os.path.abspath(leettriton.__file__).startswith(os.path.abspath(args.tree)):
        raise SystemExit(f"imported {leettriton.__file__}, not the tree {args.tree}")
    heur = os.path.join(os.path.dirname(families.__file__), "heuristics")
    names = (args.families.split(",") if args.families else
             sorted(f[:-5] for f in os.listdir(heur) if f.endswith(".json")))
    only = set(args.methods.split(",")) if args.methods else None
    print(f"torch {torch.__version__}, triton {triton.__version__}; families {', '.join(names)}", flush=True)
    t0, calls, failures = time.time(), 0, []
    for fam in names:
        with open(os.path.join(heur, f"{fam}.json")) as f:
            points = json.load(f)["points"]
        pin_family(families.FAMILIES[fam])
        for pt in points:
            dtype = getattr(torch, pt["dtype"])
            H, n, r, d = pt["bh"], pt["n"], pt["r"], pt["d"]
            # never read: the kernels are compiled, not launched
            b, c, v = (torch.empty(1, H, n, k, dtype=dtype) for k in (r, r, d))
            gamma = torch.full((H,), 0.99) if pt["decay"] else None
            forms = [("γ" if gamma is not None else "none", gamma, None)]
            if args.per_token and gamma is not None:
                forms.append(("per-token", None, torch.full((1, H, n), -0.01)))
            for name, configs in (pt.get("configs") or {}).items():
                method = registry.builtin(name)
                if method is None or (only is not None and name not in only):
                    continue
                for form, g, a in forms:
                    if a is not None and not method.per_token_decay:
                        continue
                    problem, _ = make_problem(b, c, v, g, log_decay=a)
                    plan = Plan(name, method.launch, configs, method.schedule(problem, families.FAMILIES[fam], configs))
                    before, done = len(failed), len(compiled)
                    calls += 1
                    try:
                        method.launch(problem, plan)
                    except Exception as exc:
                        # after a compile the stand-in launches nothing, and a launcher stops there; one that
                        # stops before any kernel call is a failure of its own
                        if len(compiled) == done and len(failed) == before:
                            failed.append(("(the launcher, before any kernel)", exc))
                    for kernel, exc in failed[before:]:
                        what = (f"{fam} {pt['dtype']} decay={form} bh={H} n={n} r={r} d={d} {name} {kernel} "
                                f"{json.dumps(configs, sort_keys=True)}")
                        failures.append(what)
                        print(f"FAILED {what}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}", flush=True)
    print(f"{calls} launches, {len(compiled)} kernel compiles, {len(failures)} failed, {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
