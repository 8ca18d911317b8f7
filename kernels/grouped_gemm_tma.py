"""Persistent, TMA-fed grouped GEMM forward for Hopper (same math and contract as the pointer
kernel `_grouped_fwd_kernel` in kernels/grouped_gemm.py):
    y[r, :] = x[r, :] @ w[s % G] (+ bias[s % G])   for every row r of segment s
    x [T, K], w [G, K, N], offsets int64 [S + 1] (S = R * G segments), bias [G, N] | None -> y [T, N]
    fp16/bf16 in, fp32 accumulation, y in x.dtype.

One program per SM walks the (row tile, N tile) work items of all segments. The tile map (segment s
has cdiv(rows_s, BM) row tiles) is computed in the kernel from `offsets`, so a launch never syncs
with the host. Operand tiles arrive through host-built tensor descriptors (the bulk tensor copy
engine): A tiles [BM, BK] from x [T, K] (rows past the segment's end belong to the next segment, or
read as zero past T: they are computed and masked at the store), B tiles from w viewed 2-D:
  plain       w [G, K, N] contiguous          -> [G*K, N], tile [BK, BN] at (g*K + k0, n0);
              needs K % BK == 0 so that a tile never reaches into group g + 1
  transposed  w = v.transpose(1, 2), v [G, N, K] contiguous (the input gradient's w^T)
              -> v as [G*N, K], tile [BN, BK] at (g*N + n0, k0), used as its transpose; rows of
              group g + 1 land only in columns n >= N, which the store masks
The store is a masked pointer store, not a TMA store: a row tile may straddle two segments. There is
no activation epilogue: a tile's epilogue runs after its K loop (nothing overlaps it), and an activation
there cost more than torch's elementwise pass after the product (kernels/grouped_gemm.py, _launch_fwd).
Tried again at the moe seed shapes on an H200 (probe, CUDA-graph replays): with tile-relative int32
offsets, the epilogue in two column halves (no spills) and GELU from one exp and one reciprocal, the
fused forward took 316 us against 334 for the product and torch's GELU, the fused backward 382 against
372; two programs per SM (one's epilogue beside the other's products) slowed the product itself
(128x128 tiles: 314 us against 245 for 128x256 at one per SM). The GELU's arithmetic, not its memory
traffic, is what the epilogue adds, and nothing runs beside it.
`supported()` says when this kernel applies; kernels/grouped_gemm.py falls back to the pointer
kernel otherwise, or when its caller passes impl="pointer" (grouped_matmul_forward's `impl`).
The first launch of a shape autotunes; later launches replay the picked kernel with descriptors of
its tile (kernels._common.launch.LaunchCache; the row count T keyed by its specialization only).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import (
    capability,
    cdiv,
    descriptor_aligned,
    device_properties,
    dot_accumulate,
    ieee,
    interpreting,
    next_power_of_2,
    upcast,
)
from kernels._common.launch import HostDescriptor, LaunchCache, aligned, config_dict, specialization, tensor_descriptor

# (BM, BN, num_stages, num_warps). Shared memory = stages * (BM + BN) * BK * 2 bytes + the epilogue's
# layout conversion: 128x256 at 3 stages compiles (sm_90) to 176 KiB, within the 227 KiB of an H100/H200
# SM. 64-row tiles serve many small segments (64 groups x R=4 at 16k rows leaves ~64 rows per segment);
# 64x256 with 4 warps is left out (128 accumulator registers per thread: its sm_90 build spilled to
# the stack with triton 3.9). Four configs only: every rank of a multi-rank run compiles all of them.
_HOPPER = [(128, 256, 3, 8), (128, 128, 4, 8), (256, 128, 3, 8), (64, 128, 4, 4)]
# The interpreter gets one tiny tile (fast CPU tests) and a few programs, so that every program of
# the persistent loop walks several work items.
_INTERP_TILE, _INTERP_PROGRAMS = (16, 16, 16), 3
BK_TMA = _INTERP_TILE[2] if interpreting() else 64  # every config's K tile: plain w needs K % BK_TMA == 0


def _set_block_shapes(nargs):
    """Autotune pre-hook: the descriptors' block shapes follow the config's tile."""
    bm, bn, bk = nargs["BM"], nargs["BN"], nargs["BK"]
    nargs["x_desc"].block_shape = [bm, bk]
    nargs["w_desc"].block_shape = [bn, bk] if nargs["TRANS_W"] else [bk, bn]


def _configs():
    if interpreting():
        bm, bn, bk = _INTERP_TILE
        return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 2}, num_warps=1, num_stages=1,
                              pre_hook=_set_block_shapes)]
    return [triton.Config({"BM": bm, "BN": bn, "BK": BK_TMA, "GROUP_M": 8}, num_warps=w, num_stages=s,
                          pre_hook=_set_block_shapes) for bm, bn, s, w in _HOPPER]


@triton.jit
def _tile_origin(tile, total_m, n_tiles, lo, tiles, tile_end, ss,
                 BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Work item -> (segment s, first row, first column). Row tiles go in bands of GROUP_M so that
    neighbouring programs share weight columns in L2; s = number of segments ending at or before it."""
    band = GROUP_M * n_tiles
    first_m = (tile // band) * GROUP_M
    band_m = tl.minimum(total_m - first_m, GROUP_M)  # the last band may hold fewer row tiles
    pid_m = first_m + (tile % band) % band_m
    n0 = ((tile % band) // band_m) * BN
    s = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
    s_lo = tl.sum(tl.where(ss == s, lo, 0), 0)
    s_first = tl.sum(tl.where(ss == s, tile_end - tiles, 0), 0)
    return s, s_lo + (pid_m - s_first) * BM, n0


@triton.autotune(configs=_configs(), key=["N", "K", "S", "TRANS_W"])
@triton.jit
def _grouped_fwd_tma_kernel(
    x_desc, w_desc, b_ptr, y_ptr, off_ptr,
    N, K, S, G, sbg, sym,
    TRANS_W: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_S: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Tile map over the S segments: tiles[s] row tiles each, tile_end = their inclusive cumsum.
    ss = tl.arange(0, BLOCK_S)
    # int32 row numbers (T < 2**31, checked on the host): descriptor coordinates are 32-bit
    lo = tl.load(off_ptr + ss, mask=ss < S, other=0).to(tl.int32)
    hi = tl.load(off_ptr + ss + 1, mask=ss < S, other=0).to(tl.int32)
    tiles = (hi - lo + BM - 1) // BM
    tile_end = tl.cumsum(tiles, 0)
    total_m = tl.sum(tiles, 0)
    n_tiles = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(tl.program_id(0), total_m * n_tiles, NUM_PROGRAMS, flatten=True):
        s, row0, n0 = _tile_origin(tile, total_m, n_tiles, lo, tiles, tile_end, ss, BM, BN, GROUP_M)
        wg = s % G
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([row0, ki * BK])  # [BM, BK]
            if TRANS_W:
                b = w_desc.load([wg * N + n0, ki * BK]).T  # [BN, BK] -> [BK, BN]
            else:
                b = w_desc.load([wg * K + ki * BK, n0])  # [BK, BN]
            acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        rows = row0 + tl.arange(0, BM)
        cols = n0 + tl.arange(0, BN)
        s_hi = tl.sum(tl.where(ss == s, hi, 0), 0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + wg * sbg + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        out = rows[:, None].to(tl.int64) * sym + cols[None, :]
        mask = (rows[:, None] < s_hi) & (cols[None, :] < N)
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=mask)


def weight_layout(w) -> str | None:
    """'plain' (w [G, K, N] contiguous), 'transposed' (w = v.transpose(1, 2), v [G, N, K] contiguous)
    or None (any other strides: the pointer kernel handles those)."""
    G, K, N = w.shape
    if w.stride() == (K * N, N, 1):
        return "plain"
    if w.stride() == (K * N, 1, K):
        return "transposed"
    return None


def shapes_supported(x, w, offsets, out, bias=None) -> bool:
    """Everything but the device: dtypes, layouts, strides and alignment that the kernel needs."""
    import torch

    if x.dtype not in (torch.float16, torch.bfloat16) or w.dtype != x.dtype or out.dtype != x.dtype:
        return False
    T, K = x.shape
    layout = weight_layout(w)
    if layout is None or min(T, K, w.shape[0], w.shape[2]) == 0 or T >= 2**31:
        return False
    N = w.shape[2]
    row_ok = x.stride(1) == 1 and descriptor_aligned(x, x.stride(0)) and out.stride(1) == 1
    w_ok = descriptor_aligned(w, N) and K % BK_TMA == 0 if layout == "plain" else descriptor_aligned(w, K)
    bias_ok = bias is None or bias.stride(1) == 1
    return row_ok and w_ok and bias_ok and offsets.dtype == torch.int64 and offsets.is_contiguous()


def supported(x, w, offsets, out, bias=None) -> bool:
    """CUDA device of compute capability >= 9 (TMA, wgmma) and `shapes_supported`."""
    if not (x.is_cuda and capability(x.device) >= (9, 0)):
        return False
    return shapes_supported(x, w, offsets, out, bias)


def _descriptors(x, w, layout, bm: int = 16, bn: int = 16, bk: int = 16):
    """HostDescriptors over x [T, K] and the 2-D view of w with the tile's block shapes (the autotuner's
    pre-hook sets them on a first launch)."""
    G, K, N = w.shape
    x_desc = HostDescriptor(x, (x.shape[0], K), (x.stride(0), 1), (bm, bk))
    if layout == "plain":
        return x_desc, HostDescriptor(w, (G * K, N), (N, 1), (bk, bn))
    return x_desc, HostDescriptor(w, (G * N, K), (K, 1), (bn, bk))


def _programs(device) -> int:
    if interpreting():
        return _INTERP_PROGRAMS
    return device_properties(device).multi_processor_count


_CACHE = LaunchCache("grouped_gemm_fwd_tma")


def launch_fwd(x, w, offsets, bias, y):
    """y [T, N] (row-contiguous, may be a view) <- grouped x @ w (+ bias). The caller checked
    `supported` (or `shapes_supported` under the interpreter) and handled empty shapes."""
    T, K = x.shape
    G, _, N = w.shape
    S = offsets.numel() - 1
    layout = weight_layout(w)
    sms = _programs(x.device)
    b = bias if bias is not None else y  # dummy pointer when HAS_BIAS is false
    tail = (b, y, offsets, N, K, S, G, b.stride(0) if bias is not None else 0, y.stride(0))
    key = (specialization(T), N, K, S, G, layout, x.stride(0), tail[7:], bias is not None, x.dtype,
           aligned(x, w, b, y, offsets), x.device)
    entry = _CACHE.entry(key)
    if entry is None:
        flags = (layout == "transposed", bias is not None, ieee(x.dtype), upcast(x.dtype),
                 next_power_of_2(S + 1), sms)
        grid = lambda meta: (_programs_for(T, S, N, sms, meta["BM"], meta["BN"]),)  # noqa: E731
        descs = (tensor_descriptor(d) for d in _descriptors(x, w, layout))
        compiled = _grouped_fwd_tma_kernel[grid](*descs, *tail, TRANS_W=flags[0],
                                                 HAS_BIAS=flags[1], IEEE=flags[2], UPCAST=flags[3],
                                                 BLOCK_S=flags[4], NUM_PROGRAMS=sms)
        best = _grouped_fwd_tma_kernel.best_config
        tile = (best.kwargs["BM"], best.kwargs["BN"], best.kwargs["BK"], best.kwargs["GROUP_M"])
        _CACHE.store(key, compiled, grid(best.kwargs), (*flags, *tile), config_dict(best))
        return y
    replay, _, consts, _ = entry
    bm, bn, bk = consts[6:9]
    replay(*_descriptors(x, w, layout, bm, bn, bk), *tail, grid=(_programs_for(T, S, N, sms, bm, bn), 1, 1))
    return y


def _programs_for(T: int, S: int, N: int, sms: int, bm: int, bn: int) -> int:
    """One program per SM, fewer when there are fewer work items: cdiv(T, BM) + S row tiles bound them
    (one partial tile per segment)."""
    return min(sms, (cdiv(T, bm) + S) * cdiv(N, bn))
