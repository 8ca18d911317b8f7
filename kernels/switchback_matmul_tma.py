"""Persistent, TMA-fed variant of the SwitchBack 8-bit matmul (Hopper and newer).

Same math and contract as kernels/switchback_matmul.py:
  int8  C [M, N] = (A_q [M, K] . B_q [N, K]^T) * s_a[:, None] * s_b / 127^2  (+ bias [N]), int32 accumulation
  fp8   C [M, N] = (A_q [M, K] . B_q [N, K]^T) * s_a[:, None] * s_b  (+ bias [N]), fp32 accumulation
One program per SM walks output tiles in grouped order; operand tiles arrive through tensor
descriptors (the bulk tensor copy engine on Hopper; out-of-range rows and the K tail read as zero,
so the loop needs no masks) and the epilogue is stored through a descriptor too (clipped at the
edges). Needs 16-byte aligned rows: K % 16 == 0 and N % 8 == 0 (fp16/bf16 output); the launcher in
switchback_matmul.py falls back to the pointer kernel otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._common import capability, cdiv, dequantize_tile, device_properties, quantized_dot, quantized_zeros
from kernels._common.launch import HostDescriptor, LaunchCache, aligned, best_tile, tensor_descriptor


@triton.jit
def _quantized_matmul_tma_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, PER_COLUMN: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, FP8: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_group = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        group_size = min(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_size) * BLOCK_M
        off_n = ((tile % per_group) // group_size) * BLOCK_N
        acc = quantized_zeros(BLOCK_M, BLOCK_N, FP8)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = quantized_dot(a, b.T, acc, FP8)
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        c = dequantize_tile(acc, rm, rn, M, N, sa_ptr, sb_ptr, bias_ptr, PER_COLUMN, HAS_BIAS, FP8)
        c_desc.store([off_m, off_n], c.to(c_desc.dtype))


# by format (fp8?): the picks of the int8 and the fp8 kernel are recorded under their own names
_CACHES = {False: LaunchCache("switchback_int8_matmul_tma"), True: LaunchCache("switchback_fp8_matmul_tma")}


def supported(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Hopper or newer CUDA device, and rows aligned to 16 bytes for the descriptors."""
    if not a.is_cuda:
        return False
    K, N = a.shape[1], b.shape[0]
    return capability(a.device) >= (9, 0) and K % 16 == 0 and (N * out_dtype.itemsize) % 16 == 0


def _descriptors(a, b, c, bm, bn, bk):
    """HostDescriptors of A [M, K], B [N, K] and C [M, N] with the tile's blocks."""
    return (HostDescriptor(a, a.shape, (a.stride(0), 1), (bm, bk)),
            HostDescriptor(b, b.shape, (b.stride(0), 1), (bn, bk)),
            HostDescriptor(c, c.shape, (c.stride(0), 1), (bm, bn)))


def launch(a, sa, b, sb, bias, out_dtype, per_column, config=None):
    """C [M, N] in out_dtype from int8 or fp8 operands (a.dtype says which). config = (BLOCK_M, BLOCK_N,
    BLOCK_K, num_stages, num_warps), or None to autotune once per shape; later launches of a shape replay
    the compiled kernel."""
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    tail = (sa, sb, bias if bias is not None else sa, M, N, K)
    fp8 = a.dtype != torch.int8
    key = (M, N, K, a.dtype, b.dtype, out_dtype, per_column, bias is not None, config,
           aligned(a, b, c, sa, sb, bias), a.device)
    cache = _CACHES[fp8]
    entry = cache.entry(key)
    if entry is None:
        cache.store(key, *_first_launch(a, b, c, tail, per_column, bias is not None, fp8, config))
        return c
    replay, _, consts, _ = entry
    replay(*_descriptors(a, b, c, *consts[:3]), *tail)
    return c


def _first_launch(a, b, c, tail, per_column, has_bias, fp8, config):
    """Launch through Triton (autotuning when config is None); (compiled, grid, constexprs, config)."""
    M, N = tail[3], tail[4]
    sms = device_properties(a.device).multi_processor_count
    flags = {"NUM_PROGRAMS": sms, "PER_COLUMN": per_column, "HAS_BIAS": has_bias, "FP8": fp8}
    if config is None:
        # 16-byte dummy block shapes, replaced by _set_block_shapes before each launch
        descs = (TensorDescriptor.from_tensor(a, [1, 16]), TensorDescriptor.from_tensor(b, [1, 16]),
                 TensorDescriptor.from_tensor(c, [1, 8]))
        grid = lambda meta: (min(sms, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)
        compiled = _autotuned[grid](*descs, *tail, **flags)
        bm, bn, bk, group, stages, warps = best_tile(_autotuned)
    else:
        bm, bn, bk, stages, warps = config
        group = 8
        grid = (min(sms, cdiv(M, bm) * cdiv(N, bn)),)
        descs = (tensor_descriptor(d) for d in _descriptors(a, b, c, bm, bn, bk))
        compiled = _quantized_matmul_tma_kernel[grid](*descs, *tail, BLOCK_M=bm, BLOCK_N=bn,
                                                      BLOCK_K=bk, GROUP_M=group, **flags, num_stages=stages,
                                                      num_warps=warps)
    consts = (bm, bn, bk, group, sms, per_column, has_bias, fp8)
    grid = (min(sms, cdiv(M, bm) * cdiv(N, bn)),)
    pick = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_stages": stages, "num_warps": warps}
    return compiled, grid, consts, pick


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps); shared memory = stages * (BM + BN) * BK + BM * BN * 2
CONFIGS = [(128, 256, 128, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 4, 8), (128, 128, 128, 4, 8),
           (64, 128, 128, 4, 4)]


def _set_block_shapes(nargs):
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn]


def _prune(configs, named_args, **kwargs):
    """M, N >= 1024: the first config alone (128x256x128, 3 stages, 8 warps was the fastest of all on
    an H200 at every large shape probed, and the autotuner's own timing picked worse ones through
    noise); smaller shapes tune among the tiles that M and N fill."""
    M, N = named_args["M"], named_args["N"]
    if M >= 1024 and N >= 1024:
        return configs[:1]
    kept = [c for c in configs if (c.kwargs["BLOCK_M"] <= 64 or M >= 256) and (c.kwargs["BLOCK_N"] <= 128
                                                                                  or N >= 256)]
    return kept or [c for c in configs if c.kwargs["BLOCK_M"] == 64]


_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w,
                           pre_hook=_set_block_shapes) for bm, bn, bk, s, w in CONFIGS],
    key=["M", "N", "K", "FP8"], prune_configs_by={"early_config_prune": _prune},
)(_quantized_matmul_tma_kernel)
