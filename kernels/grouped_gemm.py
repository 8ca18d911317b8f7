"""Grouped GEMM: one launch computes a separate matmul for every group of rows.

Math (G groups, rows of x in S = R * G segments, segment s owns rows offsets[s]:offsets[s+1] and
belongs to group s % G; R = 1 is the plain case of one segment per group):
    y[r, :] = x[r, :] @ w[s % G] (+ bias[s % G])             for every row r of segment s
    x [T, K], w [G, K, N], offsets int64 [S + 1] (offsets[0] = 0, offsets[S] = T, non-decreasing;
    empty segments allowed), bias [G, N] or None  ->  y [T, N] in x.dtype, fp32 accumulation.
Segments let a caller multiply rows in the order an all-to-all delivers them (source-major: source
rank, then local expert) without first permuting them into expert-major order.
The weight gradient of the same product is a second grouped kernel (`grouped_matmul_wgrad`, its
kernel in kernels/grouped_gemm_wgrad.py):
    dw[g] = sum over the segments s of g of x[rows of s]^T @ dy[rows of s]   -> [G, K, N]
and the input gradient is the forward kernel with w transposed (a strided view, no copy).

Used by the MoE expert FFN (one group per local expert) and by FragmentedLinear (one group per
fragment). The tile map is computed inside the kernel from `offsets`, so a launch never reads the
group sizes on the host (no device-to-host synchronisation).

`grouped_matmul` is differentiable (autograd.Function over the two kernels). Where torch ships its
own grouped matmul (`torch._grouped_mm`, CUTLASS on Hopper), `backend="torch"` uses it instead;
`backend="auto"` (the default) runs Triton, and callers that measured torch's kernel to be faster
on their GPU pass backend="torch" explicitly (qbench moe does so and records which ran).
Eager calls launch directly and replay compiled kernels (kernels._common.LaunchCache; the row count
T is keyed by how Triton specializes it, so a layer whose row counts change every step still
replays); while torch.compile traces, the forward and the weight gradient are custom ops
(torch.ops.qbench.grouped_mm / grouped_wgrad) with shape-only fakes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    LaunchCache,
    aligned,
    config_dict,
    dot_accumulate,
    ieee,
    interpreting,
    is_compiling,
    register_op,
    specialization,
    upcast,
    use_triton,
)
from kernels.grouped_gemm_wgrad import grouped_bias_reference, grouped_wgrad_reference, launch_wgrad

IMPLS = ("auto", "tma", "pointer")  # Triton forward kernels: TMA where it applies, TMA, pointer

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


@triton.autotune(configs=_FWD_CONFIGS, key=["N", "K", "G", "IEEE", "UPCAST"])
@triton.jit
def _grouped_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, off_ptr,
    T, N, K, G, NW,
    sxm, sxk, swg, swk, swn, sbg, sym,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_G: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
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
    y = y_ptr + rows[:, None].to(tl.int64) * sym + cols[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < N))


def _check(x, w, offsets, bias) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_matmul needs x [T, K] and w [G, K, N]; got {tuple(x.shape)}, {tuple(w.shape)}")
    G = w.shape[0]
    segments = offsets.numel() - 1
    if offsets.dim() != 1 or segments < 0 or (segments % G if G else segments):
        raise ValueError(f"offsets must have R * G + 1 entries (G = {G} groups, R >= 1 segments each), "
                         f"got {tuple(offsets.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0], w.shape[2]):
        raise ValueError(f"bias must be [G, N] = {(w.shape[0], w.shape[2])}, got {tuple(bias.shape)}")


def segments_per_group(offsets, num_groups: int) -> int:
    """R of offsets [R * G + 1] (1 when there are no groups)."""
    return (offsets.numel() - 1) // num_groups if num_groups else 1


_FWD = LaunchCache("grouped_gemm_fwd")


def _launch_fwd(x, w, offsets, bias, out=None, impl: str = "auto"):
    """Triton forward launch; w may be any strided view (the input gradient passes w^T); `out` (a
    row-contiguous [T, N] view) receives y when given; impl: see grouped_matmul_forward."""
    T, K = x.shape
    G, _, N = w.shape
    y = torch.empty((T, N), dtype=x.dtype, device=x.device) if out is None else out
    if T == 0 or N == 0:
        return y
    if K == 0 or G == 0:
        return y.zero_() if bias is None else y.copy_(_bias_rows(bias, offsets, T))
    if offsets.dtype != torch.int64 or offsets.device != x.device or not offsets.is_contiguous():
        offsets = offsets.to(device=x.device, dtype=torch.int64).contiguous()
    if _takes_tma(x, w, offsets, y, bias, impl):
        from kernels import grouped_gemm_tma as tma

        return tma.launch_fwd(x, w, offsets, bias, y)
    return _pointer_fwd(x, w, offsets, bias, y)


def _pointer_fwd(x, w, offsets, bias, y):
    T, K = x.shape
    G, _, N = w.shape
    S = offsets.numel() - 1
    b = bias if bias is not None else y  # dummy pointer when HAS_BIAS is false
    args = (x, w, b, y, offsets, T, N, K, S, G, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2),
            b.stride(0) if bias is not None else 0, y.stride(0))
    key = (specialization(T), N, K, S, G, args[10:], x.dtype, bias is not None, aligned(x, w, b, y, offsets),
           x.device)
    entry = _FWD.entry(key)
    if entry is None:
        flags = (bias is not None, ieee(x.dtype), upcast(x.dtype), triton.next_power_of_2(S + 1))
        compiled = _grouped_fwd_kernel[lambda meta: (_fwd_programs(T, S, N, meta["BM"], meta["BN"]),)](
            *args, HAS_BIAS=flags[0], IEEE=flags[1], UPCAST=flags[2], BLOCK_G=flags[3])
        best = _grouped_fwd_kernel.best_config
        tile = (best.kwargs["BM"], best.kwargs["BN"], best.kwargs["BK"], best.kwargs["GROUP_M"])
        _FWD.store(key, compiled, (_fwd_programs(T, S, N, tile[0], tile[1]),), (*flags, *tile), config_dict(best))
    else:
        bm, bn = entry[2][4], entry[2][5]
        entry[0](*args, grid=(_fwd_programs(T, S, N, bm, bn), 1, 1))
    return y


def _fwd_programs(T: int, S: int, N: int, bm: int, bn: int) -> int:
    """Row tiles of every segment fit in cdiv(T, BM) + S (one partial tile per segment), times N tiles."""
    return (triton.cdiv(T, bm) + S) * triton.cdiv(N, bn)


def _takes_tma(x, w, offsets, y, bias, impl: str) -> bool:
    """Whether the forward runs the persistent TMA kernel (kernels/grouped_gemm_tma.py): impl "auto"
    where `supported` says so (Hopper, fp16/bf16, aligned), "tma" always (ValueError where its shapes
    do not suit; under the interpreter only the shapes are checked), "pointer" never."""
    from kernels import grouped_gemm_tma as tma

    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "pointer":
        return False
    if impl == "auto":
        return tma.supported(x, w, offsets, y, bias)
    if not (tma.shapes_supported if interpreting() else tma.supported)(x, w, offsets, y, bias):
        raise ValueError("impl='tma': the TMA kernel needs a Hopper GPU, fp16/bf16, 16-byte aligned rows and "
                         f"K % {tma.BK_TMA} == 0 for plain w; got x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)}")
    return True


def _group_ids(offsets, T):
    """Segment index of every row, [T] int64, computed on the device (output_size avoids a sync)."""
    counts = (offsets[1:] - offsets[:-1]).to(torch.int64)
    ids = torch.arange(counts.numel(), device=offsets.device)
    return torch.repeat_interleave(ids, counts, output_size=T)


def _bias_rows(bias, offsets, T):
    """bias [S or G, N] -> the bias row of every row's segment [T, N]."""
    return bias.index_select(0, _group_ids(offsets.to(bias.device), T) % bias.shape[0])


