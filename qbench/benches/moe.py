"""`qbench moe`: distributed mixture-of-experts step time, TFLOP/s and per-phase breakdown.

run(config) validates the configuration (before any process starts), launches the ranks
(qbench.dist: self-spawned, or one rank of a torchrun job) and yields one record per configuration
of the sweep (local experts x overlap degree x replication x routing x GEMM backend x locality x
system). Each configuration is checked against the dense reference first; a mismatch is an error
record, not timed. System "blocks" (MixMoE's block dispatch fused with the expert GEMMs) runs one
chunk, so its cases take overlap degree 1 only; its transport ("symm" or the "a2a" fallback) is a param.

Metrics (times in ms: median over steps of the max over ranks):
  step_time, forward_time, backward_time (steps without the layer's phase events), <phase>_time (gate,
  plan, dispatch, experts, combine, backward_a2a, backward_experts; from a second pass of as many steps
  with them), step_time_instrumented (that pass's step time: what the phase events cost),
  tflops = samples * d * h * 4 * k * 3 / step (the seeds' formula,
  per GPU; 4 = two matmuls x 2 flop, 3 = forward + 2 x backward; eval mode uses 1 instead of 3),
  tflops_full (rows actually computed, padding included, plus the gate), peak_memory_mb, per-expert
  and per-rank load (max / mean), dropped_tokens, roofline_fraction (the busiest rank's floor from
  qbench/model/floors.py: gate and expert GEMMs plus the token exchange, as `qbench model --against`).
System blocks adds: ag_time, ga_time, backward_ag_time, backward_ga_time (max over ranks per step),
  blocks_total / blocks_remote (max over owner ranks), blocks_rank<r> / remote_blocks_rank<r> /
  remote_fraction_rank<r> (per rank, the importer's names), remote_fraction (all ranks' remote blocks
  over all blocks), block_imbalance (busiest rank / mean), remote_rows (most rows a rank pulls).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from qbench import units
from qbench.errors import QbenchUsageError
from qbench.store import make_record

BENCH = "moe"
ROUTINGS_HELP = "randn, rand-skew, uniform, zipf:S, trace:FILE"


@dataclass(frozen=True)
class MoEBenchConfig:
    world_size: int
    backend: str  # nccl | gloo
    device: str  # cuda | cpu
    dtype: str = "float16"
    model_dim: int = 1024
    hidden_size: int = 4096
    samples: int = 8192  # tokens per rank
    batch_size: int = 16
    num_local_experts: tuple[int, ...] = (8,)
    top_k: int = 2
    activation: str = "gelu"
    capacity_factor: float = 0.0
    fp32_gate: bool = False
    overlap_degrees: tuple[int, ...] = (1,)
    replicate_hot: tuple[int, ...] = (0,)
    routings: tuple[str, ...] = ("randn",)
    gemms: tuple[str, ...] = ("auto",)
    model: str = "layer"
    num_steps: int = 100
    warmup: int = 10
    eval: bool = False
    seed: int = 0
    timeout_s: float = 600.0
    trace_dir: str | None = None  # also record a few profiled steps per configuration here
    systems: tuple[str, ...] = ("a2a",)
    block_size: int = 64
    localities: tuple[float | None, ...] = (None,)  # None: the routing kind alone decides
    transport: str = "auto"  # blocks: auto (symm where available, else a2a) | symm[-fused-ga|-fused] | a2a


def validate(config: MoEBenchConfig, visible_gpus: int | None = None) -> None:
    """Usage errors before anything starts (QbenchUsageError: one line, exit 2)."""
    from qbench.layers.moe_routing import load_trace, parse_routing

    if config.device == "cuda" and visible_gpus is not None and config.world_size > visible_gpus:
        raise QbenchUsageError(f"--world-size {config.world_size} needs {config.world_size} GPUs but "
                               f"{visible_gpus} are visible; lower it or use --device cpu")
    if config.backend == "nccl" and config.device != "cuda":
        raise QbenchUsageError("--backend nccl needs --device cuda; use gloo on the CPU")
    for L in config.num_local_experts:
        if config.top_k > L * config.world_size:
            raise QbenchUsageError(f"--top-k {config.top_k} exceeds the {L * config.world_size} experts")
    if config.model == "attn-moe" and config.samples % config.batch_size:
        raise QbenchUsageError(f"--samples {config.samples} is not a multiple of --batch-size {config.batch_size}")
    if config.model == "attn-moe" and config.model_dim % 64:
        raise QbenchUsageError(f"--model attn-moe needs --model-dim divisible by 64, not {config.model_dim}")
    _validate_blocks(config)
    for text in config.routings:
        try:
            spec = parse_routing(text)
            if spec.kind == "trace":
                for L in config.num_local_experts:
                    load_trace(spec.trace, config.top_k, L * config.world_size)
        except ValueError as exc:
            raise QbenchUsageError(str(exc)) from None


def _validate_blocks(config: MoEBenchConfig) -> None:
    from qbench.layers.moe_routing import parse_routing

    if any(p is not None for p in config.localities):
        if any(not 0.0 <= p <= 1.0 for p in config.localities):
            raise QbenchUsageError("--locality values are probabilities: give numbers in [0, 1]")
        bad = [r for r in config.routings if parse_routing(r).kind not in ("randn", "uniform")]
        if bad:
            raise QbenchUsageError(f"--locality chooses the experts itself; it works with --routing randn or "
                                   f"uniform, not {bad[0]}")
        if min(config.num_local_experts) < config.top_k:
            raise QbenchUsageError(f"--locality needs --num-local-experts >= --top-k {config.top_k} (a token's "
                                   "k distinct experts may all live on its own rank)")
    if config.transport.startswith("symm") and config.backend != "nccl":
        raise QbenchUsageError(f"--transport {config.transport} needs CUDA GPUs with NCCL; use --transport auto")


def cases(config: MoEBenchConfig) -> list[dict[str, Any]]:
    """The case grid; system innermost so that a2a and blocks of one configuration sit together."""
    grid = itertools.product(config.num_local_experts, config.overlap_degrees, config.replicate_hot,
                             config.routings, config.gemms, config.localities, config.systems)
    out, seen = [], set()
    for L, D, N, r, g, p, system in grid:
        case = dict(num_local_experts=L, a2a_ffn_overlap_degree=1 if system == "blocks" else D,
                    replicate_hot=N, routing=r, gemm=g, locality=p, system=system)
        key = tuple(case.values())
        if key not in seen:  # blocks ignores the overlap degree: one case, not one per degree
            seen.add(key)
            out.append(case)
    return out


def run(config: MoEBenchConfig) -> Iterator[dict]:
    from qbench import dist

    gpus = dist.visible_gpus() if config.device == "cuda" and dist.torchrun_env() is None else None
    validate(config, gpus)
    yield from dist.launch(rank_main, (config,), world_size=config.world_size, backend=config.backend,
                           device=config.device, timeout_s=config.timeout_s)


def rank_main(ctx, config: MoEBenchConfig) -> Iterator[dict]:
    """Every rank runs every configuration; rank 0's records are the ones kept."""
    for case in cases(config):
        yield one_case(ctx, config, case)


