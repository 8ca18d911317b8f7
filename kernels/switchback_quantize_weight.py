"""SwitchBack weight quantizers: one scale per tensor (global) or per column, in two passes.

Math (W [N, K], s the absmax the scale covers; formats and stored scales as in
kernels/switchback_quantize.py):
  global                    Wq [N, K],   s [1]:  s = max |W|
  global-transpose          Wq^T [K, N] (contiguous), s [1]
  global, both layouts      Wq [N, K] and Wq^T [K, N] from one read of W, one s [1]
  columnwise-and-transpose  Wq^T [K, N], s [K]:  s[k] = max_n |W[n, k]|
The scale needs all of W before any element can be quantized, so there are two launches and no
zero-filled buffer: phase 1 writes partial maxima (one per program for the global scale, one per
column and row split for the columnwise ones), phase 2 reduces them and quantizes (absmax >= 0, so
the order of the reduction does not matter). A phase-2 program owns a column strip of W and walks
its rows in [BLOCK_N, BLOCK_K] tiles, last strips and rows first (phase 1 read them last, so they
are the ones still in L2); the transposed output is written tile by tile, so both the read of W and
the write of W^T are coalesced. At least 5 bytes per element cross HBM when W does not fit in L2
(read twice, write once), against 3 for a plain cast.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import (
    LaunchCache,
    aligned,
    cdiv,
    encode,
    encode_reference,
    format_consts,
    format_dtype,
    interpreting,
    multiplier,
    next_power_of_2,
    stored_scale,
)

PROGRAMS_PER_SM = 16  # strips x row splits of phase 2: enough loads in flight to hide HBM latency
ABSMAX_BLOCK = 4096  # elements per step of a phase-1 program of the global scale


@triton.jit
def _absmax_kernel(x_ptr, part_ptr, numel, BLOCK: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr):
    """Phase 1 of the global scale: program p writes the max |x| of its blocks to part[p]."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * BLOCKS_PER_PROGRAM
    best = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(BLOCKS_PER_PROGRAM):
        offs = start + b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    tl.store(part_ptr + tl.program_id(0), tl.max(best, axis=0))


