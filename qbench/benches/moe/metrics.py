"""The measured values of one `qbench moe` measurement from its per-step samples and routing statistics,
under the timing code's names (qbench/migration/moe.py turns them into tidy records with declared units).

Times in ms (median over steps of the max over ranks); tflops by the seeds' formula, tflops_full
over the rows actually computed; floor_ms and roofline_fraction from the performance model.
"""

from __future__ import annotations

import statistics
from typing import Any

from qbench.benches.moe.cases import Case, params_of
from qbench.benches.moe.config import MoEBenchConfig


def seed_flops(config: MoEBenchConfig) -> float:
    """The seeds' count per GPU and step: samples * d * h * 4 * k * 3 (1 instead of 3 in eval)."""
    passes = 1 if config.eval else 3
    return config.samples * config.model_dim * config.hidden_size * 4 * config.top_k * passes


def full_flops(config: MoEBenchConfig, stats: dict, world_size: int, num_experts: int) -> float:
    """Rows actually computed (padding included, drops excluded) per GPU, plus the gate."""
    passes = 1 if config.eval else 3
    rows = stats["computed_rows"] / world_size
    experts = rows * config.model_dim * config.hidden_size * 4
    gate = config.samples * config.model_dim * num_experts * 2
    return (experts + gate) * passes


def experts_tflops(config: MoEBenchConfig, stats: dict, world_size: int, metrics: dict) -> float | None:
    """The expert FFN's throughput: two GEMMs of rows x d x h (2 flop per multiply-add) forward, and
    twice that backward (input and weight gradients), over experts_time (+ backward_experts_time) --
    rows the mean per rank of the rows computed, padding included. None without those phase times."""
    forward, backward = metrics.get("experts_time"), metrics.get("backward_experts_time")
    if forward is None or (backward is None and not config.eval):
        return None
    rows = stats["computed_rows"] / world_size
    flops = rows * config.model_dim * config.hidden_size * 4 * (1 if config.eval else 3)
    return flops / ((forward + (0.0 if config.eval else backward)) * 1e-3) / 1e12


def summarize(config, case: Case, world_size, samples, stats, memory, device) -> dict[str, Any]:
    """The medians of the samples, throughputs, routing and block statistics and the floor of one measurement."""
    metrics: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items() if v}
    step = metrics["step_time"]
    E = case.num_local_experts * world_size
    metrics["tflops"] = seed_flops(config) / (step * 1e-3) / 1e12
    metrics["tflops_full"] = full_flops(config, stats, world_size, E) / (step * 1e-3) / 1e12
    if "loop_step_time" in metrics:  # the seeds' formula over the step in a loop
        metrics["loop_tflops"] = seed_flops(config) / (metrics["loop_step_time"] * 1e-3) / 1e12
    ffn = experts_tflops(config, stats, world_size, metrics)
    if ffn is not None:
        metrics["experts_tflops"] = ffn
    metrics.update(stats)
    if memory is not None:
        metrics["peak_memory_mb"] = memory
    floor = floor_ms(params_of(config, case, world_size), stats, device)
    if floor is not None:
        metrics["floor_ms"] = floor
        metrics["roofline_fraction"] = floor / step
    return metrics


def floor_ms(params: dict, stats: dict, device: str) -> float | None:
    """Floor of one step (forward only in eval) for the busiest rank, by the performance model's
    MoE floor (qbench/model/floors.py: gate and expert GEMMs at peak compute or memory, plus the token
    exchange over NVLink); None off CUDA or on a GPU without a hardware preset."""
    from qbench.env import current_gpu_preset
    from qbench.model.floors import moe as moe_floors

    hardware = current_gpu_preset(device)
    if hardware is None:
        return None
    return moe_floors(params, stats, hardware)["step_ms"].floor_ms
