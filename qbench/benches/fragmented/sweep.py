"""`qbench fragmented`: FragmentedLinear against dense and structured baselines, one record per
variant, task, shape and execution mode (the metrics: qbench/metrics/fragmented.py).

Measured per record (ms are medians over the timed steps, samples kept):
  forward_ms             the forward call inside a training step (inference: cold-L2 forward calls)
  backward_ms            loss.backward() alone;  optimizer_ms: Adam's step alone
  backward_optimizer_ms  zero_grad + backward + optimizer step: the seed's "Backward time"
  step_ms                the whole training step (forward, loss, zero_grad, backward, Adam)
  fwd_bwd_ms             forward + loss + backward alone (the graph mode's one measure of training)
  host_*_ms              CPU time spent issuing a step (see benches/fragmented/steps.py)
  forward_replay_ms      the eager forward replayed from one CUDA graph (GPU only; no launch overhead)
  sm_clock_mhz_<what>    GPU only: SM clock (MHz) and board power (W, power_w_<what>) while the timed work ran;
                         <what>: step (training steps), fwd_bwd (forward + backward), forward (inference)
  peak_memory_mb, param_memory_mb, optimizer_state_mb, parameters, tflops (useful forward flops /
  forward_ms), replay_tflops (over forward_replay_ms), roofline_fraction (GPU with a preset)
With a trace directory, each eager configuration then runs 3 profiled steps (steps.trace): <trace_label>-rank0.csv
and .json.gz there.
Before timing, FragmentedLinear's train, eval and inference task outputs are checked against the float64
reference definition, and a compiled or graphed step against the eager one; a mismatch is an error
record.
"""

from __future__ import annotations

from collections.abc import Iterator

from qbench.benches.fragmented import steps
from qbench.benches.fragmented.config import BENCH, Case, FragmentedConfig
from qbench.benches.fragmented.cost import forward_cost, roofline
from qbench.benches.fragmented.gate import gate
from qbench.dtypes import tolerance, torch_dtype
from qbench.modes import compiled
from qbench.store import make_record
from qbench.timing import backward_thread


