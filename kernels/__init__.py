"""Triton kernels, one file per kernel family; each file also holds a plain-torch reference.

Launchers run the Triton kernel on CUDA tensors, and on CPU tensors only under the Triton
interpreter (TRITON_INTERPRET=1, set before triton is imported); otherwise they fall back to the
torch reference, so every subcommand runs end to end on a machine without a GPU.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(*tensors) -> bool:
    """True when the Triton kernel can run on these tensors (CUDA, or CPU under the interpreter)."""
    if not tensors:
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    if not on_cuda and not interpreting():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
