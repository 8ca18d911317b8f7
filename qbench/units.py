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


# The dtype vocabulary lives in qbench.dtypes; its names stay importable from here for code written
# before it moved.
from qbench.dtypes import (  # noqa: E402, F401
    ACTIVATION_DTYPES,
    DTYPE_ALIASES,
    DTYPE_BYTES,
    canonical_dtype,
    torch_dtype,
)

# Metric-name conventions shared by the benches: a suffix names the unit, a prefix the kind of ratio.
_SUFFIXES = (("_ms", MS), ("_mb", MB), ("_tflops", TFLOPS), ("_tops", TOPS), ("_gbps", GBPS),
             ("_over_int8", RATIO))
_PREFIXES = (("speedup_", SPEEDUP), ("pct_saved_", PERCENT_SAVED), ("relerr_", REL_ERROR),
             ("sm_clock_mhz_", MHZ), ("power_w_", WATTS), ("throttle_reasons_", FLAG))


def by_name(name: str) -> str | None:
    """The unit a metric's name declares by the shared conventions, or None (the bench decides)."""
    for suffix, unit in _SUFFIXES:
        if name.endswith(suffix):
            return unit
    for prefix, unit in _PREFIXES:
        if name.startswith(prefix):
            return unit
    return None
