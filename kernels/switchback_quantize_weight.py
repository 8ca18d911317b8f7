"""SwitchBack weight quantizers: one scale per tensor (global) or per column, in two phases.

Math (W [N, K], s the absmax the scale covers; formats and stored scales as in
kernels/switchback_quantize.py):
  global                    Wq [N, K],   s [1]:  s = max |W|
  global-transpose          Wq^T [K, N] (contiguous), s [1]
  global, both layouts      Wq [N, K] and Wq^T [K, N] from one read of W, one s [1]
  columnwise-and-transpose  Wq^T [K, N], s [K]:  s[k] = max_n |W[n, k]|
The scale needs all of W before any element can be quantized, so there are two phases and no
zero-filled buffer: phase 1 writes partial maxima (one per item for the global scale, one per
column and row split for the columnwise ones), phase 2 reduces them and quantizes (absmax >= 0, so
the order of the reduction does not matter). A phase-2 item is a column strip of W whose rows it walks
in [BLOCK_N, BLOCK_K] tiles, last strips and rows first (phase 1 read them last, so they are the ones
still in L2); the transposed output is written tile by tile, so both the read of W and the write of
W^T are coalesced. At least 5 bytes per element cross HBM when W does not fit in L2 (read twice,
write once), against 3 for a plain cast.

Both phases run in one cooperative launch, split by a grid barrier: at 4096 x 1024 fp16 on an H200
(probe) two launches took 12.7 or 14.1 us from one timing call to the next, one launch 12.6-13.3 us
every time; the columnwise quantizer took 14.7 against 18.9 us, 33 against 40 us at 8192 x 2048 and
102 against 109-111 us at 16384 x 4096; the global one 1-3% longer than two launches at the two
larger sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, interpreting, next_power_of_2
from kernels._common.formats import encode, encode_reference, format_consts, format_dtype, multiplier, stored_scale
from kernels._common.launch import (
    LaunchCache,
    aligned,
    barrier_flags,
    grid_barrier,
    launch_with_grid_barrier,
    sm_count,
    stream_scratch,
)

PROGRAMS_PER_SM = 32  # strips x row splits of phase 2: enough loads in flight to hide HBM latency
ABSMAX_BLOCK = 4096  # elements per step of a phase-1 program of the global scale
ABSMAX_PROGRAMS_PER_SM = 8  # phase-1 items of the global scale
RESIDENT_PER_SM = {False: 8, True: 4}  # programs per SM at most, by per-column scales (H200 probe)
WARPS = {False: 8, True: 4}  # warps per program, by per-column scales
TILES = {True: (128, 64), False: (32, 128)}  # phase 2's [BLOCK_N, BLOCK_K] by transposed output


@triton.jit
def _absmax_item(x_ptr, part_ptr, numel, item, BLOCK: tl.constexpr, BLOCKS_PER_ITEM: tl.constexpr):
    """Phase 1 of the global scale: part[item] = the max |x| of blocks [item * BLOCKS_PER_ITEM, ...)."""
    start = tl.cast(item, tl.int64) * BLOCK * BLOCKS_PER_ITEM
    best = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(BLOCKS_PER_ITEM):
        offs = start + b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    tl.store(part_ptr + item, tl.max(best, axis=0))


@triton.jit
def _colmax_item(w_ptr, part_ptr, N, K, ROWS_PER_ITEM, c, r, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase 1 of the columnwise scales: part[r, strip c] = the max over rows [r * ROWS_PER_ITEM, ...) of
    |W[:, strip c]| ([splits, K] fp32)."""
    cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
    row0 = r * ROWS_PER_ITEM
    best = tl.zeros([BLOCK_K], dtype=tl.float32)
    for i in range(0, ROWS_PER_ITEM, BLOCK_N):
        rows = row0 + i + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
        best = tl.maximum(best, tl.max(tl.abs(w.to(tl.float32)), axis=0))
    tl.store(part_ptr + tl.cast(r, tl.int64) * K + cols, best, mask=cols < K)


