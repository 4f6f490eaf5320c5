#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/tma.log
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/tma.log
for round in 1 2; do
  for v in ${VARIANTS:-base walk store ws}; do
    case $v in base) e="LT_X_NONE=1";; walk) e="LT_X_TMA=1";; both) e="LT_X_TMA=1 LT_X_TMAS=1";; botho) e="LT_X_TMA=1 LT_X_TMAS=1 LT_X_TMA_O=1";; pass) e="LT_X_TMAS=1";; store) e="LT_X_TMA_O=1";; ws) e="LT_X_TMA=1 LT_X_TMA_O=1";; esac
    env $e TRITON_CACHE_DIR=/tmp/tc_$v timeout 300 python perf/experiments/tma_ab.py $v-r$round 2>&1 | grep -v Warn | tail -14 | tee -a $OUT/tma.log
  done
done
