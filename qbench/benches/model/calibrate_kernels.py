"""`qbench model calibrate`, qbench's own kernels: the rates `qbench explain` predicts SwitchBack's kernels
from, beside cuBLAS's (calibrate.py), so that the int8 ceiling is the kernel's and not torch._int_mm's.

Measured with the qbench timer as kernels alone (L2 flushed, the GPU kept ahead of the host):
  matmul    kernel switchback, dtype int8 (int8_matmul_rowwise_global) and fp8 (fp8_matmul_rowwise_columnwise,
            where the GPU has fp8): X [n, n] x W [n, n]^T on operands quantized by qbench's own quantizers
            and kernel cublas_rowwise, dtype fp8: torch._scaled_mm with a scale per row of X and of W, bf16 out
            (the fp8_cublas peer's products; cuBLAS's tensor-scaled rate is calibrate.py's fp8)
  quantize  kernel quantize_rowwise (X [rows, cols] fp16 -> int8 + fp32 row scales), quantize_weight
            (quantize_global) and quantize_weight_t (quantize_global_transpose) at several sizes, so that
            `qbench explain` fits a fixed time and a rate per kind
  cast      kernel cast_int8: fp16 -> int8 (`.to(torch.int8)`), the cast switchback times beside its kernels
  epilogue  kernel int8_epilogue: the int8_cublas peer's dequantizing torch passes (int32 -> fp16 with row and
            column scales: peers.dequantize_int32)
  grouped   kernels grouped (the grouped GEMM forward, kernels/grouped_gemm.py) and grouped_wgrad (its weight
            gradient with the bias gradient), dtype fp16, at the moe seed's expert shapes (both FFN products); and
            the FFN's activation passes gelu and gelu_backward (torch's, as the layer runs them)
  route     kernel moe_route: the MoE layer's routing launches (kernels/moe_route.choose_and_position with send
            rows, top-2) over fp16 logits [T, E] at a few token and expert counts
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


def _products(torch, device: str, n: int) -> dict[tuple[str, str], Callable[[], object]]:
    """{(kernel, dtype): call} of qbench's product of n x n operands quantized by its own quantizers, and of
    cuBLAS's rowwise-scaled fp8 product on the same fp8 operands."""
    from kernels.switchback_matmul import fp8_matmul_rowwise_columnwise, int8_matmul_rowwise_global
    from kernels.switchback_quantize import quantize_global, quantize_rowwise
    from qbench.benches.switchback.peers import scaled_mm_rowwise

    x, w = torch.randn(n, n, device=device, dtype=torch.float16), torch.randn(n, n, device=device, dtype=torch.float16)
    xq, sx = quantize_rowwise(x)
    wq, sw = quantize_global(w)
    out = {("switchback", "int8"): lambda: int8_matmul_rowwise_global(xq, sx, wq, sw)}
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
        x8, sx8 = quantize_rowwise(x, "e4m3")
        w8, sw8 = quantize_rowwise(w, "e4m3")
        out["switchback", "fp8"] = lambda: fp8_matmul_rowwise_columnwise(x8, sx8, w8, sw8)
        out["cublas_rowwise", "fp8"] = lambda: scaled_mm_rowwise(x8, sx8, w8, sw8, torch.bfloat16)
    return out


def matmuls(sizes: tuple[int, ...], device: str, budget_ms: float) -> Iterator[dict]:
    import torch

    for n in sizes:
        for (kernel, dtype), call in _products(torch, device, n).items():
            params = {"workload": "calibrate", "op": "matmul", "kernel": kernel, "dtype": dtype, "n": n}
            timing, clock = _timed(call, device, budget_ms)
            rate = "tops" if dtype == "int8" else "tflops"
            yield _record(params, timing, rate, 2 * n**3 / timing.median / 1e9, device, clock)


def _streams(torch, device: str, rows: int, cols: int) -> dict[str, tuple[Callable[[], object], float]]:
    """{kernel: (call, bytes read + written)} of the memory-bound passes on one [rows, cols] tensor."""
    from kernels.switchback_quantize import quantize_global, quantize_global_transpose, quantize_rowwise
    from qbench.benches.switchback.peers import dequantize_int32

    x = torch.randn(rows, cols, device=device, dtype=torch.float16)
    acc = torch.randint(-2**20, 2**20, (rows, cols), device=device, dtype=torch.int32)
    sa, sb = torch.rand(rows, device=device) + 0.5, torch.rand(cols, device=device) + 0.5
    n = rows * cols
    return {"quantize_rowwise": (lambda: quantize_rowwise(x), n * 3 + rows * SCALE_BYTES),
            "quantize_weight": (lambda: quantize_global(x), n * 3 + SCALE_BYTES),
            "quantize_weight_t": (lambda: quantize_global_transpose(x), n * 3 + SCALE_BYTES),
            "cast_int8": (lambda: x.to(torch.int8), n * 3),
            "int8_epilogue": (lambda: dequantize_int32(acc, sa, sb, torch.float16), n * 22)}


