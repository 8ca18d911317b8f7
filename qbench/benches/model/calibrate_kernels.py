"""`qbench model calibrate`, qbench's own kernels: the rates `qbench explain` predicts SwitchBack's kernels
from, beside cuBLAS's (calibrate.py), so that the int8 ceiling is the kernel's and not torch._int_mm's.

Measured with the qbench timer as kernels alone (L2 flushed, the GPU kept ahead of the host):
  matmul    kernel switchback, dtype int8 (int8_matmul_rowwise_global) and fp8 (fp8_matmul_rowwise_columnwise,
            where the GPU has fp8): X [n, n] x W [n, n]^T on operands quantized by qbench's own quantizers
  quantize  kernel quantize_rowwise (X [rows, cols] fp16 -> int8 + fp32 row scales), quantize_weight
            (quantize_global) and quantize_weight_t (quantize_global_transpose) at several sizes, so that
            `qbench explain` fits a fixed time and a rate per kind
  cast      kernel cast: fp32 -> fp16 (torch's elementwise copy), the 16-bit variant's casts
Each record's params: op, kernel, dtype, n (elements, or the square matmul size); metrics time_ms and
tflops / tops / gbps (bytes read + written), and the SM clock seen where NVML reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from qbench import store, units

SCALE_BYTES = 4  # one fp32 scale per row (rowwise) or per tensor (global)
# (rows, cols) of the quantized and cast tensors: 1 Mi, 16 Mi and 128 Mi elements on a GPU (the sizes of
# the reference runs' activations and weights)
GPU_STREAMS = ((1024, 1024), (4096, 4096), (16384, 8192))
CPU_STREAMS = ((16, 32), (32, 64))


def _record(params: dict, time, rate_name: str | None, rate: float | None, device: str, clock: dict) -> dict:
    metrics = {"time_ms": time.median, **({rate_name: rate} if rate_name else {}), **clock}
    unit = {"time_ms": units.MS, "tflops": units.TFLOPS, "tops": units.TOPS, "gbps": units.GBPS,
            "sm_clock_mhz": units.MHZ, "power_w": units.WATTS}
    return store.make_record("model", params, metrics, units={k: unit[k] for k in metrics},
                             samples={"time_ms": time.samples_ms}, device=device)


def _timed(fn: Callable[[], object], device: str, budget_ms: float) -> tuple[object, dict]:
    """(Timing, {sm_clock_mhz, power_w} medians over the timed rounds where NVML reads them)."""
    from qbench.telemetry import GpuReadings
    from qbench.timing import time_fn

    readings = GpuReadings(device)
    timing = time_fn(fn, device=device, budget_ms=budget_ms, gpu_only=True, observe=readings)
    seen = readings.metrics("calibrate")
    return timing, {k.removesuffix("_calibrate"): v for k, v in seen.items() if not k.startswith("throttle")}


def _products(torch, device: str, n: int) -> dict[str, Callable[[], object]]:
    """{dtype: call} of qbench's product of n x n operands quantized by its own quantizers."""
    from kernels.switchback_matmul import fp8_matmul_rowwise_columnwise, int8_matmul_rowwise_global
    from kernels.switchback_quantize import quantize_global, quantize_rowwise

    x, w = torch.randn(n, n, device=device, dtype=torch.float16), torch.randn(n, n, device=device, dtype=torch.float16)
    xq, sx = quantize_rowwise(x)
    wq, sw = quantize_global(w)
    out = {"int8": lambda: int8_matmul_rowwise_global(xq, sx, wq, sw)}
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
        x8, sx8 = quantize_rowwise(x, "e4m3")
        w8, sw8 = quantize_rowwise(w, "e4m3")
        out["fp8"] = lambda: fp8_matmul_rowwise_columnwise(x8, sx8, w8, sw8)
    return out


def matmuls(sizes: tuple[int, ...], device: str, budget_ms: float) -> Iterator[dict]:
    import torch

    for n in sizes:
        for dtype, call in _products(torch, device, n).items():
            params = {"workload": "calibrate", "op": "matmul", "kernel": "switchback", "dtype": dtype, "n": n}
            timing, clock = _timed(call, device, budget_ms)
            rate = "tops" if dtype == "int8" else "tflops"
            yield _record(params, timing, rate, 2 * n**3 / timing.median / 1e9, device, clock)


def _streams(torch, device: str, rows: int, cols: int) -> dict[str, tuple[Callable[[], object], float]]:
    """{kernel: (call, bytes read + written)} of the memory-bound passes on one [rows, cols] tensor."""
    from kernels.switchback_quantize import quantize_global, quantize_global_transpose, quantize_rowwise

    x = torch.randn(rows, cols, device=device, dtype=torch.float16)
    wide = torch.randn(rows, cols, device=device, dtype=torch.float32)
    n = rows * cols
    return {"quantize_rowwise": (lambda: quantize_rowwise(x), n * 3 + rows * SCALE_BYTES),
            "quantize_weight": (lambda: quantize_global(x), n * 3 + SCALE_BYTES),
            "quantize_weight_t": (lambda: quantize_global_transpose(x), n * 3 + SCALE_BYTES),
            "cast": (lambda: wide.to(torch.float16), n * 6)}


def streams(shapes: tuple[tuple[int, int], ...], device: str, budget_ms: float) -> Iterator[dict]:
    import torch

    for rows, cols in shapes:
        for kernel, (call, moved) in _streams(torch, device, rows, cols).items():
            op = "cast" if kernel == "cast" else "quantize"
            params = {"workload": "calibrate", "op": op, "kernel": kernel, "dtype": "fp16", "n": rows * cols}
            timing, clock = _timed(call, device, budget_ms)
            yield _record(params, timing, "gbps", moved / timing.median / 1e6, device, clock)


def measure(sizes: tuple[int, ...], device: str, budget_ms: float) -> Iterator[dict]:
    """Every own-kernel record: the products at `sizes`, the passes at the device's stream shapes."""
    yield from matmuls(sizes, device, budget_ms)
    yield from streams(GPU_STREAMS if device == "cuda" else CPU_STREAMS, device, budget_ms)
