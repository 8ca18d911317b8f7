"""Peers of SwitchBack in the same run.

- fp8 ("fp8", SwitchBack's layout): forward and grad-input in fp8 with rowwise scales (one per row of
  A and one per output column), on the fp8 form of SwitchBack's own matmul kernels (the int8 path's
  tiles and fused epilogue, fp32 accumulation; kernels/switchback_matmul.py), grad-weight in 16-bit.
  Quantized by the same fused kernels as int8 (kernels/switchback_quantize.py): X and W rowwise in
  e4m3, G rowwise in e5m2, W columnwise-and-transposed in e4m3 for the grad-input.
- fp8 everywhere ("fp8_all", the rowwise recipe of current fp8 training): the same plus grad-weight
  in fp8, dW = (G^T)q (X^T)q with G^T and X^T quantized per output / input feature over the tokens.
- fp8 through the vendor library ("fp8_cublas"): fp8's operands and layout, its two products through
  torch._scaled_mm with rowwise scales (cuBLASLt / CUTLASS; that mode writes bf16, cast to an fp16
  layer's dtype after it): the library path fp8 training recipes call.
- cuBLAS int8: torch._int_mm (int8 x int8 -> int32) on SwitchBack's vectorwise operands, then the
  dequantizing epilogue as separate torch ops (cuBLAS has no fused rowwise-scale epilogue here).
Each peer is skipped (absent from the record) where the GPU or the shape does not support it.
"""

from __future__ import annotations

TOTALS = {
    "time_fp8": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "standard_gw",
                 "fp8_fwd", "fp8_bwd"),
    "time_fp8_all": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "fp8_quantize_g_t",
                     "fp8_quantize_x_t", "fp8_fwd", "fp8_bwd", "fp8_gw"),
    "time_fp8_cublas": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "standard_gw",
                        "fp8_cublas_fwd", "fp8_cublas_bwd"),
    "time_int8_cublas": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise",
                         "w_quantize_colwise_transpose", "standard_gw", "int8_cublas_fwd", "int8_cublas_bwd"),
}
MATMUL_RATE = {"fp8_fwd": "tflops", "fp8_bwd": "tflops", "fp8_gw": "tflops", "fp8_cublas_fwd": "tflops",
               "fp8_cublas_bwd": "tflops", "int8_cublas_fwd": "tops",
               "int8_cublas_bwd": "tops"}
# each fp8 quantizer next to the int8 quantizer of the same shape and layout (the fairness check)
INT8_TWIN = {"fp8_quantize_x": "x_quantize_rowwise", "fp8_quantize_g": "g_quantize_rowwise",
             "fp8_quantize_w": "w_quantize_rowwise", "fp8_quantize_w_t": "w_quantize_colwise_transpose"}


def twin_ratios(medians: dict) -> dict:
    """<fp8 quantizer>_over_int8: its time over its int8 twin's (the fairness check: 1.1 is 10% slower)."""
    return {f"{fp8}_over_int8": medians[fp8] / medians[int8] for fp8, int8 in INT8_TWIN.items()
            if medians.get(fp8) and medians.get(int8)}


def quantize_bytes(shape) -> dict:
    M, K, N = shape.batch_size, shape.dim_in, shape.dim_out
    return {"fp8_quantize_x": 3 * M * K + 4 * M, "fp8_quantize_g": 3 * M * N + 4 * M,
            "fp8_quantize_w": 3 * N * K + 4 * N, "fp8_quantize_w_t": 3 * N * K + 4 * K,
            "fp8_quantize_g_t": 3 * M * N + 4 * N, "fp8_quantize_x_t": 3 * M * K + 4 * K}


def fp8_supported(ops) -> bool:
    """fp8 tensor cores: compute capability 8.9 or newer."""
    import torch

    return ops.device == "cuda" and torch.cuda.get_device_capability() >= (8, 9)


def fp8_cublas_supported(ops) -> bool:
    """torch._scaled_mm on fp8 tensor cores; it needs dims that are multiples of 16."""
    import torch

    M, K = ops.x.shape
    N = ops.w.shape[0]
    return fp8_supported(ops) and hasattr(torch, "_scaled_mm") and all(d % 16 == 0 for d in (M, K, N))


def int8_cublas_supported(ops) -> bool:
    import torch

    M, K = ops.x.shape
    N = ops.w.shape[0]
    # cuBLASLt int8 via torch._int_mm: M > 16 and K, N multiples of 8
    return ops.device == "cuda" and hasattr(torch, "_int_mm") and M > 16 and K % 8 == 0 and N % 8 == 0


