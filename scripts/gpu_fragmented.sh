#!/usr/bin/env bash
# GPU session for `qbench fragmented`: correctness first (the layer tests on CUDA, then the bench's
# own gate before every configuration), then the seed's sweep in fp32 and bf16, largest size first
# so that a time limit cuts the least important configurations.
# Usage (repository root, on a GPU machine): OUT=/some/dir scripts/gpu_fragmented.sh [steps] [full|targets]
#   full     all CUDA layer tests, the whole seed sweep (3 sizes x 3 batches x 4 N x 3 modes, 3 baselines)
#   targets  the N = 2 eval tests only (both paths), then 8192 x 8192 at batch 16 and 1 (train, eval; dense
#            baseline): the configurations the performance targets name
set -uo pipefail
OUT=${OUT:-results/gpu-fragmented}
STEPS=${1:-20}
SCOPE=${2:-full}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "$SCOPE" = targets ]; then
  TESTS=(-k "cuda and eval_mode and shape6")
  SWEEP=(--sizes 8192 --batch-sizes 16,1 --modes train,eval --baselines linear)
  LIMIT=25
else
  TESTS=(-k cuda)
  SWEEP=(--sizes 8192,4096,2048 --batch-sizes 16,8,1)
  LIMIT=115
fi
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -m pytest -q -p no:cacheprovider tests/test_fragmented_layer.py "${TESTS[@]}" 2>&1 | tail -n 15
  for dtype in fp32 bf16; do
    timeout "$LIMIT" python3 -m qbench fragmented "${SWEEP[@]}" --fragments 2,8,32,128 --dtype "$dtype" \
      --steps "$STEPS" --warmup 5 --out "$OUT/$dtype" --force --format seed > "$OUT/seed_$dtype.txt"
    echo "sweep $dtype exit $?"
  done
} 2>&1 | tee "$OUT/log.txt"
rm -f "$OUT"/*/results.csv  # at most 8 files come back from the device; the CSV is regenerated from results.jsonl
