"""FragmentedLinear's expert path when the layer keeps its per-fragment outputs (x needs no gradient),
and its weight gradient.

For x [B, in] viewed as N fragments x_f [B, F] (F = in/N), W [N, F, out], selection p [B, N] (fp32),
the low-rank path's code c [B, r] and its expansion E [out, r]:
    z[f] = x_f W_f                          [N, B, out] in x.dtype (kept for the selector's gradient)
    y    = sum_f p[:, f] * z[f] + c E^T     [B, out] in x.dtype, summed in fp32 from the rounded z, one rounding
`fragment_outputs` computes z with one program per (column block, fragment, row block): W is read once and
every SM has programs to stream it with (on an H200, bf16, 8192 x 8192, 8 fragments, B = 16: 38.8 us
against 44.6 us for one program per column block walking all fragments, probe). `expert_sum` then forms y
from z (2 MB at that size, against W's 128 MiB) and adds the low-rank path in the same pass, so the
layer's forward needs no separate addmm. Both serve skinny batches (B <= MAX_ROWS, the layer's regime:
W read once is the whole cost); larger batches, and devices Triton cannot run on, use the torch references
(same math). Eager calls replay compiled kernels per shape; under torch.compile these are custom ops.

The layer's weight gradient dW = u^T dy (u = x scaled by p, [B, in]; dy [B, out]) is, at such batches, an
outer product of rank B that writes as many bytes as W has and reads next to nothing: `expert_weight_grad`
runs it as a persistent kernel that streams tiles of dW out (same H200 case: 35.8 us against 46.0 us for
cuBLAS's u^T @ dy, probe), with the same torch fallback.
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
def _fragment_outputs_kernel(x_ptr, w_ptr, z_ptr, B, F, OUT, stride_x, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                             BLOCK_B: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr):
    """z[f, rows, cols] = x_f W_f for program (column block, fragment f, row block)."""
    f = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    ks = tl.arange(0, BLOCK_K)
    row_in, col_in = rows < B, cols < OUT
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
    key=["B", "F", "OUT"], prune_configs_by={"early_config_prune": _prune},
)(_fragment_outputs_kernel)

_LAUNCHES = LaunchCache("fragment_outputs")


def _block_b(b: int) -> int:
    return max(16, triton.next_power_of_2(b))  # tl.dot takes at least 16 rows


def _fragment_outputs(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    n, f, out = w.shape
    if not (use_triton(x, w) and b <= MAX_ROWS and x.stride(1) == 1 and b > 0):
        return fragment_outputs_reference(x, w)
    w = w.contiguous()
    z = torch.empty((n, b, out), dtype=x.dtype, device=x.device)
    args = (x, w, z, b, f, out, x.stride(0))
    key = (b, n, f, out, x.stride(0), x.dtype, w.dtype, aligned(x, w, z), x.device)
    _LAUNCHES.launch(key, args, lambda: _first_launch(args, n, x.dtype))
    return z


def _first_launch(args, n: int, dtype):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    b, out = args[3], args[5]
    block_b = _block_b(b)
    flags = (ieee(dtype), upcast(dtype), block_b)
    if interpreting():
        block_o, block_k, stages, warps = _INTERPRETER_CONFIG
        grid = (triton.cdiv(out, block_o), n, triton.cdiv(b, block_b))
        compiled = _fragment_outputs_kernel[grid](*args, *flags, BLOCK_O=block_o, BLOCK_K=block_k,
                                                  num_stages=stages, num_warps=warps)
        return compiled, grid, (*flags, block_o, block_k), {"BLOCK_O": block_o, "BLOCK_K": block_k}
    grid = lambda meta: (triton.cdiv(out, meta["BLOCK_O"]), n, triton.cdiv(b, block_b))  # noqa: E731
    compiled = _autotuned[grid](*args, *flags)
    best = _autotuned.best_config
    consts = (*flags, best.kwargs["BLOCK_O"], best.kwargs["BLOCK_K"])
    return compiled, grid(best.kwargs), consts, {**config_dict(best), "BLOCK_B": block_b}


_OP = register_op("fragment_outputs", _fragment_outputs,
                  lambda x, w: x.new_empty((w.shape[0], x.shape[0], w.shape[2])))


def fragment_outputs(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """z [N, B, out] (z_f = x_f W_f) for x [B, in], W [N, F, out]; see the module docstring."""
    return _OP(x, w) if is_compiling() else _fragment_outputs(x, w)


def fragment_outputs_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain torch, same math: one batched matmul."""
    b = x.shape[0]
    n, f, _ = w.shape
    return torch.bmm(x.reshape(b, n, f).transpose(0, 1), w)


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
    block_b = _block_b(b)
    consts = (ieee(dtype), upcast(dtype), block_b, _SUM_BLOCK_O, _SUM_BLOCK_R)
    grid = (triton.cdiv(out, _SUM_BLOCK_O), triton.cdiv(b, block_b))
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