def _fp8_quantized(ops, grad_weight: bool) -> dict:
    """name -> (fp8 tensor, scales) of the fp8 operands, made once by the fused kernels; G^T and X^T
    ([N, M], [K, M]: two more activation-sized buffers) only for fp8_all's grad-weight product."""
    from kernels import switchback_quantize as sq

    q = {"x": sq.quantize_rowwise(ops.x, "e4m3"), "g": sq.quantize_rowwise(ops.g, "e5m2"),
         "w": sq.quantize_rowwise(ops.w, "e4m3"), "w_t": sq.quantize_columnwise_transpose(ops.w, "e4m3")}
    if grad_weight:
        q.update(g_t=sq.quantize_columnwise_transpose(ops.g, "e5m2"),
                 x_t=sq.quantize_columnwise_transpose(ops.x, "e4m3"))
    return q


def _fp8_ops(ops, variants, q: dict) -> dict:
    """The fp8 matmuls on operands quantized once (q), outside the timed region."""
    from kernels.switchback_matmul import fp8_matmul_rowwise_columnwise as mm

    dt = ops.dtype
    fns = {"fp8_fwd": lambda: mm(*q["x"], *q["w"], None, dt),  # Y = X W^T  [M, N]
           "fp8_bwd": lambda: mm(*q["g"], *q["w_t"], None, dt)}  # dX = G W  [M, K]
    if "fp8_all" in variants:
        fns["fp8_gw"] = lambda: mm(*q["g_t"], *q["x_t"], None, dt)  # dW = G^T X  [N, K]
    return fns


def scaled_mm_rowwise(a, sa, b, sb, out_dtype):
    """torch._scaled_mm of A [M, K] fp8 (multipliers sa [M]) and B [N, K]^T fp8 (multipliers sb [N]): bf16
    out (what its rowwise mode writes), cast to out_dtype."""
    import torch

    y = torch._scaled_mm(a, b.t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16)
    return y if out_dtype == torch.bfloat16 else y.to(out_dtype)


def _fp8_cublas_ops(ops, q: dict) -> dict:
    dt = ops.dtype
    return {"fp8_cublas_fwd": lambda: scaled_mm_rowwise(*q["x"], *q["w"], dt),
            "fp8_cublas_bwd": lambda: scaled_mm_rowwise(*q["g"], *q["w_t"], dt)}


INT8_SCALE = 1.0 / (127.0 * 127.0)  # both operands' scales are max/127 multipliers


def dequantize_int32(acc, sa, sb, out_dtype):
    """The int8 peer's epilogue as torch ops: int32 products [M, N] x row scales sa [M] x column scales sb [N]
    -> out_dtype (three passes: 4 + 4, 4 + 4 and 4 + 2 bytes per element read + written, 16-bit out)."""
    return (acc * sa[:, None]).mul_(sb[None, :] * INT8_SCALE).to(out_dtype)


def _int8_cublas_ops(ops) -> dict:
    import torch

    def matmul(a, sa, b, sb):
        acc = torch._int_mm(a, b.t())  # [M, N'] int32; b [N', K'] row-major = column-major operand
        return dequantize_int32(acc, sa, sb, ops.dtype)

    q = ops.q
    return {
        "int8_cublas_fwd": lambda: matmul(*q["x"], *q["w_row"]),
        "int8_cublas_bwd": lambda: matmul(*q["g"], *q["w_col_t"]),
    }


def peer_outputs(ops, variants) -> dict:
    """name -> callable of the peers' matmuls (for errors as well as timing)."""
    out = {}
    fp8 = ("fp8" in variants or "fp8_all" in variants) and fp8_supported(ops)
    cublas = "fp8_cublas" in variants and fp8_cublas_supported(ops)
    q = _fp8_quantized(ops, grad_weight=fp8 and "fp8_all" in variants) if fp8 or cublas else None
    if fp8:
        out.update(_fp8_ops(ops, variants, q))
    if cublas:
        out.update(_fp8_cublas_ops(ops, q))
    if "int8_cublas" in variants and int8_cublas_supported(ops):
        out.update(_int8_cublas_ops(ops))
    return out


def peer_components(ops, variants) -> dict:
    fns = peer_outputs(ops, variants)
    if "fp8_fwd" in fns or "fp8_cublas_fwd" in fns:
        from kernels import switchback_quantize as sq

        x, g, w = ops.x, ops.g, ops.w
        fns.update({"fp8_quantize_x": lambda: sq.quantize_rowwise(x, "e4m3"),
                    "fp8_quantize_g": lambda: sq.quantize_rowwise(g, "e5m2"),
                    "fp8_quantize_w": lambda: sq.quantize_rowwise(w, "e4m3"),
                    "fp8_quantize_w_t": lambda: sq.quantize_columnwise_transpose(w, "e4m3")})
        if "fp8_gw" in fns:
            fns.update({"fp8_quantize_g_t": lambda: sq.quantize_columnwise_transpose(g, "e5m2"),
                        "fp8_quantize_x_t": lambda: sq.quantize_columnwise_transpose(x, "e4m3")})
    return fns
