"""`qbench model calibrate`: measured ceilings of this device, for rooflines that read against what
the device actually reaches rather than its datasheet.

Measures, with the qbench timer (CUDA events, warm-up excluded, L2 flushed between repeats): the
matmul rate per dtype (cuBLAS: torch.matmul for 16/32-bit, torch._int_mm for int8, torch._scaled_mm
for fp8; and qbench's own SwitchBack products, calibrate_kernels) at a few square sizes, keeping the best
median; qbench's quantizers and casts at several sizes (the rates `qbench explain` predicts from);
device-to-device copy bandwidth (read + write bytes); and the GPU time of the smallest kernel. Inputs are random, never
zeros. The L2 size and SM count are the driver's (torch's device properties); the NVLink bandwidth and
the peaks of dtypes not measured stay the preset's. The int8 ceiling is the best of cuBLAS and qbench's
own kernel (a Hopper Triton int8 matmul beats torch._int_mm).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from qbench import store, units
from qbench.dtypes import torch_dtype
from qbench.model import calibrations, hardware

GPU_SIZES = (4096, 8192)
CPU_SIZES = (256,)  # the CPU path only checks that everything runs
DTYPES = ("bf16", "fp16", "fp32", "int8", "fp8")


@dataclass(frozen=True)
class CalibrateConfig:
    device: str
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    copy_mb: int  # size of the copied tensor
    budget_ms: float  # timing budget per measurement
    kernel_sizes: tuple[int, ...] = ()  # square sizes of qbench's own products (calibrate_kernels)


def setup(device: str | None) -> tuple[CalibrateConfig, hardware.Hardware, str]:
    """(measurement plan, datasheet device it calibrates, default file) for --device auto|cuda|cpu."""
    from qbench.env import usable_device

    device = usable_device(device)
    gpu_name, reported = None, {}
    if device == "cuda":
        import torch

        gpu_name = torch.cuda.get_device_name()
        reported = reported_figures(torch.cuda.get_device_properties(torch.cuda.current_device()))
    return (default_config(device), device_hardware(device, gpu_name, reported),
            f"results/{calibrations.file_name(gpu_name)}")


def reported_figures(props) -> dict:
    """The figures the driver reports for this device (torch's device properties), which replace the
    preset's: L2 in MB as the presets count it (MiB, as NVIDIA's datasheets do) and the SM count."""
    return {"l2_mb": props.L2_cache_size / 2**20, "sm_count": int(props.multi_processor_count)}


def default_config(device: str) -> CalibrateConfig:
    if device == "cuda":
        return CalibrateConfig(device, GPU_SIZES, DTYPES, 2048, 300.0, GPU_SIZES)
    # the own kernels run through the Triton interpreter on a CPU: one small product checks they run
    return CalibrateConfig(device, CPU_SIZES, ("fp32", "bf16"), 64, 50.0, (64,))


def _operands(torch, dtype: str, n: int, device: str):
    """(call, flops) for an n x n x n matmul of `dtype` on random data; None if unsupported here."""
    if dtype == "int8":
        if device != "cuda":
            return None
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device).t()  # _int_mm wants B column-major
        return (lambda: torch._int_mm(a, b)), 2 * n**3
    if dtype == "fp8":
        if device != "cuda" or torch.cuda.get_device_capability() < (8, 9):
            return None
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return (lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), 2 * n**3
    tdt = torch_dtype(dtype)
    a, b = torch.randn(n, n, device=device, dtype=tdt), torch.randn(n, n, device=device, dtype=tdt)
    return (lambda: a @ b), 2 * n**3


def measure(cfg: CalibrateConfig) -> Iterator[dict]:
    """One record per measurement: matmul rates per (dtype, n), copy bandwidth, launch overhead."""
    import torch

    from qbench.timing import time_fn

    for dtype in cfg.dtypes:
        for n in cfg.sizes:
            params = {"workload": "calibrate", "op": "matmul", "kernel": "cublas", "dtype": dtype, "n": n}
            try:
                op = _operands(torch, dtype, n, cfg.device)
                if op is None:
                    continue
                t = time_fn(op[0], device=cfg.device, budget_ms=cfg.budget_ms)
            except (RuntimeError, TypeError) as exc:  # an op this torch build or GPU lacks
                yield store.make_record("model", params, status="skipped", error=str(exc).splitlines()[0][:200],
                                        device=cfg.device)
                continue
            rate, unit = ("tops", units.TOPS) if dtype == "int8" else ("tflops", units.TFLOPS)
            yield store.make_record("model", params, {"time_ms": t.median, rate: op[1] / t.median / 1e9},
                                    units={"time_ms": units.MS, rate: unit},
                                    samples={"time_ms": t.samples_ms}, device=cfg.device)
    numel = cfg.copy_mb * 2**20 // 4
    src = torch.randn(numel, device=cfg.device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device=cfg.device, budget_ms=cfg.budget_ms)
    yield store.make_record("model", {"workload": "calibrate", "op": "copy", "dtype": "fp32", "n": numel},
                            {"time_ms": t.median, "gbps": 2 * numel * 4 / t.median / 1e6},
                            units={"time_ms": units.MS, "gbps": units.GBPS},
                            samples={"time_ms": t.samples_ms}, device=cfg.device)
    # the smallest kernel's GPU time, the host kept ahead (gpu_only) as for every kernel timed alone: without
    # it the host's issue time of each call is timed, which is longer than a short kernel runs
    tiny = torch.zeros(1, device=cfg.device)
    t = time_fn(lambda: tiny.add_(1), device=cfg.device, budget_ms=cfg.budget_ms, flush_l2=False, gpu_only=True)
    yield store.make_record("model", {"workload": "calibrate", "op": "launch", "dtype": "fp32", "n": 1},
                            {"time_ms": t.median}, units={"time_ms": units.MS},
                            samples={"time_ms": t.samples_ms}, device=cfg.device)
    yield from own_kernels(cfg)


def own_kernels(cfg: CalibrateConfig) -> Iterator[dict]:
    """qbench's SwitchBack products and passes (calibrate_kernels); an op this GPU or build lacks is skipped."""
    from qbench.benches.model import calibrate_kernels

    try:
        yield from calibrate_kernels.measure(cfg.kernel_sizes, cfg.device, cfg.budget_ms)
    except (RuntimeError, ValueError, ImportError) as exc:
        params = {"workload": "calibrate", "op": "own_kernels", "dtype": "int8", "n": 0}
        yield store.make_record("model", params, status="skipped", error=str(exc).splitlines()[0][:200],
                                device=cfg.device)


