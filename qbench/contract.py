"""The bench contract: what every bench family implements, so that one runner (qbench/runner.py: run_bench) sweeps,
shows progress, resumes, stores and prints any of them.

A family is a package under qbench/benches/ (or a module there) exposing:
  BENCH      the records' bench name; qbench/metrics/<family>.py declares every metric its records carry
  measured_id(record) -> str          the id of the measurement a record came from: one measurement may give
                                       several tidy records (switchback: one per variant, exec and timing);
                                       --resume and the progress bar count measurements
  resolve(config) -> config            the device and device-dependent defaults filled in; usage errors
                                       raised here, before anything runs or is written
  pending(config, done) -> [case]      the typed cases (frozen dataclasses built with keywords) still to
                                       measure, `done` holding the measured ids --resume keeps
  run(config, done) -> iter[record]    each pending case checked against its reference, then timed in each
                                       execution mode asked for (qbench/modes.py); a failed check is an
                                       error record, never a timing; records as they come, nothing run
                                       before the iterator is read
  table(records) -> renderable         the table the command prints (report.FittedTable); a family the model
                                       predicts (qbench.explain.FAMILIES) takes table(records, limits), limits
                                       the run's qbench.explain.limits.RunLimits, and shows what binds each row
and, where one measurement gives several records, finished(records, statuses) -> ids: the measurements of a
run whose records are all there with one of those statuses (a run cut between them measures it again).
Families: FAMILIES below (the module of each); tests/test_layout.py checks each implements this.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from importlib import import_module
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Bench(Protocol):
    BENCH: str

    def measured_id(self, record: dict) -> str: ...

    def resolve(self, config: Any) -> Any: ...

    def pending(self, config: Any, done: frozenset[str] = frozenset()) -> Sequence[Any]: ...

    def run(self, config: Any, done: frozenset[str] = frozenset()) -> Iterator[dict]: ...

    def table(self, records: Sequence[dict]) -> Any: ...


# bench name -> the module implementing it
FAMILIES = {
    "switchback": "qbench.benches.switchback",
    "fragmented": "qbench.benches.fragmented",
    "moe": "qbench.benches.moe",
    "block": "qbench.benches.block",
    "train_check": "qbench.benches.train_check",
    "grouped_gemm": "qbench.benches.moe.grouped",
}


def family(bench: str) -> Bench:
    """The module of a bench family (imported on first use: families import torch lazily, but their
    modules are not free to import)."""
    return import_module(FAMILIES[bench])
