"""The dtype vocabulary of qbench: the canonical names records store and flags print (fp16, bf16, fp32,
tf32, int8, fp8), every alias a user or an old record may spell, their sizes, and the torch dtype of an
activation dtype name. Imports no torch until torch_dtype is called."""

from __future__ import annotations

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
