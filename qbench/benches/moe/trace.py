"""Profiled MoE steps: the layer's phases as profiler ranges while qbench.traces records a few steps.

`trace_steps(moe, make_step, out_dir, label, rank)` runs 3 steps after the timed ones under the profiler, with
the layer's phases observed as profiler ranges (`phase_range`), and writes
<label>-rank<r>.json.gz and .csv (qbench.traces.record_timeline; `qbench trace FILE.csv` prints the CSV).
"""

from __future__ import annotations

from pathlib import Path

from qbench.benches.moe.observe import observed
from qbench.traces import record_timeline


def phase_range(name: str):
    """A phase as a profiler range (it lands on the GPU timeline too)."""
    import torch

    return torch.profiler.record_function(name)


def trace_steps(moe, make_step, out_dir: Path, label: str, rank: int, steps: int = 3) -> Path:
    """After the timed steps: `steps` more under the profiler, with the layer's phases as profiler
    ranges; make_step(phase) -> step(i) builds the step as the bench times it. Writes
    <label>-rank<r>.json.gz and .csv into out_dir (record_timeline)."""
    with observed(moe, phase_range):
        return record_timeline(make_step(phase_range), steps, out_dir, label, rank)
