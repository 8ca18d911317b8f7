"""`qbench moe`: distributed mixture-of-experts layer benchmark (flags follow Tutel's helloworld)."""

from __future__ import annotations

import click

from qbench.options import callback, out_options, parse_names, parse_number_list, parse_positive_ints

EPILOG = """\b
Examples:
  qbench moe --world-size 4                              # 4 GPUs (NCCL), or 4 CPU ranks (gloo)
  qbench moe --world-size 4 --num-local-experts 8,16,32,64
  qbench moe --world-size 4 --a2a-ffn-overlap-degree 1,2,4
  qbench moe --world-size 4 --routing rand-skew --replicate-hot 0,4
  qbench moe --world-size 4 --gemm triton,torch --dtype bfloat16 --seed-format
  qbench moe --world-size 4 --a2a-ffn-overlap-degree 1,2 --trace results/moe-traces
  qbench moe --world-size 4 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --num-local-experts 8,16,32,64
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr HOST -m qbench moe
"""
CPU_SIZES = {"model_dim": 64, "hidden_size": 128, "samples": 256, "num_steps": 10, "warmup": 2}
GEMMS = ("auto", "triton", "torch", "reference")
SYSTEMS = ("a2a", "blocks")


def _list(name: str, parser, default: str, text: str):
    return click.option(name, callback=callback(parser), default=default, show_default=True, help=text)


def _options(fn):
    opts = [
        click.option("--world-size", type=click.IntRange(min=1), default=None,
                     help="Ranks to spawn (default: every visible GPU; 2 on the CPU). Under torchrun: its size."),
        click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True),
        click.option("--num-tokens", type=click.IntRange(min=1), default=512, show_default=True,
                     help="Tokens per sequence; samples per rank = batch size x tokens."),
        click.option("--samples", type=click.IntRange(min=1), default=None, help="Tokens per rank (overrides)."),
        click.option("--model-dim", type=click.IntRange(min=1), default=None, help="d (default 1024; 64 on CPU)."),
        click.option("--hidden-size", type=click.IntRange(min=1), default=None, help="h (default 4096; 128 on CPU)."),
        _list("--num-local-experts", parse_positive_ints, "8", "Experts per rank (a list sweeps)."),
        click.option("--top-k", type=click.IntRange(min=1), default=2, show_default=True),
        click.option("--dtype", type=click.Choice(("float16", "bfloat16", "float32")), default=None,
                     help="Default float16 (float32 on CPU)."),
        click.option("--activation", type=click.Choice(("gelu", "relu")), default="gelu", show_default=True),
        click.option("--capacity-factor", type=float, default=0.0, show_default=True,
                     help="x > 0: capacity x*k*T/E, padded; 0: dropless; x < 0: capped at -x, no padding."),
        click.option("--fp32-gate", is_flag=True, help="Gate weights and logits in fp32."),
        _list("--a2a-ffn-overlap-degree", parse_positive_ints, "1", "Chunks pipelined across streams."),
        _list("--replicate-hot", _non_negative, "0", "Hot experts computed locally on every rank."),
        _list("--routing", _routings, "randn", "randn, rand-skew, uniform, zipf:S, trace:FILE (a list sweeps)."),
        _list("--gemm", parse_names(GEMMS), "auto", "Grouped GEMM: auto (Triton), triton, torch (_grouped_mm)."),
        _list("--system", parse_names(SYSTEMS), "a2a",
              "a2a (all-to-all + grouped GEMM) or blocks (block dispatch fused with the GEMMs); a list sweeps."),
        click.option("--block-size", type=click.IntRange(min=1), default=64, show_default=True,
                     help="Rows per block of --system blocks."),
        click.option("--locality", callback=callback(_localities), default=None,
                     help="P[,P...]: each choice lives on the token's own rank with probability P (forced routing)."),
        click.option("--transport", type=click.Choice(("auto", "symm", "symm-fused-ga", "symm-fused", "a2a")),
                     default="auto", show_default=True,
                     help="blocks: symmetric memory where available (auto), or force one; symm-fused-ga / "
                          "symm-fused fuse the push (and the pull) into the expert GEMMs."),
        click.option("--model", type=click.Choice(("layer", "attn-moe")), default="layer", show_default=True),
        click.option("--num-steps", type=click.IntRange(min=1), default=None, help="Timed steps (100; 10 on CPU)."),
        click.option("--warmup", type=click.IntRange(min=0), default=None, help="Untimed steps (10; 2 on CPU)."),
        click.option("--device", type=click.Choice(("auto", "cuda", "cpu")), default="auto", show_default=True),
        click.option("--backend", type=click.Choice(("auto", "nccl", "gloo")), default="auto", show_default=True),
        click.option("--eval", "eval_mode", is_flag=True, help="Forward only, under no_grad."),
        click.option("--seed-format", is_flag=True, help="Also print the seeds' [Benchmark]/STEP/[Summary] lines."),
        click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Draw the run's figure here."),
        click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
                     help="After timing, profile 3 more steps per configuration: per-rank Chrome/Perfetto "
                          "traces (.json.gz) and CSVs of the GPU kernels in this folder."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return out_options(fn)


_non_negative = parse_number_list(int, lambda n: n >= 0, "integers", "0,4", "counts must be >= 0")
_localities = parse_number_list(float, lambda p: 0.0 <= p <= 1.0, "probabilities", "0.25,1.0",
                                "probabilities must lie in [0, 1]")


