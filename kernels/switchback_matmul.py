"""SwitchBack 8-bit matmuls (int8, and fp8 for the fp8 peers) with a fused dequantizing epilogue.

  int8  C [M, N] = (A_q [M, K] . B_q [N, K]^T) * s_a[:, None] * s_b / 127^2  (+ bias [N])
  fp8   C [M, N] = (A_q [M, K] . B_q [N, K]^T) * s_a[:, None] * s_b  (+ bias [N])
A_q and B_q have K contiguous (both operands K-major, the layout the 8-bit tensor-core instructions of
Ampere and Hopper read). int8: the product accumulates in int32 (|acc| <= K * 127^2, safe for
K < 133,000), the scales are absmax values. fp8 (e4m3 or e5m2, either pairing, e.g. an e5m2 gradient
times an e4m3 weight): the product accumulates in fp32, the scales are multipliers (absmax / QMAX, the
quantizers' fp8 output). s_a [M] fp32 are the rowwise scales of A; s_b is either one global scale
([1] fp32, `int8_matmul_rowwise_global`) or one scale per output column ([N] fp32,
`int8_matmul_rowwise_columnwise`, `fp8_matmul_rowwise_columnwise`). C is written in the activation
dtype (fp16 or bf16). The same kernels serve both formats, so the fp8 peer gets the int8 path's tiles,
persistence and epilogue: an int8-vs-fp8 comparison measures the formats, not two implementations.
Forward:     Y  = X W^T: A = Xq [M, K_in],  B = Wq [N_out, K_in]
Grad-input:  dX = G W:   A = Gq [M, N_out], B = Wq^T [K_in, N_out] (the transposed quantizers' output)

Autotuning keeps to a few configurations that suit Hopper (128x256x128 tiles, 3 stages, 8 warps:
wgmma on large tiles) and Ampere (128x128x128, 4 stages); an early prune drops configurations that
do not fit the device's shared memory or that waste most of a tile on a small M, so one shape tunes
in about a second.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import switchback_matmul_tma as tma
from kernels._common import (
    cdiv,
    dequantize_tile,
    interpreting,
    is_compiling,
    quantized_dot,
    quantized_zeros,
    register_op,
    use_triton,
)
from kernels._common.launch import LaunchCache, aligned, best_tile

QMAX_SQUARED = 127.0 * 127.0

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
_CONFIGS = [
    (128, 256, 128, 3, 8),
    (256, 128, 128, 3, 8),
    (128, 256, 64, 4, 8),
    (128, 128, 128, 4, 8),
    (64, 128, 128, 4, 4),
]
# The interpreter runs one small tile: autotuning there would only multiply the (slow) runs.
_INTERPRETER_CONFIG = (32, 32, 32, 1, 4)


def _smem_bytes(bm: int, bn: int, bk: int, stages: int) -> int:
    return stages * (bm + bn) * bk  # int8 operands, one byte each


def _prune(configs, named_args, **kwargs):
    """Drop configs that exceed shared memory, and big tiles when M or N is small (idle tiles)."""
    device = torch.cuda.current_device()
    limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    M, N = named_args["M"], named_args["N"]
    kept = []
    for c in configs:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        fits = _smem_bytes(bm, bn, bk, c.num_stages) + 8192 <= limit  # 8 KB: epilogue/layout scratch
        if fits and (bm <= 64 or M >= 1024) and (bn <= 128 or N >= 1024):
            kept.append(c)
    return kept or [c for c in configs if c.kwargs["BLOCK_M"] == 64]


def _triton_configs() -> list:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w)
        for bm, bn, bk, s, w in _CONFIGS
    ]


@triton.jit
def _quantized_matmul_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_am, stride_bn,
                             stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, PER_COLUMN: tl.constexpr, HAS_BIAS: tl.constexpr,
                             EVEN_K: tl.constexpr, FP8: tl.constexpr):
    # grouped ordering: GROUP_M row-tiles share each column tile while it sits in L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # wrap out-of-range rows onto valid ones so operand loads need no M/N mask (the store masks)
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M).to(tl.int64)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rbn[:, None] * stride_bn + rk[None, :]
    acc = quantized_zeros(BLOCK_M, BLOCK_N, FP8)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            if FP8:  # the interpreter casts no integer to fp8
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0)
                b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0)
        acc = quantized_dot(a, tl.trans(b), acc, FP8)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c = dequantize_tile(acc, rm, rn, M, N, sa_ptr, sb_ptr, bias_ptr, PER_COLUMN, HAS_BIAS, FP8)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=mask)


_kernel_even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})(
    _quantized_matmul_kernel
)
_autotuned = triton.autotune(
    configs=_triton_configs(), key=["M", "N", "K", "FP8"], prune_configs_by={"early_config_prune": _prune}
)(_kernel_even_k)


# by format (fp8?): the picks of the int8 and the fp8 kernel are recorded under their own names
_POINTERS = {False: LaunchCache("switchback_int8_matmul"), True: LaunchCache("switchback_fp8_matmul")}


def _launch(a, sa, b, sb, bias, out_dtype, per_column, config=None, impl="auto"):
    """impl: "tma" (persistent, descriptor-fed; Hopper+), "pointer", or "auto" (tma where supported).
    config = (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), or None to autotune once per shape."""
    if impl != "pointer" and not interpreting() and (impl == "tma" or tma.supported(a, b, out_dtype)):
        return tma.launch(a, sa, b, sb, bias, out_dtype, per_column, config)
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    args = (a, b, c, sa, sb, bias if bias is not None else sa, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    if config is None and interpreting():
        config = _INTERPRETER_CONFIG
    fp8 = a.dtype != torch.int8
    key = (M, N, K, a.stride(0), b.stride(0), a.dtype, b.dtype, out_dtype, per_column, bias is not None, config,
           aligned(a, b, c, sa, sb, bias), a.device)
    _POINTERS[fp8].launch(key, args, lambda: _first_launch(args, per_column, bias is not None, fp8, config))
    return c


def _first_launch(args, per_column, has_bias, fp8, config):
    """Launch through Triton (autotuning when config is None); (compiled, grid, constexprs, config)."""
    M, N, K = args[6:9]
    flags = {"PER_COLUMN": per_column, "HAS_BIAS": has_bias, "FP8": fp8}
    if config is None:
        grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)
        compiled = _autotuned[grid](*args, **flags)
        bm, bn, bk, group, stages, warps = best_tile(_autotuned)
    else:
        bm, bn, bk, stages, warps = config
        group = 8
        compiled = _kernel_even_k[(cdiv(M, bm) * cdiv(N, bn),)](
            *args, **flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_stages=stages, num_warps=warps)
    consts = (bm, bn, bk, group, per_column, has_bias, K % bk == 0, fp8)
    pick = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_stages": stages, "num_warps": warps}
    return compiled, (cdiv(M, bm) * cdiv(N, bn),), consts, pick


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _check(a, sa, b, sb, bias, per_column):
    """Both operands int8, or both fp8 (e4m3 or e5m2 each), 2-D with one K, and scales and bias that fit."""
    if not ((a.dtype == b.dtype == torch.int8) or (a.dtype in FP8_DTYPES and b.dtype in FP8_DTYPES)):
        raise ValueError(f"int8 operands or fp8 operands expected, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"shapes {tuple(a.shape)} and {tuple(b.shape)} do not share K (A [M, K], B [N, K])")
    if sa.numel() != a.shape[0] or sb.numel() != (b.shape[0] if per_column else 1):
        raise ValueError(f"scale lengths {sa.numel()}, {sb.numel()} do not match A {tuple(a.shape)}, "
                         f"B {tuple(b.shape)}")
    if bias is not None and bias.numel() != b.shape[0]:
        raise ValueError(f"bias has {bias.numel()} entries, expected N = {b.shape[0]}")
    return _dense(a), _fp32(sa), _dense(b), _fp32(sb)


def _dense(t):
    return t if t.is_contiguous() else t.contiguous()


def _fp32(t):
    """Scales as contiguous fp32 (checked first: each conversion call costs host time per launch)."""
    return t if t.dtype == torch.float32 and t.is_contiguous() else t.float().contiguous()


def _matmul(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None,
            out_dtype: torch.dtype, per_column: bool, impl: str) -> torch.Tensor:
    return _matmul_with(a, sa, b, sb, bias, out_dtype, per_column, None, impl)


def _matmul_with(a, sa, b, sb, bias, out_dtype, per_column, config, impl):
    a, sa, b, sb = _check(a, sa, b, sb, bias, per_column)
    if not use_triton(a, b, sa, sb):
        return quantized_matmul_reference(a, sa, b, sb, bias, out_dtype)
    return _launch(a, sa, b, sb, bias, out_dtype, per_column=per_column, config=config, impl=impl)


_OP = register_op("sb_quantized_matmul", _matmul,
                  lambda a, sa, b, sb, bias, out_dtype, per_column, impl: a.new_empty((a.shape[0], b.shape[0]),
                                                                                       dtype=out_dtype))


def _dispatch(a, sa, b, sb, bias, out_dtype, per_column, config, impl):
    """The custom op while torch.compile traces (one opaque node), a direct launch otherwise."""
    if is_compiling():
        if config is not None:
            raise ValueError("an explicit kernel config is an eager-mode (benchmark) option")
        return _OP(a, sa, b, sb, bias, out_dtype, per_column, impl)
    return _matmul_with(a, sa, b, sb, bias, out_dtype, per_column, config, impl)


def _operands(a, b, fp8: bool) -> None:
    """ValueError unless both operands are of the format the function takes (int8, or fp8 of either kind)."""
    ok = a.dtype in FP8_DTYPES and b.dtype in FP8_DTYPES if fp8 else a.dtype == b.dtype == torch.int8
    if not ok:
        raise ValueError(f"{'fp8' if fp8 else 'int8'} operands expected, got {a.dtype} and {b.dtype}")


def int8_matmul_rowwise_global(a, sa, b, sb, bias=None, out_dtype=torch.float16, config=None, impl="auto"):
    """A_q [M, K] (row scales s_a [M]) x B_q [N, K]^T (one scale s_b [1]) -> [M, N] in out_dtype."""
    _operands(a, b, fp8=False)
    return _dispatch(a, sa, b, sb, bias, out_dtype, False, config, impl)


def int8_matmul_rowwise_columnwise(a, sa, b, sb, bias=None, out_dtype=torch.float16, config=None,
                                   impl="auto"):
    """A_q [M, K] (row scales s_a [M]) x B_q [N, K]^T (row scales of B, s_b [N]) -> [M, N]."""
    _operands(a, b, fp8=False)
    return _dispatch(a, sa, b, sb, bias, out_dtype, True, config, impl)


def fp8_matmul_rowwise_columnwise(a, sa, b, sb, bias=None, out_dtype=torch.float16, config=None, impl="auto"):
    """A_q [M, K] fp8 (multipliers s_a [M]) x B_q [N, K]^T fp8 (multipliers s_b [N], one per row of B)
    -> [M, N] in out_dtype (+ bias [N]): the fp8 peers' products, on the int8 kernels (see the top)."""
    _operands(a, b, fp8=True)
    return _dispatch(a, sa, b, sb, bias, out_dtype, True, config, impl)


