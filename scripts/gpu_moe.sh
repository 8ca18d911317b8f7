#!/usr/bin/env bash
# The MoE target set on a 4-GPU machine (run from the repository root; results under $OUT).
# Each command has its own time limit so that one failure does not cost the others.
# SETS picks the runs (default all): overlap replicate experts gemm.
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-results/scratch}
SETS=${SETS:-"overlap replicate experts gemm"}
mkdir -p "$OUT/runs"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
[[ -z $SKIP_TESTS ]] && timeout 90 python3 -m pytest -q -x tests/test_grouped_gemm.py 2>&1 | tail -3
moe() { name=$1; shift; [[ " $SETS " == *" $name "* ]] || return 0
        timeout "$LIMIT" python3 -m qbench moe --world-size 4 --out "$OUT/runs/moe-$name" "$@" \
          > "$OUT/runs/$name.log" 2>&1; echo "== $name rc=$?"; tail -25 "$OUT/runs/$name.log"; }
LIMIT=150 moe overlap --a2a-ffn-overlap-degree 1,2,4 --num-steps 50 --seed-format
LIMIT=110 moe replicate --routing rand-skew --replicate-hot 0,2,4,6 --num-steps 30 --warmup 5
LIMIT=110 moe experts --num-local-experts 8,16,32,64 --num-steps 30 --warmup 5
LIMIT=80 moe gemm --dtype bfloat16 --gemm triton,torch --num-steps 30 --warmup 5
tar czf "$OUT/moe_runs.tar.gz" -C "$OUT" runs
