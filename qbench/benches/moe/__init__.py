"""`qbench moe`: distributed mixture-of-experts step time, TFLOP/s and per-phase breakdown.

resolve(config) fills the device-dependent defaults; run(config) validates it at once
(usage errors before any process starts or record is written) and returns the records as they come:
it launches the ranks (qbench.dist: self-spawned, or one rank of a torchrun job), and every rank runs
every configuration of the sweep (local experts x overlap degree x replication x routing x GEMM
backend x locality x system), in every execution mode (`--exec`: eager, compile, graph; modes.py) and,
where autograd runs a backward, with each backward thread asked for (`--backward-thread`; config.threads_of);
rank 0's records are kept. With `kernels="grouped"` the records are
kernel timings instead (grouped.py). Each configuration is checked against the dense reference
first; a mismatch is an error record, not timed. System "blocks" (MixMoE's block dispatch fused
with the expert GEMMs) runs one chunk, so its cases take overlap degree 1 only; its transport
("symm" or the "a2a" fallback) is a param.

Modules: config (MoEBenchConfig, resolve), validate, cases (the grid, each case's params), observe (the
layer's phases and plans seen through its hooks; the forced choice passed to it), rank (one
rank's work: build, check, time, the records), modes (eager, compile, graph: what each needs and how
it runs), steps (the training step and its timing), metrics, output (table, seed-format lines), trace
(profiled steps), grouped (the grouped GEMM kernel bench).

Metrics (times in ms: median over steps of the max over ranks):
  step_time, forward_time, backward_time (steps without the layer's phase events; graph replays have no
  forward / backward split), <phase>_time (eager: gate, plan, dispatch, experts, combine, backward_a2a,
  backward_experts; from a second pass of as many steps with them), step_time_instrumented (that
  pass's step time: what the phase events cost; graph: the phases from a second capture with the phase
  events in the graph, modes.graph_phases), loop_step_time (the step inside a loop of it: blocks of 8
  steps issued back to back, so a host faster than the GPU is hidden as in training; every step of
  step_time starts on an idle device) and loop_tflops (the seeds' formula over it), host_ms (CPU time
  spent issuing one step, nothing of the bench's on its path), host_<phase>_ms (eager: CPU ms per step
  inside forward, backward and each of the layer's phases, from a pass of their own on host clocks) and
  host_ms_instrumented (that pass's step: host_ms plus what the clocks cost),
  experts_tflops (the expert FFN's forward + backward FLOPs over experts_time + backward_experts_time),
  sm_clock_mhz_step (the lowest SM clock of any rank) and power_w_step (the highest board power) over the
  timed steps, and sm_clock_mhz_loop / power_w_loop over the loop's blocks, where NVML reads them
  (qbench.telemetry),
  tflops = samples * d * h * 4 * k * 3 / step (the seeds' formula,
  per GPU; 4 = two matmuls x 2 flop, 3 = forward + 2 x backward; eval mode uses 1 instead of 3),
  tflops_full (rows actually computed, padding included, plus the gate), peak_memory_mb, per-expert
  and per-rank load (max / mean), dropped_tokens, roofline_fraction (the busiest rank's floor from
  qbench/model/floors.py: gate and expert GEMMs plus the token exchange, as `qbench model --against`).
System blocks adds: ag_time, ga_time, backward_ag_time, backward_ga_time (max over ranks per step),
  blocks_total / blocks_remote (max over owner ranks), blocks_rank<r> / remote_blocks_rank<r> /
  remote_fraction_rank<r> (per rank, the importer's names), remote_fraction (all ranks' remote blocks
  over all blocks), block_imbalance (busiest rank / mean), remote_rows (most rows a rank pulls).
"""

from __future__ import annotations

from collections.abc import Iterator

from qbench.benches.moe.cases import case_label, cases, params_of, pending_cases, resolve_gemm, resume_id
from qbench.benches.moe.config import (
    BENCH,
    CPU_SIZES,
    GEMMS,
    KERNEL_BENCHES,
    SYSTEMS,
    TRANSPORTS,
    MoEBenchConfig,
    resolve,
    threads_of,
)
from qbench.benches.moe.metrics import floor_ms, full_flops, seed_flops, summarize
from qbench.benches.moe.output import block_lines, seed_lines, table
from qbench.benches.moe.validate import validate

__all__ = [
    "BENCH", "CPU_SIZES", "GEMMS", "KERNEL_BENCHES", "SYSTEMS", "TRANSPORTS", "MoEBenchConfig", "block_lines",
    "case_label", "cases", "floor_ms", "full_flops", "params_of", "pending_cases", "plan", "resolve",
    "resolve_gemm", "resume_id", "run",
    "seed_flops", "seed_lines", "summarize", "table", "validate",
]


def plan(config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> list:
    """What run(config, done) will measure, one item per record (for the progress bar): every pending case
    (all but those with every record in `done`) in every execution mode."""
    if config.kernels is not None:
        from qbench.benches.moe import grouped

        return grouped.plan(config)
    todo = pending_cases(config, config.world_size, config.device, done) if done else cases(config)
    return [dict(case, exec=mode, backward_thread=thread) for case in todo
            for mode in config.execs or ("eager",) for thread in threads_of(config, mode)]


def run(config: MoEBenchConfig, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """Validate the resolved config now, then return the records' iterator (nothing runs until it is read)."""
    from qbench import dist

    gpus = dist.visible_gpus() if config.device == "cuda" and dist.torchrun_env() is None else None
    validate(config, gpus)
    if config.kernels is not None:
        from qbench.benches.moe import grouped

        return grouped.run(config)
    from qbench.benches.moe.rank import rank_main

    return dist.launch(rank_main, (config, done), world_size=config.world_size, backend=config.backend,
                       device=config.device, timeout_s=config.timeout_s)
