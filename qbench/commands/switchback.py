"""`qbench switchback`: int8 SwitchBack layers against the 16-bit linear layer (seed-compatible). Its
hidden --model and --train-check, the spellings before `qbench block` and `qbench train-check`, forward
to those benches (switchback_block.py)."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import KERNEL_VARIANTS, check_flags, switchback_options, variants_of

EPILOG = """\b
Examples:
  qbench switchback                                # the original's 18 pairs, M = 1024 ... 131072
  qbench switchback --dims 1024,4096               # dim -> 4*dim and back, for dim 1024 and 4096
  qbench switchback --pairs 1408x6144,6144x1408 --batch-sizes 8192,32768 --dtype bf16
  qbench switchback --dims 2048 --variants global,fp8 --steps 20 --out runs/sb --plot
  qbench switchback --pairs 1024x4096 --batch-sizes 8192 --exec eager,graph   # a GPU: module eager vs CUDA graph
  qbench switchback --pairs 1024x4096 --variants global,module --backward-thread device,calling
  qbench switchback --pairs 1024x4096 --batch-sizes 8192 --exec eager --trace runs/sb-traces  # qbench trace FILE
  qbench switchback --format seed --out runs/sb-seed    # also <run>/info.jsonl for the original plots
  qbench switchback --dims 2048 --out runs/sb --resume  # finish that run after a crash: only what it lacks
"""


@click.command(epilog=EPILOG)
@switchback_options
def command(plot, **flags) -> None:
    """Time every component of a SwitchBack training step (int8 forward and grad-input, 16-bit
    grad-weight, quantizers) against the 16-bit layer, with the original benchmark's keys and totals,
    speed-ups, throughput, int8 errors, module-level times, and fp8 / cuBLAS int8 peers. A block stack's
    training step and the training check are `qbench block` and `qbench train-check`."""
    from qbench.commands.block import run_block
    from qbench.commands.common import check_plot, draw_figure
    from qbench.commands.train_check import run_train

    check_flags(flags)
    check_plot(plot)
    if flags["train_check"]:  # the spellings before `qbench train-check` and `qbench block`
        out = run_train({**flags, "presets": flags["models"]})
    elif flags["models"]:
        out = run_block({**flags, "presets": flags["models"]})
    else:
        out = _layer_bench(flags)
    draw_figure(plot, out)


def _layer_bench(f: dict) -> str:
    from qbench import report
    from qbench.benches import switchback as bench
    from qbench.commands.limits import check_switchback
    from qbench.commands.switchback_block import write_seed
    from qbench.runner import Output, run_bench

    if f["dims"] and f["pairs"]:
        raise click.BadParameter("give --dims or --pairs, not both", param_hint="--dims/--pairs")
    variants = variants_of(f["variants"], KERNEL_VARIANTS)
    configs = [bench.resolve(bench.SwitchbackConfig(
        dims=f["dims"], pairs=f["pairs"], wm=f["wm"], batch_sizes=f["batch_sizes"], dtype=dtype, variants=variants,
        repeat=f["steps"], device=f["device"], execs=f["execs"], backward_threads=f["backward_threads"],
        trace_dir=f["trace_dir"])) for dtype in f["dtypes"] or ("fp16",)]
    for c in configs:
        check_switchback(c, bench.plan(c))
    output = Output(out=f["out"], append=f["append"], force=f["force"], resume=f["resume"], as_json=f["as_json"])
    # a failed configuration exits 1: the ok ones still get their seed lines
    out, _ = run_bench(bench, configs, output, notice=report.cpu_notice(configs[0].device),
                       after=write_seed if f["fmt"] == "seed" else None)
    return out
