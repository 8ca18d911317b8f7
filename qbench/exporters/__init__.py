"""Writers of the formats other benchmark tools read, so a CI that already tracks those tracks qbench.

Formats (`qbench export RUN --format NAME`), one module each, every one built from qbench.load's tidy frame:
  pytest-benchmark  pytest_benchmark.py: pytest-benchmark's --benchmark-json layout, which github-action-benchmark
                    ingests (tool: pytest); one benchmark per record and time metric, stats in seconds
  bmf               bmf.py: Bencher Metric Format, {benchmark: {measure: {value, lower_value, upper_value}}}
  nvbench           nvbench.py: nvbench's JSON (file version 1.0.0): one benchmark per bench and time metric,
                    one state per record, its parameters as axes
Only ok records are written; a record's status and error stay in the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qbench.exporters import bmf, nvbench, pytest_benchmark

Writer = Callable[[Any, dict[str, dict[str, Any]]], dict[str, Any]]

# format name (as --format spells it) -> writer(tidy frame, run -> env); one module and one line per format
WRITERS: dict[str, Writer] = {
    "pytest-benchmark": pytest_benchmark.document,
    "bmf": bmf.document,
    "nvbench": nvbench.document,
}
FORMATS = tuple(WRITERS)
