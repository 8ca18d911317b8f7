"""Readers for two plain-text reports: FragmentedLinear benchmark reports and DeepFlow summaries.

FragmentedLinear (times in ms, memory in MB = 2**20 bytes, fp32, measured with Adam + MSE loss):
  Benchmarking with input_size=2048, output_size=2048, batch_size=1
  Linear Layer:                         -> layer "linear", mode "train", fragments 0
  FragmentedLinear (Train) Results:     -> layer "fragmented", mode "train"
  FragmentedLinear (Inference) Results: -> layer "fragmented", mode "eval" (the seed's "Inference" is
                                           model.eval() still timed with backward and Adam: qbench's eval mode)
  Fragments: 2 / Forward time / Backward time / Peak memory / Parameters
The seed's "Backward time" is zero_grad + backward + Adam step: qbench's backward_optimizer_ms.

DeepFlow (an analytical LSTM model): component times (s), `#Parameters: N Billion`, the modelled
hardware block, the memory breakdown (GB = 2**30 bytes), `Time:` (s per training run) and an
optional `time_per_step:` line.
"""

from __future__ import annotations

import re
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError

NUMBER = r"([-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?)"
SHAPE = re.compile(r"Benchmarking with input_size=(\d+), output_size=(\d+), batch_size=(\d+)")
SEED_MODES = {"train": "train", "inference": "eval"}  # seed section name -> qbench mode
SECTION = re.compile(r"^(Linear Layer:|FragmentedLinear \((\w+)\) Results:)")
FRAGMENT_FIELDS = {
    "Forward time": ("forward_ms", units.MS),
    "Backward time": ("backward_optimizer_ms", units.MS),
    "Peak memory": ("peak_memory_mb", units.MB),
    "Parameters": ("parameters", units.COUNT),
}


def read_fragmented_report(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One "fragmented" record per (size, batch, layer, mode, fragments); the Linear baseline once per shape."""
    records: list[dict[str, Any]] = []
    shape: dict[str, Any] | None = None
    current: dict[str, Any] | None = None
    section_mode: str | None = None  # "train"/"eval" inside a FragmentedLinear section
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if m := SHAPE.match(line):
            _flush(records, current)
            shape, current = _shape_params(m), None
        elif m := SECTION.match(line):
            _flush(records, current)
            current = _start(shape, layer="linear", mode="train", number=number) if m.group(2) is None else None
            section_mode = SEED_MODES.get(m.group(2).lower(), m.group(2).lower()) if m.group(2) else None
        elif m := re.match(r"Fragments: (\d+)", line):
            _flush(records, current)
            if section_mode is None:
                raise QbenchUsageError(f"line {number}: 'Fragments:' outside a FragmentedLinear section")
            current = _start(shape, layer="fragmented", mode=section_mode, number=number, fragments=int(m.group(1)))
        elif (
            (m := re.match(r"([A-Za-z ]+): " + NUMBER, line)) and current is not None and m.group(1) in FRAGMENT_FIELDS
        ):
            name, _ = FRAGMENT_FIELDS[m.group(1)]
            current["metrics"][name] = _number(m.group(2))
    _flush(records, current)
    if not records:
        raise QbenchUsageError("no 'Benchmarking with input_size=...' blocks with results found")
    env = {"gpu_name": None, "gpu_count": 1, "timing": "mean of 100 steps after 10 warm-ups, host clock"}
    return env, records


def _shape_params(match: re.Match) -> dict[str, Any]:
    in_features, out_features, batch = (int(v) for v in match.groups())
    return {"in_features": in_features, "out_features": out_features, "batch_size": batch}


def _start(shape, *, layer: str, mode: str, number: int, fragments: int = 0) -> dict[str, Any]:
    if shape is None:
        raise QbenchUsageError(f"line {number}: results before any 'Benchmarking with input_size=...' line")
    params = {**shape, "layer": layer, "mode": mode, "fragments": fragments, "dtype": "fp32"}
    return {"params": params, "metrics": {}}


def _flush(records: list[dict[str, Any]], current: dict[str, Any] | None) -> None:
    if current is None or not current["metrics"]:
        return
    unit_of = {name: unit for name, unit in FRAGMENT_FIELDS.values() if name in current["metrics"]}
    records.append(store.make_record("fragmented", current["params"], current["metrics"], units=unit_of, device="cuda"))


def _number(text: str) -> float | int:
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value


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
    metrics: dict[str, Any] = {"time_s": _number(time_line.group(1))}
    unit_of = {"time_s": units.S}
    if m := next((re.match(r"time_per_step: " + NUMBER, x) for x in lines if x.startswith("time_per_step:")), None):
        metrics["time_per_step"], unit_of["time_per_step"] = _number(m.group(1)), units.S
    for line in lines:
        if COMPONENT_LINE.match(line):
            for name, value in re.findall(r"(\w+):;?\s*" + NUMBER, line):  # Cf -> cf_s, softmax_f -> softmax_f_s
                metrics[f"{name.lower()}_s"], unit_of[f"{name.lower()}_s"] = _number(value), units.S
    if m := next((re.match(r"#Parameters: ([\d.]+) Billion", x) for x in lines if x.startswith("#Parameters")), None):
        metrics["parameters"], unit_of["parameters"] = round(float(m.group(1)) * 1e9), units.COUNT
    _deepflow_memory(lines, metrics, unit_of)
    hardware = _deepflow_hardware(lines)
    if "memory_size_gb" in hardware:
        metrics["memory_capacity_gb"], unit_of["memory_capacity_gb"] = hardware["memory_size_gb"], units.GB
    params = {"workload": "lstm", **_parallelism(lines)}
    env = {"gpu_name": None, "hardware": hardware, "timing": "analytical model (no measurement)"}
    return env, [store.make_record("model", params, metrics, units=unit_of, device="model")]


def _deepflow_memory(lines: list[str], metrics: dict[str, Any], unit_of: dict[str, str]) -> None:
    """The first (per data shard) memory breakdown: GB values and the overflow rate."""
    for line in lines:
        if m := re.match(r"([A-Za-z ]+): " + NUMBER + " GB$", line.strip()):
            name = DEEPFLOW_MEMORY.get(m.group(1))
            if name and name not in metrics:
                metrics[name], unit_of[name] = _number(m.group(2)), units.GB
        elif (m := re.match(r"Memory Overflow Rate .*: " + NUMBER, line)) and "overflow_rate" not in metrics:
            metrics["overflow_rate"], unit_of["overflow_rate"] = _number(m.group(1)), units.RATIO


def _deepflow_hardware(lines: list[str]) -> dict[str, Any]:
    """The modelled hardware block (as printed: TFLOP/s, GiB/s, GiB, TB/s, MB)."""
    hardware: dict[str, Any] = {}
    for line in lines:
        if (m := re.match(r"([A-Za-z0-9 ]+): " + NUMBER + r" \S+$", line.strip())) and m.group(1) in DEEPFLOW_HARDWARE:
            hardware.setdefault(DEEPFLOW_HARDWARE[m.group(1)], _number(m.group(2)))
    return hardware


def _parallelism(lines: list[str]) -> dict[str, int]:
    """dp, lp, hlp of the "Parallelism Strategy" line (the degrees that change what is modelled)."""
    for i, line in enumerate(lines):
        if line.strip() == "Parallelism Strategy" and i + 2 < len(lines):
            found = dict(re.findall(r"(\w+): (-?\d+)", lines[i + 2]))
            return {k: int(found[k]) for k in ("dp", "lp", "hlp") if k in found}
    return {}
