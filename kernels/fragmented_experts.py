"""FragmentedLinear's forward when the layer keeps its per-fragment outputs (x needs no gradient).

For x [B, in] viewed as N fragments x_f [B, F] (F = in/N), W [N, F, out], selection p [B, N] (fp32), and
the low-rank path's compressor C [r, in] (C_f: its columns of fragment f) and expansion E [out, r]:
    z[f] = x_f W_f                       [N, B, out] in x.dtype (kept for the selector's gradient)
    q[f] = x_f C_f^T                     [N, B, r] in fp32
    c    = sum_f (1 - p_f) q[f]          [B, r] in x.dtype: the low-rank code of x * (1 - p), rounded once
    y    = sum_f p_f z[f] + c E^T        [B, out] in x.dtype, summed in fp32 from the rounded z and c
`fragment_outputs` computes z and q with one program per (column block of W or of C^T, fragment, row block):
W and C are read once and every SM has programs to stream them with (on an H200, bf16, 8192 x 8192,
8 fragments, B = 16: 38.8 us for z against 44.6 us for one program per column block walking all
fragments, probe). `expert_sum` then forms c and y from q and z (2 MB at that size, against W's 128 MiB)
in one pass. So the forward is these two kernels and the selector's: the low-rank path needs no matmuls of
its own (cuBLAS ran c = v C^T as a split-K pair beside the pass over W, slowing it, graph timelines, probe).
Both serve skinny batches (B <= MAX_ROWS, the layer's regime: W read once is the whole cost); larger
batches, and devices Triton cannot run on, use the torch references (same math). Eager calls replay
compiled kernels per shape; under torch.compile these are custom ops.

The backward's kernels are in kernels/fragmented_backward.py.
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
    upcast,
    use_triton,
)

MAX_ROWS = 64  # rows held by one program: beyond, W would be read once per row block


@triton.jit
def _fragment_product(x_rows, b_ptr, stride_k, stride_j, cols, ncols, row_in, F, IEEE: tl.constexpr,
                      UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr):
    """x_f [rows, :] times the [F, ncols] matrix at b_ptr (element (k, j) at k * stride_k + j * stride_j), for the
    columns cols: an fp32 tile [BLOCK_B, BLOCK_O]."""
    ks = tl.arange(0, BLOCK_K)
    col_in = cols < ncols
    acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        k = k0 + ks
        a = tl.load(x_rows + k[None, :], mask=row_in[:, None] & (k[None, :] < F), other=0.0)
        b = tl.load(b_ptr + k[:, None].to(tl.int64) * stride_k + cols[None, :] * stride_j,
                    mask=(k[:, None] < F) & col_in[None, :], other=0.0)
        acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
    return acc


@triton.jit
def _fragment_outputs_kernel(x_ptr, w_ptr, cw_ptr, z_ptr, q_ptr, B, F, OUT, R, IN, stride_x, IEEE: tl.constexpr,
                             UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (column block, fragment f, row block): z[f, rows, cols] = x_f W_f for the first cdiv(OUT, BLOCK_O)
    column blocks, q[f, rows, cols] = x_f C_f^T for the rest."""
    f = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_in = rows < B
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x + f * F  # fragment f's inputs
    blocks_w = tl.cdiv(OUT, BLOCK_O)
    block = tl.program_id(0)
    if block < blocks_w:
        cols = block * BLOCK_O + tl.arange(0, BLOCK_O)
        acc = _fragment_product(x_rows, w_ptr + f.to(tl.int64) * F * OUT, OUT, 1, cols, OUT, row_in, F, IEEE, UPCAST,
                                BLOCK_B, BLOCK_O, BLOCK_K)
        tl.store(z_ptr + (f * B + rows[:, None]).to(tl.int64) * OUT + cols[None, :], acc.to(z_ptr.dtype.element_ty),
                 mask=row_in[:, None] & (cols[None, :] < OUT))
    else:
        cols = (block - blocks_w) * BLOCK_O + tl.arange(0, BLOCK_O)  # C^T's element (k, j) is C[j, f F + k]
        acc = _fragment_product(x_rows, cw_ptr + f * F, 1, IN, cols, R, row_in, F, IEEE, UPCAST,
                                BLOCK_B, BLOCK_O, BLOCK_K)
        tl.store(q_ptr + (f * B + rows[:, None]) * R + cols[None, :], acc, mask=row_in[:, None] & (cols[None, :] < R))


# (BLOCK_O, BLOCK_K, num_stages, num_warps): W streams through [BLOCK_K, BLOCK_O] tiles, N programs per column
# block; the probe's fastest bf16 tiles first
_CONFIGS = [(256, 64, 3, 8), (128, 64, 3, 8), (128, 128, 4, 4), (64, 64, 3, 4), (64, 128, 4, 4), (32, 128, 4, 4)]
_INTERPRETER_CONFIG = (32, 32, 1, 4)  # one small tile: autotuning the interpreter would only slow the tests

