"""Resource limits checked before a command starts work: what it asks for against what this machine has.

A request that cannot finish (a thousand processes on two cores, a layer whose weights alone exceed the
memory, a search of a hundred million starts) is refused up front with the estimate and the fix, in one
line, instead of running until it is killed.
"""

from __future__ import annotations

import os

from qbench.errors import QbenchUsageError

GIB = 2**30
# A CPU rank is a whole Python process with torch loaded (about 0.4 GiB resident before any tensor), and
# gloo ranks take turns on the cores: more than 4 ranks a core makes every collective wait on the scheduler.
RANK_MEMORY = 0.4 * GIB
RANKS_PER_CORE = 4
# One descent step of `qbench model search-hw` evaluates about 20 splits, ~4 ms on one core (measured:
# 20 starts x 60 iterations in 6.6 s of CPU time); 30,000 steps is about two minutes.
SEARCH_STEP_S = 0.004
MAX_SEARCH_STEPS = 30_000


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory(device: str) -> int | None:
    """Bytes that can still be allocated on the device: MemAvailable of the host, or the GPU's free
    memory; None when it cannot be told."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_cpu_ranks(world_size: int) -> None:
    """--world-size on the CPU: each rank is a process; refuse more than the cores and memory can run."""
    cores, memory = usable_cores(), available_memory("cpu")
    limit = RANKS_PER_CORE * cores
    if memory is not None:
        limit = min(limit, max(1, int(memory // RANK_MEMORY)))
    if world_size > limit:
        free = f", {memory / GIB:.1f} GiB free" if memory is not None else ""
        raise QbenchUsageError(f"--world-size {world_size} needs {world_size} processes (~{RANK_MEMORY / GIB:.1f} "
                               f"GiB each); this machine has {cores} cores{free}: use --world-size <= {limit} "
                               "or torchrun across hosts")


def check_memory(needed: float, device: str, what: str, fix: str) -> None:
    """Refuse when `needed` bytes (a lower bound of what the work allocates) exceed the device's free memory."""
    free = available_memory(device)
    if free is not None and needed > free:
        where = "the GPU" if device == "cuda" else "this machine"
        raise QbenchUsageError(f"{what} needs at least {needed / GIB:.3g} GiB but {where} has {free / GIB:.3g} GiB "
                               f"free; {fix}")


def check_search_steps(starts: int, iterations: int) -> None:
    """search-hw: starts x iterations descent steps, refused beyond MAX_SEARCH_STEPS with the time they take."""
    steps = starts * iterations
    if steps > MAX_SEARCH_STEPS:
        raise QbenchUsageError(f"--starts {starts} x --iterations {iterations} = {steps:.3g} descent steps, about "
                               f"{_duration(steps * SEARCH_STEP_S)} at ~{SEARCH_STEP_S * 1e3:.0f} ms a step; give "
                               f"starts x iterations <= {MAX_SEARCH_STEPS}")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def check_fragmented(config) -> None:
    """qbench fragmented: the largest layer's weights, their gradients and Adam's two moments (4 tensors of
    size x size in the widest dtype) must fit the device's free memory."""
    from qbench.dtypes import DTYPE_BYTES

    size = max(config.sizes)
    needed = 4 * size * size * max(DTYPE_BYTES[d] for d in config.dtypes)
    check_memory(needed, config.device, f"--sizes {size} (weights, gradients and Adam moments of a {size} x "
                 f"{size} layer)", "give smaller --sizes")


def check_moe(config) -> None:
    """qbench moe: per rank, the layer's input and output (samples x model_dim each) and its experts' two
    weights (model_dim x hidden_size each, per local expert), in the run's dtype; CPU ranks share this
    machine's memory, GPU ranks have one GPU each."""
    from qbench.dtypes import DTYPE_BYTES

    experts = max(config.num_local_experts)
    per_rank = (2 * config.samples * config.model_dim + experts * 2 * config.model_dim * config.hidden_size)
    ranks = config.world_size if config.device == "cpu" else 1
    check_memory(per_rank * DTYPE_BYTES[config.dtype] * ranks, config.device,
                 f"--samples {config.samples} x --model-dim {config.model_dim}, {experts} experts of --hidden-size "
                 f"{config.hidden_size} on {ranks} rank{'s' if ranks > 1 else ''}",
                 "give smaller sizes or fewer experts")


def check_switchback(config, shapes) -> None:
    """qbench switchback (layer bench): the largest shape's input (M x in), weight (out x in) and output
    (M x out) in the activation dtype must fit the device's free memory (the int8 copies and gradients
    come on top)."""
    from qbench.dtypes import DTYPE_BYTES

    def elements(s) -> int:
        return s.batch_size * s.dim_in + s.dim_out * s.dim_in + s.batch_size * s.dim_out

    largest = max(shapes, key=elements)
    check_memory(elements(largest) * DTYPE_BYTES[config.dtype], config.device,
                 f"batch size {largest.batch_size} with a {largest.dim_in} -> {largest.dim_out} layer",
                 "give smaller --dims, --pairs or --batch-sizes")
