"""`qbench fragmented`: FragmentedLinear (tasks train / eval / inference) against dense and structured
baselines."""

from __future__ import annotations

import click

from qbench.options import (
    WARMUP_STEPS,
    backward_thread_option,
    callback,
    device_option,
    dtypes_option,
    exec_option,
    format_option,
    out_options,
    parse_names,
    parse_positive_ints,
    plot_option,
    resume_option,
    steps_option,
)

EPILOG = """\b
Examples:
  qbench fragmented                                  # the seed's sweep on a GPU, a small one on the CPU
  qbench fragmented --sizes 8192 --batch-sizes 16 --fragments 2,128 --dtype fp32,bf16
  qbench fragmented --tasks eval --baselines dense --format seed
  qbench fragmented --sizes 8192 --fragments 8 --exec eager --trace runs/frag-traces  # then: qbench trace FILE.csv
  qbench fragmented --sizes 4096 --steps 100 --out runs/fragmented-h200 --plot fragmented.png
  qbench fragmented --sizes 4096 --steps 100 --out runs/fragmented-h200 --resume   # finish it after a crash
"""
BASELINE_NAMES = ("dense", "blockdiag", "lowrank")
OLD_BASELINE_NAMES = {"linear": "dense"}  # the spelling of runs made before the variants were named


def parse_baselines(value: str | tuple | None) -> tuple[str, ...] | None:
    """--baselines: a comma list of BASELINE_NAMES or 'none'; 'linear' (the earlier name) means dense."""
    if value is None or isinstance(value, tuple):
        return value
    names = ",".join(OLD_BASELINE_NAMES.get(n.strip(), n.strip()) for n in value.split(","))
    return parse_names(BASELINE_NAMES + ("none",))(names)


@click.command(epilog=EPILOG)
@click.option("--sizes", callback=callback(parse_positive_ints), help="Square layer sizes (in = out). "
              "[default: 2048,4096,8192 on a GPU, 256 on the CPU]")
@click.option("--batch-sizes", callback=callback(parse_positive_ints), help="[default: 1,8,16; CPU: 1,8]")
@click.option("--fragments", callback=callback(parse_positive_ints),
              help="Fragment counts N; each must divide every size. [default: 2,8,32,128; CPU: 2,8]")
@click.option("--tasks", "--modes", "tasks", default="train,eval,inference", show_default=True,
              callback=callback(parse_names(("train", "eval", "inference"))),
              help="train (soft selection), eval (hard selection, with backward and Adam), inference.")
@click.option("--baselines", default="dense,blockdiag,lowrank", show_default=True,
              callback=callback(parse_baselines), help="Baselines, or 'none' ('linear' also names dense).")
@dtypes_option("fp32")
@click.option("--bias", is_flag=True, help="Give every layer biases (the seed's layer had none).")
@steps_option("Timed steps per configuration. [default: 50; CPU: 3]")
@click.option("--warmup", type=WARMUP_STEPS, help="Untimed steps first. [default: 10; CPU: 1]")
@click.option("--no-graph", is_flag=True, help="Skip the CUDA-graph replay of the forward.")
@format_option("'seed' prints the original report layout (Forward time / Backward time / ...).")
@exec_option
@backward_thread_option
@plot_option
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="After timing, profile 3 more forward + backward steps of each eager configuration: Chrome "
                   "traces and kernel CSVs here (print one with `qbench trace FILE.csv`).")
@device_option
@out_options
@resume_option
def command(sizes, batch_sizes, fragments, tasks, baselines, dtypes, bias, steps, warmup, no_graph, fmt,
            execs, backward_threads, plot, trace_dir, device, out, append, force, as_json, resume) -> None:
    """FragmentedLinear's forward, backward, Adam step and peak memory in the tasks train, eval (hard
    selection) and inference, against a dense Linear, a block-diagonal linear with N blocks and
    a low-rank linear of rank in/32. Outputs are checked against the reference definition first."""
    from qbench import report
    from qbench.benches import fragmented as bench
    from qbench.commands.common import check_plot, draw_figure
    from qbench.commands.limits import check_fragmented
    from qbench.runner import Output, run_bench

    check_baselines(baselines)
    config = bench.resolve(bench.FragmentedConfig(
        sizes=sizes, batch_sizes=batch_sizes, fragments=fragments, tasks=tasks,
        baselines=tuple(b for b in baselines if b != "none"), dtypes=dtypes, bias=bias, steps=steps,
        warmup=warmup, cuda_graph=not no_graph, device=device, execs=execs, backward_threads=backward_threads,
        trace_dir=trace_dir))
    check_fragmented(config)
    check_plot(plot)
    output = Output(out=out, append=append, force=force, resume=resume, as_json=as_json)
    out, _ = run_bench(bench, [config], output, notice=report.cpu_notice(config.device),
                       table=bench.seed_report if fmt == "seed" else None)
    draw_figure(plot, out)


def check_baselines(baselines: tuple[str, ...]) -> None:
    """'none' means no baseline: beside a named one it contradicts itself."""
    from qbench.errors import QbenchUsageError

    if "none" in baselines and len(baselines) > 1:
        raise QbenchUsageError(f"--baselines {','.join(baselines)}: 'none' means no baseline; give it alone or "
                               "name the baselines")
