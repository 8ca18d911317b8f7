"""The calibrated rates a prediction may use, read from a `qbench model calibrate` file, and the datasheet
device its hardware bound uses.

A calibration file holds `hardware` (the calibrated device) and `measurements` (one entry per calibrate
record: op, dtype, n, kernel, time_ms and its rate). Matmul kinds are the dtype for cuBLAS and
`switchback_<dtype>` for qbench's own kernel; stream kinds are `copy` and qbench's quantizers
(`quantize_rowwise`, `quantize_weight`). A stream kind measured at two sizes or more gets a fixed time
and a rate (least squares of time over bytes); at one size only a rate.
"""

from __future__ import annotations

from pathlib import Path

from qbench.benches.model.config import load_hardware, read_yaml
from qbench.errors import QbenchUsageError
from qbench.model import calibrations, hardware
from qbench.model.predict import Rates


def for_run(env: dict, calibrated: str | None = None, root: str | Path = "results") -> tuple[Rates, hardware.Hardware]:
    """(calibrated rates, datasheet device) of the GPU a run was measured on, from --calibrated FILE or the
    committed results/model-calibration-<gpu>.yaml."""
    gpu = env.get("gpu_name") or env.get("smi_name")
    key = hardware.preset_key_for_gpu(gpu or "")
    if key is None:
        raise QbenchUsageError(f"no datasheet preset for the run's GPU {gpu!r}; explain needs an H100 or H200 run")
    path = Path(calibrated) if calibrated else Path(root) / calibrations.file_name(gpu)
    if not path.is_file():
        raise QbenchUsageError(f"no calibration {path} for {gpu}; run `qbench model calibrate` on that GPU "
                               "or pass --calibrated FILE")
    datasheet = hardware.preset(key)
    return from_file(path, datasheet), datasheet


def from_file(path: str | Path, datasheet: hardware.Hardware) -> Rates:
    """The rates of a calibration file; `datasheet` gives the peaks of the hardware bound."""
    data = read_yaml(path)
    hw = _device(path)
    matmul, streams, latency, clocks = {}, {}, {}, []
    sizes: dict[str, list[tuple[float, float]]] = {}
    for m in data.get("measurements") or []:
        if m.get("sm_clock_mhz") and m.get("op") == "matmul":  # the clock the compute rates ran at
            clocks.append(float(m["sm_clock_mhz"]))
        kind = _kind(m)
        if m.get("op") == "matmul" and (m.get("tflops") or m.get("tops")):
            matmul[kind] = max(matmul.get(kind, 0.0), float(m.get("tflops") or m.get("tops")))
        elif m.get("gbps") and m.get("time_ms"):
            sizes.setdefault(kind, []).append((float(m["gbps"]) * float(m["time_ms"]) * 1e6, float(m["time_ms"])))
    for kind, points in sizes.items():
        streams[kind], latency[kind] = _fit(points)
    # a calibration without the SM clock of its matmuls (files before calibrate recorded it) is not scaled
    # against: its long matmuls may have run power-capped below the boost clock
    clock = sorted(clocks)[len(clocks) // 2] if clocks else None
    return Rates(name=hw.name, matmul_tflops=matmul, stream_gbps=streams, stream_latency_ms=latency,
                 launch_ms=hw.launch_us * 1e-3, clock_mhz=clock, l2_bytes=hw.l2_mb * 2**20, sm_count=hw.sm_count,
                 link_gbps=hw.nvlink_gbps, peak_tflops=dict(datasheet.peak_tflops),
                 peak_hbm_gbps=datasheet.hbm_tbps * 1e3)


def _device(path: str | Path) -> hardware.Hardware:
    try:
        return load_hardware(path)
    except ValueError as exc:
        raise QbenchUsageError(str(exc)) from None


def _kind(m: dict) -> str:
    """The op kind of one calibrate measurement: cuBLAS matmuls by dtype, qbench's kernels by name."""
    kernel = m.get("kernel")
    if m.get("op") == "matmul":
        return m["dtype"] if kernel in (None, "cublas") else f"{kernel}_{m['dtype']}"
    return m["op"] if kernel in (None, "torch") else kernel


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(GB/s, fixed ms) of time = fixed + bytes / rate over (bytes, ms) points; one point: its rate, no fixed
    time; a fit with a negative fixed time or rate keeps the largest size's rate alone."""
    big = max(points)
    if len(points) < 2:
        return big[0] / big[1] / 1e6, 0.0
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    fixed = my - slope * mx
    if slope <= 0 or fixed < 0:
        return big[0] / big[1] / 1e6, 0.0
    return 1 / slope / 1e6, fixed

