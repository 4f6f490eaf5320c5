#!/usr/bin/env bash
# The GPU checks of a release, in groups that each fit one call of a few minutes (perf/gpu_steps.sh runs the
# steps, each under what is left of the budget).  The steps write their files outside $OUT, into WORK/GROUP
# (WORK default /tmp/leettriton-verify), packed into $OUT/GROUP.tgz as each step ends: a machine that brings
# back a few files of $OUT gets the archive and the log ($OUT/GROUP.log), and a call cut off still brings back
# what its finished steps wrote.
#
#   OUT=/tmp/out bash perf/verify_gpu.sh GROUP [BUDGET_S]       # in a checkout with its git history
#
# GROUP:
#   ab       no slowdown against BASE (default 1ab5c05; a revision, or a folder holding its leettriton/): the
#            chunked bench's rows (lightning_attention, block_based, auto; float16 and bfloat16; batch 1 and 16;
#            n 8192; with and without decay), and
#            RetNet-1.3B's layer at 1 × 8192, each before / after / before again (perf/ab.py); vanilla at
#            n 64 and 512 against VANILLA_BASE (default ae55516, its single-launch form); then the GPU tests
#            of hostile inputs and of the host path
#   candidates  float16 with decay, where the walk's range check costs registers: the chunked bench's cells and
#            RetNet-1.3B's layer, this tree against BASE with each of CANDIDATES (revisions, default 36bb3dd: the
#            check as two scalars a program) in the same run (perf/ab.py --also)
#   hostile  perf/hostile_gpu.py: non-finite causality, float16's range beside fla, strided indices, overlap
#   serving  bench_tree, bench_checkpoints, bench_mixed
#   compile  bench_compile (fla beside, from .whl/), bench_host_time
#   decay    bench_decay, one layer per step: MODELS (default mamba2,nemotron,gla), MINUTES each (default 6);
#            mamba-ssm's Triton kernels from .peers/mamba (perf/bench_decay.py --mamba-src)
#   tables   bench_chunked, bench_model_shapes, bench_backward, bench_models --autotune, bench_auto
#   suite    the test suite on the GPU
#
# The peers' wheels go in .whl/ first (perf/README.md); pytest-xdist's wheels there too for the test steps.
# In the archive: <gpu>/ (the benchmarks' own results folders) and <name>/ (the A/Bs' runs and ab.json): join
# each into the tree's perf/results/<gpu>/ with `python perf/render.py --fold FILE perf/results/<gpu>/NAME.json`.
set -u
GROUP=${1:?name a group: ab, candidates, hostile, serving, compile, decay, tables or suite}
BUDGET=${2:-540}
export OUT=${OUT:?set OUT}
W=${WORK:-/tmp/leettriton-verify}/$GROUP
export PACK=$W
mkdir -p "$W" "$OUT"
BASE=${BASE:-1ab5c05}
VANILLA_BASE=${VANILLA_BASE:-ae55516}
B="python3 -m leettriton.bench --no-check --json '{out}/bench.json'"
ab() {  # the A/B's base: a revision, or a folder holding an earlier leettriton/ (git archive REV leettriton)
  if [ -d "$1" ]; then echo "python3 perf/ab.py --base-tree $1 --base-label ${BASE_LABEL:-$(basename "$1")}"; else echo "python3 perf/ab.py --base $1"; fi
}
TESTS="python3 -m pytest -q -p no:cacheprovider -n 8"
steps=()
case $GROUP in
  ab)
    steps=(
      "sh:LEETTRITON_AUTOTUNE=0 $(ab $BASE) --out $W/ab_chunked -- $B --methods lightning_attention,block_based,auto --dtype float16,bfloat16 --batch 1,16 --n 8192 --decay both 2>&1 | tail -30"
      "sh:$(ab $BASE) --out $W/ab_retnet -- $B --methods auto --dtype bfloat16,float16 --batch 1 --heads 8 --r 256 --d 512 --n 8192 --decay on 2>&1 | tail -8"
      "sh:LEETTRITON_AUTOTUNE=0 $(ab $VANILLA_BASE) --out $W/ab_vanilla -- $B --methods vanilla --dtype bfloat16,float16 --batch 1,16 --n 64,512 --decay on 2>&1 | tail -14"
      "sh:$TESTS tests/test_hostile_values.py tests/test_hostile_inputs.py tests/test_host_path.py 2>&1 | tail -8") ;;
  candidates)
    also=""; for rev in ${CANDIDATES:-36bb3dd}; do also+=" --also $rev"; done
    steps=(
      "sh:LEETTRITON_AUTOTUNE=0 $(ab $BASE)$also --out $W/ab_candidates -- $B --methods lightning_attention,block_based,auto --dtype float16 --batch 1,16 --n 8192 --decay on 2>&1 | tail -14"
      "sh:LEETTRITON_AUTOTUNE=0 $(ab $BASE)$also --out $W/ab_candidates_retnet -- $B --methods lightning_attention,block_based,auto --dtype float16 --batch 1,8 --heads 8 --r 256 --d 512 --n 8192 --decay on 2>&1 | tail -14") ;;
  hostile) steps=("sh:python3 perf/hostile_gpu.py --out $W/hostile.json 2>&1 | tail -25") ;;
  serving)
    steps=("sh:python3 perf/bench_tree.py --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_checkpoints.py --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_mixed.py --out $W 2>&1 | tail -25") ;;
  compile)
    steps=("sh:python3 perf/bench_compile.py --fla /tmp/site --out $W/bench_compile.json 2>&1 | tail -30"
           "sh:python3 perf/bench_host_time.py --out $W 2>&1 | tail -30") ;;
  decay)
    M=${MODELS:-mamba2,nemotron,gla}
    for m in ${M//,/ }; do
      steps+=("sh:python3 perf/bench_decay.py --models $m --max-minutes ${MINUTES:-6} --out $W 2>&1 | tail -40")
    done ;;
  tables)
    steps=("sh:python3 perf/bench_chunked.py --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_model_shapes.py --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_backward.py --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_models.py --autotune --out $W 2>&1 | tail -20"
           "sh:python3 perf/bench_auto.py --out $W 2>&1 | tail -20") ;;
  suite) steps=("sh:$TESTS tests 2>&1 | tail -15") ;;
  *) echo "unknown group: $GROUP" >&2; exit 2 ;;
esac
if ls .whl/pytest_xdist*.whl >/dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/xdist .whl/pytest_xdist*.whl .whl/execnet*.whl >/dev/null 2>&1 ||
    echo "pytest-xdist's wheels in .whl/ did not install"
  export PYTHONPATH=/tmp/xdist${PYTHONPATH:+:$PYTHONPATH}
fi
bash "$(dirname "$0")/gpu_steps.sh" "$GROUP" "$BUDGET" "${steps[@]}"
