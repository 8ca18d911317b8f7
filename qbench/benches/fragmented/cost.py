"""Flop and byte counts of one forward, and the roofline fraction."""

from __future__ import annotations

from qbench.benches.fragmented.config import Case


def forward_cost(case: Case, selected: int | None) -> tuple[float, float]:
    """(useful flops, minimal HBM bytes) of one forward. Hard selection needs only the selected
    fragments' weights (`selected` distinct fragments) and 1/N of the expert flops per sample."""
    s, b, n = case.size, case.batch, max(case.fragments, 1)
    c, e = s // 32, {"fp32": 4, "bf16": 2, "fp16": 2}[case.dtype]
    io = b * 2 * s  # input and output elements
    if case.variant == "dense":
        flops, weights = 2 * b * s * s, s * s
    elif case.variant == "lowrank":
        flops, weights = 2 * b * 2 * s * c, 2 * s * c
    elif case.variant == "blockdiag":
        flops, weights = 2 * b * s * s / n, s * s / n
    elif case.task == "train":
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
