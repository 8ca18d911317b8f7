"""The grouped GEMM's weight gradient (kernels/grouped_gemm.py has the forward, the public API and
the custom ops): for G groups whose rows lie in S = R * G segments (segment s belongs to group s % G)

    dw[g] = sum over the segments s of g of x[rows of s]^T @ dy[rows of s]
    db[g] = sum over the same rows of dy                     (optional: the bias gradient, fused)
    x [T, K], dy [T, N], offsets int64 [S + 1]  ->  dw [G, K, N] in x.dtype, db [G, N] in dy.dtype,
    fp32 accumulation; groups without rows give zeros.
The bias gradient runs in the same launch, in programs of its own: G x N-tile programs after the
weight-gradient ones, each summing dy over its group's rows for one column tile (one more read of dy,
overlapped with the compute-bound products; no second launch). It used to be summed inside the
weight-gradient programs from the dy tile they had already loaded, but triton 3.6 builds that wrongly
for sm_90: on an H200, 2 of the 4 pointer configs gave dw off by up to 13% of its largest value
(BN 256 with several segments per group, BR 32 with one), while every config was right without the
sum. Keeping the sum out of the programs that run the dot is what makes every config right.

One weight-gradient program per (group, K tile, N tile) walks its group's segments; the grid does not
depend on the row count, so a launch never reads the group sizes on the host and every launch of one shape replays
the first one's compiled kernel (kernels._common.LaunchCache).

Two kernels of that design (launch_wgrad's `impl`): "pointer" loads every [BR, *] row chunk with
masked pointer loads; "tma" (Hopper) takes a segment's whole chunks through tensor descriptors and only
its last, partial chunk through masked loads, since a descriptor cannot stop at a segment's end.
Pointer is the default: on an H200 at the MoE seed widths the TMA kernel took 0.97x its speed in both
weight-gradient products (`qbench moe --kernels grouped`, cases g and h; results/grouped-h200-wgrad).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    LaunchCache,
    aligned,
    capability,
    cdiv,
    config_dict,
    descriptor_aligned,
    dot_accumulate,
    ieee,
    interpreting,
    upcast,
)

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
    """Weight-gradient program pid's (group g, K tile, N tile, its K indices [BK], its N indices [BN])."""
    k_tiles = tl.cdiv(K, BK)
    n_tiles = tl.cdiv(N, BN)
    pid_k = (pid // n_tiles) % k_tiles
    pid_n = pid % n_tiles
    return pid // (k_tiles * n_tiles), pid_k, pid_n, pid_k * BK + tl.arange(0, BK), pid_n * BN + tl.arange(0, BN)


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
    # Programs [0, n_wgrad): dw[g, K tile, N tile] = sum over the group's rows; then (HAS_DB) the bias ones.
    pid = tl.program_id(0)
    n_wgrad = G * tl.cdiv(K, BK) * tl.cdiv(N, BN)
    if pid >= n_wgrad:
        if HAS_DB:
            _bias_program(pid - n_wgrad, dy_ptr, db_ptr, off_ptr, N, G, R, sdm, sdn, BR, BN)
    else:
        g, _, _, ks, cols = _wgrad_program(pid, K, N, BK, BN)
        acc = tl.zeros((BK, BN), dtype=tl.float32)
        for seg in range(R):  # the R segments of group g: g, g + G, g + 2G, ...
            lo = tl.load(off_ptr + seg * G + g)
            hi = tl.load(off_ptr + seg * G + g + 1)
            for r0 in range(lo, hi, BR):
                a, b = _masked_chunk(x_ptr, dy_ptr, r0, hi, ks, cols, K, N, sxm, sxk, sdm, sdn, BR)
                acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        _store_wgrad(acc, dw_ptr, g, ks, cols, K, N, swg, swk)


def _set_wgrad_blocks(nargs):
    """Autotune pre-hook: the descriptors' block shapes follow the config's tile."""
    nargs["x_desc"].block_shape = [nargs["BR"], nargs["BK"]]
    nargs["dy_desc"].block_shape = [nargs["BR"], nargs["BN"]]


# Shared memory = stages * BR * (BK + BN) * 2 bytes (+ the epilogue's layout conversion).
if interpreting():
    _WGRAD_TMA_CONFIGS = [triton.Config({"BK": 16, "BN": 16, "BR": 16}, num_warps=1, num_stages=1,
                                        pre_hook=_set_wgrad_blocks)]
else:
    _WGRAD_TMA_CONFIGS = [triton.Config({"BK": bk, "BN": bn, "BR": br}, num_warps=8, num_stages=stages,
                                        pre_hook=_set_wgrad_blocks)
                          for bk, bn, br, stages in ((128, 256, 64, 3), (128, 128, 64, 4), (256, 128, 64, 3),
                                                     (128, 128, 128, 3))]


@triton.autotune(configs=_WGRAD_TMA_CONFIGS, key=["N", "K", "G", "HAS_DB", "IEEE", "UPCAST"])
@triton.jit
def _grouped_wgrad_tma_kernel(
    x_desc, dy_desc, x_ptr, dy_ptr, dw_ptr, db_ptr, off_ptr,
    N, K, G, R,
    sxm, sdm, swg, swk,
    HAS_DB: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
):
    # The pointer kernel's math and programs; a segment's whole BR-row chunks arrive through tensor
    # descriptors (the bulk copy engine, no masks: a chunk never passes the segment's end), its last
    # partial chunk through masked pointer loads (the rows after it belong to the next segment).
    pid = tl.program_id(0)
    n_wgrad = G * tl.cdiv(K, BK) * tl.cdiv(N, BN)
    if pid >= n_wgrad:
        if HAS_DB:
            _bias_program(pid - n_wgrad, dy_ptr, db_ptr, off_ptr, N, G, R, sdm, 1, BR, BN)
    else:
        g, pid_k, pid_n, ks, cols = _wgrad_program(pid, K, N, BK, BN)
        acc = tl.zeros((BK, BN), dtype=tl.float32)
        for seg in range(R):  # the R segments of group g: g, g + G, g + 2G, ...
            # int32 row numbers (T < 2**31, checked on the host): descriptor coordinates are 32-bit
            lo = tl.load(off_ptr + seg * G + g).to(tl.int32)
            hi = tl.load(off_ptr + seg * G + g + 1).to(tl.int32)
            whole = lo + (hi - lo) // BR * BR
            for r0 in range(lo, whole, BR):
                a = x_desc.load([r0, pid_k * BK])  # [BR, BK]
                b = dy_desc.load([r0, pid_n * BN])  # [BR, BN]
                acc = dot_accumulate(a.T, b, acc, IEEE, UPCAST)
            if whole < hi:
                a, b = _masked_chunk(x_ptr, dy_ptr, whole, hi, ks, cols, K, N, sxm, 1, sdm, 1, BR)
                acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        _store_wgrad(acc, dw_ptr, g, ks, cols, K, N, swg, swk)


_WGRAD = LaunchCache("grouped_gemm_wgrad")
_WGRAD_TMA = LaunchCache("grouped_gemm_wgrad_tma")
WGRAD_IMPLS = ("pointer", "tma")


def launch_wgrad(x, dy, offsets, G, with_bias: bool = False, impl: str = "pointer"):
    """dw [G, K, N] of x [T, K] and dy [T, N] over the segments of offsets, and with_bias also db [G, N]
    (then returns (dw, db)). Triton; the caller checked that it runs here. impl: "pointer" (masked
    pointer loads) or "tma" (tensor descriptors for whole row chunks; Hopper, fp16/bf16, 16-byte
    aligned rows: `tma_supported`)."""
    if impl not in WGRAD_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(WGRAD_IMPLS)}, got {impl!r}")
    K, N = x.shape[1], dy.shape[1]
    dw = torch.empty((G, K, N), dtype=x.dtype, device=x.device)
    db = torch.empty((G, N) if with_bias else 0, dtype=dy.dtype, device=x.device)
    if G == 0 or N == 0 or (K == 0 and not with_bias):
        return (dw, db) if with_bias else dw
    if K == 0:  # no weight tiles whose programs would sum dy
        return dw, grouped_bias_reference(dy, offsets, G)
    if offsets.dtype != torch.int64 or offsets.device != x.device or not offsets.is_contiguous():
        offsets = offsets.to(device=x.device, dtype=torch.int64).contiguous()
    if impl == "tma":
        if not tma_supported(x, dy):
            raise ValueError("impl='tma': the TMA weight gradient needs a Hopper GPU (or the interpreter), "
                             f"fp16/bf16 and 16-byte aligned rows; got x {tuple(x.shape)} {x.dtype}, "
                             f"dy {tuple(dy.shape)} {dy.dtype}")
        _launch_tma(x, dy, dw, db if with_bias else dw, offsets, G, with_bias)
        return (dw, db) if with_bias else dw
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
    """The launch grid of a config: G x K tiles x N tiles weight-gradient programs, then (with_bias)
    G x N tiles bias-gradient ones."""
    return lambda meta: (G * cdiv(N, meta["BN"]) * (cdiv(K, meta["BK"]) + int(with_bias)),)


