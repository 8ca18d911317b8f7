"""FragmentedLinear's expert path when the layer keeps its per-fragment outputs (x needs no gradient).

For x [B, in] viewed as N fragments x_f [B, F] (F = in/N), W [N, F, out], selection p [B, N] (fp32), the
low-rank path's input v = x scaled by 1 - p [B, in], its compressor C [r, in] and expansion E [out, r]:
    z[f] = x_f W_f                          [N, B, out] in x.dtype (kept for the selector's gradient)
    c    = v C^T                            [B, r] in x.dtype (the low-rank code)
    y    = sum_f p[:, f] * z[f] + c E^T     [B, out] in x.dtype, summed in fp32 from the rounded z, one rounding
`fragment_outputs` computes z with one program per (column block, fragment, row block): W is read once and
every SM has programs to stream it with (on an H200, bf16, 8192 x 8192, 8 fragments, B = 16: 38.8 us
against 44.6 us for one program per column block walking all fragments, probe). The same launch computes c
in further programs, one per block of C's rows, which the grid places among the first (fragment 0's), so
they run beside the pass over W: the layer's forward is three launches (select_scale, these two) where c
was a cuBLAS matmul of its own (a split-K product at these shapes, a memset before its kernel: the largest
host cost of an eager forward in a profile on an H100 host, probe). `expert_sum` then forms y from z (2 MB at
that size, against W's 128 MiB) and adds the low-rank path in the same pass, so the layer's forward needs
no separate addmm. Both serve skinny batches (B <= MAX_ROWS, the layer's regime: W read once is the whole
cost); larger batches, and devices Triton cannot run on, use the torch references (same math). Eager calls
replay compiled kernels per shape; under torch.compile these are custom ops.

The backward's kernels are in kernels/fragmented_backward.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    cdiv,
    dot_accumulate,
    dot_rows,
    fp32_tile_limit,
    ieee,
    interpreting,
    is_compiling,
    register_op,
    upcast,
    use_triton,
)
from kernels._common.launch import LaunchCache, aligned, config_dict

MAX_ROWS = 64  # rows held by one program: beyond, W would be read once per row block


@triton.jit
def _fragment_outputs_kernel(x_ptr, w_ptr, z_ptr, v_ptr, cw_ptr, c_ptr, B, F, OUT, R, IN, stride_x, stride_v,
                             IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CK: tl.constexpr,
                             LOW_RANK: tl.constexpr):
    """Program (column block, fragment f, row block): z[f, rows, cols] = x_f W_f for the first cdiv(OUT,
    BLOCK_O) column blocks; after them (LOW_RANK), fragment 0's programs compute c[rows, BLOCK_C rows of C] =
    v C^T over all of in (the other fragments' programs there have nothing to do). Without LOW_RANK the
    kernel is z's alone, as compiled before c moved in."""
    f = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_in = rows < B
    out_blocks = tl.cdiv(OUT, BLOCK_O)
    if tl.program_id(0) < out_blocks:
        cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
        ks = tl.arange(0, BLOCK_K)
        col_in = cols < OUT
        x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x + f * F  # fragment f's inputs
        w_rows = w_ptr + f.to(tl.int64) * F * OUT + cols[None, :]
        acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
        for k0 in range(0, F, BLOCK_K):
            k = k0 + ks
            a = tl.load(x_rows + k[None, :], mask=row_in[:, None] & (k[None, :] < F), other=0.0)
            w = tl.load(w_rows + k[:, None].to(tl.int64) * OUT, mask=(k[:, None] < F) & col_in[None, :], other=0.0)
            acc = dot_accumulate(a, w, acc, IEEE, UPCAST)
        z_rows = z_ptr + (f * B + rows[:, None]).to(tl.int64) * OUT + cols[None, :]
        tl.store(z_rows, acc.to(z_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])
    elif LOW_RANK and f == 0:
        ranks = (tl.program_id(0) - out_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
        ks = tl.arange(0, BLOCK_CK)
        rank_in = ranks < R
        v_rows = v_ptr + rows[:, None].to(tl.int64) * stride_v
        c_rows = cw_ptr + ranks[:, None].to(tl.int64) * IN  # C [R, in]: tiles [BLOCK_C, BLOCK_CK], in contiguous
        acc = tl.zeros([BLOCK_B, BLOCK_C], dtype=tl.float32)
        for k0 in range(0, IN, BLOCK_CK):
            k = k0 + ks
            a = tl.load(v_rows + k[None, :], mask=row_in[:, None] & (k[None, :] < IN), other=0.0)
            w = tl.load(c_rows + k[None, :], mask=rank_in[:, None] & (k[None, :] < IN), other=0.0)
            acc = dot_accumulate(a, tl.trans(w), acc, IEEE, UPCAST)
        tl.store(c_ptr + rows[:, None].to(tl.int64) * R + ranks[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=row_in[:, None] & rank_in[None, :])


# (BLOCK_O, BLOCK_K, num_stages, num_warps): W streams through [BLOCK_K, BLOCK_O] tiles, N programs per column
# block; the probe's fastest bf16 tiles first
_CONFIGS = [(256, 64, 3, 8), (128, 64, 3, 8), (128, 128, 4, 4), (64, 64, 3, 4), (64, 128, 4, 4), (32, 128, 4, 4)]
_INTERPRETER_CONFIG = (32, 32, 1, 4)  # one small tile: autotuning the interpreter would only slow the tests


_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_O": o, "BLOCK_K": k}, num_stages=st, num_warps=wp) for o, k, st, wp in _CONFIGS],
    key=["B", "F", "OUT", "R"],
    prune_configs_by={"early_config_prune": fp32_tile_limit("x_ptr", ("BLOCK_O", "BLOCK_K"))},
)(_fragment_outputs_kernel)

_LAUNCHES = LaunchCache("fragment_outputs")


def _fragment_outputs(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor | None, cw: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = x.shape[0]
    n, f, out = w.shape
    low_rank = v is not None
    if not (use_triton(x, w) and b <= MAX_ROWS and x.stride(1) == 1 and b > 0
            and (not low_rank or (use_triton(v, cw) and v.stride(1) == 1 and v.dtype == x.dtype
                                  and cw.dtype == w.dtype))):
        return fragment_outputs_reference(x, w, v, cw)
    w = w.contiguous()
    z = torch.empty((n, b, out), dtype=x.dtype, device=x.device)
    if low_rank:  # c's programs after W's column blocks
        cw, r = cw.contiguous(), cw.shape[0]
        c = torch.empty((b, r), dtype=x.dtype, device=x.device)
    else:  # R = 0: no programs for c (its pointers are never read)
        v, cw, c, r = x, w, z, 0
    args = (x, w, z, v, cw, c, b, f, out, r, n * f, x.stride(0), v.stride(0))
    key = (b, n, f, out, r, x.stride(0), v.stride(0), x.dtype, w.dtype, aligned(x, w, z, v, cw, c), x.device)
    _LAUNCHES.launch(key, args, lambda: _first_launch(args, n, x.dtype))
    return z, (c if low_rank else None)


# c's programs: BLOCK_C rows of C each (16 programs at r = 256), streaming in [BLOCK_C, BLOCK_CK] tiles; fp32
# keeps to short tiles (its exact products unroll into FMA code whose compile time grows with the tile), and
# the layer computes fp32's c apart (qbench/layers/fragmented.py, FUSED_LOW_RANK)
BLOCK_C = 16
BLOCK_CK = {False: 256, True: 64}  # by fp32


def _first_launch(args, n: int, dtype):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    b, out, r = args[6], args[8], args[9]
    block_b = dot_rows(b)
    flags = (ieee(dtype), upcast(dtype), block_b)
    low_rank = {"BLOCK_C": BLOCK_C, "BLOCK_CK": 32 if interpreting() else BLOCK_CK[dtype == torch.float32],
                "LOW_RANK": r > 0}

    def grid(block_o):  # W's column blocks, then c's
        return (cdiv(out, block_o) + cdiv(r, BLOCK_C), n, cdiv(b, block_b))

    if interpreting():
        block_o, block_k, stages, warps = _INTERPRETER_CONFIG
        compiled = _fragment_outputs_kernel[grid(block_o)](*args, *flags, BLOCK_O=block_o, BLOCK_K=block_k,
                                                           **low_rank, num_stages=stages, num_warps=warps)
        return (compiled, grid(block_o), (*flags, block_o, block_k, *low_rank.values()),
                {"BLOCK_O": block_o, "BLOCK_K": block_k, **low_rank})
    compiled = _autotuned[lambda meta: grid(meta["BLOCK_O"])](*args, *flags, **low_rank)
    best = _autotuned.best_config
    consts = (*flags, best.kwargs["BLOCK_O"], best.kwargs["BLOCK_K"], *low_rank.values())
    return compiled, grid(best.kwargs["BLOCK_O"]), consts, {**config_dict(best), "BLOCK_B": block_b, **low_rank}


def _op_with_low_rank(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, cw: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    return _fragment_outputs(x, w, v, cw)


def _op_z(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _fragment_outputs(x, w, None, None)[0]


_OP = register_op("fragment_outputs", _op_with_low_rank,
                  lambda x, w, v, cw: (x.new_empty((w.shape[0], x.shape[0], w.shape[2])),
                                       x.new_empty((x.shape[0], cw.shape[0]))))
_Z_OP = register_op("fragment_outputs_z", _op_z, lambda x, w: x.new_empty((w.shape[0], x.shape[0], w.shape[2])))


def fragment_outputs(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor | None = None, cw: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(z [N, B, out] = x_f W_f, c [B, r] = v C^T), both in x.dtype, for x, v [B, in], W [N, F, out], C [r, in];
    c is None when v and C are not given. See the module docstring."""
    if v is None:
        return (_Z_OP(x, w) if is_compiling() else _fragment_outputs(x, w, None, None)[0]), None
    return _OP(x, w, v, cw) if is_compiling() else _fragment_outputs(x, w, v, cw)


def fragment_outputs_reference(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor | None = None,
                               cw: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain torch, same math: a batched matmul and a matmul."""
    b = x.shape[0]
    n, f, _ = w.shape
    return torch.bmm(x.reshape(b, n, f).transpose(0, 1), w), (None if v is None else v @ cw.t())


@triton.jit
def _expert_sum_kernel(z_ptr, p_ptr, c_ptr, e_ptr, y_ptr, B, N, OUT, R, stride_c, IEEE: tl.constexpr,
                       UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):
    """y[rows, cols] = sum_f p[rows, f] z[f, rows, cols] + c[rows] E[cols]^T, in fp32, rounded once."""
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    row_in, col_in = rows < B, cols < OUT
    mask = row_in[:, None] & col_in[None, :]
    acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    rs = tl.arange(0, BLOCK_R)
    for r0 in range(0, R, BLOCK_R):  # the low-rank path: c [B, R] times E^T [R, out]
        r = r0 + rs
        a = tl.load(c_ptr + rows[:, None].to(tl.int64) * stride_c + r[None, :], mask=row_in[:, None] & (r[None, :] < R),
                    other=0.0)
        e = tl.load(e_ptr + cols[None, :].to(tl.int64) * R + r[:, None], mask=(r[:, None] < R) & col_in[None, :],
                    other=0.0)
        acc = dot_accumulate(a, e, acc, IEEE, UPCAST)
    z_rows = z_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :]
    for f in range(0, N):
        pf = tl.load(p_ptr + rows.to(tl.int64) * N + f, mask=row_in, other=0.0)
        acc += pf[:, None] * tl.load(z_rows, mask=mask, other=0.0).to(tl.float32)
        z_rows += B * OUT
    tl.store(y_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


_SUM_BLOCK_O, _SUM_BLOCK_R, _SUM_WARPS = 64, 64, 4  # 128 programs at out = 8192: a light pass, not tuned
_SUM_LAUNCHES = LaunchCache("expert_sum")


def _expert_sum(z: torch.Tensor, p: torch.Tensor, c: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    n, b, out = z.shape
    r = c.shape[1]
    if not (use_triton(z, p, c, e) and b <= MAX_ROWS and c.stride(1) == 1 and b > 0 and z.is_contiguous()
            and p.is_contiguous() and e.is_contiguous()):
        return expert_sum_reference(z, p, c, e)
    y = torch.empty((b, out), dtype=z.dtype, device=z.device)
    args = (z, p, c, e, y, b, n, out, r, c.stride(0))
    key = (n, b, out, r, c.stride(0), z.dtype, aligned(z, p, c, e, y), z.device)
    _SUM_LAUNCHES.launch(key, args, lambda: _first_sum_launch(args, z.dtype))
    return y


def _first_sum_launch(args, dtype):
    b, out = args[5], args[7]
    block_b = dot_rows(b)
    consts = (ieee(dtype), upcast(dtype), block_b, _SUM_BLOCK_O, _SUM_BLOCK_R)
    grid = (cdiv(out, _SUM_BLOCK_O), cdiv(b, block_b))
    compiled = _expert_sum_kernel[grid](*args, *consts, num_warps=_SUM_WARPS)
    return compiled, grid, consts, {"BLOCK_O": _SUM_BLOCK_O, "BLOCK_R": _SUM_BLOCK_R, "BLOCK_B": block_b,
                                    "num_warps": _SUM_WARPS}


_SUM_OP = register_op("expert_sum", _expert_sum, lambda z, p, c, e: z.new_empty((z.shape[1], z.shape[2])))


def expert_sum(z: torch.Tensor, p: torch.Tensor, c: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """y [B, out] = sum_f p[:, f] z[f] + c E^T for z [N, B, out], p [B, N] fp32, c [B, r], E [out, r]."""
    return _SUM_OP(z, p, c, e) if is_compiling() else _expert_sum(z, p, c, e)


def expert_sum_reference(z: torch.Tensor, p: torch.Tensor, c: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Plain torch, same math: the fp32 p-weighted sum of the rounded z plus the fp32 low-rank product."""
    return (torch.einsum("bn,nbo->bo", p.float(), z.float()) + c.float() @ e.float().t()).to(z.dtype)
