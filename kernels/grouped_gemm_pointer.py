"""The grouped GEMM's pointer-based forward kernel (kernels/grouped_gemm.py has the math, the public
API and the custom ops; kernels/grouped_gemm_tma.py the Hopper kernel it prefers where it applies):
    y[r, :] = epilogue(x[r, :] @ w[s % G] (+ bias[s % G]))   for every row r of segment s
    x [T, K] (any strides), w [G, K, N] (any strides: the input gradient passes w^T), offsets int64
    [S + 1], bias [G, N] | None -> y [T, N] in x.dtype, fp32 accumulation; the epilogue
    (kernels._common.activation_epilogue) is the identity, or stores the pre-activation and applies
    the activation, or multiplies by the activation's derivative at a stored pre-activation.
The tile map over the segments is computed in the kernel from `offsets` (no host read of the group
sizes); the grid is an upper bound, cdiv(T, BM) + S row tiles times the N tiles. Launches replay the
first one's compiled kernel (kernels._common.launch.LaunchCache; the row count keyed by its specialization).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import (
    Epilogue,
    activation_epilogue,
    cdiv,
    dot_accumulate,
    ieee,
    interpreting,
    next_power_of_2,
    upcast,
)
from kernels._common.launch import LaunchCache, aligned, config_dict, specialization

# Interpreter runs (CPU tests) use one tiny tile so that they stay fast; GPU configs are the usual
# Hopper/Ampere tensor-core shapes (128-row tiles for the large expert batches, 64 for small groups).
if interpreting():
    _FWD_CONFIGS = [triton.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 2}, num_warps=1, num_stages=1)]
else:
    _FWD_CONFIGS = [
        triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
        triton.Config({"BM": 64, "BN": 128, "BK": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 8}, num_warps=4, num_stages=4),
    ]


@triton.autotune(configs=_FWD_CONFIGS, key=["N", "K", "G", "EPI", "ACT", "IEEE", "UPCAST"])
@triton.jit
def _grouped_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, pre_ptr, off_ptr,
    T, N, K, G, NW,
    sxm, sxk, swg, swk, swn, sbg, sym,
    HAS_BIAS: tl.constexpr, EPI: tl.constexpr, ACT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Tile map over the G segments (weight group of segment g: g % NW): segment g has cdiv(rows_g, BM)
    # row tiles; tile_end = inclusive cumsum over segments.
    gs = tl.arange(0, BLOCK_G)
    lo = tl.load(off_ptr + gs, mask=gs < G, other=0)
    hi = tl.load(off_ptr + gs + 1, mask=gs < G, other=0)
    tiles = (hi - lo + BM - 1) // BM
    tile_end = tl.cumsum(tiles, 0)
    total_m = tl.sum(tiles, 0)
    # Launch grid covers an upper bound of row tiles (cdiv(T, BM) + G); swizzle in GROUP_M bands
    # so that neighbouring programs share weight columns in L2.
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BN)
    band = GROUP_M * n_tiles
    first_m = (pid // band) * GROUP_M
    band_m = tl.minimum(tl.cdiv(T, BM) + G - first_m, GROUP_M)  # the last band may hold fewer row slots
    pid_m = first_m + (pid % band) % band_m
    pid_n = (pid % band) // band_m
    if pid_m >= total_m:
        return
    g = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
    g_lo = tl.sum(tl.where(gs == g, lo, 0), 0)
    g_hi = tl.sum(tl.where(gs == g, hi, 0), 0)
    g_first = tl.sum(tl.where(gs == g, tile_end - tiles, 0), 0)
    rows = g_lo + (pid_m - g_first) * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    row_ok = rows < g_hi
    x_tile = x_ptr + rows[:, None].to(tl.int64) * sxm + ks[None, :] * sxk
    wg = (g % NW).to(tl.int64)
    w_tile = w_ptr + wg * swg + ks[:, None] * swk + cols[None, :] * swn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + ks) < K
        a = tl.load(x_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_tile, mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
        acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        x_tile += BK * sxk
        w_tile += BK * swk
    if HAS_BIAS:
        bias = tl.load(b_ptr + wg * sbg + cols, mask=cols < N, other=0.0)
        acc += bias[None, :].to(tl.float32)
    out = rows[:, None].to(tl.int64) * sym + cols[None, :]  # y and pre share the row stride
    mask = row_ok[:, None] & (cols[None, :] < N)
    acc = activation_epilogue(acc, pre_ptr + out, mask, EPI, ACT, y_ptr.dtype.element_ty)
    tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=mask)


_FWD = LaunchCache("grouped_gemm_fwd")


def pointer_fwd(x, w, offsets, bias, y, epi: Epilogue):
    """y <- the grouped product with its epilogue (a kernels._common.Epilogue); the caller handled
    empty shapes and int64 contiguous offsets on x's device."""
    T, K = x.shape
    G, _, N = w.shape
    S = offsets.numel() - 1
    b = bias if bias is not None else y  # dummy pointer when HAS_BIAS is false
    pre = epi.pre if epi.pre is not None else y  # dummy pointer without an activation epilogue
    args = (x, w, b, y, pre, offsets, T, N, K, S, G, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
            w.stride(2), b.stride(0) if bias is not None else 0, y.stride(0))
    key = (specialization(T), N, K, S, G, args[11:], x.dtype, bias is not None, epi.codes,
           aligned(x, w, b, y, pre, offsets), x.device)
    entry = _FWD.entry(key)
    if entry is None:
        flags = (bias is not None, *epi.codes, ieee(x.dtype), upcast(x.dtype), next_power_of_2(S + 1))
        compiled = _grouped_fwd_kernel[lambda meta: (_fwd_programs(T, S, N, meta["BM"], meta["BN"]),)](
            *args, HAS_BIAS=flags[0], EPI=flags[1], ACT=flags[2], IEEE=flags[3], UPCAST=flags[4], BLOCK_G=flags[5])
        best = _grouped_fwd_kernel.best_config
        tile = (best.kwargs["BM"], best.kwargs["BN"], best.kwargs["BK"], best.kwargs["GROUP_M"])
        _FWD.store(key, compiled, (_fwd_programs(T, S, N, tile[0], tile[1]),), (*flags, *tile), config_dict(best))
    else:
        bm, bn = entry[2][6], entry[2][7]
        entry[0](*args, grid=(_fwd_programs(T, S, N, bm, bn), 1, 1))
    return y


def _fwd_programs(T: int, S: int, N: int, bm: int, bn: int) -> int:
    """Row tiles of every segment fit in cdiv(T, BM) + S (one partial tile per segment), times N tiles."""
    return (cdiv(T, bm) + S) * cdiv(N, bn)


def _fwd_programs(T: int, S: int, N: int, bm: int, bn: int) -> int:
    """Row tiles of every segment fit in cdiv(T, BM) + S (one partial tile per segment), times N tiles."""
    return (cdiv(T, bm) + S) * cdiv(N, bn)
