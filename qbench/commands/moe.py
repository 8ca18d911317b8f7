"""`qbench moe`: distributed mixture-of-experts layer benchmark (flags follow Tutel's helloworld)."""

from __future__ import annotations

import click

from qbench.commands.moe_options import moe_options

EPILOG = """\b
Examples:
  qbench moe --world-size 4                              # 4 GPUs (NCCL), or 4 CPU ranks (gloo)
  qbench moe --world-size 4 --num-local-experts 8,16,32,64 --a2a-ffn-overlap-degree 1,2,4
  qbench moe --world-size 4 --routing rand-skew --replicate-hot 0,4 --trace runs/moe-traces
  qbench moe --world-size 4 --variant a2a,blocks --locality 0.25,0.5,0.75,1.0 --gemm triton,torch --format seed
  qbench moe --world-size 4 --variant a2a,tutel          # Tutel's layer beside qbench's (where tutel imports)
  qbench moe --world-size 1 --capacity-factor 1.0 --exec eager,compile,graph   # one GPU, the three modes
  qbench moe --world-size 4 --num-local-experts 8,16,32,64 --out runs/moe-e --resume   # finish a cut sweep
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr HOST -m qbench moe   # 2 GPU nodes
"""
@click.command(epilog=EPILOG)
@moe_options
def command(fmt, plot, steps, dtypes, out, append, force, as_json, resume, **fields) -> None:
    """Distributed mixture-of-experts layer: step time (max over ranks), forward/backward and phase
    breakdown, TFLOP/s by the seeds' formula, load balance and drops, checked against a dense reference.

    --exec compile and graph need static shapes: a fixed capacity (--capacity-factor > 0), or world
    size 1 without capped capacity, and no --replicate-hot; compile runs at world size 1 only. Other
    configurations record those modes as skipped, with the reason (dropless routing at world size > 1:
    the host must learn each step's split sizes)."""
    from qbench import dist, report
    from qbench.benches import moe as bench
    from qbench.commands.common import draw_figure
    from qbench.runner import Output, run_bench

    if fields["kernels"] is not None and not resume:  # the spelling before `qbench grouped`
        from qbench.commands.grouped import forward_from_moe

        return forward_from_moe({**fields, "dtypes": dtypes}, plot, out=out, append=append, force=force,
                                as_json=as_json)
    configs = [bench.resolve(bench.MoEBenchConfig(num_steps=steps, dtype=dtype, **fields))
               for dtype in dtypes or (None,)]  # None: the device's default dtype
    _check_flags(configs[0], plot, resume)
    output = Output(out=out, append=append, force=force, resume=resume, as_json=as_json)
    try:  # each config validates as its run starts: usage errors before any notice or record
        out, kept = run_bench(bench, configs, output, notice=report.cpu_notice(configs[0].device))
    except dist.RankFailure as exc:
        raise click.ClickException(str(exc)) from None
    if not dist.is_primary():
        return
    for measured in bench.measurements([r for r in kept if r["status"] == "ok" and fmt == "seed"]):
        click.echo("\n".join(bench.seed_lines(measured)))
    draw_figure(plot, out)


def _check_flags(config, plot, resume) -> None:
    """Usage errors found before the sweep starts: a bad figure name (not after the sweep), and --resume
    where qbench did not start the run itself."""
    from qbench import dist
    from qbench.errors import QbenchUsageError

    if dist.is_primary():
        from qbench.commands.common import check_plot

        check_plot(plot)
    if resume and (dist.torchrun_env() is not None or config.kernels is not None):
        raise QbenchUsageError("--resume finishes a layer run that qbench started itself: not under torchrun, "
                               "not with --kernels")
    from qbench.commands.limits import check_cpu_ranks, check_moe

    _check_replication(config)
    if config.device == "cpu" and dist.torchrun_env() is None:
        check_cpu_ranks(config.world_size)
    check_moe(config)


def _check_replication(config) -> None:
    """--replicate-hot H copies the H hottest of the world's experts onto every rank: H must be a count of
    experts that exist, and there must be another rank to copy them from."""
    from qbench.errors import QbenchUsageError

    hot = max(config.replicate_hot)
    if hot and config.world_size == 1:
        raise QbenchUsageError(f"--replicate-hot {hot} at world size 1: one rank already holds every expert; "
                               "drop it or use --world-size > 1")
    local = min(config.num_local_experts)
    if hot > local * config.world_size:
        raise QbenchUsageError(f"--replicate-hot {hot} exceeds the {local * config.world_size} experts of "
                               f"--num-local-experts {local} x world size {config.world_size}; give at most "
                               f"{local * config.world_size}")
