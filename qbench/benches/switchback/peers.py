"""Peers of SwitchBack in the same run, and the module-level step.

- fp8 SwitchBack: forward and grad-input through torch._scaled_mm (float8_e4m3fn operands, rowwise
  scales: one per row of A and one per output column; that mode writes bf16 only), grad-weight in
  16-bit. Quantization is plain torch (absmax, divide, cast), as a user without a fused kernel has.
- cuBLAS int8: torch._int_mm (int8 x int8 -> int32) on SwitchBack's vectorwise operands, then the
  dequantizing epilogue as separate torch ops (cuBLAS has no fused rowwise-scale epilogue here).
Each peer is skipped (absent from the record) where the GPU or the shape does not support it.
"""

from __future__ import annotations

FP8_MAX = 448.0  # largest float8_e4m3fn value
TOTALS = {
    "time_fp8": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "standard_gw",
                 "fp8_fwd", "fp8_bwd"),
    "time_int8_cublas": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise",
                         "w_quantize_colwise_transpose", "standard_gw", "int8_cublas_fwd", "int8_cublas_bwd"),
}
MATMUL_RATE = {"fp8_fwd": "tflops", "fp8_bwd": "tflops", "int8_cublas_fwd": "tops", "int8_cublas_bwd": "tops"}


def quantize_bytes(shape) -> dict:
    M, K, N = shape.batch_size, shape.dim_in, shape.dim_out
    return {"fp8_quantize_x": 3 * M * K, "fp8_quantize_g": 3 * M * N, "fp8_quantize_w": 3 * N * K,
            "fp8_quantize_w_t": 3 * N * K}


def fp8_supported(ops) -> bool:
    import torch

    if ops.device != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    M, K = ops.x.shape
    N = ops.w.shape[0]
    # fp8 tensor cores from compute capability 8.9; _scaled_mm needs dims that are multiples of 16
    return torch.cuda.get_device_capability() >= (8, 9) and all(d % 16 == 0 for d in (M, K, N))


def int8_cublas_supported(ops) -> bool:
    import torch

    M, K = ops.x.shape
    N = ops.w.shape[0]
    # cuBLASLt int8 via torch._int_mm: M > 16 and K, N multiples of 8
    return ops.device == "cuda" and hasattr(torch, "_int_mm") and M > 16 and K % 8 == 0 and N % 8 == 0


def fp8_rowwise(t):
    """t [R, C] 16-bit -> (float8_e4m3fn [R, C], fp32 scales [R, 1]) with t ~ q * scale."""
    import torch

    scale = t.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (t / scale.to(t.dtype)).to(torch.float8_e4m3fn), scale


def _fp8_ops(ops) -> dict:
    """Quantized fp8 operands (made once, outside the timed region) and the two matmuls."""
    import torch

    xq, sx = fp8_rowwise(ops.x)
    gq, sg = fp8_rowwise(ops.g)
    wq, sw = fp8_rowwise(ops.w)  # [N, K], one scale per output feature (forward)
    wtq, swt = fp8_rowwise(ops.w.t().contiguous())  # [K, N], one scale per input feature (grad-input)
    mm = torch._scaled_mm
    return {
        "fp8_fwd": lambda: mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16),
        "fp8_bwd": lambda: mm(gq, wtq.t(), scale_a=sg, scale_b=swt.t(), out_dtype=torch.bfloat16),
    }


def _int8_cublas_ops(ops) -> dict:
    import torch

    inv = 1.0 / (127.0 * 127.0)

    def matmul(a, sa, b, sb):
        acc = torch._int_mm(a, b.t())  # [M, N'] int32; b [N', K'] row-major = column-major operand
        return (acc * sa[:, None]).mul_(sb[None, :] * inv).to(ops.dtype)

    q = ops.q
    return {
        "int8_cublas_fwd": lambda: matmul(*q["x"], *q["w_row"]),
        "int8_cublas_bwd": lambda: matmul(*q["g"], *q["w_col_t"]),
    }


def peer_outputs(ops, variants) -> dict:
    """name -> callable of the peers' matmuls (for errors as well as timing)."""
    out = {}
    if "fp8" in variants and fp8_supported(ops):
        out.update(_fp8_ops(ops))
    if "int8_cublas" in variants and int8_cublas_supported(ops):
        out.update(_int8_cublas_ops(ops))
    return out


def peer_components(ops, variants) -> dict:
    fns = peer_outputs(ops, variants)
    if "fp8_fwd" in fns:
        w = ops.w
        fns.update({"fp8_quantize_x": lambda: fp8_rowwise(ops.x), "fp8_quantize_g": lambda: fp8_rowwise(ops.g),
                    "fp8_quantize_w": lambda: fp8_rowwise(w),
                    "fp8_quantize_w_t": lambda: fp8_rowwise(w.t().contiguous())})
    return fns
