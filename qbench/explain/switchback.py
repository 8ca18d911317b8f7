"""Predictions of `qbench switchback` records: each component kernel (timing per_kernel), their sum, and
the layer's whole step (per_step, loop; eager waits on the host where issuing takes longer).

Shapes: X [M, K], W [N, K], G [M, N] with M = batch_size, K = dim_in, N = dim_out; e bytes per 16-bit
element. Which kernels a variant runs is fixed by the variant (never read off the record's metrics).
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.model.predict import Prediction, Rates, chain, matmul, stream, with_host

SCALE = 4  # bytes of one fp32 scale a quantizer writes per row or column

# variant -> (kind of fwd and bwd, kind of gw, cuBLAS fallback of the 8-bit kind, quantizers timed)
_ROWWISE = ("quantize_x", "quantize_g", "quantize_w", "quantize_w_t")
VARIANTS = {
    "16bit": (None, None, None, ()),
    "switchback": ("switchback_int8", None, "int8", _ROWWISE),
    "switchback_rowwise": ("switchback_int8", None, "int8", _ROWWISE),
    "int8_cublas": ("int8", None, "int8", _ROWWISE),
    "fp8": ("switchback_fp8", None, "fp8", _ROWWISE),
    "fp8_all": ("switchback_fp8", "switchback_fp8", "fp8", (*_ROWWISE, "quantize_g_t", "quantize_x_t")),
    "fp8_cublas": ("cublas_rowwise_fp8", None, "fp8", _ROWWISE),
    "torchao": ("fp8", "fp8", "fp8", ("quantize_x", "quantize_g", "quantize_w", "quantize_x_t", "quantize_g_t")),
}


# the calibrated pass each quantizer is predicted from: the passes that write their input transposed (W^T, and
# fp8's per-feature G^T and X^T) the transposing one; W itself the global weight quantizer where the variant
# scales W globally (SwitchBack), else rowwise like X and G
TRANSPOSING = {"quantize_w_t": "quantize_weight_t", "quantize_g_t": "quantize_weight_t",
               "quantize_x_t": "quantize_weight_t"}
GLOBAL_W = ("switchback",)


def _sizes(params: Mapping) -> tuple[int, int, int, int]:
    e = 4 if params.get("dtype") == "fp32" else 2
    return int(params["batch_size"]), int(params["dim_in"]), int(params["dim_out"]), e


def components(params: Mapping, rates: Rates, clock_mhz: float | None) -> dict[str, Prediction]:
    """{component metric: Prediction} of the kernels the record's variant runs (fwd, bwd or gx, gw, its
    quantizers; the 16-bit variant also its int8 casts, timed beside but not in its step)."""
    M, K, N, e = _sizes(params)
    dtype = params.get("dtype", "fp16")
    low, gw_kind, cublas, quantizers = VARIANTS[params["variant"]]
    if low is None:
        out = {"fwd_ms": matmul(M, K, N, dtype, rates, clock_mhz, in_bytes=e, out_bytes=e, cublas=dtype),
               "gx_ms": matmul(M, N, K, dtype, rates, clock_mhz, in_bytes=e, out_bytes=e, cublas=dtype)}
    elif params["variant"] == "int8_cublas":
        out = {"fwd_ms": _int_mm(M, K, N, e, rates, clock_mhz), "bwd_ms": _int_mm(M, N, K, e, rates, clock_mhz)}
    elif params["variant"] == "fp8_cublas":
        out = {"fwd_ms": _scaled_mm(M, K, N, dtype, rates, clock_mhz),
               "bwd_ms": _scaled_mm(M, N, K, dtype, rates, clock_mhz)}
    else:
        out = {"fwd_ms": matmul(M, K, N, low, rates, clock_mhz, in_bytes=1, out_bytes=e, cublas=cublas),
               "bwd_ms": matmul(M, N, K, low, rates, clock_mhz, in_bytes=1, out_bytes=e, cublas=cublas)}
    gw_in = 1 if gw_kind else e
    out["gw_ms"] = matmul(N, M, K, gw_kind or dtype, rates, clock_mhz, in_bytes=gw_in, out_bytes=e,
                          cublas=cublas if gw_kind else dtype)
    shapes = {"x": (M, K), "g": (M, N), "w": (N, K), "w_t": (N, K), "g_t": (N, M), "x_t": (K, M)}
    for name in quantizers:
        rows, cols = shapes[name.removeprefix("quantize_")]
        kind = TRANSPOSING.get(name, "quantize_rowwise")
        if name == "quantize_w" and params["variant"] in GLOBAL_W:
            kind = "quantize_weight"
        out[f"{name}_ms"] = stream(rows * cols * (e + 1) + rows * SCALE, kind, rates)
    return out


def _int_mm(m: int, k: int, n: int, e: int, rates: Rates, clock_mhz: float | None) -> Prediction:
    """int8_cublas's product: torch._int_mm writing int32 [m, n], then its dequantizing epilogue as three torch
    passes (int32 x row scale -> fp32, x column scale in place, -> the layer dtype: 8 + 8 + 4 + e bytes) at
    the calibrated rate of those passes (int8_epilogue; the copy rate where the calibration has none)."""
    return chain({"int_mm": matmul(m, k, n, "int8", rates, clock_mhz, in_bytes=1, out_bytes=4, cublas="int8"),
                  "epilogue": stream(m * n * (20 + e), "int8_epilogue", rates)})


def _scaled_mm(m: int, k: int, n: int, dtype: str, rates: Rates, clock_mhz: float | None) -> Prediction:
    """fp8_cublas's product: torch._scaled_mm with rowwise scales (calibrated as cublas_rowwise_fp8; cuBLAS's
    tensor-scaled fp8 rate where the calibration has none) writing bf16 [m, n], then, for a layer of another
    dtype, its cast (read 2, write the layer's bytes per element)."""
    product = matmul(m, k, n, "cublas_rowwise_fp8", rates, clock_mhz, in_bytes=1, out_bytes=2, cublas="fp8")
    if dtype == "bf16":
        return product
    return chain({"scaled_mm": product, "cast": stream(m * n * (2 + (4 if dtype == "fp32" else 2)), "copy", rates)})


def casts(params: Mapping, rates: Rates) -> dict[str, Prediction]:
    """The `.to(torch.int8)` casts of X, G and W the 16-bit variant times beside its products (read e, write 1
    byte), at the calibrated rate of that cast (cast_int8; the copy rate where the calibration has none)."""
    M, K, N, e = _sizes(params)
    return {f"cast_{n}_ms": stream(r * c * (e + 1), "cast_int8", rates) for n, (r, c) in
            {"x": (M, K), "g": (M, N), "w": (N, K)}.items()}


def step(params: Mapping, rates: Rates, clock_mhz: float | None) -> Prediction:
    """The layer's forward + backward on the GPU: its kernels one after another plus the bias gradient
    (a reduction of G over its M rows)."""
    M, _, N, e = _sizes(params)
    parts = components(params, rates, clock_mhz)
    parts["bias_grad"] = stream(M * N * e + N * e, "copy", rates)
    return chain(parts)


def predict(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    """{metric: Prediction} of one switchback record; the eager step's host time is the record's own
    host_ms (what issuing costs, measured apart from the step's time)."""
    params, metrics = record["params"], record["metrics"]
    clock = metrics.get("sm_clock_mhz")
    if params.get("variant") not in VARIANTS:
        return {}
    if params.get("timing") == "per_kernel":
        out = components(params, rates, clock)
        out["kernels_ms"] = chain(dict(out))
        if params["variant"] == "16bit":
            out.update(casts(params, rates))
        return out
    gpu = step(params, rates, clock)
    out = {"chain_ms": chain(components(params, rates, clock))}
    host = metrics.get("host_ms") if params.get("exec") == "eager" else None
    out["step_ms"] = with_host(gpu, host)
    return out
