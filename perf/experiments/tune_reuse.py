"""How many autotuner passes ``leettriton.tune`` makes per point of a heuristic file, with and without
reusing a kernel's choice for launches its autotuner met already at the point (``tune._tuned_reusing``).

Runs on the CPU (every ``current_family`` of the package answers the file's family): each point's alternatives (``Method.alternatives``) and their launches are recorded on the
``meta`` device for the file's family, nothing runs.  Before the reuse, every alternative tuned each kernel
it does not pin; with it, a kernel is tuned once per distinct signature of its launches at the point.

    python perf/experiments/tune_reuse.py leettriton/autotune/heuristics/h100.json --methods block_based
"""
from __future__ import annotations

import argparse
import collections
import json

import torch

from leettriton import registry
from leettriton.autotune import KERNELS
from leettriton.autotune.families import FAMILIES
from leettriton.autotune.record import record_launches
from leettriton.problem import make_problem
from leettriton.tune import _signature, point_batch_heads


def launches(method, pt, family, pinned):
    """{kernel space: (signature of its launches, configs its autotuner times for the first)} of ``method`` at
    point ``pt`` with ``pinned`` configs, recorded on the meta device (:func:`record_launches`)."""
    batch, heads = point_batch_heads(pt["bh"])
    calls = record_launches(method, getattr(torch, pt["dtype"]), B=batch, H=heads, n=pt["n"], r=pt["r"], d=pt["d"],
                            decay=pt["decay"], initial=False, state=False, family=family, configs=pinned or None)
    by_space = collections.defaultdict(list)
    for kernel, args in calls:
        by_space[kernel.space.name].append(args)
    return {name: (_signature(all_args), len(KERNELS[name].space.usable(family, all_args[0])))
            for name, all_args in by_space.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--methods", default="block_based")
    opts = ap.parse_args()
    doc = json.load(open(opts.file))
    family = FAMILIES[doc["family"]]
    import sys
    for module in list(sys.modules.values()):   # every lookup of the device's family answers the file's
        if getattr(module, "__name__", "").startswith("leettriton") and hasattr(module, "current_family"):
            module.current_family = lambda *a, **k: family
    total = collections.Counter()
    for method in opts.methods.split(","):
        spec = registry.builtin(method)
        for pt in doc["points"]:
            if pt.get("note"):
                continue
            batch, heads = point_batch_heads(pt["bh"])
            dtype = getattr(torch, pt["dtype"])
            b, c = (torch.empty(batch, heads, pt["n"], pt["r"], dtype=dtype, device="meta") for _ in range(2))
            v = torch.empty(batch, heads, pt["n"], pt["d"], dtype=dtype, device="meta")
            gamma = 0.9 if pt["decay"] else None   # one γ: what the launches see is the same
            p, _ = make_problem(b, c, v, gamma, device_types=("meta",))
            alternatives = spec.alternatives(p, family)
            if not alternatives:
                continue
            base = launches(method, pt, family, {})
            seen = {(k, s) for k, (s, _) in base.items()}
            before = after = trials_before = trials_after = 0
            for alt in alternatives:
                sig = launches(method, pt, family, alt)
                others = {(k, s): count for k, (s, count) in sig.items() if k not in alt}
                new = {key: count for key, count in others.items() if key not in seen}
                before, after = before + len(others), after + len(new)
                trials_before += sum(others.values())
                trials_after += sum(new.values())
                seen |= set(others)
            total["points"] += 1
            total["alternatives"] += len(alternatives)
            total["before"] += before
            total["after"] += after
            total["trials_before"] += trials_before
            total["trials_after"] += trials_after
            print(f"{method} {pt['dtype']} decay={pt['decay']} {pt['r']}x{pt['d']} bh={pt['bh']} n={pt['n']}: "
                  f"{len(alternatives)} alternatives; their other kernels tuned {before} times timing "
                  f"{trials_before} configs before, {after} times timing {trials_after} with the reuse")
    print(f"{total['points']} points with alternatives, {total['alternatives']} alternatives: other kernels tuned "
          f"{total['before']} times timing {total['trials_before']} configs before, {total['after']} times timing "
          f"{total['trials_after']} with the reuse")


if __name__ == "__main__":
    main()