def case_label(case: dict[str, Any]) -> str:
    """File-name label of one configuration, e.g. a2a-L8-D1-hot0-randn-triton (-loc0.5)."""
    routing = "".join(c if c.isalnum() or c in ".-" else "_" for c in str(case["routing"]).split("/")[-1])
    label = (f"{case.get('system', 'a2a')}-L{case['num_local_experts']}-D{case['a2a_ffn_overlap_degree']}"
             f"-hot{case['replicate_hot']}-{routing}-{case['gemm']}")
    return label + (f"-loc{case['locality']:g}" if case.get("locality") is not None else "")


def params_of(config: MoEBenchConfig, case: dict[str, Any], world_size: int) -> dict[str, Any]:
    return {"world_size": world_size, "dtype": config.dtype, "model_dim": config.model_dim,
            "hidden_size": config.hidden_size, "samples": config.samples, "batch_size": config.batch_size,
            "num_local_experts": case["num_local_experts"], "top_k": config.top_k,
            "a2a_ffn_overlap_degree": case["a2a_ffn_overlap_degree"], "routing": case["routing"],
            "capacity_factor": config.capacity_factor, "model": config.model,
            "replicate_hot": case["replicate_hot"], "gemm": case["gemm"], "activation": config.activation,
            "fp32_gate": config.fp32_gate, "eval": config.eval, "backend": config.backend,
            "system": case.get("system", "a2a"), "locality": case.get("locality"),
            "block_size": config.block_size if case.get("system") == "blocks" else None,
            "transport": case.get("transport", "a2a")}


