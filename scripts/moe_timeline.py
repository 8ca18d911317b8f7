"""Kernel timelines of `qbench moe` steps on every rank (see qbench/layers/moe_trace.py), without
the timing and the reference check (`qbench moe --trace DIR` records the same after timing).

    python3 scripts/moe_timeline.py OUT_DIR [--overlap 1,2,4] [--steps 3] [--world-size 4] [...]
Builds the layer exactly as `qbench moe` does (seed config by default), warms up, then records
`--steps` profiled steps per overlap degree and rank.
"""

from __future__ import annotations

from pathlib import Path

import click


def rank_main(ctx, config, degrees, steps, out_dir, system, locality):
    from qbench.layers import moe_run
    from qbench.layers.moe_trace import PhaseMarks, record_timeline

    gemm = "triton" if ctx.device.startswith("cuda") else "auto"
    for D in degrees:
        case = dict(num_local_experts=config.num_local_experts[0], a2a_ffn_overlap_degree=D,
                    replicate_hot=config.replicate_hot[0], routing=config.routings[0], gemm=gemm,
                    system=system, locality=locality)
        model, moe, x, dy = moe_run.build(ctx, config, case)
        marks = PhaseMarks()
        step = moe_run.make_step(config, model, x, dy, marks.phase)
        for i in range(config.warmup):
            step(i)
        moe.timer = marks
        label = f"{system}-D{D}" + (f"-loc{locality:g}" if locality is not None else "")
        table = record_timeline(step, steps, Path(out_dir), label, ctx.rank)
        moe.timer = None
        yield str(table)


@click.command()
@click.argument("out_dir")
@click.option("--overlap", default="1,2")
@click.option("--steps", default=3)
@click.option("--world-size", default=4)
@click.option("--num-local-experts", default=8)
@click.option("--routing", default="randn")
@click.option("--replicate-hot", default=0)
@click.option("--system", type=click.Choice(("a2a", "blocks")), default="a2a")
@click.option("--locality", type=float, default=None)
def main(out_dir, overlap, steps, world_size, num_local_experts, routing, replicate_hot, system, locality):
    import torch

    from qbench import dist
    from qbench.benches.moe import MoEBenchConfig

    cuda = torch.cuda.is_available()
    small = {} if cuda else dict(model_dim=64, hidden_size=128, samples=256)
    config = MoEBenchConfig(world_size=world_size, backend="nccl" if cuda else "gloo",
                            device="cuda" if cuda else "cpu", dtype="float16" if cuda else "float32",
                            num_local_experts=(num_local_experts,), replicate_hot=(replicate_hot,),
                            routings=(routing,), warmup=10, **small)
    degrees = [int(v) for v in overlap.split(",")]
    for path in dist.launch(rank_main, (config, degrees, steps, out_dir, system, locality), world_size=world_size,
                            backend=config.backend, device=config.device):
        print(path)


if __name__ == "__main__":
    main()