@triton.jit
def _strip_scale(part_ptr, cols, K, P, BLOCK_P: tl.constexpr, PER_COLUMN: tl.constexpr):
    """The absmax of a column strip from phase 1: [1, BLOCK_K] (per column) or [1, 1] (global). The
    partial maxima are read from L2 (.cg): in one launch, other programs wrote them moments ago."""
    ps = tl.arange(0, BLOCK_P)
    if PER_COLUMN:
        m = (ps[:, None] < P) & (cols[None, :] < K)
        part = tl.load(part_ptr + ps[:, None].to(tl.int64) * K + cols[None, :], mask=m, other=0.0,
                       cache_modifier=".cg")
        return tl.max(part, axis=0)[None, :]
    else:
        part = tl.load(part_ptr + ps, mask=ps < P, other=0.0, cache_modifier=".cg")
        return tl.max(part, axis=0) + tl.zeros([1, 1], tl.float32)


@triton.jit
def _strip_item(w_ptr, part_ptr, s_ptr, q_ptr, qt_ptr, N, K, P, ROWS_PER_ITEM, c, r,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, PER_COLUMN: tl.constexpr,
                PLAIN: tl.constexpr, TRANSPOSED: tl.constexpr, FORMAT: tl.constexpr, QMAX: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Phase 2: quantize rows [r * ROWS_PER_ITEM, ...) of column strip c with the global or the column
    scales, last rows first; writes Wq [N, K] (PLAIN) and/or Wq^T [K, N] (TRANSPOSED)."""
    cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
    s = _strip_scale(part_ptr, cols, K, P, BLOCK_P, PER_COLUMN)
    mult = multiplier(s, QMAX)
    if r == 0:
        if PER_COLUMN:
            tl.store(s_ptr + cols[None, :], stored_scale(s, FORMAT, QMAX), mask=cols[None, :] < K)
        elif c == 0:
            tl.store(s_ptr + tl.zeros([1, 1], tl.int32), stored_scale(s, FORMAT, QMAX))
    row0 = r * ROWS_PER_ITEM
    for i in range(0, ROWS_PER_ITEM, BLOCK_N):
        rows = row0 + (ROWS_PER_ITEM - BLOCK_N - i) + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask, other=0.0)
        q = encode(w.to(tl.float32) * mult, FORMAT, INTERPRET)
        if PLAIN:
            tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], q, mask=mask)
        if TRANSPOSED:
            out = cols[:, None].to(tl.int64) * N + rows[None, :]
            tl.store(qt_ptr + out, tl.trans(q), mask=(cols[:, None] < K) & (rows[None, :] < N))


@triton.jit
def _quantize_kernel(w_ptr, part_ptr, s_ptr, q_ptr, qt_ptr, sync_ptr, N, K, PARTS, ROWS_PER_ITEM, STRIPS, SPLITS,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, PER_COLUMN: tl.constexpr,
                     PLAIN: tl.constexpr, TRANSPOSED: tl.constexpr, FORMAT: tl.constexpr, QMAX: tl.constexpr,
                     INTERPRET: tl.constexpr, ABSMAX_BLOCK: tl.constexpr, BLOCKS_PER_ITEM: tl.constexpr):
    """Both phases in one cooperative launch (every program resident at once): each program takes phase-1
    items pid, pid + programs, ... (PARTS blocks of W for the global scale, (strip, row split) pairs for
    the columnwise ones), waits at the grid barrier, then takes phase-2 items in reverse order, so the
    rows phase 1 read last (still in L2) are quantized first."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    items = STRIPS * SPLITS
    if PER_COLUMN:
        for item in range(pid, items, programs):
            _colmax_item(w_ptr, part_ptr, N, K, ROWS_PER_ITEM, item % STRIPS, item // STRIPS, BLOCK_N, BLOCK_K)
    else:
        for item in range(pid, PARTS, programs):
            _absmax_item(w_ptr, part_ptr, tl.cast(N, tl.int64) * K, item, ABSMAX_BLOCK, BLOCKS_PER_ITEM)
    grid_barrier(sync_ptr, programs)
    for item in range(pid, items, programs):
        last = items - 1 - item
        _strip_item(w_ptr, part_ptr, s_ptr, q_ptr, qt_ptr, N, K, PARTS, ROWS_PER_ITEM, last % STRIPS, last // STRIPS,
                    BLOCK_N, BLOCK_K, BLOCK_P, PER_COLUMN, PLAIN, TRANSPOSED, FORMAT, QMAX, INTERPRET)


# ---------------------------------------------------------------------------------------- launchers

_PLANS: dict[tuple, _Plan] = {}
_QUANTIZE = LaunchCache("switchback_weight_quantize")


class _Plan(NamedTuple):
    """The launch geometry of one weight shape, computed once (triton.cdiv and friends cost host time
    on every call): phase-2 tiles and items, and phase 1's partial maxima."""

    block_n: int
    block_k: int
    strips: int  # column strips of phase 2
    splits: int  # row splits of phase 2 (and of the columnwise phase 1)
    rows: int  # rows per phase-2 item
    parts: int  # partial maxima phase 1 writes: [parts] (global) or [parts, K] (per column)
    block_p: int  # next power of two of parts (phase 2 reduces them in one tile)
    per_program: int  # global phase 1: ABSMAX_BLOCK blocks per program


def _plan(N: int, K: int, per_column: bool, transposed: bool, sms: int) -> _Plan:
    """Transposed outputs use 128 x 64 tiles (128-byte rows of W^T written, 128-byte rows of W read), the
    plain layout 32 x 128."""
    key = (N, K, per_column, transposed, sms)
    if key not in _PLANS:
        block_n, block_k = TILES[transposed]
        if interpreting():
            block_n, block_k = 16, 32  # the interpreter's cost grows with the tile
        strips = cdiv(K, block_k)
        splits = max(1, min(cdiv(N, block_n), cdiv(PROGRAMS_PER_SM * sms, strips)))
        rows = cdiv(cdiv(N, splits), block_n) * block_n
        splits = cdiv(N, rows)
        if per_column:
            parts, per_program = splits, 0
        else:
            blocks = cdiv(N * K, ABSMAX_BLOCK)
            per_program = cdiv(blocks, min(ABSMAX_PROGRAMS_PER_SM * sms, blocks))
            parts = cdiv(blocks, per_program)  # rounding can leave fewer programs than asked for
        _PLANS[key] = _Plan(block_n, block_k, strips, splits, rows, parts, next_power_of_2(parts), per_program)
    return _PLANS[key]


def quantize(w: torch.Tensor, per_column: bool, plain: bool, transposed: bool, format: str):
    """(Wq [N, K] or None, Wq^T [K, N] or None, s [K] or [1]) of a 2-D, row-contiguous W, in one cooperative
    launch: the driver refuses a grid that cannot be resident at once, so the grid barrier never waits on
    a program that cannot run. Under the interpreter, whose programs run one after another, one program
    does every item."""
    dtype = format_dtype(format)
    N, K = w.shape
    q = torch.empty((N, K), dtype=dtype, device=w.device) if plain else None
    qt = torch.empty((K, N), dtype=dtype, device=w.device) if transposed else None
    s = torch.empty(K if per_column else 1, dtype=torch.float32, device=w.device)
    if N == 0 or K == 0:
        return q, qt, s.zero_()
    plan = _plan(N, K, per_column, transposed, sm_count(w.device))
    part = stream_scratch(w.device, (plan.parts, K) if per_column else (plan.parts,), torch.float32)
    args = (w, part, s, q if plain else s, qt if transposed else s, barrier_flags(w.device), N, K, plan.parts,
            plan.rows, plan.strips, plan.splits)

    def first():
        consts = (plan.block_n, plan.block_k, plan.block_p, per_column, plain, transposed, *format_consts(format),
                  ABSMAX_BLOCK, plan.per_program)
        warps = WARPS[per_column]
        compiled, grid = launch_with_grid_barrier(_quantize_kernel, args, consts, warps, w.device,
                                                  RESIDENT_PER_SM[per_column])
        return compiled, grid, consts, {"grid": list(grid), "BLOCK_N": plan.block_n, "BLOCK_K": plan.block_k,
                                        "num_warps": warps}

    key = (N, K, per_column, plain, transposed, format, w.dtype, aligned(w, part, s, q, qt), w.device)
    _QUANTIZE.launch(key, args, first)
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
