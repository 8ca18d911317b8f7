"""The GPU's SM clock (MHz) and board power (W) while timed work runs, as NVML reports them.

A `GpuReadings` is handed to qbench.timing as `observe`: the timer calls it once per timing round,
outside every timed span, while the round's last call may still run on the GPU. Records carry the
medians (`sm_clock_mhz_<what>`, `power_w_<what>`), so that a time can be read against the clock it ran
at: an H200 holds its boost clock on work that stays below its power limit and lowers it on work that
reaches the limit, so one kernel timed alone and the same kernel in a training loop can run at
different clocks. NVML comes through torch.cuda.clock_rate / power_draw (pynvml); where it cannot be
read (no GPU, no pynvml) nothing is recorded. NVML averages power over its own sample period (1/6 s to
1 s by product), so timed work shorter than that reads partly the moments before it.
"""

from __future__ import annotations

import statistics


class GpuReadings:
    """Callable: one reading of the current CUDA device's SM clock and power per call."""

    def __init__(self, device: str):
        self.clock_mhz: list[float] = []
        self.power_w: list[float] = []
        self.available = device == "cuda" and _readable()

    def __call__(self) -> None:
        if self.available:
            import torch

            self.clock_mhz.append(float(torch.cuda.clock_rate()))
            self.power_w.append(torch.cuda.power_draw() / 1e3)  # NVML reports mW

    def metrics(self, what: str) -> dict:
        """{sm_clock_mhz_<what>, power_w_<what>: the medians} (units by name: qbench.units); empty
        without readings."""
        if not self.clock_mhz:
            return {}
        return {f"sm_clock_mhz_{what}": statistics.median(self.clock_mhz),
                f"power_w_{what}": statistics.median(self.power_w)}


def _readable() -> bool:
    import torch

    try:
        torch.cuda.clock_rate()
        torch.cuda.power_draw()
    except Exception:  # noqa: BLE001 - no pynvml, or NVML refuses: the records simply go without
        return False
    return True
