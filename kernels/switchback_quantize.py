"""SwitchBack int8 quantizers: symmetric absmax quantization to 127 levels.

Math (s is the stored scale, the absmax itself, not absmax/127):
  rowwise                   X [M, K] -> Xq [M, K] int8, s [M]:  s[i] = max_j |X[i,j]|,  Xq = rint(127 X / s[i])
  global                    W [N, K] -> Wq [N, K] int8, s [1]:  s = max |W|
  global-transpose          W [N, K] -> Wq^T [K, N] int8 (contiguous), s [1]
  columnwise-and-transpose  W [N, K] -> Wq^T [K, N] int8, s [K]: s[k] = max_n |W[n,k]|
  dequantize-rowwise        Xq [M, K], s [M] -> Xq * s[:, None] / 127 in a 16-bit dtype
Rounding is round-half-to-even in fp32; the multiplier is 127 / s computed with IEEE division, so
the torch references below reproduce the kernels bit for bit. A zero scale (an all-zero row or
tensor) gives multiplier 0 and output 0, never NaN. Inputs are fp16 or bf16 (fp32 also works),
last dimension contiguous; scales are fp32.

The global and columnwise scales are reduced inside Triton: a first kernel takes per-block maxima
and folds them into an fp32 buffer with atomic_max (absmax >= 0, so float max is exact and the
order of the atomics does not matter), a second kernel quantizes. Transposed outputs are written
tile by tile so both the read of W and the write of W^T are coalesced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels._common import interpreting, use_triton

QMAX = 127.0
_QMAX = tl.constexpr(QMAX)
# 1.5 * 2**23: adding and subtracting it rounds an fp32 |v| < 2**22 to the nearest integer, ties to
# even, in IEEE arithmetic. Used only under the interpreter, which has no libdevice.
_ROUND_MAGIC = tl.constexpr(12582912.0)
ELEMENTS_PER_PROGRAM = 8192  # rowwise: 16 KB of fp16 per program keeps enough bytes in flight


@triton.jit
def _rint(v, INTERPRET: tl.constexpr):
    if INTERPRET:
        v = v.to(tl.float32)
        magic = tl.full(v.shape, _ROUND_MAGIC, tl.float32)  # keep numpy in fp32, not fp64
        return (v + magic) - magic
    else:
        return libdevice.rint(v)


@triton.jit
def _multiplier(s):
    """127 / s with IEEE rounding; 0 where s == 0 (all-zero row or tensor)."""
    # fp32 constants, not Python floats: the interpreter would otherwise compute in fp64
    zero = tl.zeros(s.shape, tl.float32)
    safe = tl.where(s > 0, s, zero + 1.0)
    return tl.where(s > 0, tl.math.div_rn(zero + _QMAX, safe), zero)


@triton.jit
def _rowwise_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    INTERPRET: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    s = tl.max(tl.abs(x), axis=1)  # [BLOCK_M]
    q = _rint(x * _multiplier(s)[:, None], INTERPRET).to(tl.int8)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows, s, mask=rows < M)


@triton.jit
def _absmax_kernel(x_ptr, s_ptr, numel, BLOCK: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr):
    """Phase 1 of the global scale: each program folds the max of its blocks into s_ptr[0]."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * BLOCKS_PER_PROGRAM
    best = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(BLOCKS_PER_PROGRAM):
        offs = start + b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    tl.atomic_max(s_ptr, tl.max(best, axis=0))


