#!/usr/bin/env bash
# One GPU session for `qbench fragmented`: correctness first (the layer tests on CUDA, then the
# bench's own gate on every configuration), then the seed's sweep in fp32 and bf16, largest size
# first so that a time limit cuts the least important configurations.
# Usage (repository root, on a GPU machine): OUT=/some/dir scripts/gpu_fragmented.sh [steps]
set -uo pipefail
OUT=${OUT:-results/gpu-fragmented}
STEPS=${1:-20}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -m pytest -q -p no:cacheprovider tests/test_fragmented_layer.py -k "cuda" 2>&1 | tail -n 15
  for dtype in fp32 bf16; do
    timeout 115 python3 -m qbench fragmented --sizes 8192,4096,2048 --batch-sizes 16,8,1 \
      --fragments 2,8,32,128 --dtype "$dtype" --steps "$STEPS" --warmup 5 --out "$OUT/$dtype" --force \
      --format seed > "$OUT/seed_$dtype.txt"
    echo "sweep $dtype exit $?"
  done
} 2>&1 | tee "$OUT/log.txt"
