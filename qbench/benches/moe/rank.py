"""One rank's side of `qbench moe`: build, check against the reference, time, count, and the records.

Per configuration every rank builds the same layer (or attention + MoE model under DDP, expert
parameters excluded from its all-reduce), checks it against the dense reference (all ranks agree on
the verdict before anything is timed), collects routing statistics in one untimed step, then, per
execution mode (modes.py: eager, compile, graph; `skipped` with a reason where the mode cannot run),
times steps with qbench.timing.time_ranks (barrier, synchronize, max over ranks per step) and a
PhaseTimer for forward / backward and, eager, the layer's phases (gate, plan, dispatch, experts,
combine, backward), plus the host time of one step. A mode whose weights or outputs stop being finite,
or whose step time drifts (qbench.samples.drift_error), is an error record, never `ok`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from qbench.benches.moe import modes
from qbench.benches.moe.cases import Case, case_label, mode_params, params_of, pending_cases, resolve_gemm
from qbench.benches.moe.config import BENCH, MoEBenchConfig
from qbench.benches.moe.metrics import summarize
from qbench.benches.moe.observe import Routed, last_plan, no_phase
from qbench.benches.moe.steps import host_ms, host_phases, make_step, time_plain, time_steps
from qbench.benches.moe.trace import trace_steps
from qbench.dist import max_over_ranks
from qbench.dtypes import torch_dtype
from qbench.layers.moe import ExampleModel, MoELayer, MoEOptions, expert_parameter_names
from qbench.layers.moe.reference import check_layer
from qbench.layers.moe.routing import forced_choices, load_trace, locality_choices, make_input, parse_routing
from qbench.migration.moe import tidy
from qbench.samples import drift_error
from qbench.store import make_record
from qbench.timing import backward_thread

HEAD_DIM = 64  # attention heads = model_dim / 64 (the usual head size)


def rank_main(ctx, config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """Every rank runs every configuration, one record per execution mode; rank 0's records are kept.
    `done` (--resume): the resume ids (resume_id) of records to keep; a configuration all of whose
    records are there is not run again."""
    for case in pending_cases(config, ctx.world_size, "cuda" if ctx.device.startswith("cuda") else "cpu", done):
        yield from one_case(ctx, config, case)


def one_case(ctx, config: MoEBenchConfig, case: Case) -> Iterator[dict]:
    """Build, check against the reference, then measure one configuration in every mode. A failure on
    any rank is an error record on every rank (they agree before each collective step, so none is left
    waiting)."""
    device = _device_kind(ctx)
    case = resolve_gemm(case, device)
    params = params_of(config, case, ctx.world_size)
    error = None
    try:
        model, moe, x, dy, choice = build(ctx, config, case)
        params["transport"] = getattr(getattr(moe, "transport", None), "name", "a2a")
        params.update(_tutel_versions(case))
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot be built is an error record
        error = f"{type(exc).__name__}: {exc}"
    if not agree(error is None, ctx.device):  # every rank skips together (no stray collective)
        yield from _every_exec(config, params, device, error or "failed on another rank")
        return
    try:
        ok, max_error, detail = check(ctx, moe, x, choice)
    except Exception as exc:  # noqa: BLE001 - e.g. a GEMM backend that rejects these shapes on every rank
        ok, max_error, detail = False, None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not agree(ok, ctx.device) or not ok:
        yield from _every_exec(config, params, device, f"reference check failed: {detail}")
        return
    yield from measure(ctx, config, case, params, (model, moe, x, dy), max_error)


def _tutel_versions(case: Case) -> dict[str, str]:
    """Variant tutel: Tutel's version and commit (params); nothing for qbench's own variants."""
    if case.variant != "tutel":
        return {}
    from qbench.benches.moe.tutel import tutel_info

    return tutel_info() or {}


def _every_exec(config, params: dict[str, Any], device: str, error: str) -> Iterator[dict]:
    for p in mode_params(config, params):
        yield make_record(BENCH, p, status="error", error=error, device=device)


def measure(ctx, config: MoEBenchConfig, case: Case, params: dict[str, Any], built,
            max_error: float) -> Iterator[dict]:
    """Routing statistics, then per execution mode: skipped with its reason, or timed steps, the
    divergence and drift checks and (eager, with trace_dir) profiled steps; `max_error`: the reference
    check's largest relative error (a metric)."""
    model, moe, x, dy = built
    twin = getattr(moe, "twin", None)  # variant tutel: its routing is its twin's (same gate, same tokens)
    stats, plan = routing_stats(ctx, model, moe, x) if twin is None else routing_stats(ctx, twin[0], twin[0], x)
    if case.variant == "blocks":
        stats.update(block_stats(ctx, plan))
    want: list = []  # an eager step's output and gradients, taken once for the compile / graph checks
    for p in mode_params(config, params):
        mode = p["exec"]
        reason = modes.refusal(mode, config, moe, ctx.world_size)
        if reason is not None:
            yield make_record(BENCH, p, status="skipped", error=reason, device=_device_kind(ctx))
            continue
        if mode != "eager" and not want:
            want = _eager_results(config, model, x, dy)
        with backward_thread(p["backward_thread"]):
            records = measure_mode(ctx, config, case, p, built, stats, max_error, want)
        yield from records


