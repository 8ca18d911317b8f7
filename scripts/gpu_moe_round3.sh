#!/usr/bin/env bash
# MoE round 3 on a 4 x H200 machine (repository root; results under $OUT). PARTS picks:
#   kernels the TMA grouped-GEMM A/B and the GPU tests of the new kernels (one GPU)
#   probe   short qbench moe A/Bs: grouped GEMM TMA on/off, replication, blocks transports at high locality
#   final   the runs quoted for issues 5 and 8 (seed config, replication, experts, the blocks sweep)
#   two     2 x H200: the symm GPU test and world-size-2 A/Bs;  long: final's runs at 100 steps
PARTS=${PARTS:-"probe"}
source scripts/gpu_moe_lib.sh
kernels_part() {  # one GPU is enough
  timeout 300 python3 scripts/gpu_grouped_tma.py --out "$OUT/runs/grouped-tma" > "$OUT/grouped_tma.log" 2>&1
  echo "== tma rc=$?"; tail -40 "$OUT/grouped_tma.log"
  timeout 240 python3 -m pytest -q tests/test_grouped_gemm_tma.py tests/test_moe_hot.py tests/test_block_gemm.py \
    tests/test_moe_route.py tests/test_grouped_gemm.py > "$OUT/gpu_tests.log" 2>&1
  echo "== gpu tests rc=$?"; tail -6 "$OUT/gpu_tests.log"
}
probe_part() {
  moe seed-tma 60 --num-steps 30 --warmup 5
  QBENCH_GROUPED_TMA=0 moe seed-pointer 60 --num-steps 30 --warmup 5
  moe replicate 80 --routing rand-skew --replicate-hot 0,2,4 --num-steps 20 --warmup 5
  TAIL=12 moe blocks-split 110 --system a2a,blocks --locality 0.75,1.0 --num-local-experts 16,32 --num-steps 20 \
    --warmup 5 --trace "$OUT/trace"
  moe blocks-fused-ga 70 --system blocks --transport symm-fused-ga --locality 1.0 --num-local-experts 16,32 \
    --num-steps 20 --warmup 5
}
two_part() {  # 2 x H200: GPU correctness of the new paths and world-size-2 A/Bs
  timeout 150 python3 -m pytest -q -x tests/test_moe_symm_gpu.py > "$OUT/symm_tests.log" 2>&1
  echo "== symm gpu tests rc=$?"; tail -3 "$OUT/symm_tests.log"
  W=2 moe w2-seed-tma 60 --num-steps 30 --warmup 5
  W=2 QBENCH_GROUPED_TMA=0 moe w2-seed-pointer 60 --num-steps 30 --warmup 5
  W=2 moe w2-replicate 80 --routing rand-skew --replicate-hot 0,2,4 --num-steps 20 --warmup 5
  W=2 TAIL=20 moe w2-blocks 150 --system a2a,blocks --locality 0.25,0.75,1.0 --num-local-experts 8,32 \
    --num-steps 20 --warmup 5
}
final_part() {  # the symm GPU test ran in the two-GPU part
  moe seed 70 --num-steps 50 --warmup 5 --seed-format
  moe replicate 90 --routing rand-skew --replicate-hot 0,2,4,6 --num-steps 30 --warmup 5
  moe experts 90 --num-local-experts 8,16,32,64 --num-steps 30 --warmup 5
  TAIL=40 moe blocks-sweep 300 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --num-local-experts 8,16,32,64 \
    --num-steps 30 --warmup 5 --seed-format
}
long_part() {  # the final runs again at the default 100 steps (30-step cells varied by up to 10%)
  moe seed100 70 --num-steps 100 --warmup 10 --seed-format
  moe experts100 100 --num-local-experts 8,16,32,64 --num-steps 100 --warmup 10
  TAIL=40 moe blocks-sweep100 300 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --num-local-experts 8,16,32,64 \
    --num-steps 100 --warmup 10 --seed-format
}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
git log --oneline -1 2>/dev/null
for part in $PARTS; do "${part}_part"; done
cd "$OUT" && tar czf runs.tar.gz runs $( [[ -d trace ]] && echo trace ) && rm -rf runs trace
