"""What the GPU did while timed work ran, as NVML reports it: SM clock (MHz), board power (W) and the
reasons NVML gives for holding the clock down (its "clocks event" or throttle reasons).

A `GpuReadings` is handed to qbench.timing as `observe`: the timer calls it once per timing round,
outside every timed span, while the round's last call may still run on the GPU. Records carry the
medians (`sm_clock_mhz_<what>`, `power_w_<what>`) and every throttle reason seen in any round
(`throttle_reasons_<what>`: the NVML bits OR-ed together; reason_names spells them), so that a time can be
read against the clock it ran at: an H200 holds its boost clock on work that stays below its power limit
and lowers it on work that reaches the limit (reason sw_power_cap), so one kernel timed alone and the same
kernel in a training loop can run at different clocks. NVML comes through torch.cuda.clock_rate /
power_draw and pynvml (the nvidia-ml-py package, optional); where it cannot be read (no GPU, no pynvml)
nothing is recorded. NVML averages power over its own sample period (1/6 s to 1 s by product), so timed
work shorter than that reads partly the moments before it.

stability_warning(records) is the one line a run prints when its clocks were not locked and a metric's
samples spread beyond NOISE_TARGET_PCT: the likely cause, and the fix.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

# NVML's clocks event reason bits (nvml.h, nvmlClocksEventReason*; the older name: ...ClocksThrottleReason*)
REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
POWER_CAPPED = 0x4 | 0x80  # the clock was lowered to hold the board's power limit (software cap or hardware brake)
REASONS_PREFIX = "throttle_reasons_"
# A sample spread (p20-p80 over the median) wider than compare's default threshold hides the very changes
# compare and history look for; unlocked clocks are the usual cause on an otherwise idle GPU.
NOISE_TARGET_PCT = 5.0
LOCKED_TOLERANCE = 0.01  # SM clocks within 1% of each other over a whole run: read as locked (NVML rounds to MHz)
MIN_SAMPLES = 5  # fewer samples say little about a spread


class GpuReadings:
    """Callable: one reading of the current CUDA device's SM clock, power and throttle reasons per call."""

    def __init__(self, device: str):
        self.clock_mhz: list[float] = []
        self.power_w: list[float] = []
        self.reasons: int | None = None  # OR of every reading's reasons; None where NVML gives none
        self.available = device == "cuda" and _readable()

    def __call__(self) -> None:
        if self.available:
            self.clock_mhz.append(read_clock_mhz())
            self.power_w.append(read_power_w())
            reasons = read_reasons()
            if reasons is not None:
                self.reasons = (self.reasons or 0) | reasons

    def metrics(self, what: str) -> dict:
        """{sm_clock_mhz_<what>, power_w_<what>: the medians, throttle_reasons_<what>: the reasons seen} (units by
        name: qbench.units); empty without readings, no reasons where NVML gave none."""
        if not self.clock_mhz:
            return {}
        out = {f"sm_clock_mhz_{what}": statistics.median(self.clock_mhz),
               f"power_w_{what}": statistics.median(self.power_w)}
        if self.reasons is not None:
            out[f"{REASONS_PREFIX}{what}"] = self.reasons
        return out


def read_clock_mhz() -> float:
    import torch

    return float(torch.cuda.clock_rate())


def read_power_w() -> float:
    import torch

    return torch.cuda.power_draw() / 1e3  # NVML reports mW


def read_reasons() -> int | None:
    """The current device's clocks event reasons (NVML bits), or None without nvidia-ml-py or an answer."""
    try:
        import pynvml
        import torch

        handle = torch.cuda._get_pynvml_handler()  # torch's own NVML handle of the current device
        query = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # the name before NVML 12.2
        return int(query(handle))
    except Exception:  # noqa: BLE001 - no pynvml, an older torch, or NVML refuses: the records go without
        return None


def _readable() -> bool:
    try:
        read_clock_mhz()
        read_power_w()
    except Exception:  # noqa: BLE001 - no pynvml, or NVML refuses: the records simply go without
        return False
    return True


def reason_names(mask: int | float | None) -> list[str]:
    """The NVML reason bits of a throttle_reasons_* value, by name (unknown bits as hex)."""
    if mask is None:
        return []
    bits = int(mask)
    names = [name for bit, name in REASONS.items() if bits & bit]
    rest = bits & ~sum(REASONS)
    return names + ([hex(rest)] if rest else [])


def power_capped(record: Mapping[str, Any]) -> list[str]:
    """The timings (<what> of throttle_reasons_<what>) of a record during which the power cap held the clock."""
    return [name.removeprefix(REASONS_PREFIX) for name, value in record.get("metrics", {}).items()
            if name.startswith(REASONS_PREFIX) and isinstance(value, (int, float)) and int(value) & POWER_CAPPED]


def clock_range(records: Iterable[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(lowest, highest) SM clock any ok record read, or None where none read one."""
    clocks = [v for r in records if r.get("status", "ok") == "ok" for k, v in r.get("metrics", {}).items()
              if k.startswith("sm_clock_mhz_") and isinstance(v, (int, float))]
    return (min(clocks), max(clocks)) if clocks else None


def noisy(records: Iterable[Mapping[str, Any]]) -> list[tuple[float, str, str]]:
    """(spread %, metric, case) of every ok record's sampled metric whose p20-p80 spread over its median
    exceeds NOISE_TARGET_PCT, widest first."""
    from qbench.samples import percentile

    out = []
    for rec in (r for r in records if r.get("status", "ok") == "ok"):
        for metric, samples in rec.get("samples", {}).items():
            kept = [x for x in samples if isinstance(x, (int, float))]
            median = percentile(kept, 50) if len(kept) >= MIN_SAMPLES else 0
            if median > 0:
                spread = 100.0 * (percentile(kept, 80) - percentile(kept, 20)) / median
                if spread > NOISE_TARGET_PCT:
                    out.append((spread, metric, rec.get("case", "")))
    return sorted(out, reverse=True)


def stability_warning(records: Iterable[Mapping[str, Any]]) -> str | None:
    """One line when the run's SM clocks moved (not locked) and some metric spread beyond the noise target;
    None otherwise, and where no clock was read (nothing to say why)."""
    records = list(records)
    clocks = clock_range(records)
    if clocks is None or clocks[1] - clocks[0] <= LOCKED_TOLERANCE * clocks[1]:
        return None
    wide = noisy(records)
    if not wide:
        return None
    spread, metric, case = wide[0]
    capped = sum(1 for r in records if power_capped(r))
    cap_text = f"; {capped} records ran power-capped (sw_power_cap or hw_power_brake)" if capped else ""
    return (f"clocks not locked (SM clock {clocks[0]:g}-{clocks[1]:g} MHz over the run){cap_text} and "
            f"{len(wide)} metric samples spread beyond {NOISE_TARGET_PCT:g}% (p20-p80 over the median; widest "
            f"{spread:.3g}%: {metric} at {case}); lock the clocks (nvidia-smi --lock-gpu-clocks) for steadier times")
