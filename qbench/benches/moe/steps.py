"""Training steps of `qbench moe` and their timing (every rank runs the same steps).

  make_step   zero_grad, forward, backward, SGD (lr 0); phase(name) wraps the forward and the backward;
              the step keeps its output (for the finiteness check after timing)
  time_steps  an eager step in two passes: steps without the layer's phase events (step, forward and
              backward times), then steps with them (the phase breakdown and step_time_instrumented)
  time_plain  one pass of any step (compiled: with forward / backward phases; graph replays: none,
              their phases come from a second capture, modes.graph_phases)
  time_loop   loop_step_time: the step inside a loop of it, as a training loop runs it (a sample is the
              mean of LOOP_BLOCK steps issued back to back after one untimed step; qbench.timing.time_ranks
              with block): where the host issues a step faster than the GPU runs it, its lead is hidden, as
              in training; step_time starts every step on an idle device and so also pays that lead
  host_ms     CPU time spent issuing one step (qbench.timing.host_time), the most of any rank: a step
              without any phase hook or event (nothing of the bench's on its path)
  host_phases host_<phase>_ms (forward, backward and the layer's phases: gate, plan, dispatch, experts,
              combine, backward_a2a, backward_experts, ...): CPU ms per step inside each phase, from a
              separate host_time pass whose phases run on host clocks (no CUDA events), the most of any
              rank; host_ms_instrumented: that pass's step, so that what the clocks cost shows beside host_ms
  sm_clock_mhz_step, power_w_step   the GPUs' SM clock (lowest rank) and power (highest rank) over the
              plain pass's steps (qbench.telemetry; GPU only)
  sm_clock_mhz_loop, power_w_loop   the same over the loop's blocks: the sustained regime that
              loop_step_time ran in (a GPU at its power cap lowers its clock there)
Samples are per step, in ms, the maximum over ranks.
"""

from __future__ import annotations

import contextlib
import statistics

import torch
import torch.distributed as dist

from qbench.benches.moe.observe import no_phase, observed
from qbench.dist import max_over_ranks, min_over_ranks
from qbench.telemetry import REASONS_PREFIX, GpuReadings
from qbench.timing import LOOP_BLOCK, PhaseTimer, host_time, time_ranks

PER_RANK_PHASES = ("ag", "ga", "backward_ag", "backward_ga")  # kept per rank (the seed prints them per rank)
HOST_REPEAT = 20  # steps whose host time is sampled (at most the timed steps)


def make_step(config, model, x, dy, phase, out: dict | None = None, reset: bool = True):
    """One step as the bench times it: zero_grad (unless `reset` is False: a graph capture drops the
    gradients outside it), forward, backward, SGD (forward only under no_grad in eval); phase(name) is a
    context manager around the forward and the backward; out["y"] keeps the step's output. The step's
    optimizer is `step.optimizer`.

    SGD runs with learning rate 0: the same kernels as any SGD step, but the weights stay those that
    passed the reference check. The output gradient dy is fixed, i.e. the gradient of a linear loss,
    which no learning rate > 0 keeps bounded: at the seeds' 1e-5 the outputs grow ~40x every 10
    steps, fp16 overflows after ~70 steps at the seed config, the gate's logits turn NaN and every
    token goes to one expert (step time x2.3 on 4 x H200, measuring a broken layer)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = {} if out is None else out

    def step(i: int) -> None:
        if config.eval:
            with torch.no_grad(), phase("forward"):
                out["y"] = model(x)
            return
        if reset:
            opt.zero_grad(set_to_none=True)
        with phase("forward"):
            out["y"] = model(x)
        with phase("backward"):
            out["y"].backward(dy)
        opt.step()

    step.optimizer = opt
    return step


def time_steps(ctx, config, model, moe, x, dy, out: dict) -> dict[str, list[float]]:
    """Per-step samples (ms, max over ranks) of an eager step: step_time, forward_time, backward_time,
    <phase>_time and step_time_instrumented. Two passes of config.num_steps steps each: step, forward
    and backward times come from steps without the layer's phase events, the phase breakdown from a
    second pass with them. Every phase records two CUDA events and enters a Python context (about 15 a
    step), host time that lengthens the step wherever the GPU waits on the host; the second pass's
    step time is kept as step_time_instrumented so that this cost stays visible."""
    if ctx.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    samples = time_plain(ctx, config, model, moe, x, dy, out)
    instrumented, timer = _timed_pass(ctx, config, model, moe, x, dy, out, phases=True)
    samples["step_time_instrumented"] = list(instrumented.samples_ms)
    for name, values in timer.results_ms().items():
        if name in ("forward", "backward"):
            continue
        samples[f"{name}_time"] = max_over_ranks(values)
        if name in PER_RANK_PHASES:
            for r, row in enumerate(_every_rank(values, ctx)):
                samples[f"{name}_time_rank{r}"] = [round(v, 6) for v in row]  # the seed's precision
    return samples


def time_plain(ctx, config, model, moe, x, dy, out: dict, step=None) -> dict[str, list[float]]:
    """step_time (and forward_time / backward_time where the step has those phases) of one pass, with the
    GPUs' SM clock and power per step where NVML reads them (sm_clock_mhz_step: the lowest of any rank,
    power_w_step: the highest); `step`: a ready step(i) (a graph replay), else make_step's step of `model`."""
    readings = GpuReadings(_device_kind(ctx))
    timing, timer = _timed_pass(ctx, config, model, moe, x, dy, out, phases=False, step=step, observe=readings)
    samples = {"step_time": list(timing.samples_ms)}
    for name, values in timer.results_ms().items():  # forward, backward
        samples[f"{name}_time"] = max_over_ranks(values)
    samples.update(_telemetry(readings, "step"))
    loop_readings = GpuReadings(_device_kind(ctx))
    samples["loop_step_time"] = time_loop(ctx, config, model, x, dy, out, step, observe=loop_readings)
    samples.update(_telemetry(loop_readings, "loop"))
    return samples


