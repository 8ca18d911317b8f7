"""`qbench summary RUN [RUN ...]`: the tables a README or a note quotes, straight from results.jsonl."""

from __future__ import annotations

import click

from qbench.options import case_filter_option, digits_option, metrics_option, strict_option

EPILOG = """\b
Examples:
  qbench summary results/switchback-h200-modes/run1 --metric step_ms --ratio-to variant=16bit \
      -k exec=graph -k timing=per_step                     # SwitchBack and fp8 over nn.Linear, graphed
  qbench summary results/switchback-h200-modes-c4c2232/run1 --metric kernels_speedup --by batch_size
  qbench summary results/switchback-h200-modes-c4c2232/run1 --metric kernels_ms -k variant=switchback \
      -k dim_in=4096 --markdown
  qbench summary results/moe-h200x4-static-8518c40/overlap --metric step_ms --by a2a_ffn_overlap_degree
  qbench summary run-a run-b --metric step_ms --by run                   # runs side by side
  qbench summary run-a run-b run-c --metric step_ms --across-runs median     # median of 3 runs
  qbench summary results/fragmented-h200-trace-d2f98b5 --metric forward_ms --json
  qbench summary results/fragmented-h200-clocks-797e89f/run{1,2,3} --metric fwd_bwd_ms --ratio-to variant=dense \
      --across-runs median                                          # fragmented over dense, median of 3
  qbench summary results/switchback-h200-modes-c4c2232/run{1,2,3} --metric step_over_kernels -k exec=graph \
      -k timing=per_step --across-runs median --target step_over_kernels:0.95..1.05   # how many cells meet it
  qbench summary results/switchback-h200-modes-c4c2232/run{1,2,3} --metric step_over_kernels -k timing=loop \
      -k exec=eager --across-runs median -k "batch_size=(32768|131072)/"   # the module in a loop of steps
  qbench summary results/switchback-h200-modes-c4c2232/run{1,2,3} --across-runs median --spreads
                                                        # how far reruns disagree, every metric
  qbench summary results/switchback-h200-modes-c4c2232/run{1,2,3} --across-runs median \
      --metric 'host_*' -k variant=switchback           # every metric the pattern matches
  qbench summary results/fragmented-h200-clocks-797e89f/run1 --metric fwd_bwd_ms --by variant --limits  # what binds
  qbench summary results/switchback-h200-model/vit-h-all/run{1,2,3} --across-runs median --metric step_ms \
      --predicted                                      # beside each time, what binds it and the model's time
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@metrics_option("A metric to show (repeatable; a shell-style pattern shows every metric it matches: "
                "'host_*'). [default: every metric with stored samples]")
@case_filter_option()
@click.option("--by", "--columns", "by", default=None, metavar="PARAM",
              help="Pivot this parameter into columns (e.g. batch_size, variant, run).")
@click.option("--across-runs", type=click.Choice(("median",)), default=None,
              help="Combine repeats of one command: the median over the runs of each run's value, "
                   "with the runs' values and their spread.")
@click.option("--ratio-to", default=None, metavar="PARAM=REF",
              help="Divide each record's metrics by those of the record with PARAM=REF in the same run and "
                   "otherwise the same configuration (e.g. variant=16bit: each variant over nn.Linear).")
@click.option("--target", "targets", multiple=True, metavar="METRIC:LO..HI",
              help="Judge every cell of METRIC against a target on its printed value (repeatable; either "
                   "bound may be left out: fwd_bwd_ms:..1.3, step_speedup:1.15..) and count the cells met.")
@click.option("--spreads", is_flag=True,
              help="With --across-runs: per metric (every metric unless --metric names some), the largest and "
                   "the median spread over the cells, and where the largest is; largest first.")
@click.option("--limits", is_flag=True,
              help="After each value the model predicts (qbench explain), the limit that binds it: compute, memory, "
                   "launch, host, link, or power (compute at a clock the power cap held down).")
@click.option("--predicted", is_flag=True,
              help="As --limits, and after the limit the time the model predicts for the cell from the GPU's "
                   "calibration (qbench explain's prediction).")
@digits_option
@click.option("--markdown", "fmt", flag_value="markdown", help="Print a Markdown table to paste.")
@click.option("--json", "fmt", flag_value="json", help="Print JSON (unpivoted, numbers as stored).")
@strict_option
def command(runs, metrics, pattern, by, across_runs, ratio_to, targets, spreads, limits, predicted, digits,
            fmt) -> None:
    """Per case (the parameters that vary; the constant ones are listed once), each chosen metric
    as the stored median with p20-p80 of the stored samples, or the stored median alone (marked)
    where the record keeps no samples. Speed-ups are the ratios of medians the records store.
    Several RUNS appear side by side (a `run` column), or combined with --across-runs; runs of
    different benches get a table each unless --metric, --target or --json is given. Runs are
    matched on their parameters, a missing `exec` read as eager and `float16` as fp16. RUNS are
    run directories or seed files (imported on the fly)."""
    from qbench.analysis import summary, summary_output

    if spreads and (targets or limits or predicted):
        other = "--target" if targets else "--limits" if limits else "--predicted"
        raise click.UsageError(f"--spreads and {other} print different tables; give one of them")
    options = summary.SummaryOptions(tuple(metrics), tuple(pattern), by, across_runs, ratio_to, every_metric=spreads,
                                     limits=limits, predicted=predicted)
    loaded = [summary.load_any(path) for path in runs]
    if spreads:
        from qbench.analysis import power_caps
        from qbench.analysis import spreads as spread_table

        capped = power_caps.capped_lines(loaded, options.patterns)
        spread_table.show(summary.summarize_runs(loaded, options), fmt, capped)
        return
    groups = summary.bench_groups(loaded)
    if len(groups) > 1 and not (metrics or targets or across_runs) and fmt != "json":
        summary_output.show_each_bench(groups, options, fmt, digits)  # each bench's own columns and metrics
        return
    summary_output.show(summary.summarize_runs(loaded, options), fmt, digits, targets)
