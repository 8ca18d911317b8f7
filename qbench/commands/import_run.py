"""`qbench import FILE`: turn a result file of a replaced tool into a qbench run directory."""

from __future__ import annotations

import click

from qbench.importers import FORMATS

EPILOG = """\b
Examples:
  qbench import tests/fixtures/seed_bnb_info.jsonl            # bitsandbytes SwitchBack results (A100)
  qbench import tests/fixtures/seed_moe_mixmoe_trimmed.log --out moe-mixmoe
  qbench import tests/fixtures/seed_fragmented_report.txt --format fragmented-report
  qbench import tests/fixtures/seed_deepflow.txt --json
  qbench import tests/fixtures/tritonbench_output.json        # tritonbench --output-json
  qbench import tests/fixtures/nvbench_output.json            # nvbench --json
"""

# The columns shown after an import, per bench: (params, metrics); switchback's records print as its own table.
COLUMNS = {
    "moe": (("num_local_experts", "world_size", "rank"),
            ("step_ms", "forward_ms", "backward_ms", "tflops", "block_count", "remote_fraction")),
    "fragmented": (
        ("in_features", "batch_size", "variant", "task", "fragments"),
        ("forward_ms", "backward_optimizer_ms", "peak_memory_mb"),
    ),
    "model": (("workload",), ("time_s", "cf_s", "cb_s", "softmax_f_s", "softmax_b_s", "memory_total_gb")),
    "tritonbench": (("op", "x_val", "backend"), ("latency", "tflops", "gbps", "speedup")),
}  # any other bench (nvbench: each benchmark has axes of its own): every parameter and metric of the records
FORMAT_CHOICES = ("auto", *FORMATS)


def _table(records: list[dict], source: str):
    from qbench import report

    if records[0]["bench"] == "switchback":  # a row per shape, as `qbench switchback` prints its tidy records
        from qbench.benches.switchback.table import table

        return table(records)
    params, metrics = COLUMNS.get(records[0]["bench"]) or (
        tuple(dict.fromkeys(k for r in records for k in r["params"])),
        tuple(dict.fromkeys(k for r in records for k in r["metrics"])))
    return report.records_table(records, params, metrics, title=f"imported from {source}")  # the title is text


@click.command(epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), default="auto", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Run directory to write.")
@click.option("--append", is_flag=True, help="Add the records to an existing run directory.")
@click.option("--force", is_flag=True, help="Replace the records of an existing run directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON on stdout.")
def command(file: str, fmt: str, out: str | None, append: bool, force: bool, as_json: bool) -> None:
    """Import FILE (bitsandbytes info.jsonl, MoE step log, FragmentedLinear report, DeepFlow summary,
    tritonbench --output-json or nvbench JSON; the format is detected from the content) as a qbench run
    directory, with the bench, parameter and metric names of qbench's own runs, so `qbench compare`,
    `qbench summary` and `qbench plot` take it."""
    from qbench import importers, report

    done = importers.import_file(file, fmt, out, append=append, force=force)
    if as_json:
        report.print_json(done.records)
    else:
        report.stdout_console().print(_table(done.records, file))
    replaced = f", {done.replaced} replacing a record of the same case" if done.replaced else ""
    report.notice(f"{report.counted(len(done.records), 'record')} in {done.path}, made from {file}{replaced}",
                  style="dim")
    if done.env.get("skipped"):
        report.notice(f"{file}: {importers.skip_note(done.env)}")