@triton.jit
def _colmax_kernel(w_ptr, s_ptr, N, K, ROWS_PER_PROGRAM, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase 1 of the columnwise scales: program (k, r) folds max over its rows into s_ptr[k block]."""
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    row0 = tl.program_id(1) * ROWS_PER_PROGRAM
    best = tl.zeros([BLOCK_K], dtype=tl.float32)
    for r in range(0, ROWS_PER_PROGRAM, BLOCK_N):
        rows = row0 + r + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
        best = tl.maximum(best, tl.max(tl.abs(w.to(tl.float32)), axis=0))
    tl.atomic_max(s_ptr + cols, best, mask=cols < K)


@triton.jit
def _scaled_tile_kernel(w_ptr, s_ptr, q_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PER_COLUMN: tl.constexpr, TRANSPOSE: tl.constexpr, INTERPRET: tl.constexpr):
    """Phase 2: quantize one [BLOCK_N, BLOCK_K] tile of W [N, K] with the global scale s_ptr[0] or the
    column scales s_ptr[k]; write it to Wq [N, K] or, with TRANSPOSE, to Wq^T [K, N]."""
    # last rows first: phase 1 read them last, so they are the ones still in L2
    rows = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < N) & (cols[None, :] < K)
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
    if PER_COLUMN:
        mult = _multiplier(tl.load(s_ptr + cols, mask=cols < K))[None, :]  # no Python-float `other` (fp64)
    else:
        mult = _multiplier(tl.load(s_ptr + tl.zeros([1], dtype=tl.int32)))[:, None]
    q = _rint(w.to(tl.float32) * mult, INTERPRET).to(tl.int8)
    if TRANSPOSE:
        out = cols[:, None].to(tl.int64) * N + rows[None, :]
        tl.store(q_ptr + out, tl.trans(q), mask=(cols[:, None] < K) & (rows[None, :] < N))
    else:
        tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], q, mask=mask)


# ---------------------------------------------------------------------------------------- launchers


def _check(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X [M, K] -> (Xq [M, K] int8, s [M] fp32)."""
    x = _check(x, "x")
    if not use_triton(x):
        return quantize_rowwise_reference(x)
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.int8, device=x.device)
    s = torch.empty(M, dtype=torch.float32, device=x.device)
    block_k = triton.next_power_of_2(K)
    block_m = max(1, ELEMENTS_PER_PROGRAM // block_k)
    warps = max(4, min(32, block_m * block_k // 1024))  # ~32 elements per thread
    _rowwise_kernel[(triton.cdiv(M, block_m),)](
        x, q, s, M, K, x.stride(0), BLOCK_M=block_m, BLOCK_K=block_k, INTERPRET=interpreting(), num_warps=warps
    )
    return q, s


def _global_scale(w: torch.Tensor) -> torch.Tensor:
    """max |W| as a [1] fp32 tensor, reduced on the device by _absmax_kernel."""
    s = torch.zeros(1, dtype=torch.float32, device=w.device)
    block = 4096
    blocks = triton.cdiv(w.numel(), block)
    # a few programs per SM, each looping over several blocks, keeps the atomics to a few hundred
    per_program = triton.cdiv(blocks, 4 * _sm_count(w.device))
    grid = (triton.cdiv(blocks, per_program),)
    _absmax_kernel[grid](w, s, w.numel(), BLOCK=block, BLOCKS_PER_PROGRAM=per_program, num_warps=8)
    return s


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # interpreter: few programs, each looping


def _quantize_tiles(w: torch.Tensor, s: torch.Tensor, per_column: bool, transpose: bool) -> torch.Tensor:
    N, K = w.shape
    q = torch.empty((K, N) if transpose else (N, K), dtype=torch.int8, device=w.device)
    block_n, block_k = (64, 64) if transpose else (32, 128)
    grid = (triton.cdiv(N, block_n), triton.cdiv(K, block_k))
    _scaled_tile_kernel[grid](
        w, s, q, N, K, BLOCK_N=block_n, BLOCK_K=block_k, PER_COLUMN=per_column, TRANSPOSE=transpose,
        INTERPRET=interpreting(), num_warps=4,
    )
    return q


def _quantize_global(w: torch.Tensor, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    w = _check(w, "w").contiguous()
    if not use_triton(w):
        return (quantize_global_transpose_reference if transpose else quantize_global_reference)(w)
    s = _global_scale(w)
    return _quantize_tiles(w, s, per_column=False, transpose=transpose), s


def quantize_global(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (Wq [N, K] int8, s [1] fp32)."""
    return _quantize_global(w, transpose=False)


def quantize_global_transpose(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (Wq^T [K, N] int8 contiguous, s [1] fp32)."""
    return _quantize_global(w, transpose=True)


def quantize_columnwise_transpose(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (Wq^T [K, N] int8 contiguous, s [K] fp32 with s[k] = max_n |W[n, k]|)."""
    w = _check(w, "w").contiguous()
    if not use_triton(w):
        return quantize_columnwise_transpose_reference(w)
    N, K = w.shape
    s = torch.zeros(K, dtype=torch.float32, device=w.device)
    block_n, block_k = 64, 128
    col_blocks = triton.cdiv(K, block_k)
    # split the rows so that about 16 programs per SM run: K / 128 column strips alone are too few,
    # and each program keeps one 16 KB load in flight, so many programs hide the memory latency
    splits = max(1, min(triton.cdiv(N, block_n), triton.cdiv(16 * _sm_count(w.device), col_blocks)))
    rows_per_program = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    grid = (col_blocks, triton.cdiv(N, rows_per_program))
    _colmax_kernel[grid](w, s, N, K, rows_per_program, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return _quantize_tiles(w, s, per_column=True, transpose=True), s


@triton.jit
def _dequantize_rowwise_kernel(q_ptr, s_ptr, y_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    offs = rows[:, None].to(tl.int64) * K + cols[None, :]
    q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.float32)
    s = tl.load(s_ptr + rows, mask=rows < M, other=0.0)
    y = q * (s / _QMAX)[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def dequantize_rowwise(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(Xq [M, K] int8, s [M]) -> Xq * s / 127 as [M, K] in dtype."""
    q = _check(q, "q").contiguous()
    if not use_triton(q, s):
        return dequantize_rowwise_reference(q, s, dtype)
    M, K = q.shape
    y = torch.empty((M, K), dtype=dtype, device=q.device)
    block_k = triton.next_power_of_2(K)
    block_m = max(1, ELEMENTS_PER_PROGRAM // block_k)
    warps = max(4, min(32, block_m * block_k // 1024))
    _dequantize_rowwise_kernel[(triton.cdiv(M, block_m),)](q, s, y, M, K, BLOCK_M=block_m, BLOCK_K=block_k,
                                                           num_warps=warps)
    return y


# ---------------------------------------------------------------------------------------- references


def _quantize_reference(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """rint(x * (127 / s)) in fp32 with the kernels' zero guard; s broadcasts against x."""
    safe = torch.where(s > 0, s, torch.ones_like(s))
    # tensor / tensor: IEEE division (the scalar form `QMAX / safe` is not correctly rounded on CPU)
    mult = torch.where(s > 0, torch.full_like(safe, QMAX) / safe, torch.zeros_like(s))
    return torch.round(x.float() * mult).to(torch.int8)  # torch.round: half to even


def quantize_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.float().abs().amax(dim=1)
    return _quantize_reference(x, s[:, None]), s


def quantize_global_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = w.float().abs().amax().reshape(1)
    return _quantize_reference(w, s), s


def quantize_global_transpose_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = quantize_global_reference(w)
    return q.t().contiguous(), s


def quantize_columnwise_transpose_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = w.float().abs().amax(dim=0)
    return _quantize_reference(w, s[None, :]).t().contiguous(), s


def dequantize_rowwise_reference(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * (s.float() / QMAX)[:, None]).to(dtype)