def one_case(ctx, config: MoEBenchConfig, case: dict[str, Any]) -> dict:
    from qbench.layers import moe_run

    device = "cuda" if ctx.device.startswith("cuda") else "cpu"
    case = dict(case, gemm=resolve_gemm(case["gemm"], device))
    params = params_of(config, case, ctx.world_size)
    error = None
    try:
        model, moe, x, dy = moe_run.build(ctx, config, case)
        params["transport"] = getattr(getattr(moe, "transport", None), "name", "a2a")
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot be built is an error record
        error = f"{type(exc).__name__}: {exc}"
    if not moe_run.agree(error is None, ctx.device):  # every rank skips together (no stray collective)
        return make_record(BENCH, params, status="error", error=error or "failed on another rank", device=device)
    try:
        ok, detail = moe_run.check(ctx, moe, x)
    except Exception as exc:  # noqa: BLE001 - e.g. a GEMM backend that rejects these shapes on every rank
        ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not moe_run.agree(ok, ctx.device) or not ok:
        return make_record(BENCH, params, status="error", error=f"reference check failed: {detail}", device=device)
    stats = moe_run.routing_stats(ctx, model, moe, x)
    if case.get("system") == "blocks":
        stats.update(moe_run.block_stats(ctx, moe))
    samples = moe_run.time_steps(ctx, config, model, moe, x, dy)
    if not moe_run.weights_finite(ctx, model):
        return make_record(BENCH, params, status="error", device=device,
                           error="weights not finite after the timed steps: the timing measured a diverged layer")
    memory = moe_run.peak_memory_mb(ctx)
    if config.trace_dir:
        moe_run.trace_steps(ctx, config, model, moe, x, dy, case_label(case))
    metrics, unit_of = summarize(config, case, ctx.world_size, samples, stats, memory, device)
    metrics["check_max_rel_error"] = float(detail.split("max error ")[1].split(" ")[0])
    unit_of["check_max_rel_error"] = units.REL_ERROR
    keep = ("step_time", "forward_time", "backward_time", "step_time_instrumented")
    return make_record(BENCH, params, metrics, units=unit_of, device=device,
                       samples={k: v for k, v in samples.items() if k in keep or "_time_rank" in k})


def resolve_gemm(gemm: str, device: str) -> str:
    """'auto' runs the Triton grouped GEMM (the torch reference on a CPU without the interpreter)."""
    return gemm if gemm != "auto" else ("triton" if device == "cuda" else "auto")


def seed_flops(config: MoEBenchConfig) -> float:
    """The seeds' count per GPU and step: samples * d * h * 4 * k * 3 (1 instead of 3 in eval)."""
    passes = 1 if config.eval else 3
    return config.samples * config.model_dim * config.hidden_size * 4 * config.top_k * passes


def full_flops(config: MoEBenchConfig, stats: dict, world_size: int, num_experts: int) -> float:
    """Rows actually computed (padding included, drops excluded) per GPU, plus the gate."""
    passes = 1 if config.eval else 3
    rows = stats["computed_rows"] / world_size
    experts = rows * config.model_dim * config.hidden_size * 4
    gate = config.samples * config.model_dim * num_experts * 2
    return (experts + gate) * passes


def summarize(config, case, world_size, samples, stats, memory, device):
    metrics: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items() if v and "_rank" not in k}
    unit_of = {k: units.MS for k in metrics}
    step = metrics["step_time"]
    E = case["num_local_experts"] * world_size
    metrics["tflops"] = seed_flops(config) / (step * 1e-3) / 1e12
    metrics["tflops_full"] = full_flops(config, stats, world_size, E) / (step * 1e-3) / 1e12
    unit_of.update(tflops=units.TFLOPS, tflops_full=units.TFLOPS)
    metrics.update(stats)
    unit_of.update(expert_load_max_over_mean=units.RATIO, rank_load_max_over_mean=units.RATIO,
                   dropped_tokens=units.COUNT, computed_rows=units.COUNT, sent_rows=units.COUNT)
    _block_metrics(samples, stats, metrics, unit_of)
    if memory is not None:
        metrics["peak_memory_mb"], unit_of["peak_memory_mb"] = memory, units.MB
    floor = floor_ms(params_of(config, case, world_size), stats, device)
    if floor is not None:
        metrics["floor_ms"], unit_of["floor_ms"] = floor, units.MS
        metrics["roofline_fraction"] = floor / step
        unit_of["roofline_fraction"] = units.FRACTION_OF_ROOFLINE
    return metrics, unit_of


