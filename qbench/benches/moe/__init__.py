"""`qbench moe`: distributed mixture-of-experts step time, TFLOP/s and per-phase breakdown.

resolve(config) fills the device-dependent defaults; run(config) validates it at once
(usage errors before any process starts or record is written) and returns the records as they come:
it launches the ranks (qbench.dist: self-spawned, or one rank of a torchrun job), and every rank runs
every configuration of the sweep (local experts x overlap degree x replication x routing x GEMM
backend x locality x variant; cases.Case), in every execution mode (`--exec`: eager, compile, graph;
modes.py) and, where autograd runs a backward, with each backward thread asked for (`--backward-thread`;
config.threads_of); rank 0's records are kept. With `kernels="grouped"` the records are
kernel timings instead (grouped.py). Each configuration is checked against the dense reference
first; a mismatch is an error record, not timed. Variant "blocks" (MixMoE's block dispatch fused
with the expert GEMMs) runs one chunk, so its cases take overlap degree 1 only; its transport
("symm" or the "a2a" fallback) is a param.

Modules: config (MoEBenchConfig, resolve), validate, cases (the grid, each case's params), observe (the
layer's phases and plans seen through its hooks; the forced choice passed to it), rank (one
rank's work: build, check, time, the records), modes (eager, compile, graph: what each needs and how
it runs), steps (the training step and its timing), metrics, output (table, seed-format lines), trace
(profiled steps), grouped (the grouped GEMM kernel bench).

Records are tidy (qbench/metrics/moe.py declares every metric; qbench/migration/moe.py maps the timing
code's names onto them): one measurement gives a record of timing per_step (every step timed alone on an
idle device: step_ms, forward_ms, backward_ms, the phase breakdown <phase>_ms from a second pass with phase
events and its step_instrumented_ms, host_ms and host_<phase>_ms, tflops by the seeds' formula
samples * d * h * 4 * k * 3 / step per GPU (eval: 1 instead of 3), tflops_full, experts_tflops, load,
drops, roofline_fraction, check_max_rel_error, the GPUs' clock and power), one of timing loop (blocks of
8 steps issued back to back, so a host faster than the GPU is hidden as in training: step_ms, tflops,
clock and power), and for variant blocks one per_step record per rank (param `rank`: block_count,
remote_block_count, remote_fraction, ag_ms, ga_ms, backward_ag_ms, backward_ga_ms). Times in ms are the
median over steps of the maximum over ranks.
"""

from __future__ import annotations

from collections.abc import Iterator

from qbench.benches.moe.cases import case_label, cases, params_of, pending_cases, resolve_gemm, resume_id
from qbench.benches.moe.config import (
    BENCH,
    CPU_SIZES,
    GEMMS,
    KERNEL_BENCHES,
    TRANSPORTS,
    MoEBenchConfig,
    resolve,
    threads_of,
)
from qbench.benches.moe.metrics import floor_ms, full_flops, seed_flops, summarize
from qbench.benches.moe.output import block_lines, measurements, seed_lines, table
from qbench.benches.moe.validate import validate, validate_here
from qbench.metrics.moe import VARIANTS

__all__ = [
    "BENCH", "CPU_SIZES", "GEMMS", "KERNEL_BENCHES", "TRANSPORTS", "VARIANTS", "MoEBenchConfig", "block_lines",
    "case_label", "cases", "floor_ms", "full_flops", "measurements", "params_of", "pending_cases", "plan", "resolve",
    "resolve_gemm", "resume_id", "run", "pending", "measured_id",
    "seed_flops", "seed_lines", "summarize", "table", "validate",
]


def plan(config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> list:
    """What run(config, done) will measure, one item per measurement (for the progress bar): every pending case
    (all but those with every record in `done`) in every execution mode."""
    if config.kernels is not None:
        from qbench.benches.moe import grouped

        return grouped.plan(config)
    todo = pending_cases(config, config.world_size, config.device, done) if done else cases(config)
    return [dict(case.params(), exec=mode, backward_thread=thread) for case in todo
            for mode in config.execs or ("eager",) for thread in threads_of(config, mode)]


def pending(config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> list:
    """What run(config, done) measures, one item per measurement (plan)."""
    return plan(config, done)


def measured_id(record: dict) -> str:
    """The measurement a record came from (its per_step, loop and per-rank records share it)."""
    return resume_id(record["params"])


def run(config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """Validate the resolved config now, then return the records' iterator (nothing runs until it is read)."""
    from qbench import dist

    validate_here(config)
    if config.kernels is not None:
        from qbench.benches.moe import grouped

        return grouped.run_cases(config)
    from qbench.benches.moe.rank import rank_main

    return dist.launch(rank_main, (config, done), world_size=config.world_size, backend=config.backend,
                       device=config.device, timeout_s=config.timeout_s)
