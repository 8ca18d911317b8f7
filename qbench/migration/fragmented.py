"""Schema-1 `fragmented` records in the tidy form (see qbench/migration/__init__.py): param `layer` becomes
`variant` (linear -> dense), `mode` becomes `task`, and the forward replayed from a CUDA graph is named for
what it is (`forward_graph_ms` -> `forward_replay_ms`, `graph_tflops` -> `replay_tflops`), apart from the
exec=graph step."""

from __future__ import annotations

OLD_BENCH = "fragmented"
PARAMS = {"layer": "variant", "mode": "task"}
VALUES = {"variant": {"linear": "dense"}}  # the other layer names are their variant names
RENAMED = {"forward_graph_ms": "forward_replay_ms", "graph_tflops": "replay_tflops"}


def migrate(record: dict) -> list[dict]:
    from qbench.migration.rename import renamed

    return renamed(record, OLD_BENCH, params=PARAMS, metrics=RENAMED, values=VALUES)
