#!/usr/bin/env bash
# One batched run on a GPU machine: restore Triton's cache, install the peers (if their wheels are
# in .whl/), run the steps asked for, save the cache and logs under $OUT.
#
#   OUT=/tmp/out bash perf/gpu_session.sh tests bench_chunked ...
#
# Steps: env, warm, tests, tests_quick, tests_gpus, bench_decode, bench_chunked, bench_fleet, bench_auto, bench_auto_cold, tune,
# remeasure, bench_main, host_overhead, profile, profile_auto, short_segments, model_shapes, walk_configs.  Each step's output goes to <step>.log; after every step the
# logs, perf/results and the heuristic files are packed into $OUT again, so a call cut off by its time
# limit still brings back what the finished steps produced.  A failing step does not stop the others.
# At the end Triton's cache is packed into $OUT as 15 MB parts, for .gpucache/ next time; SAVE_CACHE=0 leaves
# it out (a fresh machine's cache can take more parts than the files a call brings back).
set -u
OUT=${OUT:-/tmp/leettriton-out}
LOGS=/tmp/leettriton-logs
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache TRITON_STORE_BINARY_ONLY=1
mkdir -p "$TRITON_CACHE_DIR"
for part in .gpucache/triton-cache.tgz*; do
  [ -f "$part" ] && { cat .gpucache/triton-cache.tgz* | tar xzf - -C "$TRITON_CACHE_DIR" && echo "restored Triton cache"; break; }
done
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || export PYTHONPATH="$PWD:${PYTHONPATH:-}"

run() {  # run NAME CMD...: time one step (at most $LIMIT s), keep its log
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== $name: $*"
  timeout "${LIMIT:-3000}" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  save
  return $rc
}

save() {  # what has been produced so far, into $OUT
  tar czf "$OUT/results.tgz" perf/results leettriton/autotune/heuristics 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
}

for spec in "$@"; do
  # a step is NAME or NAME:LIMIT_SECONDS:EXTRA_ARGS (e.g. bench_fleet:120:--quick)
  IFS=: read -r step LIMIT EXTRA <<< "$spec"
  read -r -a extra <<< "${EXTRA:-}"
  case $step in
    env) run env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"' ;;
    warm) run warm python3 -m leettriton.autotune.warm --workers 16 "${extra[@]}" ;;
    tests) run tests python3 -m pytest tests -q -n 16 --hypothesis-profile=gpu -p no:cacheprovider -rfE "${extra[@]}" ;;
    tests_quick) run tests_quick python3 -m pytest tests -q -n 16 --hypothesis-profile=ci -p no:cacheprovider "${extra[@]}" ;;
    tests_gpus)  # the suite's test ids dealt round-robin to every GPU, $WORKERS (4) workers each; each GPU's whole log kept.
      # SHARD=k/m keeps every m-th id from the k-th (0-based), so a one-GPU machine runs the suite in m calls.
      run tests_gpus bash -c '
        python3 -m pytest tests -q --collect-only -p no:cacheprovider --hypothesis-profile=gpu | grep "::" > "$0/all_ids.txt"
        IFS=/ read -r part parts <<< "${SHARD:-0/1}"
        awk -v k="$part" -v m="$parts" "(NR - 1) % m == k" "$0/all_ids.txt" > "$0/ids.txt"
        g=$(nvidia-smi -L | wc -l)
        echo "$(wc -l < "$0/ids.txt") of $(wc -l < "$0/all_ids.txt") test ids (shard $part/$parts) over $g GPUs, ${WORKERS:-4} workers each"
        awk -v d="$0" -v g="$g" "{print > (d \"/ids\" (NR % g) \".txt\")}" "$0/ids.txt"
        for k in $(seq 0 $((g - 1))); do
          COLUMNS=250 CUDA_VISIBLE_DEVICES=$k python3 -m pytest @"$0/ids$k.txt" -q -n "${WORKERS:-4}" --hypothesis-profile=gpu \
            -p no:cacheprovider -rfE "$@" > "$0/tests_gpu$k.log" 2>&1 &
        done
        wait; tail -n 3 "$0"/tests_gpu*.log' "$LOGS" "${extra[@]}" ;;
    bench_decode) run bench_decode python3 perf/bench_decode.py --out perf/results "${extra[@]}" ;;
    bench_chunked) run bench_chunked python3 perf/bench_chunked.py --out perf/results "${extra[@]}" ;;
    bench_fleet) run bench_fleet python3 perf/bench_fleet_recursion.py --out perf/results "${extra[@]}" ;;
    bench_auto) run bench_auto python3 perf/bench_auto.py --out perf/results "${extra[@]}" ;;
    bench_auto_cold) run bench_auto_cold python3 perf/bench_auto.py --out perf/results --cold-only "${extra[@]}" ;;
    host_overhead) run host_overhead python3 perf/host_overhead.py --device cuda "${extra[@]}" ;;
    profile) run profile python3 perf/profile_kernels.py "${extra[@]}" ;;
    walk_configs) run walk_configs python3 perf/walk_configs.py "${extra[@]}" ;;
    profile_auto) run profile_auto python3 perf/profile_auto.py "${extra[@]}" ;;
    short_segments) run short_segments python3 perf/short_segments.py "${extra[@]}" ;;
    model_shapes) run model_shapes python3 perf/bench_model_shapes.py --out perf/results "${extra[@]}" ;;
    remeasure)  # the heuristic file's own points measured again (e.g. remeasure:3000:--rd 64x64)
      run remeasure python3 -m leettriton.tune --gpu "${FAMILY:-h100}" --remeasure --recorded-only "${extra[@]}" ;;
    tune) run tune python3 -m leettriton.tune --gpu "${FAMILY:-h100}" --quick --max-minutes "${TUNE_MINUTES:-8}" "${extra[@]}" ;;
    bench_main)  # a kernel fault ends the process: go on in a fresh one (--resume), three times at most
      for try in 1 2 3; do
        run bench_main$try python3 -m leettriton.bench --peers --json perf/results/bench_main.json \
          --plot perf/results/bench_main.png "${extra[@]}" --resume && break
      done ;;
    *) echo "unknown step $step" ;;
  esac
done

# results and the heuristic file come back through $OUT (at most 8 files)
save
if [ "${SAVE_CACHE:-1}" != 0 ]; then
  tar czf - -C "$TRITON_CACHE_DIR" . | split -b 15m - "$OUT/triton-cache.tgz."
fi
ls -la "$OUT"
