"""Schema-1 `fragmented` records in the tidy form (see qbench/migration/__init__.py): param `layer` becomes
`variant` (linear -> dense), `mode` becomes `task`, and the forward replayed from a CUDA graph is named for
what it is (`forward_graph_ms` -> `forward_replay_ms`, `graph_tflops` -> `replay_tflops`), apart from the
exec=graph step. The bench writes the same form through tidy_params and RENAMED."""

from __future__ import annotations

from collections.abc import Mapping

OLD_BENCH = "fragmented"
VARIANT_OF_LAYER = {"linear": "dense"}  # other layer names are their variant names
RENAMED = {"forward_graph_ms": "forward_replay_ms", "graph_tflops": "replay_tflops"}


def tidy_params(params: Mapping) -> dict:
    """A schema-1 record's params with `layer` as `variant` and `mode` as `task`, in their places."""
    out = {}
    for key, value in params.items():
        if key == "layer":
            out["variant"] = VARIANT_OF_LAYER.get(value, value)
        elif key == "mode":
            out["task"] = value
        else:
            out[key] = value
    return out


def _renamed(values: Mapping) -> dict:
    return {RENAMED.get(k, k): v for k, v in values.items()}


def migrate(record: dict) -> list[dict]:
    """One tidy record (an error or skip too: its params are renamed alike)."""
    from qbench.migration import split

    parts = (tidy_params(record["params"]), _renamed(record["metrics"]), _renamed(record.get("samples") or {}))
    return split(record, [parts])