def build(case: Case, bias: bool, device: str):
    import torch

    from qbench.layers import fragmented as fl

    kw = {"device": device, "dtype": torch_dtype(case.dtype)}
    s = case.size
    if case.variant == "dense":
        return torch.nn.Linear(s, s, bias=bias, **kw)
    if case.variant == "lowrank":
        return fl.LowRankLinear(s, s, rank=s // 32, bias=bias, **kw)
    if case.variant == "blockdiag":
        return fl.BlockDiagonalLinear(s, s, num_blocks=case.fragments, bias=bias, **kw)
    return fl.FragmentedLinear(s, s, num_fragments=case.fragments, compressed_features=s // 32, bias=bias, **kw)



def _median(values) -> float | None:
    from qbench.samples import percentile

    return percentile(values, 50) if values else None


def _phase_metrics(phases: dict) -> tuple[dict, dict]:
    """Medians and samples per phase; backward_optimizer = zero_grad + backward + optimizer per step."""
    samples = {f"{k}_ms": v for k, v in phases.items() if k in ("forward", "backward", "optimizer", "step")}
    if "backward" in phases:
        samples["backward_optimizer_ms"] = [sum(t) for t in zip(
            phases["zero_grad"], phases["backward"], phases["optimizer"])]
    return {k: _median(v) for k, v in samples.items()}, samples


def _inputs(case: Case, device: str, seed: int):
    """Fresh normal inputs and targets (never zeros), seeded per configuration."""
    import torch

    torch.manual_seed(seed)
    dtype = torch_dtype(case.dtype)
    x = torch.randn(case.batch, case.size, device=device, dtype=dtype)
    target = torch.randn(case.batch, case.size, device=device, dtype=dtype)
    return x, target


def _mismatch(got: list, want: list, dtype: str) -> str | None:
    for i, (a, b) in enumerate(zip(got, want)):
        err = float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
        if not err <= tolerance(dtype).layer:
            return f"tensor {i} (0: output, then gradients) differs from eager by {err:.2e}"
    return None


def _train(model, runner, x, target, case: Case, config: FragmentedConfig, baseline: int):
    """(phases, extra metrics, fwd_bwd samples, failure) of a train/eval configuration."""
    device, ex = config.device, case.exec
    phases, extra = ({}, {}) if ex == "graph" else steps.measure_training(
        runner, x, target, config.steps, config.warmup, device, baseline)
    step, got = steps.fwd_bwd_results(runner, x, target, ex)
    if ex != "eager":
        failure = _mismatch(got, steps.fwd_bwd_results(model, x, target, "eager")[1], case.dtype)
        if failure:
            return phases, extra, None, f"{ex}: {failure}"
    samples, timed = steps.time_fwd_bwd(step, config.steps, device)
    extra.update(timed)
    return phases, extra, samples, None


def _infer(model, runner, x, case: Case, config: FragmentedConfig, baseline: int):
    if case.exec != "eager":
        import torch

        with torch.inference_mode():
            failure = _mismatch([runner(x)], [model(x)], case.dtype)
        if failure:
            return {}, {}, f"{case.exec}: {failure}"
    phases, extra = steps.measure_inference(runner if case.exec == "compile" else model, x, config.steps,
                                            config.warmup, config.device, baseline, graph=case.exec == "graph")
    return phases, extra, None


def measure(case: Case, config: FragmentedConfig) -> dict:
    """One record: build, gate (FragmentedLinear), check the exec against eager, time, count."""

    device = config.device
    steps.sync_and_reset(device)
    baseline = steps.allocated(device)  # anything still held from earlier configurations (normally 0)
    x, target = _inputs(case, device, config.seed)
    model = build(case, config.bias, device)
    metrics, selected, failure = _checked(model, x, case)
    if failure:
        return make_record(BENCH, case.params(), metrics, status="error", error=failure, device=device)
    model.train(case.task == "train")
    runner = compiled(model, case.exec)
    fwd_bwd = None
    if case.task == "inference":
        phases, extra, failure = _infer(model, runner, x, case, config, baseline)
    else:
        with backward_thread(case.backward_thread):
            phases, extra, fwd_bwd, failure = _train(model, runner, x, target, case, config, baseline)
    if failure:
        return make_record(BENCH, case.params(), metrics, status="error", error=failure, device=device)
    medians, samples = _phase_metrics(phases)
    metrics.update(medians)
    metrics.update(extra)
    if fwd_bwd:
        samples["fwd_bwd_ms"], metrics["fwd_bwd_ms"] = fwd_bwd, _median(fwd_bwd)
    if config.cuda_graph and case.exec == "eager":
        graph = steps.replay_forward_ms(model, x, case.task, config.steps, device)
        if graph:
            samples["forward_replay_ms"], metrics["forward_replay_ms"] = graph, _median(graph)
    _throughput(metrics, case, selected, device)
    if config.trace_dir and case.exec == "eager":
        with backward_thread(case.backward_thread):
            steps.trace(model, x, target, case.task, config.trace_dir, trace_label(case))
    return make_record(BENCH, case.params(), metrics, samples=samples, device=device)


def _checked(model, x, case: Case) -> tuple[dict, int | None, str | None]:
    """(metrics known before timing, fragments the hard selection picks or None, the gate's failure or None):
    parameter counts and, for FragmentedLinear, its errors against the reference."""
    import torch

    metrics: dict = {"parameters": sum(p.numel() for p in model.parameters()),
                     "param_memory_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20}
    if case.variant != "fragmented":
        return metrics, None, None
    errors, failure = gate(model, x, case.dtype)
    metrics.update(errors)
    if failure or case.task == "train":
        return metrics, None, failure
    with torch.no_grad():
        selected = int(model.scores(x).argmax(dim=1).unique().numel())
    metrics["selected_fragments"] = selected
    return metrics, selected, None


def trace_label(case: Case) -> str:
    """The file name stem of a configuration's trace: variant, size, batch, fragments, task, dtype, backward
    thread."""
    return (f"{case.variant}-{case.size}-b{case.batch}-n{case.fragments}-{case.task}-{case.dtype}"
            f"-{case.backward_thread}")


def _throughput(metrics: dict, case: Case, selected, device: str) -> None:
    flops, moved = forward_cost(case, selected)
    metrics["tflops"] = flops / metrics["forward_ms"] / 1e9 if metrics.get("forward_ms") else None
    if metrics.get("forward_replay_ms"):
        metrics["replay_tflops"] = flops / metrics["forward_replay_ms"] / 1e9
    metrics["roofline_fraction"] = roofline(flops, moved, case.dtype, metrics.get("forward_ms"), device)


def run(config: FragmentedConfig, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """Records of every pending configuration (all but `done`'s), as they are measured (config must be resolved)."""
    from qbench.benches.fragmented.config import pending

    for case in pending(config, done):
        try:
            yield measure(case, config)
        except torch_oom_errors() as exc:
            yield make_record(BENCH, case.params(), status="error", device=config.device,
                              error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def torch_oom_errors() -> tuple[type[BaseException], ...]:
    """Errors that fail one configuration, not the sweep (out of memory, a kernel that cannot run)."""
    import torch

    return (torch.cuda.OutOfMemoryError, RuntimeError)
