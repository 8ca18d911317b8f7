"""FragmentedLinear's expert path when the layer keeps its per-fragment outputs (x needs no gradient).

For x [B, in] viewed as N fragments x_f [B, F] (F = in/N), W [N, F, out], selection p [B, N] (fp32), the
low-rank path's input v = x scaled by 1 - p [B, in], its compressor C [r, in] and expansion E [out, r]:
    z[f]  = x_f W_f                          [N, B, out] in x.dtype (kept for the selector's gradient)
    cz[f] = v_f C_f^T                        [N, B, r] fp32 (C_f: fragment f's columns of C)
    c     = sum_f cz[f]                      [B, r] in x.dtype, rounded once (the low-rank code v C^T)
    y     = sum_f p[:, f] * z[f] + c E^T     [B, out] in x.dtype, summed in fp32 from the rounded z and c
`fragment_outputs` computes z and cz with one program per (column block, fragment, row block): W is read
once and every SM has programs to stream it with (on an H200, bf16, 8192 x 8192, 8 fragments, B = 16: 38.8
us against 44.6 us for one program per column block walking all fragments, probe); C's column blocks are
further programs of the same launch. `expert_sum` then forms c and y from z and cz (2 MB and 128 KB at that
size, against W's 128 MiB) and writes c for the backward. So the layer's forward is three launches
(select_scale, these two) where the low-rank product v C^T was a cuBLAS matmul of its own (a split-K
product at these shapes: a memset and two more launches, the largest host cost of an eager forward on an
H100 host, probe). Both serve skinny batches (B <= MAX_ROWS, the layer's regime: W read once is the whole
cost); larger batches, and devices Triton cannot run on, use the torch references (same math). Eager calls
replay compiled kernels per shape; under torch.compile these are custom ops.

The backward's kernels are in kernels/fragmented_backward.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    LaunchCache,
    aligned,
    cdiv,
    config_dict,
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

MAX_ROWS = 64  # rows held by one program: beyond, W would be read once per row block


@triton.jit
def _fragment_product(a_ptr, w_ptr, stride_a, stride_k, stride_o, rows, cols, row_in, col_in, F,
                      IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """[BLOCK_B, BLOCK_O] fp32 = A[rows, :F] . M[:F, cols] with A at a_ptr (row stride stride_a) and M[k, o] at
    w_ptr + k * stride_k + o * stride_o (W_f: OUT, 1; C_f^T: 1, in)."""
    ks = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + rows[:, None].to(tl.int64) * stride_a
    w_cols = w_ptr + cols[None, :].to(tl.int64) * stride_o
    acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        k = k0 + ks
        a = tl.load(a_rows + k[None, :], mask=row_in[:, None] & (k[None, :] < F), other=0.0)
        w = tl.load(w_cols + k[:, None].to(tl.int64) * stride_k, mask=(k[:, None] < F) & col_in[None, :], other=0.0)
        acc = dot_accumulate(a, w, acc, IEEE, UPCAST)
    return acc


@triton.jit
def _fragment_outputs_kernel(x_ptr, w_ptr, z_ptr, v_ptr, cw_ptr, cz_ptr, B, F, OUT, R, IN, stride_x, stride_v,
                             IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    """Program (column block, fragment f, row block): z[f, rows, cols] = x_f W_f for the first cdiv(OUT,
    BLOCK_O) column blocks, cz[f, rows, cols] = v_f C_f^T (fp32) for the R columns after them."""
    f = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_in = rows < B
    out_blocks = tl.cdiv(OUT, BLOCK_O)
    if tl.program_id(0) < out_blocks:
        cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
        col_in = cols < OUT
        acc = _fragment_product(x_ptr + f * F, w_ptr + f.to(tl.int64) * F * OUT, stride_x, OUT, 1, rows, cols, row_in,
                                col_in, F, IEEE, UPCAST, BLOCK_B, BLOCK_O, BLOCK_K)
        z_rows = z_ptr + (f * B + rows[:, None]).to(tl.int64) * OUT + cols[None, :]
        tl.store(z_rows, acc.to(z_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])
    else:
        cols = (tl.program_id(0) - out_blocks) * BLOCK_O + tl.arange(0, BLOCK_O)
        col_in = cols < R
        acc = _fragment_product(v_ptr + f * F, cw_ptr + f * F, stride_v, 1, IN, rows, cols, row_in, col_in, F, IEEE,
                                UPCAST, BLOCK_B, BLOCK_O, BLOCK_K)
        tl.store(cz_ptr + (f * B + rows[:, None]).to(tl.int64) * R + cols[None, :], acc,
                 mask=row_in[:, None] & col_in[None, :])


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


def _fragment_outputs(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, cw: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    b = x.shape[0]
    n, f, out = w.shape
    r = cw.shape[0]
    if not (use_triton(x, w, v, cw) and b <= MAX_ROWS and x.stride(1) == 1 and v.stride(1) == 1 and b > 0
            and v.dtype == x.dtype and cw.dtype == w.dtype):
        return fragment_outputs_reference(x, w, v, cw)
    w, cw = w.contiguous(), cw.contiguous()
    z = torch.empty((n, b, out), dtype=x.dtype, device=x.device)
    cz = torch.empty((n, b, r), dtype=torch.float32, device=x.device)
    args = (x, w, z, v, cw, cz, b, f, out, r, n * f, x.stride(0), v.stride(0))
    key = (b, n, f, out, r, x.stride(0), v.stride(0), x.dtype, w.dtype, aligned(x, w, z, v, cw, cz), x.device)
    _LAUNCHES.launch(key, args, lambda: _first_launch(args, n, x.dtype))
    return z, cz


def _first_launch(args, n: int, dtype):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    b, out, r = args[6], args[8], args[9]
    block_b = dot_rows(b)
    flags = (ieee(dtype), upcast(dtype), block_b)

    def grid(block_o):  # W's column blocks, then C^T's
        return (cdiv(out, block_o) + cdiv(r, block_o), n, cdiv(b, block_b))

    if interpreting():
        block_o, block_k, stages, warps = _INTERPRETER_CONFIG
        compiled = _fragment_outputs_kernel[grid(block_o)](*args, *flags, BLOCK_O=block_o, BLOCK_K=block_k,
                                                           num_stages=stages, num_warps=warps)
        return compiled, grid(block_o), (*flags, block_o, block_k), {"BLOCK_O": block_o, "BLOCK_K": block_k}
    compiled = _autotuned[lambda meta: grid(meta["BLOCK_O"])](*args, *flags)
    best = _autotuned.best_config
    consts = (*flags, best.kwargs["BLOCK_O"], best.kwargs["BLOCK_K"])
    return compiled, grid(best.kwargs["BLOCK_O"]), consts, {**config_dict(best), "BLOCK_B": block_b}


_OP = register_op("fragment_outputs", _fragment_outputs,
                  lambda x, w, v, cw: (x.new_empty((w.shape[0], x.shape[0], w.shape[2])),
                                       x.new_empty((w.shape[0], x.shape[0], cw.shape[0]), dtype=torch.float32)))


def fragment_outputs(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, cw: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [N, B, out] = x_f W_f in x.dtype, cz [N, B, r] = v_f C_f^T in fp32) for x, v [B, in], W [N, F, out],
    C [r, in]; see the module docstring."""
    return _OP(x, w, v, cw) if is_compiling() else _fragment_outputs(x, w, v, cw)


