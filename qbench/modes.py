"""The execution modes every bench family runs a training step in (a record's `exec` param), and the
preparation of a step in each of them.

  eager    the step as written
  compile  the model (or the region the family compiles) through torch.compile(fullgraph=True,
           dynamic=False): static shapes, one compilation per shape, so the recompile limit never sends
           a shape back to eager
  graph    the whole eager step captured into one CUDA graph and replayed (GPU only;
           qbench.timing.graph_replay)

A family builds its step over `compiled(...)` and hands it to `prepared_step`, which warms it up
(compilation, Triton autotuning, optimizer state and allocator warm-up, never timed) and, in graph
mode, captures it.
"""

from __future__ import annotations

from collections.abc import Callable

EXECS = ("eager", "compile", "graph")
CPU_EXECS = ("eager",)  # what a bench runs on the CPU unless --exec asks for more (graph needs CUDA)


def default_execs(device: str) -> tuple[str, ...]:
    """The modes a bench runs without --exec: all three on a GPU, eager on the CPU."""
    return EXECS if device == "cuda" else CPU_EXECS


def resolved_execs(execs: tuple[str, ...] | None, device: str) -> tuple[str, ...]:
    """The modes a bench runs on `device`: execs as given (None: default_execs); a one-line usage error for
    graph without CUDA (compile runs on the CPU too, through the C++ toolchain or aot_eager)."""
    from qbench.errors import QbenchUsageError

    execs = execs or default_execs(device)
    if device != "cuda" and "graph" in execs:
        raise QbenchUsageError("--exec graph needs a CUDA device; on the CPU use eager or compile")
    return execs


def compiled(fn, mode: str = "compile", *, reset: bool = True, backend: str | None = None):
    """fn as `mode` runs it: torch.compile(fn, fullgraph=True, dynamic=False) in compile mode (dynamo's
    caches reset first unless reset is False, so every configuration compiles afresh and never falls
    back to eager; backend None: torch's default, inductor), fn itself in the other modes."""
    if mode != "compile":
        return fn
    import torch

    if reset:
        torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False, **({} if backend is None else {"backend": backend}))


def prepared_step(mode: str, step_of: Callable[[bool], Callable[[], object]], *, warmup: int,
                  drop: Callable[[], None], after_warmup: Callable[[], None] | None = None) -> Callable[[], object]:
    """The step to time in `mode`. step_of(reset) builds the step (over the function `compiled` returned);
    reset: it sets its gradients to None itself (eager and compiled steps). The reset step runs `warmup`
    times, then after_warmup() (a peak-memory reset there covers the capture, where a graph allocates);
    in graph mode the step without reset is captured into one CUDA graph, drop() freeing the gradients
    and kept outputs outside the capture (tensors freed inside a capture invalidate it)."""
    step = step_of(True)
    for _ in range(warmup):
        step()
    if after_warmup is not None:
        after_warmup()
    if mode != "graph":
        return step
    import torch

    from qbench.timing import graph_replay

    torch.cuda.synchronize()
    return graph_replay(step_of(False), drop)