# fp32 takes exact (IEEE) products: the dot becomes unrolled FMA code, whose compile time grows with the
# tile (minutes for the 128 x 128 and 64 x 256 tiles); it keeps to tiles of at most 64 x 128
_FP32_LARGEST_TILE = 64 * 128


def _prune(configs, named_args, **kwargs):
    if named_args["x_ptr"].dtype != torch.float32:
        return configs
    return [c for c in configs if c.kwargs["BLOCK_O"] * c.kwargs["BLOCK_K"] <= _FP32_LARGEST_TILE]


_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_O": o, "BLOCK_K": k}, num_stages=st, num_warps=wp) for o, k, st, wp in _CONFIGS],
    key=["B", "F", "OUT", "R"], prune_configs_by={"early_config_prune": _prune},
)(_fragment_outputs_kernel)

_LAUNCHES = LaunchCache("fragment_outputs")


def _block_b(b: int) -> int:
    return max(16, triton.next_power_of_2(b))  # tl.dot takes at least 16 rows


def _skinny(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """True when the kernels take x [B, *] (B <= MAX_ROWS, unit column stride) and the other operands."""
    return use_triton(x, *others) and 0 < x.shape[0] <= MAX_ROWS and x.stride(1) == 1


def _fragment_outputs(x: torch.Tensor, w: torch.Tensor, cw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not (_skinny(x, w, cw) and w.dtype == cw.dtype == x.dtype):
        return fragment_outputs_reference(x, w, cw)
    b = x.shape[0]
    n, f, out = w.shape
    r, n_in = cw.shape
    w, cw = w.contiguous(), cw.contiguous()
    z = torch.empty((n, b, out), dtype=x.dtype, device=x.device)
    q = torch.empty((n, b, r), dtype=torch.float32, device=x.device)
    args = (x, w, cw, z, q, b, f, out, r, n_in, x.stride(0))
    key = (b, n, f, out, r, x.stride(0), x.dtype, aligned(x, w, cw, z, q), x.device)
    _LAUNCHES.launch(key, args, lambda: _first_launch(args, n, x.dtype))
    return z, q


def _first_launch(args, n: int, dtype):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    b, out, r = args[5], args[7], args[8]
    block_b = _block_b(b)
    flags = (ieee(dtype), upcast(dtype), block_b)

    def grid_of(block_o: int) -> tuple:
        return (triton.cdiv(out, block_o) + triton.cdiv(r, block_o), n, triton.cdiv(b, block_b))

    if interpreting():
        block_o, block_k, stages, warps = _INTERPRETER_CONFIG
        compiled = _fragment_outputs_kernel[grid_of(block_o)](*args, *flags, BLOCK_O=block_o, BLOCK_K=block_k,
                                                               num_stages=stages, num_warps=warps)
        return compiled, grid_of(block_o), (*flags, block_o, block_k), {"BLOCK_O": block_o, "BLOCK_K": block_k}
    compiled = _autotuned[lambda meta: grid_of(meta["BLOCK_O"])](*args, *flags)
    best = _autotuned.best_config
    consts = (*flags, best.kwargs["BLOCK_O"], best.kwargs["BLOCK_K"])
    return compiled, grid_of(best.kwargs["BLOCK_O"]), consts, {**config_dict(best), "BLOCK_B": block_b}


_OP = register_op("fragment_outputs", _fragment_outputs,
                  lambda x, w, cw: (x.new_empty((w.shape[0], x.shape[0], w.shape[2])),
                                    x.new_empty((w.shape[0], x.shape[0], cw.shape[0]), dtype=torch.float32)))


def fragment_outputs(x: torch.Tensor, w: torch.Tensor, cw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [N, B, out], q [N, B, r] fp32) for x [B, in], W [N, F, out], C [r, in]; see the module docstring."""
    return _OP(x, w, cw) if is_compiling() else _fragment_outputs(x, w, cw)


@triton.jit
def _expert_sum_kernel(z_ptr, q_ptr, p_ptr, e_ptr, y_ptr, c_ptr, B, N, OUT, R, IEEE: tl.constexpr,
                       UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):
    """c[rows] = sum_f (1 - p[rows, f]) q[f, rows] (rounded; stored by the first column block) and
    y[rows, cols] = sum_f p[rows, f] z[f, rows, cols] + c[rows] E[cols]^T, in fp32, rounded once."""
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    row_in, col_in = rows < B, cols < OUT
    mask = row_in[:, None] & col_in[None, :]
    acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    rs = tl.arange(0, BLOCK_R)
    for r0 in range(0, R, BLOCK_R):  # the low-rank path: c [B, R] times E^T [R, out]
        r = r0 + rs
        code_mask = row_in[:, None] & (r[None, :] < R)
        code = tl.zeros([BLOCK_B, BLOCK_R], dtype=tl.float32)
        q_rows = q_ptr + rows[:, None] * R + r[None, :]
        for f in range(0, N):
            pf = tl.load(p_ptr + rows * N + f, mask=row_in, other=0.0)
            code += (1.0 - pf)[:, None] * tl.load(q_rows, mask=code_mask, other=0.0)
            q_rows += B * R
        code = code.to(y_ptr.dtype.element_ty)  # c as the layer keeps it for the backward
        if tl.program_id(0) == 0:
            tl.store(c_ptr + rows[:, None] * R + r[None, :], code, mask=code_mask)
        e = tl.load(e_ptr + cols[None, :].to(tl.int64) * R + r[:, None], mask=(r[:, None] < R) & col_in[None, :],
                    other=0.0)
        acc = dot_accumulate(code, e, acc, IEEE, UPCAST)
    z_rows = z_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :]
    for f in range(0, N):
        pf = tl.load(p_ptr + rows.to(tl.int64) * N + f, mask=row_in, other=0.0)
        acc += pf[:, None] * tl.load(z_rows, mask=mask, other=0.0).to(tl.float32)
        z_rows += B * OUT
    tl.store(y_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


_SUM_BLOCK_O, _SUM_BLOCK_R, _SUM_WARPS = 64, 64, 4  # 128 programs at out = 8192: a light pass, not tuned
_SUM_LAUNCHES = LaunchCache("expert_sum")


def _expert_sum(z: torch.Tensor, q: torch.Tensor, p: torch.Tensor, e: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    n, b, out = z.shape
    r = q.shape[2]
    if not (use_triton(z, q, p, e) and 0 < b <= MAX_ROWS and z.is_contiguous() and q.is_contiguous()
            and p.is_contiguous() and e.is_contiguous() and e.dtype == z.dtype):
        return expert_sum_reference(z, q, p, e)
    y = torch.empty((b, out), dtype=z.dtype, device=z.device)
    c = torch.empty((b, r), dtype=z.dtype, device=z.device)
    args = (z, q, p, e, y, c, b, n, out, r)
    key = (n, b, out, r, z.dtype, aligned(z, q, p, e, y, c), z.device)
    _SUM_LAUNCHES.launch(key, args, lambda: _first_sum_launch(args, z.dtype))
    return y, c


def _first_sum_launch(args, dtype):
    b, out = args[6], args[8]
    block_b = _block_b(b)
    consts = (ieee(dtype), upcast(dtype), block_b, _SUM_BLOCK_O, _SUM_BLOCK_R)
    grid = (triton.cdiv(out, _SUM_BLOCK_O), triton.cdiv(b, block_b))
    compiled = _expert_sum_kernel[grid](*args, *consts, num_warps=_SUM_WARPS)
    return compiled, grid, consts, {"BLOCK_O": _SUM_BLOCK_O, "BLOCK_R": _SUM_BLOCK_R, "BLOCK_B": block_b,
                                    "num_warps": _SUM_WARPS}


_SUM_OP = register_op("expert_sum", _expert_sum,
                      lambda z, q, p, e: (z.new_empty((z.shape[1], z.shape[2])), z.new_empty((z.shape[1], q.shape[2]))))


def expert_sum(z: torch.Tensor, q: torch.Tensor, p: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, out], c [B, r]) from z [N, B, out], q [N, B, r] fp32, p [B, N] fp32, E [out, r]; see the module
    docstring."""
    return _SUM_OP(z, q, p, e) if is_compiling() else _expert_sum(z, q, p, e)


# ---------------------------------------------------------------------------------------- references


def fragment_outputs_reference(x: torch.Tensor, w: torch.Tensor, cw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, same math: one batched matmul for z, the fp32 per-fragment codes q."""
    b = x.shape[0]
    n, f, _ = w.shape
    xf = x.reshape(b, n, f)
    q = torch.einsum("bnf,rnf->nbr", xf.float(), cw.reshape(cw.shape[0], n, f).float())
    return torch.bmm(xf.transpose(0, 1), w), q


def expert_sum_reference(z: torch.Tensor, q: torch.Tensor, p: torch.Tensor, e: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, same math: c rounded to z's dtype, then the fp32 sum of the p-weighted z and c E^T."""
    c = torch.einsum("bn,nbr->br", 1.0 - p.float(), q).to(z.dtype)
    y = torch.einsum("bn,nbo->bo", p.float(), z.float()) + c.float() @ e.float().t()
    return y.to(z.dtype), c