STREAM_OPS = {"cast_int8": "cast", "int8_epilogue": "epilogue"}  # kernel -> op (the rest: quantize)


def streams(shapes: tuple[tuple[int, int], ...], device: str, budget_ms: float) -> Iterator[dict]:
    import torch

    for rows, cols in shapes:
        for kernel, (call, moved) in _streams(torch, device, rows, cols).items():
            op = STREAM_OPS.get(kernel, "quantize")
            params = {"workload": "calibrate", "op": op, "kernel": kernel, "dtype": "fp16", "n": rows * cols}
            timing, clock = _timed(call, device, budget_ms)
            yield _record(params, timing, "gbps", moved / timing.median / 1e6, device, clock)


# (tokens, experts) of the routing calibration: the moe seed config's 8 experts per rank at world size 1 and 4,
# and four times its tokens, so that a fixed time and a rate are fitted
GPU_ROUTES = ((8192, 8), (8192, 32), (32768, 32))
CPU_ROUTES = ((64, 4), (128, 8))
ROUTE_K = 2


def routes(shapes: tuple[tuple[int, int], ...], device: str, budget_ms: float) -> Iterator[dict]:
    """The MoE routing launches (dropless, with send rows: what the layer runs at world size 1) per shape."""
    import torch

    from kernels.moe_route import choose_and_position, io_bytes

    for tokens, experts in shapes:
        logits = torch.randn(tokens, experts, device=device, dtype=torch.float16)
        timing, clock = _timed(lambda t=logits: choose_and_position(t, ROUTE_K, None, False, rows=True), device,
                               budget_ms)
        params = {"workload": "calibrate", "op": "route", "kernel": "moe_route", "dtype": "fp16",
                  "n": tokens * experts, "tokens": tokens, "experts": experts}
        moved = io_bytes(tokens, experts, ROUTE_K, 2)
        yield _record(params, timing, "gbps", moved / timing.median / 1e6, device, clock)


# (rows, model dim, hidden size, groups) of the expert FFN: the moe seed config's 16384 rows (8192 tokens, top-2)
# over 8 experts, d 1024, h 4096
GPU_EXPERTS = (16384, 1024, 4096, 8)
CPU_EXPERTS = (64, 32, 64, 2)


def experts(shape: tuple[int, int, int, int], device: str, budget_ms: float) -> Iterator[dict]:
    """The expert FFN's grouped products (up: d -> h, down: h -> d; the weight gradient of each) and its
    activation passes, on rows split evenly over the groups."""
    import torch

    from kernels.grouped_gemm import grouped_matmul_forward, grouped_wgrad_bias

    rows, d, h, groups = shape
    offsets = torch.arange(groups + 1, device=device) * (rows // groups)
    x, act = (torch.randn(rows, n, device=device, dtype=torch.float16) for n in (d, h))
    w_up, w_down = (torch.randn(groups, a, b, device=device, dtype=torch.float16) / a**0.5 for a, b in ((d, h), (h, d)))
    flops = 2 * rows * d * h
    calls = {("grouped", "up"): lambda: grouped_matmul_forward(x, w_up, offsets, backend="triton"),
             ("grouped", "down"): lambda: grouped_matmul_forward(act, w_down, offsets, backend="triton"),
             ("grouped_wgrad", "up"): lambda: grouped_wgrad_bias(x, act, offsets, groups, backend="triton"),
             ("grouped_wgrad", "down"): lambda: grouped_wgrad_bias(act, x, offsets, groups, backend="triton")}
    for (kernel, product), call in calls.items():
        params = {"workload": "calibrate", "op": "matmul", "kernel": kernel, "dtype": "fp16", "n": rows,
                  "product": product, "model_dim": d, "hidden_size": h, "groups": groups}
        timing, clock = _timed(call, device, budget_ms)
        yield _record(params, timing, "tflops", flops / timing.median / 1e9, device, clock)
    out = torch.empty_like(act)
    passes = {"gelu": (lambda: torch.ops.aten.gelu.out(act, out=out), 2 * act.numel() * 2),
              "gelu_backward": (lambda: torch.ops.aten.gelu_backward.grad_input(act, act, grad_input=out),
                                3 * act.numel() * 2)}
    for kernel, (call, moved) in passes.items():
        params = {"workload": "calibrate", "op": "activation", "kernel": kernel, "dtype": "fp16", "n": act.numel()}
        timing, clock = _timed(call, device, budget_ms)
        yield _record(params, timing, "gbps", moved / timing.median / 1e6, device, clock)


def measure(sizes: tuple[int, ...], device: str, budget_ms: float) -> Iterator[dict]:
    """Every own-kernel record: the products at `sizes`, the passes, the routing and the expert FFN at the
    device's shapes."""
    gpu = device == "cuda"
    yield from matmuls(sizes, device, budget_ms)
    yield from streams(GPU_STREAMS if gpu else CPU_STREAMS, device, budget_ms)
    yield from routes(GPU_ROUTES if gpu else CPU_ROUTES, device, budget_ms)
    yield from experts(GPU_EXPERTS if gpu else CPU_EXPERTS, device, budget_ms)
