"""FragmentedLinear's expert path when the layer keeps its per-fragment outputs (x needs no gradient):
both outputs from one read of the expert weights.

For x [B, in] viewed as N fragments x_f [B, F] (F = in/N), W [N, F, out], selection p [B, N] (fp32):
    z[f] = x_f W_f                      [N, B, out] in x.dtype (kept for the selector's gradient)
    y    = sum_f p[:, f] * z[f]         [B, out] in x.dtype, accumulated in fp32 from the rounded z
One program owns a block of output columns (and of rows) and walks all N fragments, so each W_f tile
is read once and y needs no second pass over z. The kernel serves skinny batches (B <= MAX_ROWS, the
layer's regime: W read once is the whole cost); larger batches, and devices Triton cannot run on, use
the torch reference (same math). Eager calls replay compiled kernels per shape; under torch.compile
this is a custom op.
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
def _fragment_outputs_kernel(x_ptr, w_ptr, p_ptr, z_ptr, y_ptr, B, N, F, OUT, stride_x,
                             IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_B: tl.constexpr,
                             BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    ks = tl.arange(0, BLOCK_K)
    row_in, col_in = rows < B, cols < OUT
    out_mask = row_in[:, None] & col_in[None, :]
    y = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x  # fragment f's inputs at f * F
    w_rows = w_ptr + cols[None, :]  # advanced by F * OUT per fragment (64-bit pointer arithmetic)
    z_rows = z_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :]  # advanced by B * OUT per fragment
    for f in range(0, N):
        acc = tl.zeros([BLOCK_B, BLOCK_O], dtype=tl.float32)
        for k0 in range(0, F, BLOCK_K):
            k = k0 + ks
            a = tl.load(x_rows + f * F + k[None, :], mask=row_in[:, None] & (k[None, :] < F), other=0.0)
            w = tl.load(w_rows + k[:, None].to(tl.int64) * OUT, mask=(k[:, None] < F) & col_in[None, :], other=0.0)
            acc = dot_accumulate(a, w, acc, IEEE, UPCAST)
        z = acc.to(z_ptr.dtype.element_ty)
        tl.store(z_rows, z, mask=out_mask)
        pf = tl.load(p_ptr + rows.to(tl.int64) * N + f, mask=row_in, other=0.0)
        y += pf[:, None] * z.to(tl.float32)
        w_rows += F * OUT
        z_rows += B * OUT
    tl.store(y_ptr + rows[:, None].to(tl.int64) * OUT + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=out_mask)


# (BLOCK_O, BLOCK_K, num_stages, num_warps): W streams through [BLOCK_K, BLOCK_O] tiles; narrow column
# blocks give every SM a program or two, deep pipelines keep enough of W in flight per SM
_CONFIGS = [(32, 128, 4, 4), (64, 128, 4, 4), (64, 64, 5, 4), (128, 64, 4, 4), (32, 256, 3, 4), (32, 256, 4, 4),
            (64, 256, 3, 8), (128, 128, 3, 8)]
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
    key=["B", "N", "F", "OUT"], prune_configs_by={"early_config_prune": _prune},
)(_fragment_outputs_kernel)

_LAUNCHES = LaunchCache("fragment_outputs")


def _block_b(b: int) -> int:
    return max(16, triton.next_power_of_2(b))  # tl.dot takes at least 16 rows


def _fragment_outputs(x: torch.Tensor, w: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = x.shape[0]
    n, f, out = w.shape
    if not (use_triton(x, w, p) and b <= MAX_ROWS and x.stride(1) == 1 and b > 0):
        return fragment_outputs_reference(x, w, p)
    w, p = w.contiguous(), p.contiguous()
    z = torch.empty((n, b, out), dtype=x.dtype, device=x.device)
    y = torch.empty((b, out), dtype=x.dtype, device=x.device)
    args = (x, w, p, z, y, b, n, f, out, x.stride(0))
    key = (b, n, f, out, x.stride(0), x.dtype, w.dtype, aligned(x, w, p, z, y), x.device)
    _LAUNCHES.launch(key, args, lambda: _first_launch(args, x.dtype))
    return z, y


def _first_launch(args, dtype):
    """Launch through Triton, autotuning on a GPU; (compiled, grid, constexprs, config for the record)."""
    b, out = args[5], args[8]
    block_b = _block_b(b)
    flags = (ieee(dtype), upcast(dtype), block_b)
    if interpreting():
        block_o, block_k, stages, warps = _INTERPRETER_CONFIG
        grid = (triton.cdiv(out, block_o), triton.cdiv(b, block_b))
        compiled = _fragment_outputs_kernel[grid](*args, *flags, BLOCK_O=block_o, BLOCK_K=block_k,
                                                  num_stages=stages, num_warps=warps)
        return compiled, grid, (*flags, block_o, block_k), {"BLOCK_O": block_o, "BLOCK_K": block_k}
    grid = lambda meta: (triton.cdiv(out, meta["BLOCK_O"]), triton.cdiv(b, block_b))  # noqa: E731
    compiled = _autotuned[grid](*args, *flags)
    best = _autotuned.best_config
    consts = (*flags, best.kwargs["BLOCK_O"], best.kwargs["BLOCK_K"])
    return compiled, grid(best.kwargs), consts, {**config_dict(best), "BLOCK_B": block_b}


_OP = register_op("fragment_outputs", _fragment_outputs,
                  lambda x, w, p: (x.new_empty((w.shape[0], x.shape[0], w.shape[2])),
                                   x.new_empty((x.shape[0], w.shape[2]))))


def fragment_outputs(x: torch.Tensor, w: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [N, B, out], y [B, out]) for x [B, in], W [N, F, out], p [B, N] fp32; see the module docstring."""
    return _OP(x, w, p) if is_compiling() else _fragment_outputs(x, w, p)


def fragment_outputs_reference(x: torch.Tensor, w: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, same math: one batched matmul for z, then the fp32 p-weighted sum of the rounded z."""
    b = x.shape[0]
    n, f, _ = w.shape
    z = torch.bmm(x.reshape(b, n, f).transpose(0, 1), w)  # [N, B, out]
    y = torch.einsum("bn,nbo->bo", p.float(), z.float()).to(x.dtype)
    return z, y
