"""Predicted times of kernels and steps from calibrated achievable rates, and the limit that binds each.

Two numbers are kept apart here:
  bound_ms      the hardware bound: flops at the datasheet peak, the bytes that cannot sit in L2 at the
                datasheet (or the measured copy, if higher) bandwidth; no correct measurement is faster
  Prediction    the expected time: flops at the rate qbench's calibration measured for that operation
                kind, scaled to the SM clock the record saw, spread over whole waves of output tiles;
                bytes at the calibrated stream rate of that kind; never less than the smallest kernel's
                time; a step adds its kernels and then waits on the host or the link where those are longer.

Rates come from `qbench model calibrate` only (qbench.explain.rates reads them): nothing in this module
sees a measured time of the record it predicts. Units: ms, bytes, flop/s. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Output tile of the calibrated matmuls (cuBLAS and qbench's Hopper kernels both settle on 128 x 256 for
# large products): a product with fewer tiles than SMs x waves leaves SMs idle in its last wave.
TILE_M, TILE_N = 128, 256


@dataclass(frozen=True)
class Rates:
    """Achievable rates of one GPU kind, from its calibration file."""

    name: str
    matmul_tflops: Mapping[str, float]  # op kind (fp16, bf16, int8, fp8, switchback_int8, ...) -> TFLOP/s (TOP/s)
    stream_gbps: Mapping[str, float]  # op kind (copy, quantize_rowwise, ...) -> GB/s, bytes read + written
    stream_latency_ms: Mapping[str, float]  # op kind -> fixed time of one launch of that kind (fit over sizes)
    launch_ms: float  # the smallest kernel's timed duration: no kernel is predicted faster
    clock_mhz: float | None  # SM clock the matmul rates were measured at (None: not recorded, no scaling)
    l2_bytes: float
    sm_count: int
    link_gbps: float  # per direction, between two GPUs
    peak_tflops: Mapping[str, float]  # datasheet peaks by cuBLAS kind: the hardware bound's, never a prediction's
    peak_hbm_gbps: float  # datasheet HBM bandwidth: the hardware bound's


@dataclass(frozen=True)
class Prediction:
    ms: float
    limit: str  # compute, memory, launch, host or link (a multi-rank step waits on its busiest rank: its rows)
    reason: str
    bound_ms: float = 0.0  # the hardware bound of the same work (bound_ms below)
    path: str = ""  # in a chain, the part whose limit and reason these are: 'block0/fc1/gw_ms'

    @property
    def why(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


def _rate(table: Mapping[str, float], kind: str, default: str) -> tuple[float, str]:
    """(rate, kind used): the calibrated rate of `kind`, else of `default` (named in the reason)."""
    if kind in table:
        return table[kind], kind
    if default in table:
        return table[default], default
    raise KeyError(kind)


def waves_efficiency(m: float, n: float, sm_count: int, groups: int = 1) -> float:
    """Fraction of the SMs busy over a product's waves of TILE_M x TILE_N output tiles (1 for a full last wave);
    a grouped product (one launch over `groups` products of m x n) fills its waves with all groups' tiles."""
    tiles = groups * math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    return tiles / (math.ceil(tiles / sm_count) * sm_count)


def matmul_bytes(m: float, k: float, n: float, in_bytes: float, out_bytes: float, l2_bytes: float,
                 sm_count: int) -> float:
    """HBM bytes of C[m,n] = A[m,k] B[n,k]^T computed in waves of TILE_M x TILE_N output tiles, one per SM:
    each wave reads the A and B panels (all of k) of the tiles it holds, as square a block of tiles as the
    shape allows, so a panel is read once per wave that needs it; an operand that fits in half the L2 is
    read from HBM once and reused from L2. C is written once."""
    tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
    waves = math.ceil(tiles_m * tiles_n / sm_count)
    pm = min(tiles_m, math.ceil(math.sqrt(sm_count)))
    pn = min(tiles_n, math.ceil(sm_count / pm))
    a, b = m * k * in_bytes, n * k * in_bytes
    a_read = a if a <= l2_bytes / 2 else max(a, waves * pm * TILE_M * k * in_bytes)
    b_read = b if b <= l2_bytes / 2 else max(b, waves * pn * TILE_N * k * in_bytes)
    return a_read + b_read + m * n * out_bytes


def matmul(m: float, k: float, n: float, kind: str, rates: Rates, clock_mhz: float | None, *,
           in_bytes: float, out_bytes: float, cublas: str, groups: int = 1) -> Prediction:
    """One product (or one grouped launch of `groups` products of the same shape, as the MoE experts): 2mkn
    flops each at `kind`'s calibrated rate (falling back to cuBLAS's `cublas` kind), capped by the peak at the
    record's clock (clock_scale), over whole waves of tiles; its bytes at the copy rate; at least a launch."""
    rate, used = _rate(rates.matmul_tflops, kind, cublas)
    scale, clock_text = clock_scale(clock_mhz, rates, rate, cublas)
    eff = waves_efficiency(m, n, rates.sm_count, groups)
    flops = groups * 2 * m * k * n
    compute = flops / (rate * 1e12 * scale * eff) * 1e3
    moved = groups * matmul_bytes(m, k, n, in_bytes, out_bytes, rates.l2_bytes, rates.sm_count)
    memory = moved / (rates.stream_gbps["copy"] * 1e6)
    least = groups * ((m * k + n * k) * in_bytes + m * n * out_bytes)
    bound = bound_ms(flops, least, rates.peak_tflops[cublas] * 1e12, rates)
    src = f"{used} {rate:.0f} T/s" + ("" if used == kind else f" (no {kind} calibrated)")
    if rates.launch_ms >= max(compute, memory):
        return Prediction(rates.launch_ms, "launch", f"{m:.0f}x{k:.0f}x{n:.0f} shorter than one launch", bound)
    if compute >= memory:
        return Prediction(compute, "compute", f"{src} {clock_text}, {eff:.0%} of SMs in waves", bound)
    return Prediction(memory, "memory", f"{memory * 1e3:.0f} us of HBM traffic > {compute * 1e3:.0f} us at {src}",
                      bound)


