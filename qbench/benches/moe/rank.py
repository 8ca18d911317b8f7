"""One rank's side of `qbench moe`: build, check against the reference, time, count, and the record.

Per configuration every rank builds the same layer (or attention + MoE model under DDP, expert
parameters excluded from its all-reduce), checks it against the dense reference (all ranks agree on
the verdict before anything is timed), collects routing statistics in one untimed step, then times
steps with qbench.timing.time_ranks (barrier, synchronize, max over ranks per step) and a PhaseTimer
for forward / backward and the layer's phases (gate, plan, dispatch, experts, combine, backward).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from qbench import units
from qbench.benches.moe.cases import case_label, cases, params_of, resolve_gemm
from qbench.benches.moe.config import BENCH, MoEBenchConfig
from qbench.benches.moe.metrics import summarize
from qbench.benches.moe.trace import trace_steps
from qbench.layers.moe import ExampleModel, MoELayer, MoEOptions, expert_parameter_names
from qbench.layers.moe.reference import check_layer
from qbench.layers.moe.routing import forced_choices, load_trace, locality_choices, make_input, parse_routing
from qbench.store import make_record
from qbench.timing import PhaseTimer, max_over_ranks, time_ranks
from qbench.units import torch_dtype

HEAD_DIM = 64  # attention heads = model_dim / 64 (the usual head size)
PER_RANK_PHASES = ("ag", "ga", "backward_ag", "backward_ga")  # kept per rank (the seed prints them per rank)


def rank_main(ctx, config: MoEBenchConfig) -> Iterator[dict]:
    """Every rank runs every configuration; rank 0's records are the ones kept."""
    for case in cases(config):
        yield one_case(ctx, config, case)


def one_case(ctx, config: MoEBenchConfig, case: dict[str, Any]) -> dict:
    """Build, check against the reference, then measure one configuration. A failure on any rank is
    an error record on every rank (they agree before each collective step, so none is left waiting)."""
    device = _device_kind(ctx)
    case = dict(case, gemm=resolve_gemm(case["gemm"], device))
    params = params_of(config, case, ctx.world_size)
    error = None
    try:
        model, moe, x, dy = build(ctx, config, case)
        params["transport"] = getattr(getattr(moe, "transport", None), "name", "a2a")
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot be built is an error record
        error = f"{type(exc).__name__}: {exc}"
    if not agree(error is None, ctx.device):  # every rank skips together (no stray collective)
        return make_record(BENCH, params, status="error", error=error or "failed on another rank", device=device)
    try:
        ok, detail = check(ctx, moe, x)
    except Exception as exc:  # noqa: BLE001 - e.g. a GEMM backend that rejects these shapes on every rank
        ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not agree(ok, ctx.device) or not ok:
        return make_record(BENCH, params, status="error", error=f"reference check failed: {detail}", device=device)
    return measure(ctx, config, case, params, (model, moe, x, dy), detail)


def measure(ctx, config: MoEBenchConfig, case: dict[str, Any], params: dict[str, Any], built, detail: str) -> dict:
    """Routing statistics, timed steps, the divergence check and (with trace_dir) profiled steps of
    a checked configuration; `detail`: the reference check's description (its max error is a metric)."""
    model, moe, x, dy = built
    device = _device_kind(ctx)
    stats = routing_stats(ctx, model, moe, x)
    if case.get("system") == "blocks":
        stats.update(block_stats(ctx, moe))
    samples = time_steps(ctx, config, model, moe, x, dy)
    if not weights_finite(ctx, model):
        return make_record(BENCH, params, status="error", device=device,
                           error="weights not finite after the timed steps: the timing measured a diverged layer")
    memory = peak_memory_mb(ctx)
    if config.trace_dir:
        trace_steps(moe, lambda phase: make_step(config, model, x, dy, phase), Path(config.trace_dir),
                    case_label(case), ctx.rank)
    metrics, unit_of = summarize(config, case, ctx.world_size, samples, stats, memory, device)
    metrics["check_max_rel_error"] = float(detail.split("max error ")[1].split(" ")[0])
    unit_of["check_max_rel_error"] = units.REL_ERROR
    keep = ("step_time", "forward_time", "backward_time", "step_time_instrumented")
    return make_record(BENCH, params, metrics, units=unit_of, device=device,
                       samples={k: v for k, v in samples.items() if k in keep or "_time_rank" in k})


def _device_kind(ctx) -> str:
    return "cuda" if ctx.device.startswith("cuda") else "cpu"