def _block_metrics(samples, stats, metrics: dict[str, Any], unit_of: dict[str, str]) -> None:
    """System blocks: per-rank AG/GA medians under the seed importer's names (ag_fwd_ms_rank<r> ...),
    and units of the block statistics (counts informative; fractions and imbalance lower-is-better)."""
    for key, values in samples.items():
        if "_time_rank" in key and values:
            phase, rank = key.split("_time_rank")
            name = f"{phase.removeprefix('backward_')}_{'bwd' if phase.startswith('backward_') else 'fwd'}_ms"
            metrics[f"{name}_rank{rank}"], unit_of[f"{name}_rank{rank}"] = statistics.median(values), units.MS
    for name in stats:
        if name not in unit_of:
            unit_of[name] = units.RATIO if "fraction" in name or "imbalance" in name else units.COUNT


def floor_ms(params: dict, stats: dict, device: str) -> float | None:
    """Floor of one step (forward only in eval) for the busiest rank, by the performance model's
    MoE floor (qbench/model/floors.py: gate and expert GEMMs at peak compute or memory, plus the token
    exchange over NVLink); None off CUDA or on a GPU without a hardware preset."""
    from qbench.model.floors import moe as moe_floors
    from qbench.model.hardware import current_gpu_preset

    hardware = current_gpu_preset(device)
    if hardware is None:
        return None
    return moe_floors(params, stats, hardware)["step_time"].floor_ms


def seed_lines(record: dict) -> list[str]:
    """The seeds' log lines for one record: [Benchmark] header, STEP-i lines, [Summary]."""
    p, s = record["params"], record.get("samples", {})
    device = "cuda:0" if record.get("device") == "cuda" else "cpu"
    lines = [f"[Benchmark] world_size = {p['world_size']}, dtype = {p['dtype']}, model_dim = {p['model_dim']}, "
             f"hidden_size = {p['hidden_size']}, samples = {p['samples']}, num_local_experts = "
             f"{p['num_local_experts']}, topK = {p['top_k']}, a2a_ffn_overlap_degree = "
             f"{p['a2a_ffn_overlap_degree']}, device = `{device}`"]
    steps = s.get("step_time", [])
    fwd = s.get("forward_time", [0.0] * len(steps))
    bwd = s.get("backward_time", [0.0] * len(steps))
    flops = p["samples"] * p["model_dim"] * p["hidden_size"] * 4 * p["top_k"] * (1 if p.get("eval") else 3)
    for i, (t, f, b) in enumerate(zip(steps, fwd, bwd)):
        lines.extend(block_lines(record, i))
        lines.append(f"STEP-{i}: step_time = {t:.6f} ms, foward_time = {f:.6f}, backward_time = {b:.6f}, "
                     f"perf = {flops / (t * 1e-3) / 1e12:.2f} tflops.")
    if steps:
        mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
        lines.append(f"[Summary] Average synchronized step_time = {mean(steps)} ms, "
                     f"forward = {mean(fwd)}, backward = {mean(bwd)}.")
    return lines


def block_lines(record: dict, step: int) -> list[str]:
    """System blocks: the seed's per-rank diagnostics printed before STEP-<step>: `block_info TOTAL
    REMOTE`, then `AG|GA, <remote fraction>, <ms>, 0` (forward AG, GA, then backward AG, GA), each
    line ending in `rank R` (the seed's lines carry no rank; the importer reads the suffix when present)."""
    m, s = record.get("metrics", {}), record.get("samples", {})
    ranks = sorted(int(k.removeprefix("blocks_rank")) for k in m if k.startswith("blocks_rank"))
    lines = [f"block_info {int(m[f'blocks_rank{r}'])} {int(m[f'remote_blocks_rank{r}'])} rank {r}" for r in ranks]
    for phase, label in (("ag", "AG"), ("ga", "GA"), ("backward_ag", "AG"), ("backward_ga", "GA")):
        for r in ranks:
            values = s.get(f"{phase}_time_rank{r}", [])
            if step < len(values):
                lines.append(f"{label}, {m[f'remote_fraction_rank{r}']:.6f}, {values[step]:.6f}, 0 rank {r}")
    return lines
