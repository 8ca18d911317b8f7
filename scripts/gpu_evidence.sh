#!/usr/bin/env bash
# Profiler evidence for the SwitchBack weight quantizers, plus the GPU-only tests of the timer.
#   OUT=out bash scripts/gpu_evidence.sh
# ncu reads DRAM bytes per kernel (clock control off: the card's clocks are left as they are).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_timing.py -m gpu 2>&1 | tail -3
cat > /tmp/quantize_once.py <<'PY'
import torch
from kernels import switchback_quantize as sq
w = torch.randn(16384, 4096, device="cuda", dtype=torch.float16)  # 128 MiB: larger than the 60 MB L2
x = torch.randn(32768, 4096, device="cuda", dtype=torch.float16)
for name in ("quantize_global", "quantize_global_transpose", "quantize_columnwise_transpose"):
    getattr(sq, name)(w)  # compile
sq.quantize_rowwise(x)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name in ("quantize_global", "quantize_global_transpose", "quantize_columnwise_transpose"):
    getattr(sq, name)(w)
sq.quantize_rowwise(x)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PY
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 240 "$NCU" --clock-control none --profile-from-start off \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  --csv python3 /tmp/quantize_once.py > "$OUT/ncu_quantizers.csv" 2> "$OUT/ncu_stderr.txt"
echo "ncu rc=$?"
python3 - "$OUT/ncu_quantizers.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
k, m, u, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
for r in body:
    print(f"{r[k][:40]:40s} {r[m]:58s} {r[v]:>14s} {r[u]}")
PY