@triton.jit
def _weight_grad_kernel(u_ptr, dy_ptr, dw_ptr, B, IN, OUT, stride_u, stride_dy, PROGRAMS: tl.constexpr,
                        IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_B: tl.constexpr):
    """dW [IN, OUT] = u^T dy: PROGRAMS programs walk the [BLOCK_M, BLOCK_N] tiles of dW in row-major order
    (neighbouring programs write neighbouring columns), each tile a sum over B in BLOCK_B row chunks."""
    tiles_n = tl.cdiv(OUT, BLOCK_N)
    tiles = tl.cdiv(IN, BLOCK_M) * tiles_n
    chunk = tl.arange(0, BLOCK_B)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS):
        rm = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for b0 in range(0, B, BLOCK_B):
            rb = b0 + chunk
            a = tl.load(u_ptr + rb[None, :].to(tl.int64) * stride_u + rm[:, None],
                        mask=(rb[None, :] < B) & (rm[:, None] < IN), other=0.0)  # u^T tile [BLOCK_M, BLOCK_B]
            d = tl.load(dy_ptr + rb[:, None].to(tl.int64) * stride_dy + rn[None, :],
                        mask=(rb[:, None] < B) & (rn[None, :] < OUT), other=0.0)
            acc = dot_accumulate(a, d, acc, IEEE, UPCAST)
        tl.store(dw_ptr + rm[:, None].to(tl.int64) * OUT + rn[None, :], acc.to(dw_ptr.dtype.element_ty),
                 mask=(rm[:, None] < IN) & (rn[None, :] < OUT))


# (BLOCK_M, BLOCK_N, num_warps): the probe's fastest tiles for the bf16 8192 x 8192 case, two programs per SM
_GRAD_CONFIGS = [(64, 128, 4), (64, 128, 8), (128, 128, 4), (128, 128, 8), (64, 256, 4)]
_GRAD_PROGRAMS_PER_SM = 2


def _prune_grad(configs, named_args, **kwargs):
    if named_args["u_ptr"].dtype != torch.float32:
        return configs
    return [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= _FP32_LARGEST_TILE]


_grad_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_stages=2, num_warps=w) for m, n, w in _GRAD_CONFIGS],
    key=["B", "IN", "OUT"], prune_configs_by={"early_config_prune": _prune_grad},
)(_weight_grad_kernel)

_GRAD_LAUNCHES = LaunchCache("expert_weight_grad")
_INTERPRETER_GRAD = (32, 32, 3)  # (BLOCK_M, BLOCK_N, programs): a few programs, each walking several tiles


def _expert_weight_grad(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    b, n_in = u.shape
    out = dy.shape[1]
    if not (use_triton(u, dy) and 0 < b <= MAX_ROWS and u.stride(1) == 1 and dy.stride(1) == 1
            and u.dtype == dy.dtype):
        return expert_weight_grad_reference(u, dy)
    dw = torch.empty((n_in, out), dtype=dy.dtype, device=dy.device)
    args = (u, dy, dw, b, n_in, out, u.stride(0), dy.stride(0))
    key = (b, n_in, out, u.stride(0), dy.stride(0), u.dtype, aligned(u, dy, dw), u.device)
    _GRAD_LAUNCHES.launch(key, args, lambda: _first_grad_launch(args, u))
    return dw


def _first_grad_launch(args, u: torch.Tensor):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    flags = (ieee(u.dtype), upcast(u.dtype))
    if interpreting():
        block_m, block_n, programs = _INTERPRETER_GRAD
        consts = (programs, *flags, block_m, block_n, 16)
        compiled = _weight_grad_kernel[(programs,)](*args, *consts)
        return compiled, (programs,), consts, {"BLOCK_M": block_m, "BLOCK_N": block_n, "PROGRAMS": programs}
    programs = _GRAD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(u.device).multi_processor_count
    compiled = _grad_autotuned[(programs,)](*args, programs, *flags, BLOCK_B=16)
    best = _grad_autotuned.best_config
    consts = (programs, *flags, best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], 16)
    return compiled, (programs,), consts, {**config_dict(best), "PROGRAMS": programs, "BLOCK_B": 16}


_GRAD_OP = register_op("expert_weight_grad", _expert_weight_grad,
                       lambda u, dy: u.new_empty((u.shape[1], dy.shape[1])))


def expert_weight_grad(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dW [in, out] = u^T dy for u [B, in], dy [B, out] (one dtype); see the module docstring."""
    return _GRAD_OP(u, dy) if is_compiling() else _expert_weight_grad(u, dy)


def expert_weight_grad_reference(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return u.t() @ dy
