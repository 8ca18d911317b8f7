"""`qbench switchback`: int8 SwitchBack layers against the 16-bit linear layer (seed-compatible), and
with --model / --train-check the same layers inside a transformer block stack (switchback_block.py)."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import KERNEL_VARIANTS, check_flags, switchback_options, variants_of

EPILOG = """\b
Examples:
  qbench switchback                                # the original's 18 pairs, M = 1024 ... 131072
  qbench switchback --dims 1024,4096               # dim -> 4*dim and back, for dim 1024 and 4096
  qbench switchback --pairs 1408x6144,6144x1408 --batch-sizes 8192,32768 --dtype bf16
  qbench switchback --dims 2048 --variants global,fp8 --repeat 20 --out runs/sb --plot
  qbench switchback --pairs 1024x4096 --batch-sizes 8192 --exec eager,graph   # a GPU: module eager vs CUDA graph
  qbench switchback --pairs 1024x4096 --variants global,module --backward-thread device,calling
  qbench switchback --pairs 1024x4096 --batch-sizes 8192 --exec eager --trace runs/sb-traces  # qbench trace FILE
  qbench switchback --format seed --out runs/sb-seed    # also <run>/info.jsonl for the original plots
  qbench switchback --dims 2048 --out runs/sb --resume  # finish that run after a crash: only what it lacks
  qbench switchback --model vit-h --batch-sizes 256 --exec compile   # 4-block CLIP ViT-H training step
  qbench switchback --model vit-l,gpt2-xl --variants 16bit,switchback,fp8 --layers 2
  qbench switchback --train-check --plot                  # loss curves per variant on a Markov chain
"""


@click.command(epilog=EPILOG)
@switchback_options
def command(plot, **flags) -> None:
    """Time every component of a SwitchBack training step (int8 forward and grad-input, 16-bit
    grad-weight, quantizers) against the 16-bit layer, with the original benchmark's keys and totals,
    speed-ups, throughput, int8 errors, module-level times, and fp8 / cuBLAS int8 peers; or, with
    --model, a training step of a transformer block stack per variant; or, with --train-check,
    whether that stack still trains."""
    from qbench.commands import switchback_block as block

    check_flags(flags)
    if flags["train_check"]:
        out = block.run_train(flags)
    elif flags["models"]:
        out = block.run_model(flags)
    else:
        out = _layer_bench(flags)
    if plot:
        from qbench import report
        from qbench.plots import plot_run

        report.notice(f"figure: {plot_run([out])}", style="dim")


def _layer_bench(f: dict) -> str:
    from qbench import report, store
    from qbench.benches import switchback as bench
    from qbench.commands.common import resumed, run_and_store
    from qbench.commands.limits import check_switchback
    from qbench.commands.switchback_block import write_seed

    if f["dims"] and f["pairs"]:
        raise click.BadParameter("give --dims or --pairs, not both", param_hint="--dims/--pairs")
    config = bench.resolve(bench.SwitchbackConfig(
        f["dims"], f["pairs"], f["wm"], f["batch_sizes"], f["dtype"] or "fp16",
        variants_of(f["variants"], KERNEL_VARIANTS), f["repeat"], f["device"], f["execs"], f["backward_threads"],
        f["trace_dir"]))
    check_switchback(config, bench.plan(config))
    done = resumed(bench.BENCH, f["out"], f["resume"], f["force"])
    out = f["out"] or str(store.default_run_dir(bench.BENCH))
    try:
        run_and_store(bench.BENCH, config, bench.run(config, done), total=len(bench.pending(config, done)), out=out,
                      append=f["append"] or f["resume"], force=f["force"], as_json=f["as_json"], table=bench.table,
                      notice=report.cpu_notice(config.device))
    finally:  # a failed configuration exits 1: the ok ones still get their seed lines
        if f["fmt"] == "seed":
            write_seed(out)
    return out