def clock_scale(clock_mhz: float | None, rates: Rates, rate: float, cublas: str) -> tuple[float, str]:
    """(factor on the calibrated `rate`, how the reason says it). A lower clock lowers what the SMs can issue,
    the datasheet peak times record clock / calibration clock, not the calibrated rate itself: a product that
    reached 71% of the peak at the calibration's clock was held back by more than its clock, and keeps its
    rate until the clock-scaled peak falls below it. 1 where either clock is unknown."""
    if not clock_mhz or not rates.clock_mhz:
        return 1.0, "(clock not scaled: " + ("calibration" if clock_mhz else "record") + " has none)"
    ceiling = rates.peak_tflops[cublas] * clock_mhz / rates.clock_mhz
    if ceiling >= rate:
        return 1.0, f"(peak at {clock_mhz:.0f} MHz: {ceiling:.0f} T/s, above it)"
    return ceiling / rate, f"capped at the peak at {clock_mhz:.0f} / {rates.clock_mhz:.0f} MHz"


def stream(bytes_moved: float, kind: str, rates: Rates) -> Prediction:
    """A memory-bound pass (quantize, cast, reduce): its fixed time plus bytes at `kind`'s calibrated rate
    (falling back to the copy rate and the smallest kernel's time)."""
    gbps, used = _rate(rates.stream_gbps, kind, "copy")
    latency = rates.stream_latency_ms.get(used, 0.0)
    ms = latency + bytes_moved / (gbps * 1e6)
    src = f"{bytes_moved / 1e6:.1f} MB at {used} {gbps:.0f} GB/s"
    bound = bound_ms(0, bytes_moved, 1.0, rates)
    if ms <= rates.launch_ms:
        return Prediction(rates.launch_ms, "launch", f"{src}: shorter than one launch", bound)
    return Prediction(ms, "memory", src + (f" + {latency * 1e3:.1f} us" if latency else ""), bound)


def work(flops: float, bytes_moved: float, kind: str, rates: Rates, clock_mhz: float | None, *, cublas: str,
         what: str) -> Prediction:
    """Work of no single product shape (a layer's pass, attention): flops at `kind`'s calibrated rate
    (clock-scaled) or bytes at the copy rate, whichever is longer, and at least a launch."""
    rate, used = _rate(rates.matmul_tflops, kind, cublas)
    scale, clock_text = clock_scale(clock_mhz, rates, rate, cublas)
    compute = flops / (rate * 1e12 * scale) * 1e3
    memory = bytes_moved / (rates.stream_gbps["copy"] * 1e6)
    bound = bound_ms(flops, bytes_moved, rates.peak_tflops[cublas] * 1e12, rates)
    if rates.launch_ms >= max(compute, memory):
        return Prediction(rates.launch_ms, "launch", f"{what}: shorter than one launch", bound)
    if compute >= memory:
        return Prediction(compute, "compute", f"{what}: {flops / 1e9:.1f} GFLOP at {used} {rate:.0f} T/s {clock_text}",
                          bound)
    return Prediction(memory, "memory", f"{what}: {bytes_moved / 1e6:.1f} MB at copy", bound)


def chain(parts: Mapping[str, Prediction]) -> Prediction:
    """Kernels one after another: times add; the limit and reason are those of the longest part (its path)."""
    total = sum(p.ms for p in parts.values())
    name, main = max(parts.items(), key=lambda kv: kv[1].ms)
    return Prediction(total, main.limit, main.reason, sum(p.bound_ms for p in parts.values()),
                      f"{name}/{main.path}" if main.path else name)


def with_host(gpu: Prediction, host_ms: float | None) -> Prediction:
    """An eager step: the GPU waits on the host when issuing the step's calls takes longer than running them."""
    if host_ms is None or host_ms <= gpu.ms:
        return gpu
    return Prediction(host_ms, "host", f"host issues the step in {host_ms:.3f} ms > {gpu.ms:.3f} ms of GPU work",
                      gpu.bound_ms)


def transfer(bytes_sent: float, world_size: int, rates: Rates) -> Prediction:
    """An all-to-all: (n-1)/n of the bytes a rank sends leave it over the link, plus one launch."""
    if world_size <= 1:
        return Prediction(0.0, "memory", "one rank: nothing crosses a link")
    moved = (world_size - 1) / world_size * bytes_sent
    ms = moved / (rates.link_gbps * 1e6) + rates.launch_ms
    return Prediction(ms, "link", f"{moved / 1e6:.1f} MB at {rates.link_gbps:.0f} GB/s",
                      moved / (rates.link_gbps * 1e6))


def bound_ms(flops: float, bytes_moved: float, peak_flops: float, rates: Rates) -> float:
    """The hardware bound: flops at the datasheet peak (which is at the boost clock: not scaled, so that it
    stays a bound) or the bytes that cannot sit in L2 at the larger of the datasheet and the measured copy
    bandwidth, whichever is longer. A measurement below it counted its work wrong or its timer missed work."""
    hbm = max(0.0, bytes_moved - rates.l2_bytes)
    bandwidth = max(rates.peak_hbm_gbps, rates.stream_gbps["copy"]) * 1e9
    return max(flops / peak_flops, hbm / bandwidth) * 1e3


def error(predicted_ms: float, measured_ms: float) -> float:
    """|predicted / measured - 1|."""
    return abs(predicted_ms / measured_ms - 1)
