"""`qbench block` metrics: one record per preset x batch size x variant x exec, a training step (forward,
loss, backward, AdamW) of a transformer block stack whose linear layers are the variant's; ms are medians
over steps issued back to back, their samples kept."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric
from qbench.metrics.common import TELEMETRY

BENCH = "block"
# the linear layers of qbench.layers.transformer.LINEARS: 16bit nn.Linear, SwitchBack int8, its fp8 forms
# (grad-weight in 16-bit / in fp8), torchao's Float8Linear
VARIANTS = ("16bit", "switchback", "fp8", "fp8_all", "torchao")

METRICS = (
    Metric("step_ms", units.MS, "forward + loss + backward + AdamW step of the stack"),
    Metric("tokens_per_s", units.TOKENS_PER_S, "batch_size x tokens over step_ms"),
    Metric("step_speedup", units.SPEEDUP, "16bit's step_ms over this variant's, same preset, batch and exec"),
    Metric("linear_ms", units.MS, "forward + backward of the stack's linear layers alone, same exec and shapes"),
    Metric("linear_share", units.SHARE, "linear_ms / step_ms: the share of the step the linear layers take alone"),
    Metric("linears_speedup", units.SPEEDUP, "16bit's linear_ms over this variant's"),
    Metric("tflops", units.TFLOPS, "matmul flop of the step (6 x tokens x linear weights + 12 B T^2 C x layers of "
                                   "attention) over step_ms"),
    Metric("host_ms", units.MS, "CPU time spent issuing one step"),
    Metric("peak_memory_mb", units.MB, "torch.cuda.max_memory_allocated over one step after warm-up, less the "
                                       "input and target"),
    Metric("memory_estimate_mb", units.MB, "the estimate checked against free memory before building the stack"),
    Metric("relerr_output", units.REL_ERROR, "the step's output against the eager 16bit stack's"),
    Metric("relerr_loss", units.REL_ERROR, "the step's loss against the eager 16bit stack's"),
    Metric("relerr_grads", units.REL_ERROR, "the gradients (one flat vector) against the eager 16bit stack's"),
    *TELEMETRY,
)
