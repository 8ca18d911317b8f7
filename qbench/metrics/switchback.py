"""`qbench switchback` metrics. Records per shape (batch_size x dim_in -> dim_out, dtype) and
variant; timing per_kernel holds the components of the bitsandbytes benchmark and their sum (exec eager),
timing per_step and loop the module's whole training step (forward + backward) in each exec."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric
from qbench.metrics.common import TELEMETRY

BENCH = "switchback"
# 16bit: nn.Linear; switchback: SwitchBackLinear (global W scale); switchback_rowwise: its rowwise-W form;
# fp8 / fp8_all: the fp8 forms of SwitchBack's kernels (grad-weight in 16-bit / in fp8); fp8_cublas and
# int8_cublas: the same products through torch._scaled_mm / torch._int_mm; torchao: torchao's Float8Linear
VARIANTS = ("16bit", "switchback", "switchback_rowwise", "fp8", "fp8_all", "fp8_cublas", "int8_cublas", "torchao")

# the component kernels: name -> what it computes ([M, K] X, [M, N] G, [N, K] W)
COMPONENTS = {
    "fwd": "forward product X W^T",
    "bwd": "grad-input product G W (the low-precision variants' name for it)",
    "gx": "grad-input product G W (16-bit)",
    "gw": "grad-weight product G^T X",
    "quantize_x": "quantize X rowwise",
    "quantize_g": "quantize G rowwise",
    "quantize_w": "quantize W (its variant's scaling)",
    "quantize_w_t": "quantize W transposed, for the grad-input product",
    "quantize_g_t": "quantize G^T per output feature (fp8 grad-weight)",
    "quantize_x_t": "quantize X^T per input feature (fp8 grad-weight)",
    "cast_x": "X.to(int8): a plain cast, the memory-bound reference bitsandbytes times",
    "cast_g": "G.to(int8): a plain cast, the memory-bound reference bitsandbytes times",
    "cast_w": "W.to(int8): a plain cast, the memory-bound reference bitsandbytes times",
}
PRODUCTS = ("fwd", "bwd", "gx", "gw")
# host time of each call an eager step makes (benches/switchback/host_calls.py)
HOST_CALLS = ("quantize_x", "quantize_w", "forward_matmul", "weight_grad", "quantize_g", "input_grad_matmul",
              "forward", "input_grad", "bias_grad")


def _components() -> list[Metric]:
    out = []
    for name, what in COMPONENTS.items():
        out.append(Metric(f"{name}_ms", units.MS, f"median time of the {what} kernel(s), timed alone"))
        if name in PRODUCTS:
            out.append(Metric(f"{name}_tflops", units.TFLOPS, f"2 M N K flops of the {what} over {name}_ms"))
            out.append(Metric(f"{name}_tops", units.TOPS, f"2 M N K integer ops of the {what} over {name}_ms"))
            out.append(Metric(f"relerr_{name}", units.REL_ERROR,
                              f"||out - ref|| / ||ref|| of the {what} against the 16-bit product"))
        else:
            out.append(Metric(f"{name}_gbps", units.GBPS, f"bytes read and written by the {what} over {name}_ms"))
        if name.startswith("quantize_") and name in ("quantize_x", "quantize_g", "quantize_w", "quantize_w_t"):
            out.append(Metric(f"{name}_over_int8", units.RATIO,
                              "this fp8 quantizer's time over its int8 twin's (same shape and layout)"))
    return out


METRICS = (
    *_components(),
    Metric("kernels_ms", units.MS, "the variant's training step as the sum of its component kernels' medians"),
    Metric("kernels_speedup", units.SPEEDUP, "16bit's kernels_ms over this variant's"),
    Metric("kernels_pct_saved", units.PERCENT_SAVED, "100 (16bit - this) / 16bit of kernels_ms"),
    Metric("roofline_fraction", units.FRACTION_OF_ROOFLINE,
           "the step's floor (products at peak, quantizers at HBM bandwidth) over kernels_ms"),
    Metric("repeat", units.COUNT, "timed calls of the least-timed component"),
    Metric("step_ms", units.MS, "the layer's forward + backward (dX, dW, db) step"),
    Metric("step_speedup", units.SPEEDUP, "16bit's step_ms over this variant's, same exec and timing"),
    Metric("host_ms", units.MS, "CPU time spent issuing one step"),
    *(Metric(f"host_{call}_ms", units.MS, f"CPU time of the step's {call.replace('_', ' ')} call, timed alone")
      for call in HOST_CALLS),
    Metric("host_calls_ms", units.MS, "the sum of the host_<call>_ms of the variant's calls"),
    Metric("chain_ms", units.MS, "the variant's kernels run back to back as one CUDA graph"),
    Metric("chain_speedup", units.SPEEDUP, "16bit's chain_ms over this variant's"),
    Metric("step_over_kernels", units.SPEEDUP, "step_speedup / kernels_speedup: the kernel gain the module keeps"),
    Metric("step_over_chain", units.SPEEDUP, "step_speedup / chain_speedup: the same against the chained kernels"),
    *TELEMETRY,
)
