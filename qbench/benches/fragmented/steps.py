"""Timed steps of `qbench fragmented`, in each execution mode.

  training steps (tasks train, eval)  forward, MSE loss, zero_grad, backward, Adam step; phases timed by
                                events (forward_ms, backward_ms, optimizer_ms, step_ms ...), eager or
                                compiled (torch.compile(model, fullgraph=True), static shapes)
  fwd_bwd                       forward + loss + backward alone (fwd_bwd_ms), in every mode; the
                                graph mode captures it into one CUDA graph and replays it
  inference                     forward calls under torch.inference_mode(), cold L2 before each
  host time                     CPU time spent issuing one step (host_step_ms, host_fwd_bwd_ms,
                                host_forward_ms), the device synchronized outside each sample
  traced steps                  with --trace: 3 more eager forward + loss + backward steps (or inference
                                forwards) under the profiler, phases "forward" and "backward" as ranges
                                (qbench.traces.record_training_steps; `qbench trace FILE.csv` prints the kernels)
  clock and power               GPU only: SM clock (MHz) and board power (W) while the timed work ran,
                                medians of one NVML reading per timed step taken outside the timed spans
                                (qbench.telemetry): sm_clock_mhz_<what> and power_w_<what>, <what> step
                                (training steps), fwd_bwd or forward (inference)
peak_memory_mb: torch.cuda.max_memory_allocated over the timed steps (reset after warm-up):
parameters, gradients, both Adam moments, input and target, activations saved for backward and kernel
temporaries (inference: parameters, input, activations).
"""

from __future__ import annotations

import gc

from qbench.modes import prepared_step
from qbench.telemetry import GpuReadings
from qbench.timing import PhaseTimer, graph_replay, host_time, time_fn


def sync_and_reset(device: str) -> None:
    import torch

    if device == "cuda":
        gc.collect()  # frees the previous configuration's tensors before the peak is reset
        torch.cuda.synchronize()
        # cuBLAS workspaces are cached per stream and each CUDA-graph capture uses a new side stream:
        # without this, every earlier configuration would leave ~32-64 MB counted in the next peak
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mb(device: str, baseline: int = 0) -> float | None:
    """Peak allocated MB since the last reset, less `baseline` bytes held before the model existed."""
    import torch

    return (torch.cuda.max_memory_allocated() - baseline) / 2**20 if device == "cuda" else None


def allocated(device: str) -> int:
    import torch

    return torch.cuda.memory_allocated() if device == "cuda" else 0


def measure_training(model, x, target, steps: int, warmup: int, device: str, baseline: int = 0
                     ) -> tuple[dict, dict]:
    """Training steps timed phase by phase. Returns ({phase: [ms per step]}, memory, host, clock and power
    metrics)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters())
    timer = PhaseTimer(device)

    def step() -> None:
        with timer.phase("step"):
            with timer.phase("forward"):
                out = model(x)
            loss = F.mse_loss(out, target)  # outside the named phases, as in the seed
            with timer.phase("zero_grad"):
                optimizer.zero_grad()
            with timer.phase("backward"):
                loss.backward()
            with timer.phase("optimizer"):
                optimizer.step()
        timer.next_step()

    def plain_step() -> None:  # the same step without phase events, for its host time
        out = model(x)
        optimizer.zero_grad()
        F.mse_loss(out, target).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    sync_and_reset(device)
    timer.discard()
    readings = GpuReadings(device)  # the clock and power the timed steps ran at
    for _ in range(steps):
        step()
        readings()  # after the step is issued, outside its phases (as qbench.timing's observe)
    phases = timer.results_ms()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    extra = {"peak_memory_mb": peak_mb(device, baseline), "optimizer_state_mb": state / 2**20,
             "host_step_ms": host_time(plain_step, device=device, warmup=1, repeat=steps).median,
             **readings.metrics("step")}
    return phases, extra


def fwd_bwd(model, x, target, out: dict, reset: bool = True):
    """forward + MSE loss + backward, the output in out["y"]; reset: grads set to None first (a graph
    capture gets them reset outside it instead)."""
    import torch.nn.functional as F

    def run() -> None:
        if reset:
            clear_grads(model)
        out["y"] = model(x)
        F.mse_loss(out["y"], target).backward()

    return run


def clear_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def fwd_bwd_results(model, x, target, exec: str):
    """(the step to time, [output, grads...] after one step) of forward + backward in a mode."""
    out: dict = {}
    step = prepared_step(exec, lambda reset: fwd_bwd(model, x, target, out, reset), warmup=3,
                         drop=lambda: (clear_grads(model), out.clear()))
    step()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]  # eval: S gets none
    return step, [out["y"].detach().clone()] + grads


def time_fwd_bwd(step, steps: int, device: str) -> tuple[list[float], dict]:
    """(samples of fwd_bwd_ms, {host_fwd_bwd_ms, and on a GPU the clock and power the timed calls ran at})."""
    readings = GpuReadings(device)
    timing = time_fn(step, device=device, warmup=1, repeat=steps, flush_l2=True, observe=readings)
    host = host_time(step, device=device, warmup=1, repeat=steps).median
    return list(timing.samples_ms), {"host_fwd_bwd_ms": host, **readings.metrics("fwd_bwd")}


def forward_fn(model, x, task: str):
    """The forward call of a task: under inference_mode for 'inference', with autograd otherwise."""
    import torch

    if task != "inference":
        return lambda: model(x)

    def infer():
        with torch.inference_mode():
            return model(x)

    return infer


def measure_inference(model, x, steps: int, warmup: int, device: str, baseline: int = 0,
                      graph: bool = False) -> tuple[dict, dict]:
    """Forward calls under torch.inference_mode(), cold L2 before each (as inside a larger model);
    with graph=True the forward is one replayed CUDA graph."""
    fn = forward_fn(model, x, "inference")
    for _ in range(warmup):
        fn()
    sync_and_reset(device)
    fn()  # peak memory of one call, before the timer's L2-flush buffer exists
    peak = peak_mb(device, baseline)
    if graph:
        fn = graph_replay(fn)
    readings = GpuReadings(device)  # the clock and power the timed calls ran at
    timing = time_fn(fn, device=device, warmup=1, repeat=steps, observe=readings)
    host = host_time(fn, device=device, warmup=1, repeat=steps).median
    return {"forward": list(timing.samples_ms)}, {"peak_memory_mb": peak, "host_forward_ms": host,
                                                  **readings.metrics("forward")}


def replay_forward_ms(model, x, task: str, steps: int, device: str) -> list[float] | None:
    """The forward replayed as a CUDA graph (what a training loop gets from graph capture), or None
    on the CPU or when this forward cannot be captured."""
    if device != "cuda":
        return None
    try:
        timing = time_fn(forward_fn(model, x, task), device=device, warmup=3, repeat=steps, cuda_graph=True)
    except RuntimeError:
        return None
    return list(timing.samples_ms)


def trace(model, x, target, task: str, out_dir: str, label: str):
    """3 steps after the timed ones under the profiler (qbench.traces.record_training_steps): forward + MSE loss +
    backward (grads set to None first), or the forward under inference_mode for 'inference'."""
    import torch
    import torch.nn.functional as F

    from qbench.traces import record_training_steps

    if task == "inference":
        def infer():
            with torch.inference_mode():
                model(x)

        return record_training_steps(infer, None, out_dir, label)
    return record_training_steps(lambda: F.mse_loss(model(x), target), lambda loss: loss.backward(), out_dir, label,
                                 before=lambda: clear_grads(model))
