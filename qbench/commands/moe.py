"""`qbench moe`: distributed mixture-of-experts layer benchmark (flags follow Tutel's helloworld)."""

from __future__ import annotations

import click

from qbench.commands.moe_options import moe_options

EPILOG = """\b
Examples:
  qbench moe --world-size 4                              # 4 GPUs (NCCL), or 4 CPU ranks (gloo)
  qbench moe --world-size 4 --num-local-experts 8,16,32,64 --a2a-ffn-overlap-degree 1,2,4
  qbench moe --world-size 4 --routing rand-skew --replicate-hot 0,4 --trace runs/moe-traces
  qbench moe --world-size 4 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --gemm triton,torch --seed-format
  qbench moe --world-size 4 --system a2a,tutel           # Tutel's layer beside qbench's (where tutel imports)
  qbench moe --kernels grouped --dtype bf16              # a GPU: the grouped GEMM kernels alone, TMA vs pointer
  qbench moe --world-size 1 --capacity-factor 1.0 --exec eager,compile,graph   # one GPU, the three modes
  qbench moe --world-size 4 --num-local-experts 8,16,32,64 --out runs/moe-e --resume   # finish a cut sweep
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr HOST -m qbench moe   # 2 GPU nodes
"""
@click.command(epilog=EPILOG)
@moe_options
def command(seed_format, plot, out, append, force, as_json, resume, **fields) -> None:
    """Distributed mixture-of-experts layer: step time (max over ranks), forward/backward and phase
    breakdown, TFLOP/s by the seeds' formula, load balance and drops, checked against a dense reference.

    --exec compile and graph need static shapes: a fixed capacity (--capacity-factor > 0), or world
    size 1 without capped capacity, and no --replicate-hot; compile runs at world size 1 only. Other
    configurations record those modes as skipped, with the reason (dropless routing at world size > 1:
    the host must learn each step's split sizes)."""
    from qbench import dist, report, store
    from qbench.benches import moe as bench
    from qbench.commands.common import resumed, run_and_store

    config = bench.resolve(bench.MoEBenchConfig(**fields))
    _check_flags(config, plot, resume)
    done = resumed(bench.BENCH, out, resume, force, key=lambda record: bench.resume_id(record["params"]))
    records = bench.run(config, done)  # validates now: usage errors before any notice or record
    if not dist.is_primary():  # ranks > 0 of a torchrun job measure but never write results
        list(records)
        return
    out = out or str(store.default_run_dir(bench.BENCH))
    try:
        kept = run_and_store(bench.BENCH, config, records, total=len(bench.plan(config, done)), out=out,
                             append=append or resume, force=force, as_json=as_json, table=bench.table,
                             notice=report.cpu_notice(config.device))
    except dist.RankFailure as exc:
        raise click.ClickException(str(exc)) from None
    for record in [r for r in kept if r["status"] == "ok" and seed_format]:
        click.echo("\n".join(bench.seed_lines(record)))
    if plot:
        from qbench.plots import plot_run

        plot_run([out], plot)


def _check_flags(config, plot, resume) -> None:
    """Usage errors found before the sweep starts: a bad figure name (not after the sweep), and --resume
    where qbench did not start the run itself."""
    from qbench import dist
    from qbench.errors import QbenchUsageError

    if plot and dist.is_primary():
        from qbench.plots import check_figure_path

        check_figure_path(plot)
    if resume and (dist.torchrun_env() is not None or config.kernels is not None):
        raise QbenchUsageError("--resume finishes a layer run that qbench started itself: not under torchrun, "
                               "not with --kernels")