def device_hardware(device: str, gpu_name: str | None, reported: dict | None = None) -> hardware.Hardware:
    """The description to calibrate: the preset of this GPU with the figures its driver reports
    (reported_figures), or a plain CPU stand-in."""
    if device == "cuda":
        base = hardware.preset_for_gpu(gpu_name or "")
        if base is None:
            raise ValueError(f"no preset describes {gpu_name!r}; calibrate needs one for the NVLink bandwidth and "
                             "the peaks of the dtypes it does not measure")
        return replace(base, **(reported or {}))
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return hardware.Hardware("CPU", {"fp32": 1.0}, mem_gb, 0.01, 1.0, os.cpu_count() or 1, 1.0,
                             source="cpu stand-in")


def calibrated_hardware(records: list[dict], base: hardware.Hardware) -> hardware.Hardware:
    """Best measured rate per dtype, copy bandwidth and launch time, over `base`."""
    peaks: dict[str, float] = {}
    hbm, launch = base.hbm_tbps, None
    for rec in (r for r in records if r["status"] == "ok"):
        p, m = rec["params"], rec["metrics"]
        if p["op"] == "matmul":
            rate = m.get("tflops", m.get("tops"))
            peaks[p["dtype"]] = max(peaks.get(p["dtype"], 0.0), rate)
        elif p["op"] == "copy":
            hbm = m["gbps"] / 1e3
        elif p["op"] == "launch":
            launch = m["time_ms"] * 1e3
    notes = {"method": "best matmul median over sizes and kernels (cuBLAS and qbench's own); copy read+write; "
                       "smallest kernel's GPU time"}
    return hardware.calibrated(base, peaks, hbm, launch, notes)


def save(hw: hardware.Hardware, records: list[dict], path: str | Path) -> Path:
    """Write the calibrated device (loadable by --calibrated) with its measurements beside it."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"hardware": hw.to_dict(),
            "measurements": [{**r["params"], **r["metrics"]} for r in records]}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
