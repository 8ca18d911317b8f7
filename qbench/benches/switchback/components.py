"""The timed components of `qbench switchback`: inputs, correctness gates, timing, derived numbers.

Shapes: X [M, K] (activations), G [M, N] (output gradient), W [N, K]; M = batch_size tokens,
K = dim_in, N = dim_out. All inputs are fresh N(0, 1) draws (W scaled by 1/sqrt(K)) quantized by
the real quantizers: never zeros, never `x.to(int8)` truncation (the casts are timed only as a
memory-bound reference, as in the original).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qbench.benches.switchback import peers
from qbench.dtypes import tolerance, torch_dtype

# The seed's totals, plus the peers' (each peer keeps the 16-bit grad-weight, as SwitchBack does).
TOTALS = {
    "time_standard": ("standard_fwd", "standard_gx", "standard_gw"),
    "time_rowwise": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_colwise_transpose",
                     "w_quantize_rowwise", "standard_gw", "rowwise_fwd", "rowwise_bwd"),
    "time_global": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_global",
                    "w_quantize_global_transpose", "standard_gw", "global_fwd", "global_bwd"),
    **peers.TOTALS,
}
SAMPLE_ROWS = 1024  # rows of X / G on which outputs are checked and errors measured (full W)


class OutOfMemory(RuntimeError):
    pass


@dataclass
class Operands:
    x: Any
    g: Any
    w: Any
    dtype: Any
    device: str
    q: dict  # name -> (int8 tensor, scales) made by the Triton quantizers

    @classmethod
    def make(cls, shape, config) -> Operands:
        import torch

        from kernels import switchback_quantize as sq

        dtype = torch_dtype(config.dtype)
        gen = torch.Generator(device=config.device).manual_seed(shape.batch_size + 7 * shape.dim_in + shape.dim_out)
        M, K, N = shape.batch_size, shape.dim_in, shape.dim_out

        def randn(*size, scale=1.0):
            return (torch.randn(size, generator=gen, device=config.device, dtype=torch.float32) * scale).to(dtype)

        try:
            x, g, w = randn(M, K), randn(M, N), randn(N, K, scale=K**-0.5)
            q = {"x": sq.quantize_rowwise(x), "g": sq.quantize_rowwise(g), "w_global": sq.quantize_global(w),
                 "w_global_t": sq.quantize_global_transpose(w), "w_row": sq.quantize_rowwise(w),
                 "w_col_t": sq.quantize_columnwise_transpose(w)}
        except torch.OutOfMemoryError as exc:
            raise OutOfMemory(f"out of GPU memory for M={M}, K={K}, N={N}") from exc
        return cls(x, g, w, dtype, config.device, q)


def memory_note(shape, config) -> str | None:
    """A reason to skip when the shape cannot fit on the GPU, else None."""
    if config.device != "cuda":
        return None
    import torch

    M, K, N = shape.batch_size, shape.dim_in, shape.dim_out
    # X, G, their int8 copies and 16-bit outputs, cuBLAS int8's int32 + fp32 epilogue, module grads,
    # the kernel chains' kept outputs (16-bit Y and dX of two chains, int8 X and G)
    need = M * (K + N) * 11 + M * max(K, N) * 12 + N * K * 24
    free, _ = torch.cuda.mem_get_info()
    if need > 0.9 * free:
        return f"needs about {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free: skipped"
    return None


def release() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def int8_matmuls(ops: Operands) -> dict:
    """name -> zero-argument callable of each int8 matmul (outputs in the activation dtype)."""
    from kernels import switchback_matmul as sm

    q, dt = ops.q, ops.dtype
    return {
        "global_fwd": lambda: sm.int8_matmul_rowwise_global(*q["x"], *q["w_global"], None, dt),
        "global_bwd": lambda: sm.int8_matmul_rowwise_global(*q["g"], *q["w_global_t"], None, dt),
        "rowwise_fwd": lambda: sm.int8_matmul_rowwise_columnwise(*q["x"], *q["w_row"], None, dt),
        "rowwise_bwd": lambda: sm.int8_matmul_rowwise_columnwise(*q["g"], *q["w_col_t"], None, dt),
    }


def components(ops: Operands, variants) -> dict:
    """Every timed key -> zero-argument callable."""
    import torch

    from kernels import switchback_quantize as sq

    x, g, w = ops.x, ops.g, ops.w
    fns = {
        "standard_fwd": lambda: torch.matmul(x, w.t()),
        "standard_gw": lambda: torch.matmul(g.t(), x),
        "standard_gx": lambda: torch.matmul(g, w),
        "x_quantize_rowwise": lambda: sq.quantize_rowwise(x),
        "g_quantize_rowwise": lambda: sq.quantize_rowwise(g),
        "w_quantize_rowwise": lambda: sq.quantize_rowwise(w),
        "w_quantize_colwise_transpose": lambda: sq.quantize_columnwise_transpose(w),
        "w_quantize_global": lambda: sq.quantize_global(w),
        "w_quantize_global_transpose": lambda: sq.quantize_global_transpose(w),
        "cast_x": lambda: x.to(torch.int8),
        "cast_g": lambda: g.to(torch.int8),
        "cast_w": lambda: w.to(torch.int8),
    }
    for name, fn in int8_matmuls(ops).items():
        if name.split("_")[0] in variants:
            fns[name] = fn
    fns.update(peers.peer_components(ops, variants))
    return fns


def _sample_rows(t):
    return t[: min(SAMPLE_ROWS, t.shape[0])]


def check(ops: Operands, variants) -> str | None:
    """Quantizers against their references, int8 matmuls against the worst-case bound; the first
    failure as text, or None."""
    from kernels import switchback_quantize as sq

    for name, src, key, rows in (("quantize_rowwise", ops.x, "x", True), ("quantize_rowwise", ops.g, "g", True),
                                 ("quantize_global", ops.w, "w_global", False),
                                 ("quantize_global_transpose", ops.w, "w_global_t", False),
                                 ("quantize_rowwise", ops.w, "w_row", False),
                                 ("quantize_columnwise_transpose", ops.w, "w_col_t", False)):
        want_q, want_s = getattr(sq, name + "_reference")(_sample_rows(src) if rows else src)
        got_q, got_s = ops.q[key]
        got_q, got_s = (_sample_rows(got_q), _sample_rows(got_s)) if rows else (got_q, got_s)
        if not (got_q.equal(want_q) and got_s.equal(want_s)):
            bad = int((got_q != want_q).sum())
            return f"{name} of {key}: {bad} values differ from the torch reference"
    for name, fn in int8_matmuls(ops).items():
        if name.split("_")[0] in variants:
            failure = _check_matmul(ops, name, _sample_rows(fn()))
            if failure:
                return failure
    return None


def _operands_of(ops: Operands, name: str):
    """(A rows [S, K'], B [N', K'], scales of A, scales of B) of an int8 matmul, on the sample rows."""
    a, sa = (ops.x, ops.q["x"][1]) if name.endswith("fwd") else (ops.g, ops.q["g"][1])
    b = ops.w if name.endswith("fwd") else ops.w.t()
    sb = ops.q[{"global_fwd": "w_global", "global_bwd": "w_global_t", "rowwise_fwd": "w_row",
                "rowwise_bwd": "w_col_t"}[name]][1]
    return _sample_rows(a), b, _sample_rows(sa), sb


def _check_matmul(ops: Operands, name: str, got) -> str | None:
    from kernels.switchback_matmul import quantization_error_bound

    a, b, sa, sb = _operands_of(ops, name)
    exact = a.float() @ b.float().t()
    import torch

    ulp = 2.0**-10 if ops.dtype == torch.float16 else 2.0**-7  # one unit in the last place of the output
    bound = quantization_error_bound(a, b, sa, sb) + ulp * exact.abs() + 1e-5  # + rounding to 16 bits
    bad = (got.float() - exact).abs() > bound
    if bad.any():
        i, j = bad.nonzero()[0].tolist()
        return f"{name}: {int(bad.sum())} outputs outside the quantization bound, first at ({i}, {j})"
    return None


def relative_errors(ops: Operands, variants) -> dict:
    """||C_int8 - C_16bit|| / ||C_16bit|| on the sample rows, for every int8 (and fp8) matmul."""
    import torch

    ref = {"fwd": _sample_rows(ops.x) @ ops.w.t(), "bwd": _sample_rows(ops.g) @ ops.w}
    out = {}
    outputs = {n: fn for n, fn in int8_matmuls(ops).items() if n.split("_")[0] in variants}
    outputs.update(peers.peer_outputs(ops, variants))
    if any(name.endswith("_gw") for name in outputs):
        ref["gw"] = _sample_rows(ops.g.t() @ ops.x)  # dW [N, K] sums over all M tokens
    for name, fn in outputs.items():
        want = ref[name.rsplit("_", 1)[1]].float()
        got = _sample_rows(fn()).float()
        out[f"relerr_{name}"] = (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()
    return out


def error_gate(relerrs: dict) -> str | None:
    """The first matmul whose relative error exceeds its format's bound (or is not finite), or None."""
    for name, err in relerrs.items():
        bound = tolerance("fp8" if "fp8" in name else "int8").vs_16bit
        if not err <= bound:
            return f"{name.removeprefix('relerr_')}: relative error {err:.3g} against 16-bit exceeds {bound}"
    return None


def time_all(ops: Operands, variants, *, repeat, budget_ms, observe=None) -> dict:
    """Timing per component, each timed alone (GPU-only); observe: see qbench.timing.time_fn."""
    from qbench.timing import time_fn

    return {name: time_fn(fn, device=ops.device, repeat=repeat, budget_ms=budget_ms, flush_l2=True,
                          gpu_only=True, observe=observe)
            for name, fn in components(ops, variants).items()}


def _flops(shape) -> float:
    return 2.0 * shape.batch_size * shape.dim_in * shape.dim_out


def _quantize_bytes(shape) -> dict:
    """Bytes each quantizer must move at least: read 16-bit once, write int8 once, write fp32 scales."""
    M, K, N = shape.batch_size, shape.dim_in, shape.dim_out
    return {"x_quantize_rowwise": 3 * M * K + 4 * M, "g_quantize_rowwise": 3 * M * N + 4 * M,
            "w_quantize_rowwise": 3 * N * K + 4 * N, "w_quantize_colwise_transpose": 3 * N * K + 4 * K,
            "w_quantize_global": 3 * N * K + 4, "w_quantize_global_transpose": 3 * N * K + 4,
            "cast_x": 3 * M * K, "cast_g": 3 * M * N, "cast_w": 3 * N * K}


MATMUL_RATE = {"standard_fwd": "tflops", "standard_gw": "tflops", "standard_gx": "tflops",
               "global_fwd": "tops", "global_bwd": "tops", "rowwise_fwd": "tops", "rowwise_bwd": "tops",
               **peers.MATMUL_RATE}


def throughputs(shape, medians: dict) -> dict:
    out = {}
    for key, rate in MATMUL_RATE.items():
        if medians.get(key):
            out[f"{key}_{rate}"] = _flops(shape) / (medians[key] * 1e-3) / 1e12
    for key, nbytes in {**_quantize_bytes(shape), **peers.quantize_bytes(shape)}.items():
        if medians.get(key):
            out[f"{key}_gbps"] = nbytes / (medians[key] * 1e-3) / 1e9
    return out


def roofline_fraction(shape, medians: dict, config) -> float | None:
    """Floor of the SwitchBack-global step (int8 matmuls at the int8 peak, grad-weight at the 16-bit
    peak, quantizers at HBM bandwidth) over its measured total; None without a known GPU preset."""
    from qbench.env import current_gpu_preset
    from qbench.model.roofline import floor_ms

    hw = current_gpu_preset(config.device)
    if hw is None or "time_global" not in medians:
        return None
    nbytes = _quantize_bytes(shape)
    floor = floor_ms(_flops(shape), 0, hw, config.dtype) + 2 * floor_ms(_flops(shape), 0, hw, "int8")
    floor += sum(floor_ms(0, nbytes[k], hw, "int8") for k in TOTALS["time_global"] if k in nbytes)
    return floor / medians["time_global"]