def _torch_offs(offsets):
    """torch._grouped_mm takes int32 end offsets [G] (no leading zero)."""
    return offsets[1:].to(torch.int32)


def _forward(x, w, offsets, bias, backend: str, out, impl: str):
    """grouped_matmul_forward on the eager path (every backend)."""
    if backend == "reference" or (backend == "auto" and not use_triton(x, w)):
        y = grouped_matmul_reference(x, w, offsets, bias)
    elif backend == "torch":
        ws, bs = _per_segment(w, offsets), None if bias is None else _per_segment(bias, offsets)
        y = torch._grouped_mm(x, ws, offs=_torch_offs(offsets))
        y = y if bias is None else y + _bias_rows(bs, offsets, x.shape[0])
    else:
        return _launch_fwd(x, w, offsets, bias, out, impl)
    return y if out is None else out.copy_(y)


def _per_segment(t, offsets):
    """t [G, ...] repeated for R segments per group -> [R * G, ...] (a copy when R > 1): torch's
    grouped matmul has no notion of segments sharing a weight."""
    R = segments_per_group(offsets, t.shape[0])
    return t if R == 1 else t.repeat(R, *([1] * (t.dim() - 1)))


def _wgrad(x, dy, offsets, num_groups: int, backend: str):
    if backend == "reference" or (backend == "auto" and not use_triton(x, dy)):
        return grouped_wgrad_reference(x, dy, offsets, num_groups)
    if backend == "torch":
        R = segments_per_group(offsets, num_groups)
        dw = torch._grouped_mm(x.t(), dy, offs=_torch_offs(offsets))
        return dw if R == 1 else dw.view(R, num_groups, *dw.shape[1:]).sum(0)
    return launch_wgrad(x, dy, offsets, num_groups)


