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


# The one dtype vocabulary of qbench: canonical names (what records store and flags print) and every
# alias a user or an old record may spell. Activation dtypes of the benches are fp16, bf16, fp32.
DTYPE_ALIASES = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32",
    "int8": "int8",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8",
}
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "int8": 1, "fp8": 1}
ACTIVATION_DTYPES = ("fp16", "bf16", "fp32")


def canonical_dtype(dtype) -> str:
    """'bfloat16' -> 'bf16', 'torch.float16' -> 'fp16'; ValueError naming the dtype otherwise."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_ALIASES[key]


def torch_dtype(dtype):
    """The torch dtype of an activation dtype name or alias ('fp16', 'bfloat16', torch.float32, ...)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = canonical_dtype(dtype)
    if name not in ACTIVATION_DTYPES:
        raise ValueError(f"{dtype!r} is not an activation dtype; choose from {', '.join(ACTIVATION_DTYPES)}")
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


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
