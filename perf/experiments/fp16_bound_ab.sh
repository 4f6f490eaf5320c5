#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/ab.log
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/ab.log
for round in 1 2; do
  for v in base bound; do
    case $v in base) e="LT_X_BOUND=0";; bound) e="LT_X_BOUND=1";; esac
    env $e TRITON_CACHE_DIR=/tmp/tc_$v timeout 280 python perf/experiments/fp16_bound_ab.py $v-r$round 2>&1 | grep -v Warn | tail -14 | tee -a $OUT/ab.log
  done
done
