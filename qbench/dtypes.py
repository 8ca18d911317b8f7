"""The dtype vocabulary of qbench: the canonical names records store and flags print (fp16, bf16, fp32,
tf32, int8, fp8), every alias a user or an old record may spell, their sizes, and the torch dtype of an
activation dtype name. Imports no torch until torch_dtype is called."""

from __future__ import annotations

from typing import NamedTuple

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


class Tolerance(NamedTuple):
    """The largest error a result in one dtype may show against its reference before a bench records an
    error (and a test fails), by what is compared; None where that comparison does not run in the dtype."""

    # one GEMM kernel against plain torch on the same inputs, max |error| / max |reference|: both sum exact
    # products in fp32, in another order (K up to 4096), and round once to the dtype
    gemm: float | None = None
    # a layer's output against its float64 definition on the same rounded weights and inputs,
    # ||error|| / ||reference||: each of a few roundings (scaled input, partial outputs) adds up to 2^-mantissa
    layer: float | None = None
    # a layer's output and gradients against its dense reference, max |error| / max |reference|: one
    # rounding per op, a handful of ops (the MoE layer keeps its activations in its dtype)
    layer_peak: float | None = None
    # an 8-bit matmul's or layer's output and input gradient against 16-bit on N(0, 1) data,
    # ||error|| / ||reference||: int8 with absmax scales ~1e-2; fp8 e4m3 (3 mantissa bits) ~3e-2, e5m2 ~6e-2
    vs_16bit: float | None = None


# The one tolerance table of qbench, by dtype name.
TOLERANCE = {
    "fp32": Tolerance(gemm=1e-5, layer=1e-4, layer_peak=1e-4),  # fp32 differs only in summation order
    "fp16": Tolerance(gemm=2e-3, layer=5e-3, layer_peak=1e-2),  # 11-bit mantissa
    "bf16": Tolerance(gemm=1.6e-2, layer=3e-2, layer_peak=5e-2),  # 8-bit mantissa: ~8x fp16's
    "int8": Tolerance(vs_16bit=0.05),
    "fp8": Tolerance(vs_16bit=0.1),
}


def tolerance(dtype) -> Tolerance:
    """TOLERANCE of a dtype name, alias or torch dtype ('bf16', 'bfloat16', torch.bfloat16)."""
    return TOLERANCE[canonical_dtype(dtype)]
