"""The 8-bit quantization formats (int8, fp8 e4m3 and e5m2): their names, largest magnitudes and
stored dtypes, the jit helpers that encode a scaled fp32 tile and store its scale, and their plain-torch
twin (encode_reference).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels._common import interpreting

# ------------------------------------------------------------------------------ quantization formats

# name -> (torch dtype of the stored elements, QMAX: the largest magnitude the format stores)
QUANT_FORMATS = {"int8": ("int8", 127.0), "e4m3": ("float8_e4m3fn", 448.0), "e5m2": ("float8_e5m2", 57344.0)}
_FORMAT_CODE = {"int8": 0, "e4m3": 1, "e5m2": 2}
# 1.5 * 2**23: adding and subtracting it rounds an fp32 |v| < 2**22 to the nearest integer, ties to
# even, in IEEE arithmetic. Used only under the interpreter, which has no libdevice.
_ROUND_MAGIC = tl.constexpr(12582912.0)


def format_consts(format: str) -> tuple[int, float, bool]:
    """(FORMAT code, QMAX, INTERPRET): the constexprs every quantizing kernel takes."""
    if format not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {format!r}; choose from {', '.join(QUANT_FORMATS)}")
    return _FORMAT_CODE[format], QUANT_FORMATS[format][1], interpreting()


_FORMAT_DTYPES: dict = {}


def format_dtype(format: str):
    """The torch dtype of a quantization format's stored elements."""
    if format not in _FORMAT_DTYPES:
        import torch

        format_consts(format)  # validates the name
        _FORMAT_DTYPES[format] = getattr(torch, QUANT_FORMATS[format][0])
    return _FORMAT_DTYPES[format]


@triton.jit
def rint(v, INTERPRET: tl.constexpr):
    """Round half to even in fp32 (libdevice on the GPU, the magic-number add under the interpreter)."""
    if INTERPRET:
        v = v.to(tl.float32)
        magic = tl.full(v.shape, _ROUND_MAGIC, tl.float32)  # keep numpy in fp32, not fp64
        return (v + magic) - magic
    else:
        return libdevice.rint(v)


@triton.jit
def _fp8_grid(v, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    """v (fp32) rounded half to even onto the fp8 grid with MANTISSA bits and smallest normal
    exponent MIN_EXP; only under the interpreter, whose own fp8 conversion misrounds across binades
    (127.3 -> e5m2 gave 64, checked with triton 3.9)."""
    bits = v.to(tl.int32, bitcast=True)
    drop: tl.constexpr = 23 - MANTISSA
    odd = (bits >> drop) & 1
    normal = ((bits + (1 << (drop - 1)) - 1 + odd) >> drop) << drop
    step = tl.full(v.shape, 2.0 ** (MIN_EXP - MANTISSA), tl.float32)  # subnormal spacing
    magic = tl.full(v.shape, _ROUND_MAGIC, tl.float32)
    sub = ((v / step + magic) - magic) * step
    return tl.where(tl.abs(v) < 2.0**MIN_EXP, sub, normal.to(tl.float32, bitcast=True))


@triton.jit
def encode(v, FORMAT: tl.constexpr, INTERPRET: tl.constexpr):
    """v (fp32, |v| <= QMAX of the format) -> the stored element: int8 (round half to even), e4m3 or
    e5m2 (the hardware's round-to-nearest-even conversion)."""
    if FORMAT == 0:
        return rint(v, INTERPRET).to(tl.int8)
    elif FORMAT == 1:
        if INTERPRET:
            v = _fp8_grid(v, 3, -6)
        return v.to(tl.float8e4nv)
    else:
        if INTERPRET:
            v = _fp8_grid(v, 2, -14)
        return v.to(tl.float8e5)


@triton.jit
def multiplier(s, QMAX: tl.constexpr):
    """QMAX / s with IEEE rounding; 0 where s == 0 (an all-zero row or tensor)."""
    # fp32 constants, not Python floats: the interpreter would otherwise compute in fp64
    zero = tl.zeros(s.shape, tl.float32)
    safe = tl.where(s > 0, s, zero + 1.0)
    return tl.where(s > 0, tl.math.div_rn(zero + QMAX, safe), zero)


@triton.jit
def stored_scale(s, FORMAT: tl.constexpr, QMAX: tl.constexpr):
    """int8 keeps the absmax (the original SwitchBack convention); fp8 keeps the dequantization
    multiplier absmax / QMAX, the form torch._scaled_mm takes."""
    if FORMAT == 0:
        return s
    else:
        return tl.math.div_rn(s, tl.zeros(s.shape, tl.float32) + QMAX)


def encode_reference(x, s, format: str):
    """The plain-torch twin of `encode(x * multiplier(s))` and `stored_scale(s)`: (q, stored scale);
    s (the absmax) broadcasts against x."""
    import torch

    qmax = QUANT_FORMATS[format][1]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    # tensor / tensor: IEEE division (the scalar form `qmax / safe` is not correctly rounded on CPU)
    mult = torch.where(s > 0, torch.full_like(safe, qmax) / safe, torch.zeros_like(s))
    v = x.float() * mult
    if format == "int8":
        return torch.round(v).to(torch.int8), s  # torch.round: half to even
    return v.to(format_dtype(format)), s / torch.full_like(s, qmax)
