"""The rich table of `qbench fragmented` (or the original report layout with fmt="seed")."""

from __future__ import annotations

TABLE_PARAMS = ("dtype", "in_features", "batch_size", "variant", "task", "fragments", "exec", "backward_thread")
TABLE_METRICS = ("forward_ms", "forward_replay_ms", "backward_ms", "optimizer_ms", "backward_optimizer_ms",
                 "step_ms", "fwd_bwd_ms", "host_step_ms", "host_fwd_bwd_ms", "peak_memory_mb", "parameters",
                 "tflops")
HEADERS = {"in_features": "size", "batch_size": "batch", "forward_replay_ms": "fwd replay",
           "backward_optimizer_ms": "bwd+opt", "fwd_bwd_ms": "fwd+bwd", "host_step_ms": "host step",
           "host_fwd_bwd_ms": "host f+b", "peak_memory_mb": "peak mem", "backward_thread": "bwd thread"}


def table(records, limits=None):
    """A table that fits the console (report.records_table: the parameters the records share listed once below
    it, the metrics no record fills, GPU-only ones on the CPU, left out); with `limits` (the run's
    qbench.explain.limits.RunLimits) the limit binding each record's step."""
    from qbench import report

    return report.records_table(records, TABLE_PARAMS, TABLE_METRICS, title="FragmentedLinear", headers=HEADERS,
                                limits=limits)


def seed_report(records):
    """The original tool's text report of the records (--format seed)."""
    from rich.text import Text

    from qbench.benches.fragmented.seed import format_seed

    return Text(format_seed(records))
