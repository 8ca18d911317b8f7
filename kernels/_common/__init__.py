"""Helpers shared by the kernel families: where Triton can run, the jit helpers that more than one
family uses, host-side launch geometry and device queries, and the torch custom-op registration.
Kernel files import shared code only from this package (this module; launch.py: repeated and
cooperative launches; formats.py: the 8-bit quantization formats), never from a sibling family, so the
families form no import loop.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import triton
import triton.language as tl

# Read once: triton reads TRITON_INTERPRET when it is first imported, so the value cannot change later.
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    """True under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return _INTERPRETING


def use_triton(*tensors) -> bool:
    """True when the Triton kernel can run on these tensors (CUDA, or CPU under the interpreter)."""
    if not tensors:
        return False
    return _INTERPRETING or all(t.is_cuda for t in tensors)


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


_SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)


@triton.jit
def activation_epilogue(acc, pre_ptrs, mask, EPI: tl.constexpr, ACT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """A GEMM epilogue around an elementwise activation (ACT 1: relu, 2: exact erf GELU, as F.gelu), on
    the fp32 tile acc rounded to OUT_DTYPE first (what an unfused activation reads):
    EPI 0: acc as is; 1: store the pre-activation at pre_ptrs, return act(pre); 2: return acc * act'(pre)
    with pre loaded from pre_ptrs (the activation's backward: acc is the gradient of its output)."""
    if EPI == 0:
        return acc
    v = acc.to(OUT_DTYPE).to(tl.float32)
    if EPI == 1:
        tl.store(pre_ptrs, v.to(OUT_DTYPE), mask=mask)
        if ACT == 1:
            return tl.maximum(v, 0.0)
        return 0.5 * v * (1.0 + tl.math.erf(v * _SQRT_HALF))
    p = tl.load(pre_ptrs, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        return tl.where(p > 0.0, v, 0.0)
    return v * (0.5 * (1.0 + tl.math.erf(p * _SQRT_HALF)) + p * tl.exp(-0.5 * p * p) * _INV_SQRT_2PI)


ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}  # the ACT codes of activation_epilogue (None: no activation)
EPILOGUES = {None: 0, "act": 1, "act_grad": 2}  # its EPI codes


class Epilogue(NamedTuple):
    """What a GEMM does to its product, chosen by name (build one with `epilogue`): kind None (the product
    as is), "act" (store the product as the pre-activation `pre`, return activation(pre)) or "act_grad"
    (the product is the gradient of the activation's output: return it times activation'(pre));
    activation "relu" or "gelu"; pre [T, N] with the output's strides, or None. codes: the (EPI, ACT)
    constexprs of activation_epilogue, looked up once here rather than on every launch."""

    kind: str | None
    activation: str | None
    pre: Any
    codes: tuple[int, int]


def epilogue(kind: str | None = None, activation: str | None = None, pre=None) -> Epilogue:
    """The Epilogue of that name; ValueError naming the choices for an unknown kind or activation, or an
    activation epilogue without its activation or pre-activation tensor."""
    if kind not in EPILOGUES:
        raise ValueError(f"unknown epilogue {kind!r}; choose from {', '.join(map(str, EPILOGUES))}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from relu, gelu")
    if kind is not None and (activation is None or pre is None):
        raise ValueError(f"epilogue {kind!r} needs an activation and its pre-activation tensor")
    return Epilogue(kind, activation, pre, (EPILOGUES[kind], ACTIVATIONS[activation]))


PRODUCT = epilogue()  # the product as it is


_INV_QMAX_SQUARED = tl.constexpr(1.0 / (127.0 * 127.0))


@triton.jit
def quantized_zeros(BM: tl.constexpr, BN: tl.constexpr, FP8: tl.constexpr):
    """The accumulator tile [BM, BN] of an 8-bit product: int32 for int8 (exact), fp32 for fp8."""
    if FP8:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    return acc


@triton.jit
def quantized_dot(a, b, acc, FP8: tl.constexpr):
    """acc + a . b of 8-bit tiles a [BM, BK], b [BK, BN]. int8 sums exactly in int32. fp8 (e4m3 or e5m2,
    in any pairing) sums in fp32 with Triton's default accumulation (on Hopper the tensor cores' own,
    without periodic promotion: the fast-accumulation mode of torch._scaled_mm)."""
    if FP8:
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    return acc


@triton.jit
def dequantize_tile(acc, rm, rn, M, N, sa_ptr, sb_ptr, bias_ptr, PER_COLUMN: tl.constexpr, HAS_BIAS: tl.constexpr,
                    FP8: tl.constexpr):
    """The SwitchBack matmuls' fused dequantizing epilogue (pointer and TMA kernels): tile [BM, BN] ->
    fp32 acc * s_a[rm] * s_b (+ bias[rn]); s_b is one scale (global) or one per column. int8 scales are
    absmax values (the product is divided by 127^2 here), fp8 scales are multipliers (absmax / QMAX)."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    if PER_COLUMN:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr + tl.zeros([1], dtype=tl.int32))[:, None]
    if FP8:
        c = acc * sa[:, None] * sb
    else:
        c = acc.to(tl.float32) * (sa[:, None] * _INV_QMAX_SQUARED) * sb
    if HAS_BIAS:
        c += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return c


# ------------------------------------------------------------------------------ launch geometry, devices

_DEVICE_PROPERTIES: dict = {}  # CUDA device index -> torch's properties


def device_properties(device):
    """torch.cuda.get_device_properties of a CUDA device, queried once per device: each query costs
    about 2 us of host time, and launchers ask on every call."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_PROPERTIES:
        _DEVICE_PROPERTIES[index] = torch.cuda.get_device_properties(index)
    return _DEVICE_PROPERTIES[index]


def capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (cached)."""
    props = device_properties(device)
    return props.major, props.minor


def descriptor_aligned(t, row_elems: int) -> bool:
    """A tensor descriptor's rules: 16-byte aligned base and row stride (row_elems elements per row)."""
    return t.data_ptr() % 16 == 0 and (row_elems * t.element_size()) % 16 == 0


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host-side launch geometry. triton.cdiv is a constexpr_function in recent triton: its
    wrapper costs a few microseconds of host time per call, and launch paths run it on every step."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0, as triton.next_power_of_2), on the host (see cdiv)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def dot_rows(n: int) -> int:
    """The row block that holds n rows in one tl.dot operand: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, next_power_of_2(n))


# fp32 kernels take exact (IEEE) products: the dot becomes unrolled FMA code, whose compile time grows with
# the tile (minutes for 128 x 128 and 64 x 256 tiles); their autotuners keep to tiles of at most this many
FP32_LARGEST_TILE = 64 * 128


def fp32_tile_limit(pointer: str, dims: tuple[str, str]):
    """An autotuner's early_config_prune: with an fp32 tensor at argument `pointer`, only the configs whose
    tile dims[0] x dims[1] is at most FP32_LARGEST_TILE; every config otherwise."""
    def prune(configs, named_args, **kwargs):
        import torch

        if named_args[pointer].dtype != torch.float32:
            return configs
        return [c for c in configs if c.kwargs[dims[0]] * c.kwargs[dims[1]] <= FP32_LARGEST_TILE]

    return prune


# ------------------------------------------------------------------------------ torch custom ops


def is_compiling() -> bool:
    """True while torch.compile traces: launchers then call their registered custom op, so the
    compiled graph treats the kernel as one opaque node with a known output shape. In eager mode
    they launch directly (a custom op's dispatch costs ~11 us of host time per call on an H200 host)."""
    import torch

    return torch.compiler.is_compiling()


_LIBRARY = None  # the qbench namespace of torch.ops, made on the first registration


def register_op(name: str, impl, fake):
    """torch.ops.qbench.<name> with `impl` (type-annotated, no mutation, outputs never alias inputs) and
    its fake (shapes only). Defined through torch.library.Library, not torch.library.custom_op: a compiled
    step calls these ops at run time, and custom_op's Python wrappers cost ~18 us per call against ~6 us
    for a Library-defined op (CPU, torch 2.13: a no-op impl called 20,000 times)."""
    import torch

    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("qbench", "FRAGMENT")
    _LIBRARY.define(name + torch.library.infer_schema(impl, mutates_args=()))
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"qbench::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.qbench, name).default
