"""Helpers shared by the kernel families: where Triton can run, and the jit helpers that more than
one family uses. Every kernel file imports from here only (never from a sibling family), so the
families form no import loop.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    """True under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(*tensors) -> bool:
    """True when the Triton kernel can run on these tensors (CUDA, or CPU under the interpreter)."""
    if not tensors:
        return False
    return all(t.is_cuda for t in tensors) or interpreting()


def ieee(dtype) -> bool:
    """fp32 inputs get IEEE products (no TF32), so a kernel matches the fp32 reference."""
    import torch

    return dtype == torch.float32 or upcast(dtype)


def upcast(dtype) -> bool:
    """The Triton interpreter's bf16 tl.dot returns garbage (checked with triton 3.9), so under the
    interpreter bf16 tiles are widened to fp32 before the product; compiled kernels never upcast."""
    import torch

    return interpreting() and dtype == torch.bfloat16


@triton.jit
def dot_accumulate(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc += a @ b in fp32. UPCAST widens 16-bit tiles first (only under the interpreter, whose bf16
    dot is wrong); IEEE asks for exact fp32 products (no TF32) so fp32 matches the fp32 reference."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


_INV_QMAX_SQUARED = tl.constexpr(1.0 / (127.0 * 127.0))


@triton.jit
def dequantize_tile(acc, rm, rn, M, N, sa_ptr, sb_ptr, bias_ptr, PER_COLUMN: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The SwitchBack int8 matmuls' fused dequantizing epilogue (pointer and TMA kernels): int32 tile
    [BM, BN] -> fp32 acc * s_a[rm] * s_b / 127^2 (+ bias[rn]); s_b is one scale (global) or one per
    column."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    if PER_COLUMN:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr + tl.zeros([1], dtype=tl.int32))[:, None]
    c = acc.to(tl.float32) * (sa[:, None] * _INV_QMAX_SQUARED) * sb
    if HAS_BIAS:
        c += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return c