def _telemetry(readings: GpuReadings, what: str) -> dict[str, list[float]]:
    """sm_clock_mhz_<what> (the lowest of any rank) and power_w_<what> (the highest) samples, where every rank
    read its GPU, with throttle_reasons_<what> where every rank's NVML gave reasons; nothing otherwise."""
    if min_over_ranks([1.0 if readings.clock_mhz else 0.0]) != [1.0]:
        return {}
    return {f"sm_clock_mhz_{what}": min_over_ranks(readings.clock_mhz),
            f"power_w_{what}": max_over_ranks(readings.power_w), **_reasons_over_ranks(readings, what)}


REASON_BITS = 32  # NVML's clocks event reasons use the low bits (qbench.telemetry.REASONS)


def _reasons_over_ranks(readings: GpuReadings, what: str) -> dict[str, list[float]]:
    """throttle_reasons_<what>: [the reasons any rank's GPU gave], their NVML bits OR-ed over the ranks (one
    maximum per bit), where every rank has some; nothing otherwise. Every rank calls it (all-reduces)."""
    if min_over_ranks([0.0 if readings.reasons is None else 1.0]) != [1.0]:
        return {}
    bits = max_over_ranks([float((readings.reasons >> b) & 1) for b in range(REASON_BITS)])
    return {f"{REASONS_PREFIX}{what}": [float(sum(1 << b for b, seen in enumerate(bits) if seen))]}


def time_loop(ctx, config, model, x, dy, out: dict, step=None, observe=None) -> list[float]:
    """loop_step_time samples (ms per step, the most of any rank): one per block of LOOP_BLOCK steps issued
    back to back, config.num_steps // LOOP_BLOCK blocks (at least 3) after the plain pass's warm-up;
    observe: see qbench.timing.time_ranks (called once per block, while the block runs)."""
    run = step or make_step(config, model, x, dy, no_phase, out)
    blocks = max(3, config.num_steps // LOOP_BLOCK)
    timing = time_ranks(run, steps=blocks, warmup=0, device=_device_kind(ctx), block=LOOP_BLOCK, observe=observe)
    return list(timing.samples_ms)


def _timed_pass(ctx, config, model, moe, x, dy, out: dict, phases: bool, step=None, observe=None):
    """time_ranks over the steps with a PhaseTimer around forward and backward, and inside the layer
    too when `phases`: (Timing of the steps, the PhaseTimer); observe: see qbench.timing.time_ranks."""
    device = _device_kind(ctx)
    timer = PhaseTimer(device)
    run = step or make_step(config, model, x, dy, timer.phase, out)

    def timed(i: int) -> None:
        run(i)
        timer.next_step()

    with observed(moe, timer.phase) if phases else contextlib.nullcontext():
        timing = time_ranks(timed, steps=config.num_steps, warmup=config.warmup, device=device,
                            on_warmup_end=timer.discard, observe=observe)
    return timing, timer


def host_ms(ctx, config, step) -> float:
    """Median CPU time (ms) spent issuing one step, the most of any rank (every rank runs as many)."""
    repeat = max(1, min(config.num_steps, HOST_REPEAT))
    local = host_time(lambda: step(0), device=_device_kind(ctx), warmup=1, repeat=repeat).median
    return max(max_over_ranks([local]))


def host_phases(ctx, config, model, moe, x, dy) -> dict[str, float]:
    """host_<phase>_ms and host_ms_instrumented (module docstring): medians over the pass's steps of each
    rank, then the most of any rank (one reduction, after the pass). Every rank has the same phases."""
    clocks = PhaseTimer("cpu")  # host clocks whatever the device: what issuing each phase costs the CPU
    step = make_step(config, model, x, dy, clocks.phase)
    repeat = max(1, min(config.num_steps, HOST_REPEAT))
    with observed(moe, clocks.phase):
        timing = host_time(lambda: step(0), device=_device_kind(ctx), warmup=1, repeat=repeat, phases=clocks)
    phases = clocks.results_ms()
    names = [f"host_{name}_ms" for name in phases] + ["host_ms_instrumented"]
    local = [statistics.median(values) for values in phases.values()] + [timing.median]
    return dict(zip(names, max_over_ranks(local)))


def _every_rank(values: list[float], ctx) -> list[list[float]]:
    """Every rank's per-step list (one all_gather; all ranks time the same number of steps)."""
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _device_kind(ctx) -> str:
    return "cuda" if ctx.device.startswith("cuda") else "cpu"
