#!/usr/bin/env bash
# `qbench fragmented` on a GPU machine (repository root; outputs under $OUT, see gpu_prelude.sh).
#   scripts/gpu_fragmented.sh tests    the layer's CUDA tests (outputs, gradients, compile, graph, no syncs)
#   scripts/gpu_fragmented.sh modes    the execution-mode command of results/fragmented-h200-modes, RUNS times
#   scripts/gpu_fragmented.sh sweep    the seed's sweep in fp32 and bf16, largest size first (seed layout too)
source "$(dirname "$0")/gpu_prelude.sh"
gpu_header
case "${1:-tests}" in
tests)
  python3 -m pytest -q -p no:cacheprovider tests/test_fragmented_layer.py tests/test_fragmented_bench.py 2>&1 | tail -5 ;;
modes)
  for i in $(seq "${RUNS:-3}"); do
    qbench fragmented --sizes 8192 --batch-sizes 16,1 --fragments 8 --tasks train --baselines dense \
      --dtype bf16,fp32 --steps 50 --warmup 10 --out "$OUT/runs/run$i" | tail -1
  done
  pack_runs ;;
sweep)
  for dtype in fp32 bf16; do
    qbench fragmented --sizes 8192,4096,2048 --batch-sizes 16,8,1 --fragments 2,8,32,128 --dtype "$dtype" \
      --exec eager --steps 20 --warmup 5 --out "$OUT/runs/$dtype" --format seed > "$OUT/seed_$dtype.txt"
  done
  pack_runs ;;
*) echo "unknown part $1: tests, modes or sweep" >&2; exit 2 ;;
esac