# ------------------------------------------------------------------------ public API and custom ops


def _op_fwd(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None, backend: str,
            impl: str) -> torch.Tensor:
    return _forward(x, w, offsets, bias, backend, None, impl)


def _op_wgrad(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
              backend: str) -> torch.Tensor:
    return _wgrad(x, dy, offsets, num_groups, backend)


def _wgrad_bias(x, dy, offsets, num_groups: int, backend: str):
    if backend in ("auto", "triton") and use_triton(x, dy):
        return launch_wgrad(x, dy, offsets, num_groups, with_bias=True)
    return _wgrad(x, dy, offsets, num_groups, backend), _bias_grad(dy, offsets, num_groups, backend)


def _op_wgrad_bias(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _wgrad_bias(x, dy, offsets, num_groups, backend)


_OPS = {"fwd": register_op("grouped_mm", _op_fwd,
                           lambda x, w, offsets, bias, backend, impl: x.new_empty((x.shape[0], w.shape[2]))),
        "wgrad": register_op("grouped_wgrad", _op_wgrad,
                             lambda x, dy, offsets, g, backend: x.new_empty((g, x.shape[1], dy.shape[1]))),
        "wgrad_bias": register_op("grouped_wgrad_bias", _op_wgrad_bias,
                                  lambda x, dy, offsets, g, backend: (x.new_empty((g, x.shape[1], dy.shape[1])),
                                                                      dy.new_empty((g, dy.shape[1]))))}


def grouped_matmul_forward(x, w, offsets, bias=None, *, backend: str = "auto", out=None, impl: str = "auto"):
    """y = x @ w[s % G] (+ bias[s % G]) per segment s, no autograd; written into `out` when given.
    backend: auto | triton | torch | reference. impl (Triton only): "auto" (the persistent TMA kernel
    where it applies, else the pointer kernel), "tma" or "pointer". Under torch.compile every backend
    but "torch" (an aten op, traced as is) is one custom op."""
    if backend != "torch" and is_compiling():
        y = _OPS["fwd"](x, w, offsets, bias, backend, impl)
        return y if out is None else out.copy_(y)
    return _forward(x, w, offsets, bias, backend, out, impl)


def grouped_matmul_wgrad(x, dy, offsets, num_groups: int, *, backend: str = "auto"):
    """dw[g] = sum over g's segments of x_s^T @ dy_s -> [G, K, N] in x.dtype (fp32 accumulation);
    empty groups give zeros."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad"](x, dy, offsets, num_groups, backend)
    return _wgrad(x, dy, offsets, num_groups, backend)


def grouped_wgrad_bias(x, dy, offsets, num_groups: int, *, backend: str = "auto"):
    """(dw [G, K, N], db [G, N]) of a product with a bias: grouped_matmul_wgrad and grouped_bias_grad,
    on the Triton backend in one launch (the bias gradient sums the dy tiles the weight gradient reads)."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad_bias"](x, dy, offsets, num_groups, backend)
    return _wgrad_bias(x, dy, offsets, num_groups, backend)


