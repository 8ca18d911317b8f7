"""`qbench grouped` metrics. Records per shape (a-f of qbench/benches/moe/grouped.py: rows x K -> N over
G groups, dtype) and variant, exec eager, timing per_kernel (each kernel timed alone, L2 flushed)."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric

BENCH = "grouped_gemm"
# tma: the persistent TMA grouped GEMM (kernels/grouped_gemm_tma.py); pointer: the pointer-array kernel
# (kernels/grouped_gemm.py); dense: one torch.matmul of the same flops, a yardstick
VARIANTS = ("tma", "pointer", "dense")
ABS_ERROR = "abs. error"  # informative unit (no direction) for the max absolute errors

METRICS = (
    Metric("kernel_ms", units.MS, "median time of one call of the variant's kernel, timed alone"),
    Metric("tflops", units.TFLOPS, "2 rows K N flops (the real rows, no padding) over kernel_ms"),
    Metric("speedup", units.SPEEDUP, "the pointer kernel's kernel_ms over the TMA kernel's (on the tma record)"),
    Metric("first_call_ms", units.MS, "wall clock of the first call: Triton compile + autotune (a note)"),
    Metric("max_abs_err", ABS_ERROR, "max |out - reference| of the [rows, N] output"),
    Metric("rel_err", units.REL_ERROR, "max |out - reference| / max |reference|"),
    Metric("cross_rel_err", units.REL_ERROR, "max |tma - pointer| / max |pointer| (on the tma record)"),
)
