"""Flop and byte counts of one forward, the roofline fraction, and the units of every metric."""

from __future__ import annotations

from qbench import units
from qbench.benches.fragmented.config import Case


def forward_cost(case: Case, selected: int | None) -> tuple[float, float]:
    """(useful flops, minimal HBM bytes) of one forward. Hard selection needs only the selected
    fragments' weights (`selected` distinct fragments) and 1/N of the expert flops per sample."""
    s, b, n = case.size, case.batch, max(case.fragments, 1)
    c, e = s // 32, {"fp32": 4, "bf16": 2, "fp16": 2}[case.dtype]
    io = b * 2 * s  # input and output elements
    if case.layer == "linear":
        flops, weights = 2 * b * s * s, s * s
    elif case.layer == "lowrank":
        flops, weights = 2 * b * 2 * s * c, 2 * s * c
    elif case.layer == "blockdiag":
        flops, weights = 2 * b * s * s / n, s * s / n
    elif case.mode == "train":
        flops, weights = 2 * b * (s * s + 2 * s * c + s), s * s + 2 * s * c + s
    else:
        used = selected if selected is not None else min(b, n)
        flops, weights = 2 * b * (s * s / n + 2 * s * c + s), used * s * s / n + 2 * s * c + s
    return flops, (weights + io) * e


def roofline(flops: float, moved: float, dtype: str, forward_ms: float, device: str) -> float | None:
    from qbench.env import current_gpu_preset
    from qbench.model.roofline import floor_ms, roofline_fraction

    hardware = current_gpu_preset(device)
    if hardware is None or not forward_ms:
        return None
    return roofline_fraction(floor_ms(flops, moved, hardware, dtype), forward_ms)


UNITS = {"forward_ms": units.MS, "backward_ms": units.MS, "optimizer_ms": units.MS,
         "backward_optimizer_ms": units.MS, "forward_graph_ms": units.MS, "peak_memory_mb": units.MB,
         "param_memory_mb": units.MB, "optimizer_state_mb": units.MB, "parameters": units.COUNT,
         "tflops": units.TFLOPS, "graph_tflops": units.TFLOPS,
         "roofline_fraction": units.FRACTION_OF_ROOFLINE, "selected_fragments": units.COUNT,
         "rel_error_train": units.REL_ERROR, "rel_error_eval": units.REL_ERROR,
         "rel_error_inference": units.REL_ERROR, "step_ms": units.MS, "fwd_bwd_ms": units.MS,
         "host_step_ms": units.MS, "host_fwd_bwd_ms": units.MS, "host_forward_ms": units.MS}