def fragment_outputs_reference(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, cw: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, same math: two batched matmuls (the low-rank one in fp32 from the rounded v and C)."""
    b = x.shape[0]
    n, f, _ = w.shape
    vf = v.float().reshape(b, n, f).transpose(0, 1)  # [N, B, F]
    cf = cw.float().reshape(-1, n, f).permute(1, 2, 0)  # [N, F, r]
    return torch.bmm(x.reshape(b, n, f).transpose(0, 1), w), torch.bmm(vf, cf)


@triton.jit
def _expert_sum_kernel(z_ptr, p_ptr, cz_ptr, e_ptr, y_ptr, c_ptr, B, N, OUT, R, IEEE: tl.constexpr,
                       UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):
    """y[rows, cols] = sum_f p[rows, f] z[f, rows, cols] + c[rows] E[cols]^T, in fp32, rounded once, with
    c = sum_f cz[f] rounded to y's dtype first (as the unfused product v C^T is); the programs of the first
    column block write c out."""
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    row_in, col_in = rows < B, cols < OUT
    mask = row_in[:, None] & col_in[None, :]
    acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    rs = tl.arange(0, BLOCK_R)
    for r0 in range(0, R, BLOCK_R):  # the low-rank path: c [B, R] times E^T [R, out]
        r = r0 + rs
        c_mask = row_in[:, None] & (r[None, :] < R)
        cz_rows = cz_ptr + rows[:, None].to(tl.int64) * R + r[None, :]
        a = tl.zeros([BLOCK_B, BLOCK_R], dtype=tl.float32)
        for _ in range(0, N):
            a += tl.load(cz_rows, mask=c_mask, other=0.0)
            cz_rows += B * R
        a = a.to(y_ptr.dtype.element_ty)
        if tl.program_id(0) == 0:
            tl.store(c_ptr + rows[:, None].to(tl.int64) * R + r[None, :], a, mask=c_mask)
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


def _expert_sum(z: torch.Tensor, p: torch.Tensor, cz: torch.Tensor, e: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    n, b, out = z.shape
    r = cz.shape[2]
    if not (use_triton(z, p, cz, e) and b <= MAX_ROWS and b > 0 and z.is_contiguous() and p.is_contiguous()
            and cz.is_contiguous() and e.is_contiguous() and e.dtype == z.dtype):
        return expert_sum_reference(z, p, cz, e)
    y = torch.empty((b, out), dtype=z.dtype, device=z.device)
    c = torch.empty((b, r), dtype=z.dtype, device=z.device)
    args = (z, p, cz, e, y, c, b, n, out, r)
    key = (n, b, out, r, z.dtype, aligned(z, p, cz, e, y, c), z.device)
    _SUM_LAUNCHES.launch(key, args, lambda: _first_sum_launch(args, z.dtype))
    return y, c


def _first_sum_launch(args, dtype):
    b, out = args[6], args[8]
    block_b = dot_rows(b)
    consts = (ieee(dtype), upcast(dtype), block_b, _SUM_BLOCK_O, _SUM_BLOCK_R)
    grid = (cdiv(out, _SUM_BLOCK_O), cdiv(b, block_b))
    compiled = _expert_sum_kernel[grid](*args, *consts, num_warps=_SUM_WARPS)
    return compiled, grid, consts, {"BLOCK_O": _SUM_BLOCK_O, "BLOCK_R": _SUM_BLOCK_R, "BLOCK_B": block_b,
                                    "num_warps": _SUM_WARPS}


_SUM_OP = register_op("expert_sum", _expert_sum, lambda z, p, cz, e: (z.new_empty((z.shape[1], z.shape[2])),
                                                                       z.new_empty((z.shape[1], cz.shape[2]))))


def expert_sum(z: torch.Tensor, p: torch.Tensor, cz: torch.Tensor, e: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, out] = sum_f p[:, f] z[f] + c E^T, c [B, r] = sum_f cz[f] rounded to z.dtype) for z [N, B, out],
    p [B, N] fp32, cz [N, B, r] fp32, E [out, r]."""
    return _SUM_OP(z, p, cz, e) if is_compiling() else _expert_sum(z, p, cz, e)


def expert_sum_reference(z: torch.Tensor, p: torch.Tensor, cz: torch.Tensor, e: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, same math: c rounded once from the fp32 sum of the partials, then the fp32 p-weighted sum
    of the rounded z plus the fp32 low-rank product of the rounded c."""
    c = cz.sum(dim=0).to(z.dtype)
    return (torch.einsum("bn,nbo->bo", p.float(), z.float()) + c.float() @ e.float().t()).to(z.dtype), c
