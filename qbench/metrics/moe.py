"""`qbench moe` metrics. Records per configuration (world size, experts per rank, overlap degree, routing,
GEMM backend, ...), variant, exec and timing: timing per_step holds the step, its forward / backward and
phase breakdown, host times, load and the reference check; timing loop the step inside a loop of it.
Times in ms are the median over steps of the maximum over ranks. Variant blocks adds one record per rank
(param `rank`) with that rank's blocks and all-gather / gather-add times (what the seed's block lines print).
"""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric
from qbench.metrics.common import TELEMETRY

BENCH = "moe"
# a2a: qbench's MoE layer (all-to-all token exchange); blocks: MixMoE's block dispatch fused with the
# expert GEMMs; tutel: Tutel's moe_layer with the a2a layer's weights
VARIANTS = ("a2a", "blocks", "tutel")

# the layer's phases (qbench/layers/moe/hooks.py) as metric names: phase -> (metric stem, what it does).
# The layer's backward all-to-all phase is "backward_a2a"; a2a names a variant, so its metric says exchange.
PHASES = {
    "gate": ("gate", "the gate: scores, top-k and routing"),
    "plan": ("plan", "the dispatch plan: split sizes, capacity, row order"),
    "dispatch": ("dispatch", "the forward token exchange to the experts' ranks"),
    "experts": ("experts", "the expert FFN's forward GEMMs"),
    "combine": ("combine", "the weighted sum of the experts' rows back into tokens"),
    "replicas": ("replicas", "the hot experts' replica gradient reduction"),
    "backward_a2a": ("backward_exchange", "the backward token exchange (gradients back to the tokens' ranks)"),
    "backward_experts": ("backward_experts", "the expert FFN's backward GEMMs (input and weight gradients)"),
    "ag": ("ag", "blocks: the forward all-gather of remote blocks"),
    "ga": ("ga", "blocks: the forward gather-add of the results to their owners"),
    "backward_ag": ("backward_ag", "blocks: the backward all-gather"),
    "backward_ga": ("backward_ga", "blocks: the backward gather-add"),
}


def _phases() -> list[Metric]:
    out = []
    for stem, what in PHASES.values():
        out.append(Metric(f"{stem}_ms", units.MS, f"GPU time of {what}, from the pass with phase events"))
        out.append(Metric(f"host_{stem}_ms", units.MS, f"CPU time per step issuing {what} (host clocks)"))
    return out


# what `qbench import` reads from the seeds' MoE logs besides the step times (qbench/importers/moe.py)
IMPORTED = {
    "summary_step_ms": (units.MS, "the [Summary] line's mean step time"),
    "summary_forward_ms": (units.MS, "the [Summary] line's mean forward time"),
    "summary_backward_ms": (units.MS, "the [Summary] line's mean backward time"),
    "summary_steps": (units.COUNT, "trailing STEP lines the [Summary] averages (found by recomputing it)"),
    "steps_logged": (units.COUNT, "STEP lines in the block"),
    "warmup_steps": (units.COUNT, "leading STEP lines left out of the medians"),
    "experts_per_rank": (units.COUNT, "experts a rank holds (the printed FMoELinear num_expert)"),
    "replicated_expert_slots": (units.COUNT, "experts_per_rank minus num_local_experts"),
    "total_experts": (units.COUNT, "the gate's output features"),
    "moe_forward_ms": (units.MS, "MixMoE's printed MoE forward (max over ranks per step)"),
    "first_gemm_fwd_ms": (units.MS, "MixMoE's printed first expert GEMM forward (max over ranks per step)"),
    "first_gemm_bwd_ms": (units.MS, "MixMoE's printed first expert GEMM backward (max over ranks per step)"),
    "weight_grad_ms": (units.MS, "MixMoE's printed weight gradient (max over ranks per step)"),
    "second_gemm_bwd_ms": (units.MS, "MixMoE's printed second expert GEMM backward (max over ranks per step)"),
    "linear1_bwd_ms": (units.MS, "MixMoE's printed Linear 1 backward (max over ranks per step)"),
    "linear2_bwd_ms": (units.MS, "MixMoE's printed Linear 2 backward (max over ranks per step)"),
}


def _imported() -> list[Metric]:
    return [Metric(name, unit, f"imported seed logs: {what}") for name, (unit, what) in IMPORTED.items()]


METRICS = (
    Metric("step_ms", units.MS, "one training step (forward + backward; eval: forward) of the layer"),
    Metric("forward_ms", units.MS, "the step's forward (steps without phase events; graph replays: none)"),
    Metric("backward_ms", units.MS, "the step's backward (steps without phase events; graph replays: none)"),
    Metric("step_instrumented_ms", units.MS, "the step in the pass with phase events: step_ms plus their cost"),
    *_phases(),
    Metric("host_ms", units.MS, "CPU time spent issuing one step (the most of any rank)"),
    Metric("host_forward_ms", units.MS, "CPU time per step inside the forward (host clocks)"),
    Metric("host_backward_ms", units.MS, "CPU time per step inside the backward (host clocks)"),
    Metric("host_instrumented_ms", units.MS, "the step of the host-clock pass: host_ms plus what the clocks cost"),
    Metric("tflops", units.TFLOPS, "samples d h 4 k 3 flops per rank (the seeds' formula; eval: 1 not 3) over step_ms"),
    Metric("tflops_full", units.TFLOPS, "rows actually computed (padding included) plus the gate over step_ms"),
    Metric("experts_tflops", units.TFLOPS, "the expert FFN's forward + backward flops over experts_ms + "
                                           "backward_experts_ms"),
    Metric("peak_memory_mb", units.MB, "peak allocated GPU memory of any rank"),
    Metric("expert_load_max_over_mean", units.RATIO, "tokens of the busiest expert over the mean (all ranks)"),
    Metric("rank_load_max_over_mean", units.RATIO, "rows the busiest rank's expert GEMMs run over the mean"),
    Metric("dropped_tokens", units.COUNT, "token-expert assignments dropped by the capacity, all ranks"),
    Metric("computed_rows", units.COUNT, "rows the expert GEMMs run on, all ranks, padding included"),
    Metric("sent_rows", units.COUNT, "rows rank 0 sends in the forward exchange"),
    Metric("floor_ms", units.MS, "the busiest rank's step floor (qbench/model/floors.py): GEMMs and exchange"),
    Metric("roofline_fraction", units.FRACTION_OF_ROOFLINE, "floor_ms over step_ms"),
    Metric("check_max_rel_error", units.REL_ERROR, "the reference check's largest relative error (outputs and "
                                                   "gradients against the dense reference)"),
    Metric("block_count", units.COUNT, "blocks: blocks a rank owns (the most of any rank; per rank with `rank`)"),
    Metric("remote_block_count", units.COUNT, "blocks: of those, blocks from other ranks (the most of any rank; "
                                              "per rank with `rank`)"),
    Metric("remote_fraction", units.RATIO, "blocks: remote blocks over all blocks (all ranks; per rank with `rank`)"),
    Metric("block_imbalance", units.RATIO, "blocks: the busiest rank's blocks over the mean"),
    Metric("remote_rows", units.COUNT, "blocks: the most rows a rank pulls from other ranks"),
    *_imported(),
    *TELEMETRY,
)
