#!/usr/bin/env bash
# `qbench switchback` on a GPU machine (repository root; outputs under $OUT, see gpu_prelude.sh).
#   scripts/gpu_switchback.sh tests    GPU tests: kernels, layers (compiled, graphed, sync-free), fp8, timer
#   scripts/gpu_switchback.sh modes    the execution-mode command of results/switchback-h200-modes, RUNS times
#   scripts/gpu_switchback.sh model    transformer block stacks (--model) and the training check
#   scripts/gpu_switchback.sh vit-h    the command of results/switchback-h200-model/vit-h-compile-3runs, RUNS times
#   scripts/gpu_switchback.sh reruns   the command of results/switchback-h200-reruns, RUNS times in one call
#                                      (one GPU, one host; then: qbench summary ... --across-runs median --spreads)
#   scripts/gpu_switchback.sh ncu      DRAM bytes of the weight quantizers read by ncu (clocks left alone)
#   scripts/gpu_switchback.sh torchao  with torchao's wheel carried under .whl/: its GPU test, then RUNS runs of
#                                      the layers (three shapes, M = 32768, every mode) and of the vit-h stack
#                                      compiled, each beside 16-bit, SwitchBack and the fp8 variants
source "$(dirname "$0")/gpu_prelude.sh"
PAIRS=1024x4096,4096x1024,2048x8192,8192x2048,4096x16384,16384x4096
gpu_header
case "${1:-tests}" in
tests)
  python3 -m pytest -q -p no:cacheprovider tests/test_switchback_kernels.py tests/test_switchback_layers.py \
    tests/test_fp8_layers.py tests/test_timing.py 2>&1 | tail -5 ;;
modes)
  for i in $(seq "${RUNS:-3}"); do
    qbench switchback --pairs "$PAIRS" --batch-sizes 8192,32768,131072 --out "$OUT/runs/run$i" | tail -1
  done
  pack_runs ;;
model)
  qbench switchback --model vit-h --batch-sizes 256 --out "$OUT/runs/model-vit-h" | tail -12
  qbench switchback --train-check --out "$OUT/runs/train-check" | tail -8
  pack_runs ;;
vit-h)
  for i in $(seq "${RUNS:-3}"); do
    qbench switchback --model vit-h --batch-sizes 256 --exec compile --variants 16bit,switchback \
      --out "$OUT/runs/vit-h-compile-run$i" | tail -1
  done
  pack_runs ;;
reruns)
  for i in $(seq "${RUNS:-3}"); do
    qbench switchback --pairs 1024x4096,4096x16384,16384x4096 --batch-sizes 8192,32768 \
      --out "$OUT/runs/rerun$i" | tail -1
  done
  pack_runs ;;
ncu)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 240 "$NCU" --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 -c "
import torch
from kernels import switchback_quantize as sq
w = torch.randn(16384, 4096, device='cuda', dtype=torch.float16)  # 128 MiB: larger than the 60 MB L2
for name in ('quantize_global', 'quantize_global_transpose', 'quantize_columnwise_transpose'):
    getattr(sq, name)(w)
torch.cuda.synchronize()" > "$OUT/ncu_quantizers.csv" 2> "$OUT/ncu_stderr.txt"
  echo "ncu rc=$?" ;;
torchao)
  python3 -c "import torchao; print('torchao', torchao.__version__)" || exit 1
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_switchback_cli.py -k torchao 2>&1 | tail -2
  for i in $(seq "${RUNS:-3}"); do
    timeout 240 python3 -m qbench switchback --pairs 1024x4096,4096x16384,16384x4096 --batch-sizes 32768 \
      --variants global,fp8,fp8_all,module,torchao --out "$OUT/runs/layers-torchao-run$i" | tail -5
    timeout 240 python3 -m qbench switchback --model vit-h --batch-sizes 256 --exec compile \
      --variants 16bit,switchback,fp8,fp8_all,torchao --out "$OUT/runs/vit-h-torchao-run$i" | tail -7
    (cd "$OUT" && tar -rf torchao.tar runs && rm -rf runs && mkdir runs)  # what ran stays if the call is cut
  done ;;
*) echo "unknown part $1: tests, modes, model, vit-h, reruns, ncu or torchao" >&2; exit 2 ;;
esac