def tma_supported(x, dy) -> bool:
    """fp16/bf16, unit column strides, 16-byte aligned bases and row strides, T < 2**31, on a GPU of
    compute capability >= 9 (or under the interpreter)."""
    if x.dtype not in (torch.float16, torch.bfloat16) or dy.dtype != x.dtype or x.shape[0] >= 2**31:
        return False
    if not all(t.stride(1) == 1 and descriptor_aligned(t, t.stride(0)) for t in (x, dy)):
        return False
    return interpreting() or (x.is_cuda and capability(x.device) >= (9, 0))


def _tma_descriptors(x, dy, br: int = 16, bk: int = 16, bn: int = 16):
    """Host descriptors over x [T, K] ([BR, BK] tiles) and dy [T, N] ([BR, BN] tiles)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    T = x.shape[0]
    return (TensorDescriptor(x, [T, x.shape[1]], [x.stride(0), 1], [br, bk]),
            TensorDescriptor(dy, [T, dy.shape[1]], [dy.stride(0), 1], [br, bn]))


def _launch_tma(x, dy, dw, db, offsets, G: int, with_bias: bool) -> None:
    K, N = x.shape[1], dy.shape[1]
    tail = (x, dy, dw, db, offsets, N, K, G, (offsets.numel() - 1) // G, x.stride(0), dy.stride(0),
            dw.stride(0), dw.stride(1))
    # the descriptors carry the row count, so one key (and compiled kernel) serves every T
    key = (tail[5:], with_bias, x.dtype, aligned(x, dy, dw, db, offsets), x.device)
    entry = _WGRAD_TMA.entry(key)
    if entry is None:
        flags = (with_bias, ieee(x.dtype), upcast(x.dtype))
        grid = _grid(G, K, N, with_bias)
        compiled = _grouped_wgrad_tma_kernel[grid](*_tma_descriptors(x, dy), *tail, HAS_DB=flags[0],
                                                   IEEE=flags[1], UPCAST=flags[2])
        best = _grouped_wgrad_tma_kernel.best_config
        tile = (best.kwargs["BK"], best.kwargs["BN"], best.kwargs["BR"])
        _WGRAD_TMA.store(key, compiled, grid(best.kwargs), (*flags, *tile), config_dict(best))
        return
    replay, _, consts, _ = entry
    bk, bn, br = consts[3:6]
    replay(*_tma_descriptors(x, dy, br, bk, bn), *tail)


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
