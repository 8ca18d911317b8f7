"""Units of metrics, and for each whether lower or higher is better.

Every record declares the unit of each metric (record["units"]); `qbench compare` reads the
direction from that declaration, never from the metric's name. Benches use these constants.
"""

from __future__ import annotations

MS = "ms"  # time per call
S = "s"  # time per step of an analytical model
MB = "MB"  # memory, 2**20 bytes
GB = "GB"  # memory, 2**30 bytes
TFLOPS = "TFLOP/s"
TOPS = "TOP/s"  # integer tensor-core rate
GBPS = "GB/s"  # 1e9 bytes per second
SPEEDUP = "x"  # ratio baseline / candidate
PERCENT_SAVED = "% saved"
FRACTION_OF_ROOFLINE = "of roofline"  # floor / measured, in [0, 1]
REL_ERROR = "rel. error"  # ||out - ref|| / ||ref||
COUNT = "count"  # tokens, blocks, parameters: informative, no better/worse
RATIO = "ratio"  # informative ratio (load imbalance max/mean): lower is better
FLAG = "flag"
TOKENS_PER_S = "tokens/s"  # training throughput
NATS = "nats"  # cross-entropy per token
SHARE = "share"  # informative fraction of a whole (a step's time in its linear layers): no verdict
MHZ = "MHz"  # a GPU clock while work ran: informative, no verdict
WATTS = "W"  # a GPU's board power while work ran: informative, no verdict

LOWER_IS_BETTER = {MS, S, MB, GB, REL_ERROR, RATIO, NATS}
HIGHER_IS_BETTER = {TFLOPS, TOPS, GBPS, SPEEDUP, PERCENT_SAVED, FRACTION_OF_ROOFLINE, TOKENS_PER_S}


def direction(unit: str | None) -> int:
    """-1: lower is better, +1: higher is better, 0: no verdict (counts, flags, unknown units)."""
    if unit in LOWER_IS_BETTER:
        return -1
    if unit in HIGHER_IS_BETTER:
        return 1
    return 0
