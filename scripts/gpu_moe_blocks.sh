#!/usr/bin/env bash
# `qbench moe --system blocks` on a 4-GPU machine (run from the repository root; logs under $OUT).
# Two parts, each its own function with its own time limits:
#   kernels_part  the block GEMM kernels and the symmetric-memory transport: the 4-rank transport
#                 test, kernel timings (gather_matmul vs the grouped GEMM on the same rows) and
#                 transport timings (symm fused / symm split / all_to_all, one plan); after the
#                 layer part, the kernel unit tests on one GPU (kernel_tests)
#   layer_part    the layer: dense-reference check with transport symm at world size 4 (small
#                 config), then a short --system a2a,blocks timing at the seed config
#   sweep_part    the sweep, ONE command at the seed config (4 ranks, fp16, d 1024, h 4096,
#                 8192 tokens per rank, top-2): --system a2a,blocks x locality 0.25..1.0 x 8..64 local
#                 experts (32 cases, ~4-6 min), with --seed-format lines; run it alone: PARTS=sweep
# PARTS picks them (default kernels and layer).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-results/scratch}
PARTS=${PARTS:-"kernels layer"}
mkdir -p "$OUT"

kernels_part() {  # ~4 min: most valuable first (the 4-rank transport test), unit tests last
  timeout 100 python3 -m pytest -q -x tests/test_moe_symm_gpu.py > "$OUT/symm_tests.log" 2>&1
  echo "== symm transport test (4 ranks) rc=$?"; tail -5 "$OUT/symm_tests.log"
  timeout 60 python3 scripts/blocks_timing.py kernels > "$OUT/kernel_timing.log" 2>&1
  echo "== kernel timing rc=$?"; grep -v '^JSON' "$OUT/kernel_timing.log" | tail -16
  timeout 60 python3 scripts/blocks_timing.py transports > "$OUT/transport_timing.log" 2>&1
  echo "== transport timing rc=$?"; tail -4 "$OUT/transport_timing.log"
}

kernel_tests() {  # the interpreter tests on one GPU (compiled kernels, autotuned): many compiles
  timeout "${1:-90}" python3 -m pytest -q tests/test_block_gemm.py > "$OUT/kernel_tests.log" 2>&1
  echo "== kernel tests rc=$?"; tail -4 "$OUT/kernel_tests.log"
}

layer_part() {  # ~2.5 min
  timeout 70 python3 -m qbench moe --world-size 4 --system blocks --transport symm --num-local-experts 3 \
    --model-dim 200 --hidden-size 136 --samples 300 --dtype float32 --num-steps 3 --warmup 1 \
    --out "$OUT/runs/blocks-check" > "$OUT/layer_check.log" 2>&1
  echo "== layer check (symm, W=4) rc=$?"; tail -12 "$OUT/layer_check.log"
  timeout 90 python3 -m qbench moe --world-size 4 --system a2a,blocks --locality 0.25,1.0 \
    --num-steps 10 --warmup 3 --out "$OUT/runs/blocks-seed" > "$OUT/layer_seed.log" 2>&1
  echo "== seed config a2a,blocks rc=$?"; tail -12 "$OUT/layer_seed.log"
}

sweep_part() {  # 32 cases: reference check + 10 warm-up + 100 timed steps each
  timeout 560 python3 -m qbench moe --world-size 4 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 \
    --num-local-experts 8,16,32,64 --seed-format --out "$OUT/runs/blocks-sweep" > "$OUT/sweep.log" 2>&1
  echo "== blocks sweep rc=$?"; grep -v -E '^(STEP-|AG, |GA, |block_info )' "$OUT/sweep.log" | tail -45
}

nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
[[ " $PARTS " == *" kernels "* ]] && kernels_part
[[ " $PARTS " == *" layer "* ]] && layer_part
[[ " $PARTS " == *" sweep "* ]] && sweep_part
[[ -d "$OUT/runs" ]] && tar czf "$OUT/runs.tar.gz" -C "$OUT" runs && rm -rf "$OUT/runs"  # few files come back
[[ " $PARTS " == *" kernels "* ]] && kernel_tests "${KERNEL_TESTS_S:-90}"
exit 0
