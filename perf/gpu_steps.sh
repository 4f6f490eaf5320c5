#!/usr/bin/env bash
# One GPU call of steps, each timed from what is left of the call: the log and the heuristic file come back
# under $OUT after every step, so a call cut off by its limit still brings back what the finished steps made.
#
#   OUT=/tmp/out GPU=h100 bash perf/gpu_steps.sh NAME BUDGET_S STEP...
#
# NAME: the log, $OUT/NAME.log.  BUDGET_S: the call's seconds; each step runs under `timeout` with what is left.
# STEP is KIND:ARGS:
#   warm:ARGS   python -m leettriton.autotune.warm --workers 16 ARGS
#   tune:CAP ARGS   python -m leettriton.tune --gpu $GPU ARGS --max-minutes M, M = min(CAP, (seconds left - 75) / 60):
#               the tuner checks its limit only between points, so it is left 75 s for the point under way
#   ms:ARGS     python perf/bench_model_shapes.py ARGS --out $OUT/msK, K the step's number (from 1): each
#               step's files of their own (bench_model_shapes always names its files the same)
#   bc:ARGS     python perf/bench_chunked.py ARGS
#   py:ARGS     python ARGS (ARGS split on spaces: no quoting)
#   sh:CMD      bash -c CMD (quotes kept: e.g. a pytest -k expression with spaces)
# The peers' wheels in .whl/, if any, are installed to /tmp/site first.  LEETTRITON_GIT_SHA names the commit
# where the tree has no .git (a copy of the working tree), so the results record it.
# PACK (optional): a folder the steps write their files into, packed after every step into $OUT/PACK.tgz (named
# after the folder), for a call whose files come back only a few at a time: the steps' many files come back
# as one archive.
# The heuristic file the tuner writes is the tree's own: a later call on a fresh copy of the tree starts from
# the committed file, so take $OUT/$GPU.json into the tree between calls, or join the calls' files afterwards
# with `python -m leettriton.tune --gpu $GPU --merge FILE...` (each point's later measurement is kept).
set -u
NAME=$1 BUDGET=$2; shift 2
GPU=${GPU:-h100}
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1
[ -n "${LEETTRITON_GIT_SHA:-}" ] || export LEETTRITON_GIT_SHA=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
L=$OUT/$NAME.log
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
{ echo "# call $NAME: code $LEETTRITON_GIT_SHA, $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee -a "$L"
HEUR=leettriton/autotune/heuristics/$GPU.json
K=0
for step in "$@"; do
  K=$((K + 1))
  kind=${step%%:*}; args=${step#*:}
  echo "## $(( $(date +%s) - T0 )) s, $(left) s left: $kind $args" | tee -a "$L"
  case $kind in
    warm) timeout "$(left)" python3 -m leettriton.autotune.warm --workers 16 $args 2>&1 | tail -2 | tee -a "$L" ;;
    tune) cap=${args%% *}; args=${args#* }
          M=$(python3 -c "print(round(max(0.1, min($cap, ($(left) - 75) / 60)), 1))")
          echo "# python3 -m leettriton.tune --gpu $GPU $args --max-minutes $M" | tee -a "$L"
          timeout "$(left)" python3 -m leettriton.tune --gpu "$GPU" $args --max-minutes "$M" 2>&1 | tee -a "$L" ;;
    ms) mkdir -p "$OUT/ms$K"
        echo "# python3 perf/bench_model_shapes.py $args --out \$OUT/ms$K" | tee -a "$L"
        timeout "$(left)" python3 perf/bench_model_shapes.py $args --out "$OUT/ms$K" 2>&1 | tee -a "$L" ;;
    bc) echo "# python3 perf/bench_chunked.py $args" | tee -a "$L"
        timeout "$(left)" python3 perf/bench_chunked.py $args 2>&1 | tee -a "$L" ;;
    py) timeout "$(left)" python3 $args 2>&1 | tee -a "$L" ;;
    sh) timeout "$(left)" bash -c "$args" 2>&1 | tee -a "$L" ;;
    *) echo "unknown step kind: $kind" | tee -a "$L" ;;
  esac
  [ -f "$HEUR" ] && cp "$HEUR" "$OUT/$GPU.json"
  if [ -n "${PACK:-}" ] && [ -d "$PACK" ]; then
    tar czf "$OUT/.pack.tgz" -C "$PACK" . && mv "$OUT/.pack.tgz" "$OUT/$(basename "$PACK").tgz"
  fi
done
echo "## $(( $(date +%s) - T0 )) s: done" | tee -a "$L"
