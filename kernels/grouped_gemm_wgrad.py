"""The grouped GEMM's weight gradient (kernels/grouped_gemm.py has the forward, the public API and
the custom ops): for G groups whose rows lie in S = R * G segments (segment s belongs to group s % G)

    dw[g] = sum over the segments s of g of x[rows of s]^T @ dy[rows of s]
    db[g] = sum over the same rows of dy                     (optional: the bias gradient, fused)
    x [T, K], dy [T, N], offsets int64 [S + 1]  ->  dw [G, K, N] in x.dtype, db [G, N] in dy.dtype,
    fp32 accumulation; groups without rows give zeros.
The bias gradient runs in the same launch, in programs of its own: G x N-tile programs before the
weight-gradient ones, each summing dy over its group's rows for one column tile (one more read of dy,
no second launch). First, because the GPU starts programs roughly in launch order: the memory-bound
sums then run beside the first compute-bound products instead of after the last ones, where they
lengthened the launch's tail. It used to be summed inside the weight-gradient programs from the dy
tile they had already loaded, but triton 3.6 builds that wrongly for sm_90: on an H200, 2 of the 4
pointer configs gave dw off by up to 13% of its largest value (BN 256 with several segments per group,
BR 32 with one), while every config was right without the sum. Keeping the sum out of the programs
that run the dot is what makes every config right.

One weight-gradient program per (group, K tile, N tile) walks its group's segments; the grid does not
depend on the row count, so a launch never reads the group sizes on the host and every launch of one
shape replays the first one's compiled kernel (kernels._common.launch.LaunchCache).

A TMA-fed variant (whole row chunks through tensor descriptors) was tried and timed at 0.97x this
kernel on an H200 at the MoE seed widths (results/grouped-h200-wgrad), so it was removed. Nor does
cuBLAS win inside the layer's step: with padded capacity at world size 1 (one segment of C rows per
group) the weight gradients as strided-batched bmm on [G, C, *] views plus torch's bias sums gave the
same dw bit for bit and a graphed seed-config step of 1.8955-1.9002 ms against this kernel's
1.8979-1.9038 (H200 probe, three rounds each), so the layer keeps one path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, dot_accumulate, ieee, interpreting, upcast
from kernels._common.launch import LaunchCache, aligned, config_dict

if interpreting():  # one tiny tile keeps CPU tests fast
    _WGRAD_CONFIGS = [triton.Config({"BK": 16, "BN": 16, "BR": 16}, num_warps=1, num_stages=1)]
else:
    _WGRAD_CONFIGS = [
        triton.Config({"BK": 128, "BN": 128, "BR": 64}, num_warps=8, num_stages=3),
        triton.Config({"BK": 128, "BN": 256, "BR": 64}, num_warps=8, num_stages=3),
        triton.Config({"BK": 128, "BN": 128, "BR": 32}, num_warps=4, num_stages=4),
        triton.Config({"BK": 64, "BN": 128, "BR": 64}, num_warps=4, num_stages=4),
    ]


@triton.jit
def _wgrad_program(pid, K, N, BK: tl.constexpr, BN: tl.constexpr):
    """Weight-gradient program pid's (group g, its K indices [BK], its N indices [BN])."""
    k_tiles = tl.cdiv(K, BK)
    n_tiles = tl.cdiv(N, BN)
    pid_k = (pid // n_tiles) % k_tiles
    pid_n = pid % n_tiles
    return pid // (k_tiles * n_tiles), pid_k * BK + tl.arange(0, BK), pid_n * BN + tl.arange(0, BN)


@triton.jit
def _masked_chunk(x_ptr, dy_ptr, r0, hi, ks, cols, K, N, sxm, sxk, sdm, sdn, BR: tl.constexpr):
    """Rows [r0, r0 + BR) as x^T [BK, BR] and dy [BR, BN], zero at and past hi (the segment's end)."""
    rows = r0 + tl.arange(0, BR)
    r_ok = rows < hi
    a = tl.load(x_ptr + rows[None, :].to(tl.int64) * sxm + ks[:, None] * sxk,
                mask=r_ok[None, :] & (ks[:, None] < K), other=0.0)
    b = tl.load(dy_ptr + rows[:, None].to(tl.int64) * sdm + cols[None, :] * sdn,
                mask=r_ok[:, None] & (cols[None, :] < N), other=0.0)
    return a, b


@triton.jit
def _store_wgrad(acc, dw_ptr, g, ks, cols, K, N, swg, swk):
    """dw[g]'s [BK, BN] tile <- acc."""
    dw = dw_ptr + g.to(tl.int64) * swg + ks[:, None] * swk + cols[None, :]
    tl.store(dw, acc.to(dw_ptr.dtype.element_ty), mask=(ks[:, None] < K) & (cols[None, :] < N))


@triton.jit
def _bias_program(pid, dy_ptr, db_ptr, off_ptr, N, G, R, sdm, sdn, BR: tl.constexpr, BN: tl.constexpr):
    """Bias-gradient program pid (numbered from 0): db[g, N tile] <- dy summed over group g's rows (fp32)."""
    n_tiles = tl.cdiv(N, BN)
    g = pid // n_tiles
    cols = (pid % n_tiles) * BN + tl.arange(0, BN)
    dacc = tl.zeros((BR, BN), dtype=tl.float32)
    for seg in range(R):
        lo = tl.load(off_ptr + seg * G + g)
        hi = tl.load(off_ptr + seg * G + g + 1)
        for r0 in range(lo, hi, BR):
            rows = r0 + tl.arange(0, BR)
            b = tl.load(dy_ptr + rows[:, None].to(tl.int64) * sdm + cols[None, :] * sdn,
                        mask=(rows[:, None] < hi) & (cols[None, :] < N), other=0.0)
            dacc += b.to(tl.float32)
    tl.store(db_ptr + g.to(tl.int64) * N + cols, tl.sum(dacc, 0).to(db_ptr.dtype.element_ty), mask=cols < N)


@triton.autotune(configs=_WGRAD_CONFIGS, key=["N", "K", "G", "HAS_DB", "IEEE", "UPCAST"])
@triton.jit
def _grouped_wgrad_kernel(
    x_ptr, dy_ptr, dw_ptr, db_ptr, off_ptr,
    N, K, G, R,
    sxm, sxk, sdm, sdn, swg, swk,
    HAS_DB: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
):
    # Programs [0, n_bias) (HAS_DB): db[g, N tile]; then dw[g, K tile, N tile] = sum over the group's rows.
    pid = tl.program_id(0)
    n_bias = G * tl.cdiv(N, BN) if HAS_DB else 0
    if pid < n_bias:
        _bias_program(pid, dy_ptr, db_ptr, off_ptr, N, G, R, sdm, sdn, BR, BN)
    else:
        g, ks, cols = _wgrad_program(pid - n_bias, K, N, BK, BN)
        acc = tl.zeros((BK, BN), dtype=tl.float32)
        for seg in range(R):  # the R segments of group g: g, g + G, g + 2G, ...
            lo = tl.load(off_ptr + seg * G + g)
            hi = tl.load(off_ptr + seg * G + g + 1)
            for r0 in range(lo, hi, BR):
                a, b = _masked_chunk(x_ptr, dy_ptr, r0, hi, ks, cols, K, N, sxm, sxk, sdm, sdn, BR)
                acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        _store_wgrad(acc, dw_ptr, g, ks, cols, K, N, swg, swk)


_WGRAD = LaunchCache("grouped_gemm_wgrad")


def launch_wgrad(x, dy, offsets, G, with_bias: bool = False):
    """dw [G, K, N] of x [T, K] and dy [T, N] over the segments of offsets, and with_bias also db [G, N]
    (then returns (dw, db)). Triton; the caller checked that it runs here."""
    K, N = x.shape[1], dy.shape[1]
    dw = torch.empty((G, K, N), dtype=x.dtype, device=x.device)
    db = torch.empty((G, N) if with_bias else 0, dtype=dy.dtype, device=x.device)
    if G == 0 or N == 0 or (K == 0 and not with_bias):
        return (dw, db) if with_bias else dw
    if K == 0:  # no weight tiles whose programs would sum dy
        return dw, grouped_bias_reference(dy, offsets, G)
    if offsets.dtype != torch.int64 or offsets.device != x.device or not offsets.is_contiguous():
        offsets = offsets.to(device=x.device, dtype=torch.int64).contiguous()
    args = (x, dy, dw, db if with_bias else dw, offsets, N, K, G, (offsets.numel() - 1) // G,
            x.stride(0), x.stride(1), dy.stride(0), dy.stride(1), dw.stride(0), dw.stride(1))
    # the grid (G x K tiles x N tiles) does not depend on the row count: one key per shape
    key = (args[5:], with_bias, x.dtype, dy.dtype, aligned(x, dy, dw, db, offsets), x.device)

    def first():
        flags = (with_bias, ieee(x.dtype), upcast(x.dtype))
        grid = _grid(G, K, N, with_bias)
        compiled = _grouped_wgrad_kernel[grid](*args, HAS_DB=flags[0], IEEE=flags[1], UPCAST=flags[2])
        best = _grouped_wgrad_kernel.best_config
        tile = (best.kwargs["BK"], best.kwargs["BN"], best.kwargs["BR"])
        return compiled, grid(best.kwargs), (*flags, *tile), config_dict(best)

    _WGRAD.launch(key, args, first)
    return (dw, db) if with_bias else dw


def _grid(G: int, K: int, N: int, with_bias: bool):
    """The launch grid of a config: (with_bias) G x N tiles bias-gradient programs, then G x K tiles x
    N tiles weight-gradient ones."""
    return lambda meta: (G * cdiv(N, meta["BN"]) * (cdiv(K, meta["BK"]) + int(with_bias)),)


def grouped_bias_reference(dy, offsets, num_groups: int):
    """Plain torch: db[g] = sum of dy over the rows of group g, fp32 sums, in dy.dtype."""
    counts = (offsets[1:] - offsets[:-1]).to(device=dy.device, dtype=torch.int64)
    segment = torch.repeat_interleave(torch.arange(counts.numel(), device=dy.device), counts, output_size=dy.shape[0])
    out = torch.zeros((num_groups, dy.shape[1]), dtype=torch.float32, device=dy.device)
    out.index_add_(0, segment % max(num_groups, 1), dy.float())
    return out.to(dy.dtype)


def grouped_wgrad_reference(x, dy, offsets, num_groups: int):
    """Plain torch: dw[g] = x_g^T @ dy_g in fp32, returned in x.dtype."""
    bounds = [int(v) for v in offsets.tolist()]
    dw = torch.zeros((num_groups, x.shape[1], dy.shape[1]), dtype=torch.float32, device=x.device)
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        if hi > lo:
            dw[s % num_groups] += x[lo:hi].float().t() @ dy[lo:hi].float()
    return dw.to(x.dtype)
