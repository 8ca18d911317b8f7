"""Roofline floors: the fastest a kernel could run on a device, and how close a measurement came.

floor = max(flops / peak[dtype], bytes / HBM bandwidth) + launches x launch overhead   (seconds)
fraction of roofline = floor / measured, in (0, 1] for a correct flop and byte count; a value above 1
means the count is wrong or the data sat in cache.

Times here are in milliseconds (qbench's unit for measured kernels). No torch import.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from qbench.model.hardware import Hardware, canonical_dtype


@dataclass(frozen=True)
class Floor:
    """Roofline analysis of one workload on one device."""

    flops: float  # floating-point (or integer) operations
    bytes_moved: float  # HBM bytes read + written
    intensity: float  # flops / byte
    ridge: float  # peak / bandwidth: the intensity above which the workload is compute-bound
    bound: str  # "compute", "memory" or "latency" (launch overhead dominates)
    compute_ms: float
    memory_ms: float
    floor_ms: float

    def to_dict(self) -> dict:
        return asdict(self)


def ridge_point(hardware: Hardware, dtype: str) -> float:
    """Arithmetic intensity (flop/byte) where the peak rate and the HBM bandwidth meet."""
    return hardware.peak(dtype) / hardware.hbm_bytes_per_s


def analyze(flops: float, bytes_moved: float, hardware: Hardware, dtype: str, *, launches: int = 1) -> Floor:
    """Full roofline analysis; see `floor_ms` for the formula."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be >= 0, not {flops} and {bytes_moved}")
    canonical_dtype(dtype)
    compute_ms = flops / hardware.peak(dtype) * 1e3
    memory_ms = bytes_moved / hardware.hbm_bytes_per_s * 1e3
    launch_ms = launches * hardware.launch_us * 1e-3
    floor = max(compute_ms, memory_ms) + launch_ms
    if launch_ms > max(compute_ms, memory_ms):
        bound = "latency"
    else:
        bound = "compute" if compute_ms >= memory_ms else "memory"
    intensity = flops / bytes_moved if bytes_moved else math.inf
    ridge = ridge_point(hardware, dtype)
    return Floor(flops, bytes_moved, intensity, ridge, bound, compute_ms, memory_ms, floor)


def floor_ms(flops: float, bytes_moved: float, hardware: Hardware, dtype: str, *, launches: int = 1) -> float:
    """max(flops / peak of `dtype`, bytes / HBM bandwidth) + launches x launch overhead, in ms."""
    return analyze(flops, bytes_moved, hardware, dtype, launches=launches).floor_ms


def roofline_fraction(floor_ms: float, measured_ms: float) -> float:
    """floor / measured (<= 1 when the counts are right). ValueError for a non-positive measurement."""
    if not measured_ms or measured_ms <= 0 or not math.isfinite(measured_ms):
        raise ValueError(f"measured time must be a positive number of ms, not {measured_ms!r}")
    return floor_ms / measured_ms


def collective_ms(bytes_per_rank: float, world_size: int, hardware: Hardware, *, kind: str = "all_to_all",
                  latency_us: float = 5.0) -> float:
    """Floor of one NCCL collective over NVLink, by NCCL's bus-bandwidth conventions: all-reduce moves
    2(n-1)/n x S per rank, all-gather / reduce-scatter / all-to-all (n-1)/n x S; plus a per-call
    latency (5 us: the low end of NCCL's 5-10 us, so the floor stays a lower bound)."""
    factors = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}
    if kind not in factors:
        raise ValueError(f"unknown collective {kind!r}; choose from {', '.join(factors)}")
    if world_size <= 1:
        return 0.0
    moved = factors[kind] * (world_size - 1) / world_size * bytes_per_rank
    return moved / hardware.nvlink_bytes_per_s * 1e3 + latency_us * 1e-3