@triton.jit
def _colmax_kernel(w_ptr, part_ptr, N, K, ROWS_PER_PROGRAM, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase 1 of the columnwise scales: program (c, r) writes the max over its rows of |W[:, strip c]|
    to part[r, strip c] ([splits, K] fp32)."""
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    row0 = tl.program_id(1) * ROWS_PER_PROGRAM
    best = tl.zeros([BLOCK_K], dtype=tl.float32)
    for r in range(0, ROWS_PER_PROGRAM, BLOCK_N):
        rows = row0 + r + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
        best = tl.maximum(best, tl.max(tl.abs(w.to(tl.float32)), axis=0))
    tl.store(part_ptr + tl.program_id(1).to(tl.int64) * K + cols, best, mask=cols < K)


@triton.jit
def _strip_scale(part_ptr, cols, K, P, BLOCK_P: tl.constexpr, PER_COLUMN: tl.constexpr):
    """The absmax of a column strip from phase 1: [1, BLOCK_K] (per column) or [1, 1] (global)."""
    ps = tl.arange(0, BLOCK_P)
    if PER_COLUMN:
        m = (ps[:, None] < P) & (cols[None, :] < K)
        part = tl.load(part_ptr + ps[:, None].to(tl.int64) * K + cols[None, :], mask=m, other=0.0)
        return tl.max(part, axis=0)[None, :]
    else:
        part = tl.load(part_ptr + ps, mask=ps < P, other=0.0)
        return tl.max(part, axis=0) + tl.zeros([1, 1], tl.float32)


@triton.jit
def _strip_kernel(w_ptr, part_ptr, s_ptr, q_ptr, qt_ptr, N, K, P, ROWS_PER_PROGRAM,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, PER_COLUMN: tl.constexpr,
                  PLAIN: tl.constexpr, TRANSPOSED: tl.constexpr, FORMAT: tl.constexpr, QMAX: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """Phase 2: program (c, r) quantizes rows [r * ROWS_PER_PROGRAM, ...) of column strip c with the
    global or the column scales; writes Wq [N, K] (PLAIN) and/or Wq^T [K, N] (TRANSPOSED)."""
    c = tl.num_programs(0) - 1 - tl.program_id(0)
    r = tl.num_programs(1) - 1 - tl.program_id(1)
    cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
    s = _strip_scale(part_ptr, cols, K, P, BLOCK_P, PER_COLUMN)
    mult = multiplier(s, QMAX)
    if r == 0:
        if PER_COLUMN:
            tl.store(s_ptr + cols[None, :], stored_scale(s, FORMAT, QMAX), mask=cols[None, :] < K)
        elif c == 0:
            tl.store(s_ptr + tl.zeros([1, 1], tl.int32), stored_scale(s, FORMAT, QMAX))
    row0 = r * ROWS_PER_PROGRAM
    for i in range(0, ROWS_PER_PROGRAM, BLOCK_N):
        rows = row0 + (ROWS_PER_PROGRAM - BLOCK_N - i) + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
        q = encode(w.to(tl.float32) * mult, FORMAT, INTERPRET)
        if PLAIN:
            tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], q, mask=mask)
        if TRANSPOSED:
            out = cols[:, None].to(tl.int64) * N + rows[None, :]
            tl.store(qt_ptr + out, tl.trans(q), mask=(cols[:, None] < K) & (rows[None, :] < N))


# ---------------------------------------------------------------------------------------- launchers

_SM_COUNTS: dict[int, int] = {}
_PLANS: dict[tuple, _Plan] = {}
_PHASE1 = LaunchCache("switchback_weight_absmax")
_PHASE2 = LaunchCache("switchback_weight_strips")


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (cached: the query costs ~2 us of host time), 2 otherwise."""
    if device.type != "cuda":
        return 2  # interpreter: few programs, each looping
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


class _Plan(NamedTuple):
    """The launch geometry of one weight shape, computed once (triton.cdiv and friends cost host time
    on every call): phase-2 tiles and programs, and phase 1's partial maxima."""

    block_n: int
    block_k: int
    strips: int  # column strips of phase 2 (grid dim 0)
    splits: int  # row splits of phase 2 (grid dim 1)
    rows: int  # rows per phase-2 program
    parts: int  # partial maxima phase 1 writes: [parts] (global) or [parts, K] (per column)
    block_p: int  # next power of two of parts (phase 2 reduces them in one tile)
    grid1: tuple  # phase 1's grid
    per_program: int  # global phase 1: ABSMAX_BLOCK blocks per program


def _plan(N: int, K: int, per_column: bool, transposed: bool, sms: int) -> _Plan:
    """Transposed outputs use 128 x 64 tiles (128-byte rows of W^T written, 128-byte rows of W read), the
    plain layout 32 x 128."""
    key = (N, K, per_column, transposed, sms)
    if key not in _PLANS:
        block_n, block_k = (128, 64) if transposed else (32, 128)
        if interpreting():
            block_n, block_k = 16, 32  # the interpreter's cost grows with the tile
        strips = cdiv(K, block_k)
        splits = max(1, min(cdiv(N, block_n), cdiv(PROGRAMS_PER_SM * sms, strips)))
        rows = cdiv(cdiv(N, splits), block_n) * block_n
        splits = cdiv(N, rows)
        if per_column:
            parts, grid1, per_program = splits, (strips, splits), 0
        else:
            blocks = cdiv(N * K, ABSMAX_BLOCK)
            per_program = cdiv(blocks, min(2 * sms, blocks))
            parts = cdiv(blocks, per_program)  # rounding can leave fewer programs than 2 * sms
            grid1 = (parts,)
        _PLANS[key] = _Plan(block_n, block_k, strips, splits, rows, parts, next_power_of_2(parts), grid1,
                            per_program)
    return _PLANS[key]


def _partial_maxima(w: torch.Tensor, per_column: bool, plan: _Plan) -> torch.Tensor:
    """Phase 1: [parts] fp32 maxima (global) or [splits, K] (columnwise)."""
    N, K = w.shape
    if per_column:
        part = torch.empty((plan.parts, K), dtype=torch.float32, device=w.device)
        args, consts, kernel = (w, part, N, K, plan.rows), (min(64, plan.block_n), plan.block_k), _colmax_kernel
    else:
        part = torch.empty(plan.parts, dtype=torch.float32, device=w.device)
        args, consts, kernel = (w, part, N * K), (ABSMAX_BLOCK, plan.per_program), _absmax_kernel

    def first():
        warps = 4 if per_column else 8
        compiled = kernel[plan.grid1](*args, *consts, num_warps=warps)
        return compiled, plan.grid1, consts, {"grid": list(plan.grid1), "num_warps": warps}

    _PHASE1.launch((N, K, per_column, w.dtype, aligned(w, part), w.device), args, first)
    return part


def quantize_strips(w: torch.Tensor, per_column: bool, plain: bool, transposed: bool, format: str):
    """(Wq [N, K] or None, Wq^T [K, N] or None, s [K] or [1]) of a 2-D, row-contiguous W."""
    dtype = format_dtype(format)
    N, K = w.shape
    q = torch.empty((N, K), dtype=dtype, device=w.device) if plain else None
    qt = torch.empty((K, N), dtype=dtype, device=w.device) if transposed else None
    s = torch.empty(K if per_column else 1, dtype=torch.float32, device=w.device)
    if N == 0 or K == 0:
        return q, qt, s.zero_()
    plan = _plan(N, K, per_column, transposed, sm_count(w.device))
    part = _partial_maxima(w, per_column, plan)
    args = (w, part, s, q if plain else s, qt if transposed else s, N, K, plan.parts, plan.rows)

    def first():
        consts = (plan.block_n, plan.block_k, plan.block_p, per_column, plain, transposed, *format_consts(format))
        grid = (plan.strips, plan.splits)
        warps = 8 if plan.block_n * plan.block_k >= 8192 else 4
        compiled = _strip_kernel[grid](*args, *consts, num_warps=warps)
        return compiled, grid, consts, {"BLOCK_N": plan.block_n, "BLOCK_K": plan.block_k, "num_warps": warps}

    key = (N, K, per_column, plain, transposed, format, w.dtype, aligned(w, part, s, q, qt), w.device)
    _PHASE2.launch(key, args, first)
    return q, qt, s


# ---------------------------------------------------------------------------------------- references


def quantize_global_reference(w: torch.Tensor, format: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    s = w.float().abs().amax().reshape(1) if w.numel() else w.new_zeros(1, dtype=torch.float32)
    return encode_reference(w, s, format)


def quantize_global_transpose_reference(w: torch.Tensor, format: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    q, s = quantize_global_reference(w, format)
    return q.t().contiguous(), s


def quantize_global_both_reference(w: torch.Tensor, format: str = "int8"):
    q, s = quantize_global_reference(w, format)
    return q, q.t().contiguous(), s


def quantize_columnwise_transpose_reference(w: torch.Tensor, format: str = "int8"):
    s = w.float().abs().amax(dim=0) if w.shape[0] else w.new_zeros(w.shape[1], dtype=torch.float32)
    q, stored = encode_reference(w, s[None, :], format)
    return q.t().contiguous(), stored[0]