def measure_mode(ctx, config, case, params, built, stats, max_error: float, want: list) -> list[dict]:
    """One execution mode (params["exec"]) of a checked configuration: its records."""
    model, moe, x, dy = built
    device, mode, out = _device_kind(ctx), params["exec"], {}
    try:
        samples, step, failure = _mode_samples(ctx, config, mode, built, out, want)
    except Exception as exc:  # noqa: BLE001 - e.g. a capture or compilation that fails here
        samples, step, failure = None, None, f"{mode}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    if not agree(failure is None, ctx.device):
        return [make_record(BENCH, params, status="error", error=failure or "failed on another rank", device=device)]
    finite = outputs_finite(ctx, out) and weights_finite(ctx, model)
    extra = {"peak_memory_mb": peak_memory_mb(ctx), "host_ms": host_ms(ctx, config, step)}
    if mode == "eager":  # after host_ms, in a pass of its own: its clocks are on no other measured path
        extra.update(host_phases(ctx, config, model, moe, x, dy))
    if mode == "graph":  # after the peak memory: the second capture holds a pool of its own
        try:
            samples.update(modes.graph_phases(ctx, config, model, moe, x, dy, out))
        except Exception as exc:  # noqa: BLE001 - the record says why, the sweep goes on
            return [make_record(BENCH, params, status="error", device=device,
                                error=f"graph phases: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")]
    if config.trace_dir and mode == "eager":
        trace_steps(moe, lambda phase: make_step(config, model, x, dy, phase), Path(config.trace_dir),
                    case_label(case), ctx.rank)
    return record_of(config, case, params, ctx.world_size, samples, stats, extra, max_error, device, finite)


# the per-step samples a record keeps (the seed lines and compare's significance tests read them), besides the
# per-rank phase samples of variant blocks (<phase>_time_rank<r>)
KEPT_SAMPLES = ("step_time", "forward_time", "backward_time", "step_time_instrumented", "loop_step_time")


def record_of(config, case: Case, params, world_size: int, samples, stats, extra: dict, max_error: float,
              device: str, finite: bool = True) -> list[dict]:
    """The records of a timed mode (timing per_step, loop, and per rank: qbench/migration/moe.py tidy):
    `error` (never `ok`) when its weights or outputs stopped being finite or its step time drifted
    (qbench.samples.drift_error), else `ok`; metrics and samples are kept either way but for a diverged
    layer (its times measured something else)."""
    if not finite:
        return [make_record(BENCH, params, status="error", device=device,
                            error="weights or outputs not finite after the timed steps: the timing measured a "
                                  "diverged layer")]
    metrics = summarize(config, case, world_size, samples, stats, extra["peak_memory_mb"], device)
    metrics.update((k, v) for k, v in extra.items() if k.startswith("host_"))  # host_ms, host_<phase>_ms, ...
    metrics["check_max_rel_error"] = max_error
    drifted = drift_error(samples["step_time"])
    kept = {k: v for k, v in samples.items() if k in KEPT_SAMPLES or "_time_rank" in k}
    return [make_record(BENCH, p, values, device=device, status="error" if drifted else "ok", error=drifted,
                        samples=values_samples) for p, values, values_samples in tidy(params, metrics, kept)]


def _mode_samples(ctx, config, mode: str, built, out: dict, want: list):
    """(samples, the step whose host time is taken, failure) of one mode; compile and graph are first
    checked against the eager step's results (`want`)."""
    model, moe, x, dy = built
    device = _device_kind(ctx)
    if mode == "eager":
        return time_steps(ctx, config, model, moe, x, dy, out), make_step(config, model, x, dy, no_phase), None
    runner, step = model, None
    if mode == "compile":
        runner = modes.compiled(model, device)
        warm = make_step(config, runner, x, dy, no_phase, out)
        for i in range(modes.WARMUP):  # compilation and autotuning, untimed
            warm(i)
    else:
        step = modes.graphed(config, model, x, dy, out)
        step(0)
    if device == "cuda":
        torch.cuda.synchronize()
    failure = modes.mismatch(modes.step_results(model, out), want, x.dtype)
    if failure is not None:
        return None, None, f"{mode}: {failure}"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    samples = time_plain(ctx, config, runner, moe, x, dy, out, step=step)
    return samples, step or make_step(config, runner, x, dy, no_phase), None


def _eager_results(config, model, x, dy) -> list:
    out: dict = {}
    make_step(config, model, x, dy, no_phase, out)(0)
    return modes.step_results(model, out)


def _device_kind(ctx) -> str:
    return "cuda" if ctx.device.startswith("cuda") else "cpu"