def build(ctx, config, case: dict[str, Any]):
    """(model, moe layer, x, dy) for one configuration on this rank."""
    dtype = torch_dtype(config.dtype)
    opts = MoEOptions(config.model_dim, config.hidden_size, case["num_local_experts"], config.top_k,
                      config.activation, config.capacity_factor, config.fp32_gate,
                      case["a2a_ffn_overlap_degree"], case["replicate_hot"], case["gemm"])
    moe = _layer(ctx, config, case, opts, dtype)
    spec = parse_routing(case["routing"])
    gen = torch.Generator(device=ctx.device).manual_seed(config.seed * 1009 + ctx.rank + 1)
    x = make_input(spec, config.samples, config.model_dim, generator=gen, device=ctx.device, dtype=dtype)
    dy = torch.randn(x.shape, generator=gen, device=ctx.device).to(dtype)
    trace = load_trace(spec.trace, config.top_k, moe.num_experts) if spec.kind == "trace" else None
    moe.forced = forced_choices(spec, config.samples, config.top_k, moe.num_experts, rank=ctx.rank,
                                step=0, trace=trace, device=ctx.device)
    if case.get("locality") is not None:
        moe.forced = locality_choices(config.samples, config.top_k, opts.num_local_experts, ctx.world_size,
                                      case["locality"], rank=ctx.rank, step=0, device=ctx.device)
    model = moe
    if config.model == "attn-moe":
        model = ExampleModel(moe, max(1, config.model_dim // HEAD_DIM))
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, expert_parameter_names(model))
        ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        x, dy = (t.view(config.batch_size, -1, config.model_dim) for t in (x, dy))
    return model, moe, x, dy


def _layer(ctx, config, case, opts, dtype):
    """The a2a layer, or (system "blocks") the block-dispatch layer over its transport."""
    if case.get("system", "a2a") == "blocks":
        from qbench.layers.moe import BlocksMoELayer

        return BlocksMoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=dtype, device=ctx.device,
                              seed=config.seed, block_size=config.block_size, transport=config.transport,
                              local_world_size=ctx.local_world_size)
    return MoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=dtype, device=ctx.device,
                    seed=config.seed)


def agree(ok: bool, device: str) -> bool:
    """True only when every rank says True (so that all ranks skip or time together)."""
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def weights_finite(ctx, model) -> bool:
    """True when every parameter on every rank is finite (after timing: a timed step that diverged
    measured a different layer)."""
    with torch.no_grad():
        ok = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return agree(ok, ctx.device)


def check(ctx, moe, x) -> tuple[bool, str]:
    """The MoE layer on its own tokens against the dense reference; a fresh dy for the check."""
    x2 = x.reshape(-1, x.shape[-1])
    gen = torch.Generator(device=x2.device).manual_seed(4242 + ctx.rank)
    dy = torch.randn(x2.shape, generator=gen, device=x2.device).to(x2.dtype)
    result = check_layer(moe, x2, dy)
    moe.zero_grad(set_to_none=True)
    return agree(result.ok, ctx.device), result.describe()


@torch.no_grad()
def routing_stats(ctx, model, moe, x) -> dict[str, float]:
    """One untimed forward: per-expert load (max/mean, global), per-rank load, dropped assignments."""
    model(x)
    routing, plan = moe.last["routing"], moe.last["plan"]
    counts = routing.counts.clone().to(torch.float64)
    dist.all_reduce(counts)
    rank_rows = torch.zeros(ctx.world_size, dtype=torch.float64, device=counts.device)
    # rows the expert GEMMs run on: what this rank received (both systems), plus its replicas' rows
    rank_rows[ctx.rank] = plan.recv_rows + sum(plan.kept[e] for e in plan.hot)
    dist.all_reduce(rank_rows)
    dropped = torch.tensor([float((~routing.keep).sum())], dtype=torch.float64, device=counts.device)
    dist.all_reduce(dropped)
    return {"expert_load_max_over_mean": float(counts.max() / counts.mean()),
            "rank_load_max_over_mean": float(rank_rows.max() / rank_rows.mean().clamp_min(1)),
            "dropped_tokens": float(dropped.item()),
            "computed_rows": float(rank_rows.sum().item()),
            "sent_rows": float(plan.send_rows)}


