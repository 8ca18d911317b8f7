"""Reader for the FragmentedLinear benchmark's plain-text report.

Times in ms, memory in MB (2**20 bytes), fp32, measured with Adam + MSE loss:
  Benchmarking with input_size=2048, output_size=2048, batch_size=1
  Linear Layer:                         -> variant "dense", task "train", fragments 0
  FragmentedLinear (Train) Results:     -> variant "fragmented", task "train"
  FragmentedLinear (Inference) Results: -> variant "fragmented", task "eval" (the seed's "Inference" is
                                           model.eval() still timed with backward and Adam: qbench's eval task)
  Fragments: 2 / Forward time / Backward time / Peak memory / Parameters
The seed's "Backward time" is zero_grad + backward + Adam step: qbench's backward_optimizer_ms.
"""

from __future__ import annotations

import math
import re
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError

# A printed number: sign, thousands commas, decimals, exponent (also read by the DeepFlow reader).
NUMBER = r"([-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?)"
SHAPE = re.compile(r"Benchmarking with input_size=(\d+), output_size=(\d+), batch_size=(\d+)")
SEED_TASKS = {"train": "train", "inference": "eval"}  # seed section name -> qbench task
SECTION = re.compile(r"^(Linear Layer:|FragmentedLinear \((\w+)\) Results:)")
FRAGMENT_FIELDS = {
    "Forward time": ("forward_ms", units.MS),
    "Backward time": ("backward_optimizer_ms", units.MS),
    "Peak memory": ("peak_memory_mb", units.MB),
    "Parameters": ("parameters", units.COUNT),
}


def read_fragmented_report(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One "fragmented" record per (size, batch, variant, task, fragments); the dense baseline once per shape.
    A value line that does not parse or is negative, and a block whose sizes are 0, are skipped and named
    in env["skipped"]."""
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    shape: dict[str, Any] | None = None  # {} for a block with a size of 0 (its results are skipped)
    current: dict[str, Any] | None = None
    section_task: str | None = None  # "train"/"eval" inside a FragmentedLinear section
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if m := SHAPE.match(line):
            _flush(records, current)
            shape, current = _shape_params(m, number, skipped), None
        elif m := SECTION.match(line):
            _flush(records, current)
            current = _start(shape, variant="dense", task="train", number=number) if m.group(2) is None else None
            section_task = SEED_TASKS.get(m.group(2).lower(), m.group(2).lower()) if m.group(2) else None
        elif m := re.match(r"Fragments: (\d+)", line):
            _flush(records, current)
            if section_task is None:
                raise QbenchUsageError(f"line {number}: 'Fragments:' outside a FragmentedLinear section")
            current = _start(shape, variant="fragmented", task=section_task, number=number,
                             fragments=int(m.group(1)))
        elif current is not None:
            _field(line, number, current, skipped)
    _flush(records, current)
    if not records:
        found = f" ({skipped[0]})" if skipped else ""
        raise QbenchUsageError(f"no 'Benchmarking with input_size=...' blocks with results found{found}")
    env = {"gpu_name": None, "gpu_count": 1, "timing": "mean of 100 steps after 10 warm-ups, host clock",
           "skipped": skipped}
    return env, records


def _field(line: str, number: int, current: dict[str, Any], skipped: list[str]) -> None:
    """A `Forward time: 0.12ms` line of the current result into its metrics; one that does not parse or is
    negative is named in `skipped`."""
    label, sep, rest = line.partition(":")
    if not sep or label not in FRAGMENT_FIELDS:
        return
    m = re.match(NUMBER, rest.strip())
    value = parse_number(m.group(1)) if m else None
    if value is None or not math.isfinite(value) or value < 0:
        skipped.append(f"line {number}: {label} {rest.strip()[:30]!r} is not a number >= 0")
        return
    current["metrics"][FRAGMENT_FIELDS[label][0]] = value


def _shape_params(match: re.Match, number: int, skipped: list[str]) -> dict[str, Any]:
    """The block's sizes; {} (its results skipped, named once) when one of them is 0."""
    in_features, out_features, batch = (int(v) for v in match.groups())
    if not (in_features and out_features and batch):
        skipped.append(f"line {number}: a block with a size of 0; its results are skipped")
        return {}
    return {"in_features": in_features, "out_features": out_features, "batch_size": batch}


def _start(shape, *, variant: str, task: str, number: int, fragments: int = 0) -> dict[str, Any] | None:
    if shape is None:
        raise QbenchUsageError(f"line {number}: results before any 'Benchmarking with input_size=...' line")
    if not shape:
        return None  # a block skipped for its sizes
    params = {**shape, "variant": variant, "task": task, "fragments": fragments, "dtype": "fp32"}
    return {"params": params, "metrics": {}}


def _flush(records: list[dict[str, Any]], current: dict[str, Any] | None) -> None:
    if current is None or not current["metrics"]:
        return
    unit_of = {name: unit for name, unit in FRAGMENT_FIELDS.values() if name in current["metrics"]}
    records.append(store.make_record("fragmented", current["params"], current["metrics"], units=unit_of, device="cuda"))


def parse_number(text: str) -> float | int:
    """A printed number: "4,196,352" -> 4196352 (an int when printed without a point), "1.5e-3" -> 0.0015."""
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value