def build(ctx, config, case: Case):
    """(model, moe layer, x, dy, choice) for one configuration on this rank: choice, the routing kind's
    forced expert ids [T, k] (or None: the gate routes), which the model (observe.Routed) passes on."""
    dtype = torch_dtype(config.dtype)
    opts = MoEOptions(model_dim=config.model_dim, hidden_size=config.hidden_size,
                      num_local_experts=case.num_local_experts, top_k=config.top_k, activation=config.activation,
                      capacity_factor=config.capacity_factor, fp32_gate=config.fp32_gate,
                      a2a_ffn_overlap_degree=case.a2a_ffn_overlap_degree, replicate_hot=case.replicate_hot,
                      gemm=case.gemm)
    moe = _layer(ctx, config, case, opts, dtype)
    spec = parse_routing(case.routing)
    gen = torch.Generator(device=ctx.device).manual_seed(config.seed * 1009 + ctx.rank + 1)
    x = make_input(spec, config.samples, config.model_dim, generator=gen, device=ctx.device, dtype=dtype)
    dy = torch.randn(x.shape, generator=gen, device=ctx.device).to(dtype)
    trace = load_trace(spec.trace, config.top_k, moe.num_experts) if spec.kind == "trace" else None
    choice = forced_choices(spec, config.samples, config.top_k, moe.num_experts, rank=ctx.rank,
                            step=0, trace=trace, device=ctx.device)
    if case.locality is not None:
        choice = locality_choices(config.samples, config.top_k, opts.num_local_experts, ctx.world_size,
                                  case.locality, rank=ctx.rank, step=0, device=ctx.device)
    model = moe
    if config.model == "attn-moe":
        model = ExampleModel(moe, max(1, config.model_dim // HEAD_DIM))
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, expert_parameter_names(model))
        ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        x, dy = (t.view(config.batch_size, -1, config.model_dim) for t in (x, dy))
    return (model if choice is None else Routed(model, choice)), moe, x, dy, choice


def _layer(ctx, config, case, opts, dtype):
    """The a2a layer, or (variant "blocks") the block-dispatch layer over its transport, or (variant "tutel")
    Tutel's layer with the a2a layer's weights (its gate without bias)."""
    if case.variant == "tutel":
        from qbench.benches.moe.tutel import TutelLayer, zero_gate_bias

        twin = MoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=dtype, device=ctx.device,
                        seed=config.seed)
        zero_gate_bias(twin)
        return TutelLayer(twin)
    if case.variant == "blocks":
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


def outputs_finite(ctx, out: dict) -> bool:
    """True when the last timed step's output is finite on every rank."""
    y = out.get("y")
    return agree(y is None or bool(torch.isfinite(y).all()), ctx.device)


def weights_finite(ctx, model) -> bool:
    """True when every parameter on every rank is finite (after timing: a timed step that diverged
    measured a different layer)."""
    with torch.no_grad():
        ok = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return agree(ok, ctx.device)


def check(ctx, moe, x, choice=None) -> tuple[bool, float, str]:
    """The MoE layer on its own tokens against the dense reference, a fresh dy for the check: (every rank
    passed, this rank's largest relative error over outputs and gradients, its description)."""
    x2 = x.reshape(-1, x.shape[-1])
    gen = torch.Generator(device=x2.device).manual_seed(4242 + ctx.rank)
    dy = torch.randn(x2.shape, generator=gen, device=x2.device).to(x2.dtype)
    if getattr(moe, "twin", None) is not None:
        from qbench.benches.moe.tutel import check_tutel

        result = check_tutel(moe, x2, dy)
    else:
        result = check_layer(moe, x2, dy, choice)
    moe.zero_grad(set_to_none=True)
    return agree(result.ok, ctx.device), max(result.errors.values(), default=0.0), result.describe()


@torch.no_grad()
def routing_stats(ctx, model, moe, x) -> tuple[dict[str, float], Any]:
    """One untimed forward: per-expert load (max/mean, global), per-rank load, dropped assignments; and
    that forward's plan."""
    (routing, plan), _ = last_plan(moe, lambda: model(x))
    counts = routing.counts.clone().to(torch.float64)
    dist.all_reduce(counts)
    rank_rows = torch.zeros(ctx.world_size, dtype=torch.float64, device=counts.device)
    # rows the expert GEMMs run on: what this rank received (both variants), plus its replicas' rows
    rank_rows[ctx.rank] = plan.recv_rows + sum(plan.kept[e] for e in plan.hot)
    dist.all_reduce(rank_rows)
    dropped = torch.tensor([float((~routing.keep).sum())], dtype=torch.float64, device=counts.device)
    dist.all_reduce(dropped)
    return {"expert_load_max_over_mean": float(counts.max() / counts.mean()),
            "rank_load_max_over_mean": float(rank_rows.max() / rank_rows.mean().clamp_min(1)),
            "dropped_tokens": float(dropped.item()),
            "computed_rows": float(rank_rows.sum().item()),
            "sent_rows": float(plan.send_rows)}, plan


def block_stats(ctx, plan) -> dict[str, float]:
    """From the blocks layer's plan of routing_stats's forward: blocks and remote blocks per owner rank,
    the global remote fraction, the busiest rank over the mean, and the most rows a rank pulls."""
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
