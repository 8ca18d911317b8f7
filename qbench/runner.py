"""The one runner of every bench family (qbench/contract.py): it resumes, sweeps with a progress bar,
writes each record the moment it is measured (a crash keeps what was measured), prints the family's table
and exits 1 when a configuration failed its check or errored.

    run_bench(family, configs, Output(out=..., resume=...), notice=...) -> (run directory, records)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench import report, store
from qbench.env import capture_env


@dataclass(frozen=True)
class Output:
    """Where a bench command's records go and how: --out (None: a new run under runs/), --append, --force,
    --resume (finish the run: only measurements not yet ok or skipped run) and --json (print the records)."""
    out: str | None = None
    append: bool = False
    force: bool = False
    resume: bool = False
    as_json: bool = False


def run_bench(family, configs: Sequence[Any], output: Output, *, notice: str | None = None,
              table: Callable[[Sequence[dict]], Any] | None = None,
              after: Callable[[str], None] | None = None) -> tuple[str, list[dict]]:
    """Every resolved config of `family` (one per --dtype) into one run: the measurements --resume keeps
    skipped, progress counted in measurements (family.pending), the family's table printed (limited_table; or
    `table`).
    `after(run directory)` runs once the records are stored, even when a configuration failed (exit 1)."""
    done = resumed(family.BENCH, output.out, output.resume, output.force, key=family.measured_id)
    if done and hasattr(family, "finished"):  # a family whose measurement gives several records says which
        done = family.finished(store.read_records(output.out), DONE)  # are whole: one cut short runs again
    config, records = over_dtypes(configs, [family.run(c, done) for c in configs])
    from qbench import dist

    if not dist.is_primary():  # ranks > 0 of a torchrun job measure but never write results
        list(records)
        return "", []
    total = sum(len(family.pending(c, done)) for c in configs)
    out = output.out or str(store.default_run_dir(family.BENCH))
    try:
        kept = run_and_store(family.BENCH, config, records, total=total, out=out,
                             append=output.append or output.resume, force=output.force, as_json=output.as_json,
                             table=table or limited_table(family, out), notice=notice, unit=family.measured_id)
    finally:
        if after is not None:
            after(out)
    return out, kept


def limited_table(family, out: str) -> Callable[[Sequence[dict]], Any]:
    """The family's table; for a family the model predicts (qbench.explain.FAMILIES) with the limit binding each
    row, from the calibration of the GPU the run's env.json names (none on a CPU run: the table says why)."""
    from qbench.explain import FAMILIES

    if family.BENCH not in FAMILIES:
        return family.table

    def table(records: Sequence[dict]) -> Any:
        from qbench.explain.limits import for_run

        return family.table(records, for_run(store.read_env(out)))

    return table


DONE = ("ok", "skipped")  # record statuses that --resume keeps; errors run again


def resumed(bench: str, out: str | None, resume: bool, force: bool,
            key: Callable[[dict], str] = lambda record: record["case"]) -> frozenset[str]:
    """The ids (`key` of a record: its case id by default) of the records of `out` that --resume keeps
    (none without --resume): those whose status is in DONE. One-line usage errors for --resume without a
    run of this bench to finish."""
    from qbench.errors import QbenchUsageError

    if not resume:
        return frozenset()
    if force:
        raise QbenchUsageError("--resume finishes a run and --force replaces it; pass only one of them")
    if out is None:
        raise QbenchUsageError("--resume needs --out naming the run to finish")
    if not store.is_run_dir(out) and store.is_claimed_dir(out):
        return frozenset()  # a run stopped before its first record: everything runs again
    if not store.is_run_dir(out):
        raise QbenchUsageError(f"--resume: {out} is not a run directory (no {store.RECORDS_FILE})")
    records = store.read_records(out)
    others = {r["bench"] for r in records} - {bench}
    if others:
        raise QbenchUsageError(f"--resume: {out} holds a {'/'.join(sorted(others))} run, not {bench}")
    return frozenset(key(r) for r in records if r["status"] in DONE)


def run_and_store(
    bench: str,
    config: Any,
    records: Iterable[dict],
    *,
    total: int | None,
    out: str | None,
    append: bool,
    force: bool,
    as_json: bool,
    table: Callable[[Sequence[dict]], Any],
    root: str | Path | None = None,
    notice: str | None = None,
    unit: Callable[[dict], str] | None = None,
) -> list[dict]:
    """Write each record the moment it is measured (a crash keeps what was measured), then print
    the table (with --append / --resume, of the whole run) or the JSON of this command's records. Exits 1
    when any configuration this command ran failed its correctness check or errored.
    `notice` (e.g. the CPU notice) is printed once the run directory is claimed, so a refused --out
    is the only line a usage error prints. `unit` (a record -> the id of the measurement it came from) counts
    progress in measurements where one gives several records; by default each record is one."""
    path = Path(out) if out else store.default_run_dir(bench, root or store.RUNS_ROOT)
    kept: list[dict] = []
    env = capture_env(config=config)
    with store.RunWriter(path, env, append=append, force=force, bench=bench) as writer:
        if notice:
            report.notice(notice)
        if total == 0 and append:
            report.notice(f"nothing to run: {path} holds every configuration of this command", style="dim")
        with report.progress(total, bench) as advance:
            last = None
            for record in records:
                writer.write(record)
                kept.append(record)
                measured = unit(record) if unit else record["case"]
                if unit is None or measured != last:
                    advance(measured[:60])
                last = measured
    shown = store.read_records(path) if append else kept  # --append / --resume: the whole run's table
    if as_json:
        report.print_json(kept)  # the records this command measured
    else:
        report.stdout_console().print(table(shown))
    added = f"{report.counted(len(kept), 'record')} added; " if append else ""
    report.notice(f"{added}{report.counted(len(shown), 'record')} in {path}", style="dim")
    from qbench.telemetry import stability_warning

    if warning := stability_warning(kept):  # once per run: the likely cause of noisy times, and the fix
        report.notice(warning)
    failed = [r for r in kept if r["status"] == "error"]
    if failed:
        report.notice(f"{report.counted(len(failed), 'configuration')} failed; see the status column", style="red")
        sys.exit(1)
    return kept


def over_dtypes(configs: Sequence[Any], runs: Sequence[Iterable[dict]]) -> tuple[Any, Iterable[dict]]:
    """One run of a bench whose config takes one dtype, over --dtype's list: (the config env.json keeps,
    its dtype the comma list; the records of each dtype's config in turn). runs: each config's records,
    not read yet (the benches' record iterators measure nothing until they are read). A single config (a
    family whose config holds its dtype list itself) is kept as it is."""
    import dataclasses
    import itertools

    if len(configs) == 1:
        return configs[0], itertools.chain(*runs)
    return dataclasses.replace(configs[0], dtype=",".join(c.dtype for c in configs)), itertools.chain(*runs)
