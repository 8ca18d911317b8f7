# Sourced by the scripts/gpu_moe_*.sh run scripts (repository root, results under $OUT): the device
# environment (NVLink multicast off), $OUT/runs, and `moe NAME LIMIT_S ARGS...`, which runs
# `qbench moe --world-size ${W:-4} ARGS` into $OUT/runs/moe-NAME, logs to $OUT/NAME.log and prints
# the rc and the table's last ${TAIL:-8} rows.
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-results/scratch}
mkdir -p "$OUT/runs"
moe() { name=$1; limit=$2; shift 2
        timeout "$limit" python3 -m qbench moe --world-size "${W:-4}" --out "$OUT/runs/moe-$name" "$@" > "$OUT/$name.log" 2>&1
        echo "== $name rc=$?"; grep -E "│|rror" "$OUT/$name.log" | tail -${TAIL:-8}; }
