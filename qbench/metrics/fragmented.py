"""`qbench fragmented` metrics. One record per layer (variant) x task x shape (size, batch, fragments, dtype)
x exec x backward thread; the times of a record are medians over its timed steps, samples kept.

Tasks (the `task` param): train (model.train(): soft selection, full Adam step), eval (model.eval(): hard
selection, still with autograd and the Adam step, the seed's "Inference"), inference (torch.inference_mode(),
forward only)."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric

BENCH = "fragmented"
# dense: nn.Linear; fragmented: FragmentedLinear (N fragments + a low-rank path of rank in/32);
# blockdiag: a block-diagonal linear of N blocks; lowrank: the low-rank path alone (rank in/32)
VARIANTS = ("dense", "fragmented", "blockdiag", "lowrank")
TASKS = ("train", "eval", "inference")

# the GPU's clock and power while each kind of timed work ran: step (training steps), fwd_bwd (forward +
# loss + backward), forward (inference calls); one record may hold two of them
_TELEMETRY = tuple(
    metric
    for what in ("step", "fwd_bwd", "forward")
    for metric in (
        Metric(f"sm_clock_mhz_{what}", units.MHZ, f"median SM clock (NVML) over the timed {what} calls"),
        Metric(f"power_w_{what}", units.WATTS, f"median board power (NVML) over the timed {what} calls"),
        Metric(f"throttle_reasons_{what}", units.FLAG, f"NVML throttle reason bits seen over the {what} calls"),
    )
)

METRICS = (
    Metric("forward_ms", units.MS, "the forward call inside a training step (inference: cold-L2 forward calls)"),
    Metric("backward_ms", units.MS, "loss.backward() alone, inside a training step"),
    Metric("optimizer_ms", units.MS, "Adam's step alone, inside a training step"),
    Metric("backward_optimizer_ms", units.MS, "zero_grad + backward + Adam step: the seed's 'Backward time'"),
    Metric("step_ms", units.MS, "the whole training step (forward, loss, zero_grad, backward, Adam)"),
    Metric("fwd_bwd_ms", units.MS, "forward + loss + backward alone (exec graph: one replayed CUDA graph)"),
    Metric("forward_replay_ms", units.MS,
           "the eager forward replayed from a CUDA graph (no launch overhead; not the exec=graph step)"),
    Metric("host_step_ms", units.MS, "CPU time spent issuing one training step"),
    Metric("host_fwd_bwd_ms", units.MS, "CPU time spent issuing one forward + loss + backward"),
    Metric("host_forward_ms", units.MS, "CPU time spent issuing one inference forward"),
    Metric("peak_memory_mb", units.MB, "torch.cuda.max_memory_allocated over the timed steps, less what was "
                                       "held before the layer existed"),
    Metric("param_memory_mb", units.MB, "the layer's parameters"),
    Metric("optimizer_state_mb", units.MB, "Adam's two moments"),
    Metric("parameters", units.COUNT, "the layer's parameter count"),
    Metric("selected_fragments", units.COUNT, "distinct fragments the hard selection picks for the batch"),
    Metric("tflops", units.TFLOPS, "useful forward flops (hard selection: 1/N of the expert's) over forward_ms"),
    Metric("replay_tflops", units.TFLOPS, "the same flops over forward_replay_ms"),
    Metric("roofline_fraction", units.FRACTION_OF_ROOFLINE, "the forward's roofline floor over forward_ms"),
    Metric("rel_error_train", units.REL_ERROR, "train-mode output against the float64 reference (soft selection)"),
    Metric("rel_error_eval", units.REL_ERROR, "eval-mode output against the float64 reference (hard selection)"),
    Metric("rel_error_inference", units.REL_ERROR, "infer() output against the float64 reference (hard selection)"),
    *_TELEMETRY,
)
