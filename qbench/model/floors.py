"""Roofline floors of qbench's own workloads: a GEMM, the SwitchBack components, the FragmentedLinear
layer and the MoE layer.

Each function returns {metric name: Floor}, keyed by the metric of a stored record that it explains.
Counts are minimal: useful flops, and HBM bytes with every operand read once and every output written
once (intermediates that a fused kernel could keep on chip are not counted), so a floor is a lower
bound and floor / measured <= 1 for a correct count. Sizes: M tokens, K in, N out; e = element bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from qbench.model.hardware import DTYPE_BYTES, Hardware, canonical_dtype
from qbench.model.roofline import Floor, analyze, collective_ms

SCALE_BYTES = 2  # a per-row scale stored in 16 bits at least (lower bound on what a quantizer writes)


def gemm(m: float, k: float, n: float, dtype: str, hw: Hardware, *, out_bytes: float | None = None) -> Floor:
    """C[m,n] = A[m,k] B[k,n]: 2mkn flops; A and B read once, C written once (an 8-bit GEMM writes at
    least a 16-bit result: int8 accumulates in int32, fp8 outputs bf16)."""
    e = DTYPE_BYTES[canonical_dtype(dtype)]
    out = (max(e, 2) if out_bytes is None else out_bytes)
    return analyze(2 * m * k * n, (m * k + k * n) * e + m * n * out, hw, dtype)


def combine(floors: list[Floor], hw: Hardware) -> Floor:
    """Kernels run one after another: floors and counts add; the bound is that of the largest part."""
    total = sum(f.floor_ms for f in floors)
    flops, moved = sum(f.flops for f in floors), sum(f.bytes_moved for f in floors)
    main = max(floors, key=lambda f: f.floor_ms)
    intensity = flops / moved if moved else math.inf
    return replace(main, flops=flops, bytes_moved=moved, intensity=intensity, floor_ms=total,
                   compute_ms=sum(f.compute_ms for f in floors), memory_ms=sum(f.memory_ms for f in floors))


def _stream(read: float, written: float, hw: Hardware, dtype: str = "fp16") -> Floor:
    """A memory-bound pass (quantize, cast): bytes only, its few flops per element are free."""
    return analyze(0, read + written, hw, dtype)


def switchback(params: Mapping, hw: Hardware) -> dict[str, Floor]:
    """Floors of the bitsandbytes SwitchBack benchmark keys (16-bit GEMMs, int8 GEMMs, quantizers)."""
    M, K, N = params["batch_size"], params["dim_in"], params["dim_out"]
    dt = params.get("dtype", "fp16")
    e = DTYPE_BYTES[canonical_dtype(dt)]
    f = {
        "standard_fwd": gemm(M, K, N, dt, hw),
        "standard_gx": gemm(M, N, K, dt, hw),
        "standard_gw": gemm(N, M, K, dt, hw),
    }
    int8_fwd = analyze(2 * M * K * N, M * K + N * K + M * N * e + (M + N) * SCALE_BYTES, hw, "int8")
    int8_bwd = analyze(2 * M * K * N, M * N + N * K + M * K * e + (M + N) * SCALE_BYTES, hw, "int8")
    f.update(rowwise_fwd=int8_fwd, global_fwd=int8_fwd, rowwise_bwd=int8_bwd, global_bwd=int8_bwd)
    for name, rows, cols in (("x", M, K), ("g", M, N), ("w", N, K)):
        f[f"{name}_quantize_rowwise"] = _stream(rows * cols * e, rows * cols + rows * SCALE_BYTES, hw)
        f[f"cast_{name}"] = _stream(rows * cols * e, rows * cols, hw)
    f["w_quantize_colwise_transpose"] = _stream(N * K * e, N * K + K * SCALE_BYTES, hw)
    f["w_quantize_global"] = _stream(N * K * e, N * K + SCALE_BYTES, hw)
    f["w_quantize_global_transpose"] = f["w_quantize_global"]
    f.update(_switchback_peers(M, K, N, e, hw))
    f["time_standard"] = combine([f["standard_fwd"], f["standard_gx"], f["standard_gw"]], hw)
    f["time_rowwise"] = combine([f[k] for k in ("x_quantize_rowwise", "g_quantize_rowwise",
                                                "w_quantize_colwise_transpose", "w_quantize_rowwise",
                                                "standard_gw", "rowwise_fwd", "rowwise_bwd")], hw)
    f["time_global"] = combine([f[k] for k in ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_global",
                                               "w_quantize_global_transpose", "standard_gw", "global_fwd",
                                               "global_bwd")], hw)
    f["time_fp8"] = combine([f[k] for k in ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w",
                                            "fp8_quantize_w_t", "standard_gw", "fp8_fwd", "fp8_bwd")], hw)
    f["time_fp8_cublas"] = combine([f[k] for k in ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w",
                                                   "fp8_quantize_w_t", "standard_gw", "fp8_cublas_fwd",
                                                   "fp8_cublas_bwd")], hw)
    f["time_int8_cublas"] = combine([f[k] for k in ("x_quantize_rowwise", "g_quantize_rowwise",
                                                    "w_quantize_rowwise", "w_quantize_colwise_transpose",
                                                    "standard_gw", "int8_cublas_fwd", "int8_cublas_bwd")], hw)
    f["module_linear_ms"] = f["time_standard"]  # forward + backward of nn.Linear: the three GEMMs
    f["module_switchback_ms"] = f["time_global"]
    return f


def switchback_record(params: Mapping, hw: Hardware) -> dict[str, Floor]:
    """The floors of a switchback record: a tidy record's (one variant, exec and timing) under its metrics'
    names, placed as qbench/migration/switchback.py places the seed keys; a record without a variant (a
    shape given by hand) keeps the seed keys."""
    from qbench.migration.switchback import WIDE

    wide = switchback(params, hw)
    if "variant" not in params:
        return wide
    where = (params["variant"], params.get("exec"), params.get("timing"))
    return {name: floor for key, floor in wide.items() for *place, name in WIDE.get(key, ()) if tuple(place) == where}


def _switchback_peers(M, K, N, e, hw: Hardware) -> dict[str, Floor]:
    """fp8 SwitchBack (16-bit output, from SwitchBack's kernels or torch._scaled_mm: the same bytes at the
    floor, the latter's cast of its bf16 output to fp16 being overhead) and cuBLAS int8 (torch._int_mm,
    int32 output)."""
    out = {
        "fp8_fwd": analyze(2 * M * K * N, M * K + N * K + M * N * 2 + (M + N) * SCALE_BYTES, hw, "fp8"),
        "fp8_bwd": analyze(2 * M * K * N, M * N + N * K + M * K * 2 + (M + N) * SCALE_BYTES, hw, "fp8"),
        "int8_cublas_fwd": analyze(2 * M * K * N, M * K + N * K + M * N * 4, hw, "int8"),
        "int8_cublas_bwd": analyze(2 * M * K * N, M * N + N * K + M * K * 4, hw, "int8"),
    }
    out["fp8_cublas_fwd"], out["fp8_cublas_bwd"] = out["fp8_fwd"], out["fp8_bwd"]
    for name, rows, cols in (("x", M, K), ("g", M, N), ("w", N, K), ("w_t", N, K)):
        out[f"fp8_quantize_{name}"] = _stream(rows * cols * e, rows * cols, hw)
    return out


def fragmented(params: Mapping, metrics: Mapping, hw: Hardware) -> dict[str, Floor]:
    """Floors of one FragmentedLinear-bench record (params variant, task, sizes): forward, backward alone, Adam
    step alone, and zero_grad + backward + step. Hard selection (tasks eval, inference) touches only the
    selected fragments."""
    B, n_in, n_out = params["batch_size"], params["in_features"], params["out_features"]
    variant, n, dt = params["variant"], max(int(params.get("fragments") or 1), 1), params["dtype"]
    e, c = DTYPE_BYTES[canonical_dtype(dt)], n_in // 32
    hard = params.get("task") in ("eval", "inference") and variant == "fragmented"
    used = max(1, min(int(metrics.get("selected_fragments") or 1), n)) if hard else n
    low = n_in * c + c * n_out  # the compressor / expander weights
    weights = {"dense": n_in * n_out, "blockdiag": n_in * n_out / n, "lowrank": low,
               "fragmented": used * n_in * n_out / n + low + n_in}[variant]
    flops_per_row = {"dense": n_in * n_out, "blockdiag": n_in * n_out / n, "lowrank": low,
                     "fragmented": (n_in * n_out / n if hard else n_in * n_out) + low + n_in}[variant]
    io = B * (n_in + n_out)
    fwd = analyze(2 * B * flops_per_row, (weights + io) * e, hw, dt)
    # backward: input and weight gradients (2x the forward flops); read weights, write their gradients
    bwd = analyze(4 * B * flops_per_row, (2 * weights + io + B * n_in) * e, hw, dt)
    n_params = metrics.get("parameters") or weights
    # Adam: read parameter, gradient and two moments, write parameter and both moments (7 passes)
    adam = analyze(0, 7 * min(n_params, weights) * e, hw, dt, launches=1)
    return {"forward_ms": fwd, "backward_ms": bwd, "optimizer_ms": adam,
            "backward_optimizer_ms": combine([bwd, adam], hw)}


def moe(params: Mapping, metrics: Mapping, hw: Hardware) -> dict[str, Floor]:
    """Floors of one MoE-bench record for the busiest rank (a step ends when the last rank does): gate
    GEMM, two expert GEMMs over the rows that rank computes, and the dispatch + combine all-to-alls, of
    which (n-1)/n leaves the rank. Rows come from the record's routing statistics when it has them
    (computed_rows over all ranks x rank_load_max_over_mean), else T x k (x the capacity factor when
    below 1). Overlapped (a2a_ffn_overlap_degree > 1): max of compute and network, else their sum."""
    n, dt = int(params["world_size"]), params["dtype"]
    d, h, T, k = params["model_dim"], params["hidden_size"], params["samples"], params["top_k"]
    experts = int(params["num_local_experts"])
    e = DTYPE_BYTES[canonical_dtype(dt)]
    cf = float(params.get("capacity_factor") or 0)
    if metrics.get("computed_rows"):
        rows = metrics["computed_rows"] / n * max(1.0, float(metrics.get("rank_load_max_over_mean") or 1.0))
    else:
        rows = T * k * (min(1.0, cf) if cf > 0 else 1.0)
    gate = gemm(T, d, experts * n, dt, hw)
    ffn = combine([analyze(2 * rows * d * h, (rows * d + rows * h + experts * d * h) * e, hw, dt)] * 2, hw)
    a2a = 2 * _transfer_ms(params, metrics, n, d * e, hw)  # dispatch + combine (AG + GA for blocks)
    overlap = int(params.get("a2a_ffn_overlap_degree") or 1) > 1
    compute = combine([gate, ffn], hw)
    fwd = _with_network(compute, a2a, overlap)
    # backward: input and weight gradients of each GEMM, twice the forward's flops and bytes
    bwd_compute = replace(compute, flops=2 * compute.flops, bytes_moved=2 * compute.bytes_moved,
                          compute_ms=2 * compute.compute_ms, memory_ms=2 * compute.memory_ms,
                          floor_ms=2 * compute.floor_ms)
    bwd = _with_network(bwd_compute, a2a, overlap)
    step = replace(fwd, floor_ms=fwd.floor_ms + bwd.floor_ms, flops=fwd.flops + bwd.flops,
                   bytes_moved=fwd.bytes_moved + bwd.bytes_moved)
    if params.get("eval"):  # forward only: the step is the forward
        step = fwd
    return {"forward_ms": fwd, "backward_ms": bwd, "step_ms": step}  # the moe records' metric names


def _transfer_ms(params: Mapping, metrics: Mapping, n: int, row_bytes: float, hw: Hardware) -> float:
    """One direction of the token exchange: an all-to-all of the rows one rank sends, of which (n-1)/n
    leave it; for --variant blocks only the busiest rank's remote rows cross NVLink (+ 5 us a call)."""
    if params.get("variant") == "blocks" and metrics.get("remote_rows") is not None:
        return metrics["remote_rows"] * row_bytes / hw.nvlink_bytes_per_s * 1e3 + 5e-3
    sent = metrics.get("sent_rows") or params["samples"] * params["top_k"]
    return collective_ms(sent * row_bytes, n, hw, kind="all_to_all")


def _with_network(compute: Floor, network_ms: float, overlap: bool) -> Floor:
    total = max(compute.floor_ms, network_ms) if overlap else compute.floor_ms + network_ms
    bound = "network" if network_ms > compute.floor_ms else compute.bound
    return replace(compute, floor_ms=total, bound=bound)


def for_record(record: Mapping, hw: Hardware) -> dict[str, Floor]:
    """The floors of a stored record whose workload the model knows ({} otherwise)."""
    bench, params, metrics = record.get("bench"), record.get("params", {}), record.get("metrics", {})
    if bench == "switchback":
        return switchback_record(params, hw)
    if bench == "fragmented":
        return fragmented(params, metrics, hw)
    if bench == "moe":
        return moe(params, metrics, hw)
    return {}