def grouped_bias_grad(dy, offsets, num_groups: int, *, backend: str = "auto"):
    """db[g] = sum of dy over the rows of group g -> [G, N] in dy.dtype (fp32 sums).

    On the kernel backends this is the weight-gradient kernel with a column of ones (one streaming
    read of dy on the tensor cores); the reference path adds rows into an fp32 buffer. A product's
    weight and bias gradients together take grouped_wgrad_bias (one pass over dy)."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad"](_ones(dy), dy, offsets, num_groups, backend)[:, 0, :]
    return _bias_grad(dy, offsets, num_groups, backend)


def _bias_grad(dy, offsets, num_groups: int, backend: str):
    if backend == "reference" or (backend == "auto" and not use_triton(dy)):
        return grouped_bias_reference(dy, offsets, num_groups)
    return _wgrad(_ones(dy), dy, offsets, num_groups, backend)[:, 0, :]


def _ones(dy):
    return dy.new_ones((dy.shape[0], 16))  # 16: the narrowest tensor-core operand


class GroupedMatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offsets, bias, backend):
        ctx.save_for_backward(x, w, offsets)
        ctx.has_bias, ctx.backend = bias is not None, backend
        return grouped_matmul_forward(x, w, offsets, bias, backend=backend)

    @staticmethod
    def backward(ctx, dy):
        x, w, offsets = ctx.saved_tensors
        dy = dy.contiguous()
        G = w.shape[0]
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = grouped_matmul_forward(dy, w.transpose(1, 2), offsets, backend=ctx.backend)
        want_db = ctx.has_bias and ctx.needs_input_grad[3]
        if ctx.needs_input_grad[1] and want_db:
            dw, db = grouped_wgrad_bias(x, dy, offsets, G, backend=ctx.backend)
        elif ctx.needs_input_grad[1]:
            dw = grouped_matmul_wgrad(x, dy, offsets, G, backend=ctx.backend)
        elif want_db:
            db = grouped_bias_grad(dy, offsets, G, backend=ctx.backend)
        return dx, dw, None, db, None


def grouped_matmul(x, w, offsets, bias=None, *, backend: str = "auto"):
    """x [T, K] (rows sorted by group), w [G, K, N], offsets int64 [G + 1], bias [G, N] | None
    -> [T, N] in x.dtype with fp32 accumulation. Differentiable in x, w and bias.

    Runs the Triton kernel on CUDA (and on CPU under TRITON_INTERPRET=1), the torch reference
    otherwise; backend="torch" uses torch._grouped_mm (bf16 on Hopper) where the caller chose it.
    """
    _check(x, w, offsets, bias)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, bias))
    if not needs_grad:
        return grouped_matmul_forward(x, w, offsets, bias, backend=backend)
    return GroupedMatmulFn.apply(x, w, offsets, bias, backend)


def grouped_matmul_reference(x, w, offsets, bias=None):
    """Plain torch: one matmul per group (fp32 accumulation, result in x.dtype)."""
    _check(x, w, offsets, bias)
    bounds = [int(v) for v in offsets.tolist()]
    y = torch.zeros((x.shape[0], w.shape[2]), dtype=torch.float32, device=x.device)
    for s in range(len(bounds) - 1):
        lo, hi, g = bounds[s], bounds[s + 1], s % max(w.shape[0], 1)
        if hi > lo:
            y[lo:hi] = x[lo:hi].float() @ w[g].float()
            if bias is not None:
                y[lo:hi] += bias[g].float()
    return y.to(x.dtype)
