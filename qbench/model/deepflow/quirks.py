"""DeepFlow's known quirks: where its LSTM model departs from its own equations or from the workload it
describes (reference sections 5, 6, 8 and 11), and what the corrected model does instead.

`exact` keeps every quirk (DeepFlow to the printed digit); `corrected` fixes all of them. A quirk's
`witness` is the parallelism (scheduling_param values over a single device) on which it shows, so that
`qbench model quirks` can evaluate both modes there; {} means the config's own strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SOFTMAX_SPLIT_INNER = "softmax-split-inner"
CB_ACCUM_PREC = "cb-accumulation-bytes"
CB_POINTWISE_GATES = "cb-pointwise-gates"
KP1_GATHER_TWICE = "kp1-gather-twice"
CB_KP2_ROWS = "cb-kp2-exchange-rows"
PROJECTION_B_KP2 = "projection-b-kp2-forward"
SMALL_COLLECTIVE = "small-collective-bytes"
DP_SOFTMAX_ALLREDUCE = "dp-softmax-allreduce"
OPTIMIZER_UNSHARDED = "optimizer-unsharded"
MEMORY_PROJECTION = "memory-projection"
MODEL_SHARD_CATEGORIES = "model-shard-categories"

MODES = ("exact", "corrected")


@dataclass(frozen=True)
class Quirk:
    key: str
    section: str  # where the reference documents it
    exact: str  # what DeepFlow does
    corrected: str  # what the corrected model does
    measure: str  # the quantity it changes: time_s, projection_b_s, memory_gib or weight_gib
    witness: dict = field(default_factory=dict)  # scheduling settings on which it shows


_SOFTMAX_CR4 = {"kp_softmax_type": 1, "kp_softmax_dim1": 4}
_HIDDEN_CR4 = {"kp_hidden_type": 1, "kp_hidden_dim1": 4}
QUIRKS = (
    Quirk(SOFTMAX_SPLIT_INNER, "5.4, 11.7", "a split softmax GEMM uses the projection P as its inner dimension",
          "inner dimension K_s = D, as the unsplit softmax", "time_s", _SOFTMAX_CR4),
    Quirk(CB_ACCUM_PREC, "6.3, 11.4", "Cb's weight-gradient accumulation counts elements as bytes",
          "x precision bytes", "time_s"),
    Quirk(CB_POINTWISE_GATES, "6.3", "Cb's pointwise work counts b*D elements where Cf counts b*D*G",
          "b*D*G, as Cf", "time_s"),
    Quirk(KP1_GATHER_TWICE, "5.2, 11.7", "a column-row backward adds its all-gather twice", "once", "time_s",
          _HIDDEN_CR4),
    Quirk(CB_KP2_ROWS, "5.3", "Cb_kp2 exchanges all b rows where Cf_kp2 exchanges b/h1", "b/h1, as Cf_kp2",
          "time_s", {"kp_hidden_type": 2, "kp_hidden_dim1": 2, "kp_hidden_dim2": 2}),
    Quirk(PROJECTION_B_KP2, "5.4, 11.7", "the row-column projection backward is timed as its forward",
          "the backward block", "projection_b_s",
          {"kp_projection_type": 2, "kp_projection_dim1": 2, "kp_projection_dim2": 2}),
    Quirk(SMALL_COLLECTIVE, "5.1, 11.7", "a collective under 128 B returns its bytes as seconds",
          "bytes / link bandwidth + line latency", "time_s", {"dp": 2}),
    Quirk(DP_SOFTMAX_ALLREDUCE, "5.5, 11.7", "data parallelism all-reduces only the LSTM weight gradients",
          "the softmax weight gradients too", "time_s", {"dp": 4}),
    Quirk(OPTIMIZER_UNSHARDED, "6.1", "weight updates and the all-reduce cover whole matrices on every device",
          "each device's shard of a kernel-split matrix", "time_s", _SOFTMAX_CR4),
    Quirk(MEMORY_PROJECTION, "8.1, 11.5", "memory and parameters keep the projection the time leaves out "
          "(softmax weights P x V)", "no projection anywhere (softmax weights D x V)", "memory_gib"),
    Quirk(MODEL_SHARD_CATEGORIES, "8.3, 11.6", "per-model-shard weight/activation/pointwise repeat the "
          "per-data-shard values", "computed per model shard", "weight_gib", _HIDDEN_CR4),
)
ALL = frozenset(q.key for q in QUIRKS)


def fixes_for(mode: str) -> frozenset[str]:
    """The quirks a mode fixes: none for exact, all for corrected."""
    if mode not in MODES:
        raise ValueError(f"deepflow mode {mode!r}: choose exact or corrected")
    return ALL if mode == "corrected" else frozenset()
