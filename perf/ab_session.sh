#!/usr/bin/env bash
# A/B of two checkouts on one GPU machine, in one run: before, after, before again (the noise).
#
#   OUT=/tmp/out BEFORE=.ab/before LABEL_BEFORE=3119bc7 bash perf/ab_session.sh
#
# BEFORE is a folder holding the earlier commit's leettriton/ (e.g. `git archive 3119bc7 leettriton |
# tar -x -C .ab/before`); "after" is this checkout.  Each pass is its own process (perf/ab_compare.py
# measure) with LEETTRITON_AUTOTUNE=0, so both launch their family's first config for the explicit
# methods and the heuristic file's for auto.  Then the host time per call of both (perf/host_overhead.py).
set -u
OUT=${OUT:-/tmp/leettriton-out}
BEFORE=${BEFORE:-.ab/before}
AFTER_SHA=$(git rev-parse --short HEAD 2>/dev/null || echo "${LABEL_AFTER:-after}")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LEETTRITON_AUTOTUNE=0
pass() {  # pass TREE LABEL JSON
  echo "=== $2 ($1)"
  PYTHONPATH="$1" python3 perf/ab_compare.py measure --label "$2" --json "$3" 2>&1 | tail -n 3
}
pass "$BEFORE" "before ${LABEL_BEFORE:-}" "$OUT/ab_before.json"
pass "$PWD" "after ${LABEL_AFTER:-$AFTER_SHA}" "$OUT/ab_after.json"
pass "$BEFORE" "before ${LABEL_BEFORE:-} (second run)" "$OUT/ab_before2.json"
python3 perf/ab_compare.py compare "$OUT/ab_before.json" "$OUT/ab_after.json" "$OUT/ab_before2.json" \
  --md "$OUT/ab_compare.md"
for side in before after; do
  tree=$BEFORE; [ "$side" = after ] && tree=$PWD
  echo "=== host time per call, $side"
  PYTHONPATH="$tree" python3 perf/host_overhead.py --device cuda --calls 2000 \
    --methods auto lightning_attention block_based decode_step --profile 2>&1 | tee "$OUT/host_$side.log" | tail -n 120
done
