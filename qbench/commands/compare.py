"""`qbench compare A B [C ...]`: ratios, significance, geometric mean, exit 1 on a regression."""

from __future__ import annotations

import sys

import click

from qbench.options import case_filter_option, metrics_option, strict_option

EPILOG = """\b
Examples:
  qbench compare results/moe-h200x4-static-8518c40/run{1,2}   # the shell expands it to the two runs
  qbench compare results/moe-h200x4-static-8518c40/run{1,2} --metric step_ms --threshold 3% --only-changed
  qbench compare results/switchback-h200-modes-c4c2232/run{1,2} --fail-on time_global:5   # exit 1 on a regression
  qbench compare tests/fixtures/seed_bnb_info.jsonl results/switchback-h200-modes-c4c2232/run1 --cross-env --markdown
  qbench compare results/fragmented-h200-clocks-797e89f/run1 --across exec   # graph vs eager, one run
  qbench compare results/moe-h200-ws1/threads-797e89f/run1 --across backward_thread=device --metric step_ms
  qbench compare --group 3 results/switchback-h200-modes-c4c2232/run{1,2,3} \
      results/switchback-h200-torchao/layers-run{1,2,3} -k batch_size=32768/ --metric speedup_module_graph
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@metrics_option("Compare only this metric (repeatable; a shell-style pattern: every metric it matches, 'time_*').")
@click.option("--threshold", default="5%", show_default=True, help="Changes within this are noise ('=').")
@click.option("--only-changed", is_flag=True, help="Hide rows within the threshold.")
@click.option("--sort", type=click.Choice(("name", "ratio")), default="name", show_default=True)
@case_filter_option("rows whose 'bench/case metric'")
@click.option("--cross-env", is_flag=True, help="Compare runs from different GPUs anyway (and say so).")
@click.option("--fail-on", multiple=True, help="METRIC:PCT, exit 1 if METRIC gets worse by more than PCT.")
@click.option("--allow-missing", is_flag=True, help="Cases the reference has and a candidate lacks do not fail a gate.")
@click.option("--across", default=None, metavar="PARAM[=REF]",
              help="Compare within the runs: records with PARAM=REF (exec: eager by default) against each other "
                   "value of PARAM, joined on the remaining parameters; repeated runs that each hold both sides "
                   "merge per side as --group merges a group.")
@click.option("--group", "group", type=int, default=None, metavar="N",
              help="RUNS come in groups of N consecutive runs, the repeated runs of one side (an A/B made by "
                   "alternating runs): each group compares as one, each metric the median over its runs, their "
                   "samples pooled for the U test; a change is + or - only where no run of one side lies within "
                   "the other side's runs (else ~).")
@click.option("--markdown", "fmt", flag_value="markdown", help="Print a markdown table.")
@click.option("--csv", "fmt", flag_value="csv", help="Print CSV.")
@click.option("--json", "fmt", flag_value="json", help="Print JSON.")
@strict_option
def command(runs, metrics, threshold, only_changed, sort, pattern, cross_env, fail_on, allow_missing, across,
            group, fmt) -> None:
    """Compare runs against the first (the reference): per case and metric the values, the ratio,
    the change, a Mann-Whitney U test on the samples, and a marker: + worse, - better, ~ beyond
    the threshold but not significant (or, with --group, the sides' runs overlap), = same, x not
    comparable, ! newly failing, * fixed, n/a missing. Lower is better for times, higher for
    throughputs (declared by each metric's unit). With --fail-on, a case the reference has and a
    candidate lacks also fails (unless --allow-missing). RUNS are run directories or seed files
    (imported on the fly). Joins read a missing `exec` parameter as eager, a missing
    `backward_thread` as device and `float16` as fp16, so runs from older versions still join."""
    from qbench import metric_names, report
    from qbench.analysis import compare, compare_gate, compare_output, run_groups
    from qbench.errors import QbenchUsageError

    threshold = compare_gate.parse_threshold(threshold)
    gates = compare_gate.parse_fail_on(fail_on)
    loaded = [compare.load_any(r) for r in runs]
    if group is not None and across:
        raise QbenchUsageError("--group and --across are two ways of choosing what to compare; give one")
    if group is not None:
        loaded = run_groups.group_runs(loaded, group)
    if across:
        loaded = run_groups.across_param(loaded, across, cross_env)
    options = compare.CompareOptions(
        metric_names.expand(metrics, metric_names.of(rec for run in loaded for rec in run.records)), threshold,
        tuple(pattern), cross_env, only_changed, sort
    )
    compare_gate.require_metrics(loaded, options.metrics, gates)
    result = compare.compare_runs(loaded, options)
    result.reference = loaded[0].label if across else result.reference
    compare_gate.require_gates_evaluable(result, gates)
    compare_output.print_comparison(result, fmt)
    failures = compare_gate.gate_failures(result, gates, allow_missing)
    for line in failures:
        report.notice(line, style="bold red")
    if failures:
        sys.exit(1)
