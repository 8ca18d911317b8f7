"""What every benchmark command does after parsing: store records as they come, then print them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from qbench import report, store
from qbench.env import capture_env


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
    root: str | Path = "results",
    notice: str | None = None,
) -> list[dict]:
    """Write each record the moment it is measured (a crash keeps what was measured), then print
    the table (or JSON). Exits 1 when any configuration failed its correctness check or errored.
    `notice` (e.g. the CPU notice) is printed once the run directory is claimed, so a refused --out
    is the only line a usage error prints."""
    path = Path(out) if out else store.default_run_dir(bench, root)
    kept: list[dict] = []
    env = capture_env(config=config)
    with store.RunWriter(path, env, append=append, force=force, bench=bench) as writer:
        if notice:
            report.notice(notice)
        with report.progress(total, bench) as advance:
            for record in records:
                writer.write(record)
                kept.append(record)
                advance(record["case"][:60])
    if as_json:
        report.print_json(kept)
    else:
        report.stdout_console().print(table(kept))
    report.notice(f"{len(kept)} records in {path}", style="dim")
    failed = [r for r in kept if r["status"] == "error"]
    if failed:
        report.notice(f"{len(failed)} configurations failed; see the status column", style="red")
        sys.exit(1)
    return kept
