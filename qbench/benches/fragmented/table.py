"""The rich table of `qbench fragmented` (or the original report layout with fmt="seed")."""

from __future__ import annotations

TABLE_PARAMS = ("dtype", "in_features", "batch_size", "layer", "mode", "fragments", "exec", "backward_thread")
VARYING_ONLY = ("dtype", "backward_thread")  # columns shown only where the records differ in them
TABLE_METRICS = ("forward_ms", "forward_graph_ms", "backward_ms", "optimizer_ms", "backward_optimizer_ms",
                 "step_ms", "fwd_bwd_ms", "host_step_ms", "host_fwd_bwd_ms", "peak_memory_mb", "parameters",
                 "tflops")
HEADERS = {"in_features": "size", "batch_size": "batch", "forward_graph_ms": "fwd graph",
           "backward_optimizer_ms": "bwd+opt", "fwd_bwd_ms": "fwd+bwd", "host_step_ms": "host step",
           "host_fwd_bwd_ms": "host f+b", "peak_memory_mb": "peak mem", "backward_thread": "bwd thread"}


def table(fmt: str = "table"):
    """A function records -> renderable: the seed's text report, or a table of the columns any record
    fills (GPU-only metrics are left out on the CPU; the dtype and backward-thread columns only when records
    differ in them)."""
    from rich.text import Text

    from qbench import report
    from qbench.benches.fragmented.seed import format_seed
    from qbench.store import varying_params

    if fmt == "seed":
        return lambda records: Text(format_seed(records))

    def render(records):
        metrics = [m for m in TABLE_METRICS if any(r["metrics"].get(m) is not None for r in records)]
        shown = varying_params(records, VARYING_ONLY)
        params = [p for p in TABLE_PARAMS if p not in VARYING_ONLY or p in shown]
        return report.records_table(records, params, metrics, title="FragmentedLinear", headers=HEADERS)

    return render
