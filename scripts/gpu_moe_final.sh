#!/usr/bin/env bash
# The MoE runs quoted for issues 5 and 8 on a 4 x H200 machine (repository root; results under $OUT).
# PARTS picks them: check (GPU tests + a short seed-config timing), a2a (overlap, replication, experts,
# timelines), blocks (the a2a-vs-blocks sweep over locality and local experts, one command).
PARTS=${PARTS:-"check a2a blocks"}
source scripts/gpu_moe_lib.sh
check_part() {
  timeout 150 python3 -m pytest -q -x tests/test_grouped_gemm.py tests/test_moe_route.py tests/test_moe_symm_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1; echo "== gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.log"
  moe check 120 --system a2a,blocks --locality 0.25,1.0 --num-steps 20 --warmup 5
}
a2a_part() {
  moe overlap 80 --a2a-ffn-overlap-degree 1,2,4 --num-steps 50 --seed-format
  moe replicate 60 --routing rand-skew --replicate-hot 0,2,4,6 --num-steps 30 --warmup 5
  moe experts 80 --num-local-experts 8,16,32,64 --num-steps 30 --warmup 5
  timeout 50 python3 scripts/moe_timeline.py "$OUT/timeline" --overlap 1,2 --steps 3 > "$OUT/timeline.log" 2>&1
  echo "== timeline rc=$?"
}
blocks_part() {
  TAIL=40 moe blocks-sweep 300 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --num-local-experts 8,16,32,64 \
    --num-steps 30 --warmup 5 --seed-format
}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
for part in $PARTS; do "${part}_part"; done
cd "$OUT" && tar czf runs.tar.gz runs $( [[ -d timeline ]] && echo timeline ) && rm -rf runs timeline
