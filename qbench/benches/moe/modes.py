"""Execution modes of `qbench moe` (the record's `exec` param): the ways a training step runs.

  eager    the step as written; timed in two passes (steps.time_steps: phase breakdown in the second)
  compile  torch.compile(model, fullgraph=True, dynamic=False): inductor on a GPU, aot_eager on the CPU
           (no C++ toolchain needed for a smoke run); the MoE kernels are custom ops in the graph
  graph    the whole step (forward, backward, SGD) captured into one CUDA graph and replayed (GPU only);
           its phase breakdown from a second capture with the phases' events in it (graph_phases)
compile and graph need the layer's static shapes (MoELayer.static_reason() is None: fixed capacity, or
world size 1 without capped capacity, no replication): otherwise the host reads each step's plan
(with dropless routing at world size > 1 it must learn the all-to-all's split sizes), and the record
is `skipped` with that one-line reason. compile traces the world-size-1 layer only (at world size > 1
the all-to-all runs eager; graph mode captures a static step there, the collectives included).
Before a compiled or graphed step is timed, one step's output and gradients are checked against an
eager step's (same kernels: within the dtype's tolerance).
"""

from __future__ import annotations

import torch

from qbench import modes as shared_modes
from qbench.benches.moe.observe import no_phase, observed
from qbench.benches.moe.steps import make_step
from qbench.dist import max_over_ranks
from qbench.layers.moe.reference import TOLERANCE, rel_error
from qbench.timing import PhaseTimer, graph_replay

WARMUP = 3  # eager steps before a capture (autotuning, first launches, allocator), compilation steps


def refusal(mode: str, config, moe, world_size: int) -> str | None:
    """One line: why this configuration cannot run in `mode` (recorded as `skipped`), or None."""
    if mode == "eager":
        return None
    if getattr(moe, "twin", None) is not None:
        return f"{mode}: --variant tutel is timed eager (Tutel's layer as its users run it)"
    if config.model == "attn-moe":
        return (f"{mode}: the attn-moe model trains under DistributedDataParallel, whose gradient all-reduce is "
                f"not {'traced' if mode == 'compile' else 'captured'} here; use --model layer")
    if mode == "compile" and world_size > 1:
        return ("compile traces the world-size-1 layer: at world size > 1 the all-to-all runs eager "
                "(graph mode captures a static step)")
    if mode == "graph" and moe.opts.gemm == "torch" and moe.w1.dtype != torch.bfloat16:
        # its CUTLASS kernel takes bf16; other dtypes run its fallback, which copies the offsets to the host
        return ("graph: torch._grouped_mm (--gemm torch) reads its group offsets on the host for "
                f"{str(moe.w1.dtype).removeprefix('torch.')} (its fallback path), which a CUDA graph cannot capture")
    reason = moe.static_reason()
    return None if reason is None else f"{mode} needs static shapes: {reason}"


def compiled(model, device: str):
    """torch.compile with fullgraph and static shapes, fresh caches (one compilation per configuration)."""
    return shared_modes.compiled(model, backend="inductor" if device == "cuda" else "aot_eager")


def graphed(config, model, x, dy, out: dict, timer=None):
    """step(i) replaying one CUDA graph of the whole training step, after WARMUP eager steps. The
    gradients and the kept output are dropped outside the capture (timing.graph_replay's prepare).
    timer: a PhaseTimer(captured=True) whose phases (forward, backward, and the layer's own while it
    observes the layer, observe.observed) the graph records at every replay; it keeps only the captured step's.
    A kept output of an earlier capture is dropped first: its autograd graph holds the parameters'
    gradient accumulators, made on that capture's stream, which the eager warm-up steps would otherwise
    reuse from the default stream (a cross-stream wait per accumulation; torch warns of it)."""
    out.clear()
    warm = make_step(config, model, x, dy, no_phase, out)
    for i in range(WARMUP):
        warm(i)
    torch.cuda.synchronize()
    captured = make_step(config, model, x, dy, no_phase if timer is None else timer.phase, out, reset=False)

    def prepare() -> None:
        captured.optimizer.zero_grad(set_to_none=True)
        out.clear()
        if timer is not None:
            timer.discard()  # the eager call before the capture recorded phases too

    replay = graph_replay(lambda: captured(0), prepare)
    return lambda i: replay()


def graph_phases(ctx, config, model, moe, x, dy, out: dict) -> dict[str, list[float]]:
    """<phase>_time samples (ms per replay, the most of any rank) of the graphed step, from a second
    capture whose phases are event-record nodes: the breakdown that eager's second pass gives, without
    an eager step's host gaps between kernels (the timed graph, step_time, carries no such nodes)."""
    timer = PhaseTimer("cuda", captured=True)
    with observed(moe, timer.phase):
        replay = graphed(config, model, x, dy, out, timer)
    replay(0)  # the first replay uploads the graph
    samples: dict[str, list[float]] = {}
    for i in range(config.num_steps):
        replay(i)
        for name, ms in timer.replay_ms().items():
            samples.setdefault(f"{name}_time", []).append(ms)
    return {name: max_over_ranks(values) for name, values in sorted(samples.items())}


def step_results(model, out: dict) -> list:
    """[output, gradients of every parameter that has one] of the last step, cloned."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return [t.detach().clone() for t in (out["y"], *grads)]


def mismatch(got: list, want: list, dtype) -> str | None:
    """First tensor (0: the output, then parameter gradients) whose relative error exceeds the dtype's
    tolerance against the eager step, or None."""
    if len(got) != len(want):
        return f"{len(got)} results against eager's {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        err = rel_error(a, b)
        if not err <= TOLERANCE[dtype]:
            return f"tensor {i} (0: output, then gradients) differs from eager by {err:.2e}"
    return None
