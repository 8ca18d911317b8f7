#!/usr/bin/env bash
# GPU validation, tuning probes and the committed run of `qbench switchback`.
#   scripts/gpu_switchback.sh check   # GPU tests + bandwidth / TOP/s probes + a small qbench run
#   scripts/gpu_switchback.sh full    # the original's 18 pairs at M = 8192, 32768, 131072
# Outputs go to ${OUT:-out}; run from the repository root.
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

probe() {
python3 - <<'PY'
import torch
from qbench.timing import time_fn
from kernels import switchback_quantize as sq, switchback_matmul as sm

def gbps(nbytes, fn):
    t = time_fn(fn, device="cuda", budget_ms=200)
    return nbytes / (t.median * 1e-3) / 1e9, t.median

buf = torch.empty(2**30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(buf)
copy, _ = gbps(2 * buf.numel(), lambda: dst.copy_(buf))
print(f"copy {copy:.0f} GB/s (read + write)")
for M, K in ((32768, 4096), (32768, 16384), (131072, 1024)):
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    for epp in (4096, 8192, 16384, 32768):
        sq.ELEMENTS_PER_PROGRAM = epp
        bw, ms = gbps(3 * M * K, lambda: sq.quantize_rowwise(x))
        print(f"rowwise M={M} K={K} elems/program={epp}: {bw:.0f} GB/s = {100 * bw / copy:.0f}% of copy")
    sq.ELEMENTS_PER_PROGRAM = 8192
for N, K in ((16384, 4096), (4096, 16384), (32384, 8096)):
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    for name in ("quantize_global", "quantize_global_transpose", "quantize_columnwise_transpose", "quantize_rowwise"):
        bw, ms = gbps(3 * N * K, lambda: getattr(sq, name)(w))
        print(f"{name} W={N}x{K}: {bw:.0f} GB/s = {100 * bw / copy:.0f}% of copy ({ms:.3f} ms)")
M, K, N = 32768, 4096, 16384
a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(N, K, device="cuda", dtype=torch.float16)
aq, sa = sq.quantize_rowwise(a); bq, sb = sq.quantize_global(b)
t = time_fn(lambda: a @ b.t(), device="cuda", budget_ms=300)
print(f"fp16 cuBLAS {2 * M * N * K / t.median / 1e9:.0f} TFLOP/s")
t = time_fn(lambda: torch._int_mm(aq, bq.t()), device="cuda", budget_ms=300)
print(f"torch._int_mm {2 * M * N * K / t.median / 1e9:.0f} TOP/s")
configs = [(128, 256, 128, 3, 8), (128, 256, 128, 4, 8), (256, 128, 128, 3, 8), (128, 256, 64, 4, 8),
           (128, 256, 64, 5, 8), (128, 128, 128, 4, 8), (128, 128, 128, 4, 4), (128, 128, 64, 5, 4),
           (256, 128, 64, 4, 8), (64, 256, 128, 4, 4), (128, 256, 128, 2, 8), (128, 128, 64, 6, 8)]
for shape in ((M, K, N), (M, N, K), (8192, 1024, 4096), (131072, 4096, 16384)):
    m_, k_, n_ = shape
    a2 = torch.randint(-127, 128, (m_, k_), device="cuda", dtype=torch.int8)
    b2 = torch.randint(-127, 128, (n_, k_), device="cuda", dtype=torch.int8)
    s1 = torch.rand(m_, device="cuda"); s2 = torch.rand(1, device="cuda")
    for impl in ("pointer", "tma"):
        res = []
        for c in configs:
            try:
                t = time_fn(lambda: sm.int8_matmul_rowwise_global(a2, s1, b2, s2, None, torch.float16, config=c,
                            impl=impl), device="cuda", budget_ms=100)
                res.append((2 * m_ * n_ * k_ / t.median / 1e9, c))
            except Exception as exc:  # noqa: BLE001
                print(impl, "config", c, "failed:", type(exc).__name__, str(exc)[:80])
        t = time_fn(lambda: sm.int8_matmul_rowwise_global(a2, s1, b2, s2, None, torch.float16, impl=impl),
                    device="cuda", budget_ms=200)
        print(f"int8 {impl} {shape}: autotuned {2 * m_ * n_ * k_ / t.median / 1e9:.0f} TOP/s;",
              " ".join(f"{c}:{v:.0f}" for v, c in sorted(res, reverse=True)[:5]))
PY
}

case "${1:-check}" in
check)
    python3 -m pytest -q -x tests/test_switchback_kernels.py tests/test_switchback_layers.py 2>&1 | tail -5
    probe 2>&1 | tee "$OUT/probe.txt"
    python3 -m qbench switchback --pairs 1024x4096,4096x16384 --batch-sizes 8192,32768 --out "$OUT/sbcheck" \
        2>&1 | tail -12
    ;;
full)
    python3 -m pytest -q -x tests/test_switchback_kernels.py 2>&1 | tail -3 | tee "$OUT/probe.txt"
    grep -q failed "$OUT/probe.txt" && exit 1
    python3 -c "
import torch
from qbench.timing import time_fn
buf = torch.empty(2**30, dtype=torch.uint8, device='cuda'); dst = torch.empty_like(buf)
t = time_fn(lambda: dst.copy_(buf), device='cuda', budget_ms=200)
print(f'copy {2 * buf.numel() / t.median / 1e6:.0f} GB/s (read + write, median of {len(t.samples_ms)})')
" 2>&1 | tee -a "$OUT/probe.txt"
    COLUMNS=200 python3 -m qbench switchback --batch-sizes 8192,32768,131072 --out "$OUT/switchback-full" 2>&1 \
        | tail -62
    ;;
esac