def _routings(value):
    from qbench.layers.moe_routing import parse_routing

    if value is None or isinstance(value, tuple):
        return value
    items = tuple(v.strip() for v in str(value).split(","))
    for item in items:
        try:
            parse_routing(item)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return items


@click.command(epilog=EPILOG)
@_options
def command(**kw) -> None:
    """Distributed mixture-of-experts layer: step time (max over ranks), forward/backward and phase
    breakdown, TFLOP/s by the seeds' formula, load balance and drops, checked against a dense reference."""
    from qbench.benches.moe import validate

    config = build_config(kw)
    validate(config)  # usage errors before any notice, process or record
    records = _records(config)
    from qbench import dist

    if not dist.is_primary():  # ranks > 0 of a torchrun job measure but never write results
        for _ in records:
            pass
        return
    from qbench.commands.common import run_and_store
    from qbench.store import default_run_dir

    kw["out"] = kw["out"] or str(default_run_dir("moe"))
    kept = run_and_store("moe", config, records, total=_total(config), out=kw["out"], append=kw["append"],
                         force=kw["force"], as_json=kw["as_json"], table=_table)
    _finish(kept, kw)


def _records(config):
    from qbench import dist, report
    from qbench.benches.moe import run

    if config.device == "cpu":
        report.notice(report.CPU_NOTICE)
    try:
        yield from run(config)
    except dist.RankFailure as exc:
        raise click.ClickException(str(exc)) from None


def build_config(kw):
    """Flags -> MoEBenchConfig, with CPU defaults where a flag was not given."""
    from qbench import dist
    from qbench.benches.moe import MoEBenchConfig
    from qbench.errors import QbenchUsageError

    gpus = dist.visible_gpus() if kw["device"] != "cpu" else 0
    device = kw["device"] if kw["device"] != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise QbenchUsageError("--device cuda but no CUDA GPU is visible; use --device cpu")
    backend = kw["backend"] if kw["backend"] != "auto" else ("nccl" if device == "cuda" else "gloo")
    world = _world_size(kw["world_size"], device, gpus)
    small = device == "cpu"
    pick = lambda name, gpu: kw[name] if kw[name] is not None else (CPU_SIZES[name] if small else gpu)  # noqa: E731
    samples = kw["samples"] or (CPU_SIZES["samples"] if small else kw["batch_size"] * kw["num_tokens"])
    return MoEBenchConfig(
        world_size=world, backend=backend, device=device, dtype=kw["dtype"] or ("float32" if small else "float16"),
        model_dim=pick("model_dim", 1024), hidden_size=pick("hidden_size", 4096), samples=samples,
        batch_size=kw["batch_size"], num_local_experts=kw["num_local_experts"], top_k=kw["top_k"],
        activation=kw["activation"], capacity_factor=kw["capacity_factor"], fp32_gate=kw["fp32_gate"],
        overlap_degrees=kw["a2a_ffn_overlap_degree"], replicate_hot=kw["replicate_hot"], routings=kw["routing"],
        gemms=kw["gemm"], model=kw["model"], num_steps=pick("num_steps", 100), warmup=pick("warmup", 10),
        eval=kw["eval_mode"], systems=kw["system"], block_size=kw["block_size"],
        localities=kw["locality"] or (None,), transport=kw["transport"], trace_dir=kw["trace_dir"])


def _world_size(given, device: str, gpus: int) -> int:
    from qbench import dist
    from qbench.errors import QbenchUsageError

    env = dist.torchrun_env()
    if env is not None:
        if given is not None and given != env[1]:
            raise QbenchUsageError(f"--world-size {given} differs from torchrun's WORLD_SIZE {env[1]}; drop it")
        return env[1]
    if given is None:
        return gpus if device == "cuda" else 2
    if device == "cuda" and given > gpus:
        raise QbenchUsageError(f"--world-size {given} needs {given} GPUs but {gpus} are visible; "
                               "lower it, or use --device cpu")
    return given


def _total(config) -> int:
    from qbench.benches.moe import cases

    return len(cases(config))


def _table(records):
    from qbench.report import records_table

    params = ["world_size", "num_local_experts", "a2a_ffn_overlap_degree", "replicate_hot", "routing", "gemm"]
    metrics = ["step_time", "forward_time", "backward_time", "dispatch_time", "experts_time", "combine_time",
               "tflops", "roofline_fraction", "expert_load_max_over_mean", "dropped_tokens"]
    if any(r["params"].get("system") == "blocks" for r in records):
        params += ["system", "transport", "locality"]
        metrics[3:6] = ["plan_time", "ag_time", "ga_time", "dispatch_time", "combine_time"]
        metrics.append("remote_fraction")
    elif any(r["params"].get("locality") is not None for r in records):
        params.append("locality")
    return records_table(records, params, metrics, title="qbench moe (ms: median over steps of the max over ranks)",
                         headers={"a2a_ffn_overlap_degree": "overlap", "num_local_experts": "experts/rank",
                                  "expert_load_max_over_mean": "load max/mean", "replicate_hot": "hot"})


def _finish(records, kw) -> None:
    if kw["seed_format"]:
        from qbench.benches.moe import seed_lines

        for record in records:
            if record["status"] == "ok":
                click.echo("\n".join(seed_lines(record)))
    if kw["plot"]:
        from qbench.plots import plot_run

        plot_run([kw["out"]], kw["plot"])