def make_step(config, model, x, dy, phase):
    """One step as the bench times it: zero_grad, forward, backward, SGD (forward only under no_grad
    in eval); phase(name) is a context manager around the forward and the backward.

    SGD runs with learning rate 0: the same kernels as any SGD step, but the weights stay those that
    passed the reference check. The output gradient dy is fixed, i.e. the gradient of a linear loss,
    which no learning rate > 0 keeps bounded: at the seeds' 1e-5 the outputs grow ~40x every 10
    steps, fp16 overflows after ~70 steps at the seed config, the gate's logits turn NaN and every
    token goes to one expert (step time x2.3 on 4 x H200, measuring a broken layer)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step(i: int) -> None:
        if config.eval:
            with torch.no_grad(), phase("forward"):
                model(x)
            return
        opt.zero_grad(set_to_none=True)
        with phase("forward"):
            out = model(x)
        with phase("backward"):
            out.backward(dy)
        opt.step()

    return step


def time_steps(ctx, config, model, moe, x, dy) -> dict[str, list[float]]:
    """Per-step samples (ms, max over ranks): step_time, forward_time, backward_time, <phase>_time and
    step_time_instrumented. Two passes of config.num_steps steps each: step, forward and backward
    times come from steps without the layer's phase events, the phase breakdown from a second pass
    with them. Every phase records two CUDA events and enters a Python context (about 15 a step),
    host time that lengthens the step wherever the GPU waits on the host; the second pass's step
    time is kept as step_time_instrumented so that this cost stays visible."""
    device = _device_kind(ctx)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    plain, outer = _timed_pass(config, model, moe, x, dy, device, phases=False)
    instrumented, timer = _timed_pass(config, model, moe, x, dy, device, phases=True)
    samples = {"step_time": list(plain.samples_ms), "step_time_instrumented": list(instrumented.samples_ms)}
    for name, values in outer.results_ms().items():  # forward, backward
        samples[f"{name}_time"] = max_over_ranks(values)
    for name, values in timer.results_ms().items():
        if name in ("forward", "backward"):
            continue
        samples[f"{name}_time"] = max_over_ranks(values)
        if name in PER_RANK_PHASES:
            for r, row in enumerate(_every_rank(values, ctx)):
                samples[f"{name}_time_rank{r}"] = [round(v, 6) for v in row]  # the seed's precision
    return samples


def _timed_pass(config, model, moe, x, dy, device: str, phases: bool):
    """time_ranks over the steps with a PhaseTimer around forward and backward, and inside the layer
    too when `phases`: (Timing of the steps, the PhaseTimer)."""
    timer = PhaseTimer(device)
    moe.timer = timer if phases else None
    run = make_step(config, model, x, dy, timer.phase)

    def step(i: int) -> None:
        run(i)
        timer.next_step()

    try:
        timing = time_ranks(step, steps=config.num_steps, warmup=config.warmup, device=device,
                            on_warmup_end=timer.discard)
    finally:
        moe.timer = None
    return timing, timer


def _every_rank(values: list[float], ctx) -> list[list[float]]:
    """Every rank's per-step list (one all_gather; all ranks time the same number of steps)."""
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def block_stats(ctx, moe) -> dict[str, float]:
    """From the blocks layer's last forward (routing_stats's): blocks and remote blocks per owner rank,
    the global remote fraction, the busiest rank over the mean, and the most rows a rank pulls."""
    plan = moe.last["plan"]
    remote_rows = plan.recv_rows - plan.recv_splits[ctx.rank]
    mine = torch.tensor([plan.num_blocks, plan.blocks_remote, remote_rows], dtype=torch.float64,
                        device=ctx.device)
    every = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(every, mine)
    table = torch.stack(every).cpu()  # [W, 3]
    stats = {"blocks_total": float(table[:, 0].max()), "blocks_remote": float(table[:, 1].max()),
             "remote_fraction": float(table[:, 1].sum() / table[:, 0].sum().clamp_min(1)),
             "block_imbalance": float(table[:, 0].max() / table[:, 0].mean().clamp_min(1)),
             "remote_rows": float(table[:, 2].max())}
    for r, (total, remote, _) in enumerate(table.tolist()):
        stats[f"blocks_rank{r}"], stats[f"remote_blocks_rank{r}"] = total, remote
        stats[f"remote_fraction_rank{r}"] = remote / total if total else 0.0
    return stats


def peak_memory_mb(ctx) -> float | None:
    if not ctx.device.startswith("cuda"):
        return None
    return max(max_over_ranks([torch.cuda.max_memory_allocated() / 2**20]))
