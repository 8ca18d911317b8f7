#!/usr/bin/env bash
# MoE round 4 on a 4 x H200 machine (repository root; results under $OUT). PARTS picks:
#   trace   timelines of the seed step and of rand-skew with replication, the GPU test of the block-GEMM
#           copy kernel, the grouped GEMM with source-major against expert-major rows (one GPU, fp16)
#   probe   this round's changes at 100 steps: the seed config with expert-major rows (then the default) and
#           source-major rows (QBENCH_EXPERT_MAJOR=0), rand-skew with replication, a replicated timeline
#   final   the runs quoted for issue 5 at 100 steps (seed config, replication, experts)
#   again   the seed config twice (expert-major rows opt-in, QBENCH_EXPERT_MAJOR=1, between) and
#           replication on another machine instance
PARTS=${PARTS:-"trace"}
source scripts/gpu_moe_lib.sh
trace_part() {
  moe seed-trace 90 --num-steps 30 --warmup 5 --trace "$OUT/trace"
  moe replicate-trace 150 --routing rand-skew --replicate-hot 0,2,4 --num-steps 30 --warmup 5 --trace "$OUT/trace"
  timeout 150 python3 -m pytest -q tests/test_block_gemm.py > "$OUT/gpu_tests.log" 2>&1
  echo "== block gemm gpu tests rc=$?"; tail -4 "$OUT/gpu_tests.log"
  timeout 240 python3 scripts/gpu_grouped_tma.py --dtypes fp16 --out "$OUT/runs/grouped-tma" > "$OUT/grouped_tma.log" 2>&1
  echo "== tma rc=$?"; tail -24 "$OUT/grouped_tma.log"
}
probe_part() {
  moe smoke 60 --num-steps 5 --warmup 2
  moe seed100 90 --num-steps 100 --warmup 10 --seed-format
  QBENCH_EXPERT_MAJOR=0 moe seed100-source-major 90 --num-steps 100 --warmup 10
  moe replicate100 200 --routing rand-skew --replicate-hot 0,2,4 --num-steps 100 --warmup 10
  moe replicate-trace 90 --routing rand-skew --replicate-hot 4 --num-steps 10 --warmup 5 --trace "$OUT/trace"
}
final_part() {
  moe seed100 90 --num-steps 100 --warmup 10 --seed-format
  QBENCH_EXPERT_MAJOR=0 moe seed100-source-major 90 --num-steps 100 --warmup 10
  moe replicate100 200 --routing rand-skew --replicate-hot 0,2,4,6 --num-steps 100 --warmup 10
  moe experts100 120 --num-local-experts 8,16,32,64 --num-steps 100 --warmup 10
}
again_part() {
  moe seed100 90 --num-steps 100 --warmup 10 --seed-format
  QBENCH_EXPERT_MAJOR=1 moe seed100-expert-major 90 --num-steps 100 --warmup 10
  moe seed100-again 90 --num-steps 100 --warmup 10
  moe replicate100 200 --routing rand-skew --replicate-hot 0,2,4 --num-steps 100 --warmup 10
}
third_part() {  # replication once more, the no-replication case timed before and after
  moe replicate100 200 --routing rand-skew --replicate-hot 0,2,4 --num-steps 100 --warmup 10
  moe replicate100-hot0-again 80 --routing rand-skew --replicate-hot 0 --num-steps 100 --warmup 10
}
nvidia-smi -L
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 &
SMI=$!
for part in $PARTS; do "${part}_part"; done
kill $SMI
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
cd "$OUT" && tar czf runs.tar.gz runs $( [[ -d trace ]] && echo trace ) && rm -rf runs trace
