"""Profiled MoE steps: the layer's phases as profiler ranges while qbench.traces records a few steps.

`trace_steps(moe, make_step, out_dir, label, rank)` runs 3 steps after the timed ones under the profiler, with
`PhaseMarks` standing in for the layer's PhaseTimer (so the phases appear as ranges), and writes
<label>-rank<r>.json.gz and .csv (qbench.traces.record_timeline; `qbench trace FILE.csv` prints the CSV).
"""

from __future__ import annotations

from pathlib import Path

from qbench.traces import record_timeline


class PhaseMarks:
    """Duck-typed PhaseTimer whose phases are profiler ranges (they land on the GPU timeline too)."""

    def phase(self, name: str):
        import torch

        return torch.profiler.record_function(name)

    def next_step(self) -> None:
        return None


def trace_steps(moe, make_step, out_dir: Path, label: str, rank: int, steps: int = 3) -> Path:
    """After the timed steps: `steps` more under the profiler, with the layer's phases as profiler
    ranges; make_step(phase) -> step(i) builds the step as the bench times it. Writes
    <label>-rank<r>.json.gz and .csv into out_dir (record_timeline)."""
    marks = PhaseMarks()
    moe.timer = marks
    try:
        return record_timeline(make_step(marks.phase), steps, out_dir, label, rank)
    finally:
        moe.timer = None