def quantized_matmul_reference(a, sa, b, sb, bias=None, out_dtype=torch.float16):
    """Plain torch: the product computed in fp32 (exact for int8 while |acc| < 2**24, and for the products
    of fp8 values; beyond, fp32 rounding is far below the output dtype's), then the same epilogue as the
    kernel (int8 scales divided by 127^2, fp8 scales as multipliers)."""
    acc = a.float() @ b.float().t()
    sb = sb.float().reshape(1, -1)
    unit = 1.0 / QMAX_SQUARED if a.dtype == torch.int8 else 1.0
    c = acc * (sa.float()[:, None] * unit) * sb
    if bias is not None:
        c = c + bias.float()[None, :]
    return c.to(out_dtype)


def quantization_error_bound(a, b, sa, sb):
    """Elementwise worst-case |C_q - A B^T| of the int8 product, from the quantization step alone.

    a [M, K], b [N, K] are the 16-bit operands; sa [M] and sb ([1] or [N]) their absmax scales. Each
    int8 operand is off by at most half a step, h = 0.5 * s / 127, so with A_q = A + dA, B_q = B + dB:
      |dC_ij| <= h_a[i] * sum_k |B_jk| + h_b[j] * sum_k |A_ik| + K * h_a[i] * h_b[j].
    Rounding of the output to 16 bits comes on top (the caller adds it). Returns [M, N] fp32.
    """
    K = a.shape[1]
    ha = 0.5 * sa.float().reshape(-1, 1) / 127.0
    hb = (0.5 * sb.float() / 127.0).reshape(1, -1)
    sum_a = a.float().abs().sum(dim=1, keepdim=True)  # [M, 1]
    sum_b = b.float().abs().sum(dim=1).reshape(1, -1)  # [1, N]
    return ha * sum_b + hb * sum_a + K * ha * hb


def expected_relative_error(a, b, sa, sb, reference):
    """Predicted ||C_q - A B^T||_F / ||reference||_F when rounding errors are independent and uniform
    on [-h, h] (variance h^2 / 3), as they are for data that is not already on the int8 grid:
      E ||dC||_F^2 = (sum_i h_a[i]^2 ||B||_F^2 + sum_j h_b[j]^2 ||A||_F^2) / 3   (cross term dropped,
    it is h_a h_b K, two orders smaller). sb is [1] (global: counted for all N columns) or [N]."""
    ha2 = (0.5 * sa.float() / 127.0).pow(2).sum()
    hb2 = (0.5 * sb.float() / 127.0).pow(2)
    hb2 = hb2.sum() * (b.shape[0] if sb.numel() == 1 else 1)
    var = (ha2 * b.float().pow(2).sum() + hb2 * a.float().pow(2).sum()) / 3.0
    return (var.sqrt() / reference.float().norm()).item()
