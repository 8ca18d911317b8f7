"""Reader for a DeepFlow summary (the analytical LSTM model's printed report).

It holds the component times (s), `#Parameters: N Billion`, the "Parallelism Strategy" block, the
modelled hardware block, the memory breakdown (GB = 2**30 bytes) with its overflow rate, `Time:`
(s per training run) and an optional `time_per_step:` line. It becomes one "model" record
(workload "lstm") with the metric names `qbench model lstm` writes.
"""

from __future__ import annotations

import re
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError
from qbench.importers.fragmented import NUMBER, parse_number

# DeepFlow's labels -> (metric name, unit)
# Metric names as `qbench model lstm` writes them, so an imported summary joins its records.
DEEPFLOW_MEMORY = {
    "Total Memory": "memory_total_gb",
    "Embedding Memory": "memory_embedding_gb",
    "Hidden Memory": "memory_hidden_gb",
    "Softmax Memory": "memory_softmax_gb",
    "Projection Memory": "memory_projection_gb",
    "Weight Memory": "memory_weight_gb",
    "Activation Memory": "memory_activation_gb",
    "Pointwise Memory": "memory_pointwise_gb",
}
DEEPFLOW_HARDWARE = {
    "Throughput": "throughput_tflops",
    "Memory Bandwidth": "memory_bw_gbps",  # GiB/s as DeepFlow prints it
    "Memory Size": "memory_size_gb",
    "L2 Bandwidth": "l2_bw_tbps",
    "L2 Size": "l2_size_mb",
    "Shared Memory Size": "shared_memory_mb",
    "Interconnection Bandwidth": "interconnect_gbps",
}
COMPONENT_LINE = re.compile(r"^Cf: .*Cb:")


def read_deepflow(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One "model" record (workload "lstm"): Time and the component times in s, memory in GB."""
    lines = text.splitlines()
    time_line = next((m for x in lines if (m := re.match(r"Time: " + NUMBER, x.strip()))), None)
    if time_line is None:
        raise QbenchUsageError("no 'Time:' line")
    metrics: dict[str, Any] = {"time_s": parse_number(time_line.group(1))}
    unit_of = {"time_s": units.S}
    if m := next((re.match(r"time_per_step: " + NUMBER, x) for x in lines if x.startswith("time_per_step:")), None):
        metrics["step_budget_s"], unit_of["step_budget_s"] = parse_number(m.group(1)), units.S
    for line in lines:
        if COMPONENT_LINE.match(line):
            for name, value in re.findall(r"(\w+):;?\s*" + NUMBER, line):  # Cf -> cf_s, softmax_f -> softmax_f_s
                metrics[f"{name.lower()}_s"], unit_of[f"{name.lower()}_s"] = parse_number(value), units.S
    if m := next((re.match(r"#Parameters: ([\d.]+) Billion", x) for x in lines if x.startswith("#Parameters")), None):
        metrics["parameters"], unit_of["parameters"] = round(float(m.group(1)) * 1e9), units.COUNT
    _deepflow_memory(lines, metrics, unit_of)
    hardware = _deepflow_hardware(lines)
    if "memory_size_gb" in hardware:
        metrics["memory_capacity_gb"], unit_of["memory_capacity_gb"] = hardware["memory_size_gb"], units.GB
    params = {"workload": "lstm", **_parallelism(lines)}
    env = {"gpu_name": None, "hardware": hardware, "timing": "analytical model (no measurement)",
           "skipped": _missing(metrics, hardware, params)}
    return env, [store.make_record("model", params, metrics, units=unit_of, device="model")]


def _deepflow_memory(lines: list[str], metrics: dict[str, Any], unit_of: dict[str, str]) -> None:
    """The first (per data shard) memory breakdown: GB values and the overflow rate."""
    for line in lines:
        if m := re.match(r"([A-Za-z ]+): " + NUMBER + " GB$", line.strip()):
            name = DEEPFLOW_MEMORY.get(m.group(1))
            if name and name not in metrics:
                metrics[name], unit_of[name] = parse_number(m.group(2)), units.GB
        elif (m := re.match(r"Memory Overflow Rate .*: " + NUMBER, line)) and "overflow_rate" not in metrics:
            metrics["overflow_rate"], unit_of["overflow_rate"] = parse_number(m.group(1)), units.RATIO


def _deepflow_hardware(lines: list[str]) -> dict[str, Any]:
    """The modelled hardware block (as printed: TFLOP/s, GiB/s, GiB, TB/s, MB)."""
    hardware: dict[str, Any] = {}
    for line in lines:
        if (m := re.match(r"([A-Za-z0-9 ]+): " + NUMBER + r" \S+$", line.strip())) and m.group(1) in DEEPFLOW_HARDWARE:
            hardware.setdefault(DEEPFLOW_HARDWARE[m.group(1)], parse_number(m.group(2)))
    return hardware


def _parallelism(lines: list[str]) -> dict[str, int]:
    """dp, lp, hlp of the "Parallelism Strategy" line (the degrees that change what is modelled)."""
    for i, line in enumerate(lines):
        if line.strip() == "Parallelism Strategy" and i + 2 < len(lines):
            found = dict(re.findall(r"(\w+): (-?\d+)", lines[i + 2]))
            return {k: int(found[k]) for k in ("dp", "lp", "hlp") if k in found}
    return {}


def _missing(metrics: dict[str, Any], hardware: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The parts of a DeepFlow summary that were not found (a cut or garbled file), as skip notes."""
    parts = {"the component times line (Cf: ... Cb: ...)": "cf_s" in metrics,
             "the memory breakdown (Total Memory: ... GB)": "memory_total_gb" in metrics,
             "the hardware block": bool(hardware), "the Parallelism Strategy block": "dp" in params}
    return [f"no {part} found" for part, found in parts.items() if not found]
