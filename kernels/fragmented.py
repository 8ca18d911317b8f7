"""FragmentedLinear's selector in one kernel each way: scores, selection and both scaled inputs
forward; the input and selector gradients backward.

Forward, for one row x [in] viewed as N fragments x_f [F] (F = in/N), selector weights S [N, F]:
    score_f = <x_f, S_f>                    (fp32)
    soft:  p = softmax_f(score)             hard: p = one_hot(argmax_f score)  (first index on ties)
    u_f = x_f * p_f       (the expert path's input: one dense matmul with W [in, out] follows)
    v_f = x_f * (1 - p_f) (the low-rank path's input)
Backward, given du, dv [B, in]:
    dp_f = <du_f - dv_f, x_f>,  dscore = p * (dp - <p, dp>)            (soft only; argmax has no gradient)
    dx_f = du_f p_f + dv_f (1 - p_f) + dscore_f S_f                     (the last term soft only)
    dS_f = sum_b dscore[b, f] x[b, f]                                   (soft only)
The selector's gradient alone (soft; x needs no gradient), given the expert path's per-fragment
outputs z [N, B, out] (z_f = x_f W_f, so <du_f, x_f> = <dy, z_f> and du = dy W^T is never formed):
    dp_f = <dy, z_f> - <dv_f, x_f>,  dscore and dS as above           (selector_gradient)
Shapes: x [B, in] (row stride free, unit column stride), S [N, F] -> u, v [B, in] in x.dtype, p [B, N]
fp32, idx [B] int64 (hard only); dx [B, in] in x.dtype, dS [N, F] in S.dtype. One program per row holds
the whole row as an [N, F] tile (forward, and the row part of backward); dS takes a second launch with
one program per fragment, summing over the rows. selector_gradient splits each row's dp into S pieces (B
x S programs: its z pass reads N x B x out values) and works out dscore in the dS pass. Rows wider than
MAX_TILE padded elements use the torch references (same math). Eager calls launch directly and replay
compiled kernels per shape (kernels._common.launch.LaunchCache); under torch.compile they are custom ops.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, is_compiling, next_power_of_2, register_op, use_triton
from kernels._common.launch import LaunchCache, aligned

MAX_TILE = 32768  # padded elements per row held in registers (128 KB of fp32 over 8 warps)


@triton.jit
def _select_scale_kernel(x_ptr, s_ptr, u_ptr, v_ptr, p_ptr, idx_ptr, N, F, stride_x,
                         HARD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ns = tl.arange(0, BLOCK_N)
    fs = tl.arange(0, BLOCK_F)
    mask = (ns[:, None] < N) & (fs[None, :] < F)
    offs = ns[:, None] * F + fs[None, :]  # [BLOCK_N, BLOCK_F] position inside the row
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    score = tl.where(ns < N, tl.sum(x * s, axis=1), float("-inf"))  # [BLOCK_N]
    if HARD:
        best = tl.argmax(score, axis=0, tie_break_left=True)
        p = tl.where(ns == best, 1.0, 0.0)
        tl.store(idx_ptr + row, best.to(tl.int64))
    else:
        e = tl.exp(score - tl.max(score, axis=0))  # padded fragments: exp(-inf) = 0
        p = e / tl.sum(e, axis=0)
    tl.store(p_ptr + row * N + ns, p, mask=ns < N)
    u = x * p[:, None]
    v = x * (1.0 - p[:, None])
    out = row * N * F + offs
    tl.store(u_ptr + out, u.to(u_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + out, v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _select_scale_backward_kernel(x_ptr, s_ptr, p_ptr, du_ptr, dv_ptr, dx_ptr, dscore_ptr, N, F, stride_x,
                                  HARD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """One row: dx [in] and (soft) dscore [N] from du, dv [in], p [N], x [in], S [N, F]."""
    row = tl.program_id(0).to(tl.int64)
    ns = tl.arange(0, BLOCK_N)
    fs = tl.arange(0, BLOCK_F)
    mask = (ns[:, None] < N) & (fs[None, :] < F)
    offs = ns[:, None] * F + fs[None, :]
    du = tl.load(du_ptr + row * N * F + offs, mask=mask, other=0.0).to(tl.float32)
    dv = tl.load(dv_ptr + row * N * F + offs, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + row * N + ns, mask=ns < N, other=0.0)
    dx = du * p[:, None] + dv * (1.0 - p[:, None])
    if not HARD:
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dp = tl.sum((du - dv) * x, axis=1)  # [BLOCK_N]
        dscore = p * (dp - tl.sum(p * dp, axis=0))
        tl.store(dscore_ptr + row * N + ns, dscore, mask=ns < N)
        dx += dscore[:, None] * s
    tl.store(dx_ptr + row * N * F + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _selector_partial_kernel(x_ptr, dv_ptr, z_ptr, dy_ptr, part_ptr, B, N, F, OUT, CHUNK_O, CHUNK_F, stride_x,
                             stride_dy, BLOCK_N: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_F: tl.constexpr):
    """Program (b, s): part[s, b, :N] = sum over output chunk s of dy[b, o] z[:, b, o] minus the sum
    over feature chunk s of dv[b, :, f] x[b, :, f] (z [N, B, OUT] contiguous): dp of row b in S pieces,
    so that B x S programs share the work (one program per row left most SMs idle)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    ns = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    z_rows = z_ptr + ns[:, None].to(tl.int64) * B * OUT + row * OUT
    o_end = tl.minimum(s * CHUNK_O + CHUNK_O, OUT)
    for o0 in range(s * CHUNK_O, o_end, BLOCK_O):
        os = o0 + tl.arange(0, BLOCK_O)
        d = tl.load(dy_ptr + row * stride_dy + os, mask=os < o_end, other=0.0).to(tl.float32)
        z = tl.load(z_rows + os[None, :], mask=(ns[:, None] < N) & (os[None, :] < o_end), other=0.0)
        acc += tl.sum(z.to(tl.float32) * d[None, :], axis=1)
    fs = s * CHUNK_F + tl.arange(0, BLOCK_F)
    mask = (ns[:, None] < N) & (fs[None, :] < tl.minimum(s * CHUNK_F + CHUNK_F, F))
    offs = ns[:, None] * F + fs[None, :]
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    dv = tl.load(dv_ptr + row * N * F + offs, mask=mask, other=0.0).to(tl.float32)
    acc -= tl.sum(dv * x, axis=1)
    tl.store(part_ptr + (s * B + row) * N + ns, acc, mask=ns < N)


@triton.jit
def _selector_grad_partials_kernel(x_ptr, part_ptr, p_ptr, ds_ptr, B, N, F, S, stride_x, BLOCK_S: tl.constexpr,
                                   BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """dS[n, f block] = sum_b dscore[b, n] x[b, n, f block], with dscore = p * (dp - <p, dp>) worked out
    here from dp = the S partial sums part[:, b, :] (program (n, f block) walks the rows)."""
    n = tl.program_id(0)
    fs = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    ss = tl.arange(0, BLOCK_S)
    ns = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        bs = b0 + tl.arange(0, BLOCK_B)
        parts = part_ptr + (ss[:, None, None] * B + bs[None, :, None]) * N + ns[None, None, :]
        inside = (ss[:, None, None] < S) & (bs[None, :, None] < B) & (ns[None, None, :] < N)
        dp = tl.sum(tl.load(parts, mask=inside, other=0.0), axis=0)  # [BLOCK_B, BLOCK_N]
        rows = (bs[:, None] < B) & (ns[None, :] < N)
        p = tl.load(p_ptr + bs[:, None].to(tl.int64) * N + ns[None, :], mask=rows, other=0.0)
        dscore = p * (dp - tl.sum(p * dp, axis=1)[:, None])
        d = tl.sum(tl.where(ns[None, :] == n, dscore, 0.0), axis=1)  # [BLOCK_B]: column n
        m = (bs[:, None] < B) & (fs[None, :] < F)
        x = tl.load(x_ptr + bs[:, None].to(tl.int64) * stride_x + n * F + fs[None, :], mask=m, other=0.0)
        acc += tl.sum(x.to(tl.float32) * d[:, None], axis=0)
    tl.store(ds_ptr + n * F + fs, acc.to(ds_ptr.dtype.element_ty), mask=fs < F)


@triton.jit
def _selector_grad_kernel(x_ptr, dscore_ptr, ds_ptr, B, N, F, stride_x, BLOCK_B: tl.constexpr,
                          BLOCK_F: tl.constexpr):
    """dS[n, f block] = sum_b dscore[b, n] x[b, n, f block]: program (n, f block) walks the rows."""
    n = tl.program_id(0)
    fs = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        bs = b0 + tl.arange(0, BLOCK_B)
        m = (bs[:, None] < B) & (fs[None, :] < F)
        x = tl.load(x_ptr + bs[:, None].to(tl.int64) * stride_x + n * F + fs[None, :], mask=m, other=0.0)
        d = tl.load(dscore_ptr + bs.to(tl.int64) * N + n, mask=bs < B, other=0.0)
        acc += tl.sum(x.to(tl.float32) * d[:, None], axis=0)
    tl.store(ds_ptr + n * F + fs, acc.to(ds_ptr.dtype.element_ty), mask=fs < F)


# ---------------------------------------------------------------------------------------- launchers


@functools.cache
def _blocks(n: int, f: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_F) of a selector [n, f] (cached: triton.next_power_of_2 costs host time per call)."""
    return next_power_of_2(n), next_power_of_2(f)


def _fits(x, s) -> bool:
    block_n, block_f = _blocks(*s.shape)
    return use_triton(x, s) and block_n * block_f <= MAX_TILE and x.stride(1) == 1 and x.shape[0] > 0


_FORWARD = LaunchCache("fragmented_select_scale")
_BACKWARD = LaunchCache("fragmented_select_scale_backward")
_SELECTOR = LaunchCache("fragmented_selector_grad")
_PARTIAL = LaunchCache("fragmented_selector_partial")
_FROM_PARTIALS = LaunchCache("fragmented_selector_grad_partials")


def _row_launch(cache, kernel, key, args, grid, n, f, hard):
    block_n, block_f = _blocks(n, f)
    consts = (hard, block_n, block_f)

    def first():
        warps = 8 if block_n * block_f >= 4096 else 4
        compiled = kernel[grid](*args, *consts, num_warps=warps)
        return compiled, grid, consts, {"BLOCK_N": block_n, "BLOCK_F": block_f, "num_warps": warps}

    cache.launch(key, args, first)


def _select_scale(x: torch.Tensor, s: torch.Tensor, hard: bool):
    if not _fits(x, s):
        u, v, p, idx = select_scale_reference(x, s, hard)
        return u, v, p, idx if hard else p.new_empty(0, dtype=torch.int64)
    b = x.shape[0]
    n, f = s.shape
    s = s.contiguous()
    u = torch.empty((b, n * f), dtype=x.dtype, device=x.device)
    v = torch.empty_like(u)
    p = torch.empty((b, n), dtype=torch.float32, device=x.device)
    idx = torch.empty(b if hard else 0, dtype=torch.int64, device=x.device)
    args = (x, s, u, v, p, idx if hard else p, n, f, x.stride(0))
    key = (b, n, f, x.stride(0), x.dtype, s.dtype, hard, aligned(x, s, u, v, p, idx), x.device)
    _row_launch(_FORWARD, _select_scale_kernel, key, args, (b,), n, f, hard)
    return u, v, p, idx


def _select_scale_backward(x, s, p, du, dv, hard: bool):
    if not _fits(x, s):
        return select_scale_backward_reference(x, s, p, du, dv, hard)
    b = x.shape[0]
    n, f = s.shape
    s, du, dv = s.contiguous(), du.contiguous(), dv.contiguous()
    dx = torch.empty((b, n * f), dtype=x.dtype, device=x.device)
    dscore = torch.empty((b, n) if not hard else 0, dtype=torch.float32, device=x.device)
    args = (x, s, p, du, dv, dx, dscore if not hard else p, n, f, x.stride(0))
    key = (b, n, f, x.stride(0), x.dtype, s.dtype, du.dtype, dv.dtype, hard, aligned(x, s, p, du, dv, dx, dscore),
           x.device)
    _row_launch(_BACKWARD, _select_scale_backward_kernel, key, args, (b,), n, f, hard)
    if hard:
        return dx, s.new_zeros(0)
    return dx, _selector_grad(x, dscore, s)


def _selector_gradient(x, s, p, dv, z, dy):
    if not _fits(x, s):
        return selector_gradient_reference(x, s, p, dv, z, dy)
    b = x.shape[0]
    n, f = s.shape
    out = z.shape[2]
    dv, z = dv.contiguous(), z.contiguous()
    tile = _partial_tile(b, n, f, out)
    chunk_o, chunk_f, pieces = tile[:3]
    part = torch.empty((pieces, b, n), dtype=torch.float32, device=x.device)
    args = (x, dv, z, dy, part, b, n, f, out, chunk_o, chunk_f, x.stride(0), dy.stride(0))
    key = (b, n, f, out, x.stride(0), dy.stride(0), x.dtype, dv.dtype, z.dtype, dy.dtype,
           aligned(x, dv, z, dy, part), x.device)
    _PARTIAL.launch(key, args, lambda: _first_partial(args, tile))
    ds = torch.empty_like(s)
    args = (x, part, p, ds, b, n, f, pieces, x.stride(0))
    key = (b, n, f, pieces, x.stride(0), x.dtype, s.dtype, aligned(x, part, p, ds), x.device)
    _FROM_PARTIALS.launch(key, args, lambda: _first_from_partials(args, tile))
    return ds


PARTIAL_PROGRAMS = 512  # programs of the partial dp pass to aim for (a few per SM)


@functools.cache
def _partial_tile(b: int, n: int, f: int, out: int) -> tuple[int, ...]:
    """(CHUNK_O, CHUNK_F, S pieces per row, BLOCK_N, BLOCK_O, BLOCK_F, BLOCK_S, BLOCK_B) of the selector's
    two passes: rows split into S pieces so that about PARTIAL_PROGRAMS programs share the z pass."""
    block_n = next_power_of_2(n)
    block_o = max(16, min(next_power_of_2(out), 2048 // block_n, 256))
    pieces = max(1, min(cdiv(PARTIAL_PROGRAMS, b), cdiv(out, block_o), 4096 // block_n))
    chunk_o = cdiv(cdiv(out, pieces), block_o) * block_o
    pieces = cdiv(out, chunk_o)
    chunk_f = cdiv(f, pieces)
    block_s = next_power_of_2(pieces)
    block_b = max(1, min(16, 4096 // (block_s * block_n)))
    return chunk_o, chunk_f, pieces, block_n, block_o, next_power_of_2(chunk_f), block_s, block_b


def _first_partial(args, tile):
    chunk_o, chunk_f, pieces, block_n, block_o, block_f = tile[:6]
    grid, consts = (args[5], pieces), (block_n, block_o, block_f)
    compiled = _selector_partial_kernel[grid](*args, *consts, num_warps=4)
    return compiled, grid, consts, {"S": pieces, "BLOCK_N": block_n, "BLOCK_O": block_o, "BLOCK_F": block_f}


def _first_from_partials(args, tile):
    n, f = args[5], args[6]
    block_n, block_s, block_b = tile[3], tile[6], tile[7]
    block_f = min(next_power_of_2(f), 256)
    grid, consts = (n, cdiv(f, block_f)), (block_s, block_b, block_n, block_f)
    compiled = _selector_grad_partials_kernel[grid](*args, *consts, num_warps=4)
    return compiled, grid, consts, {"BLOCK_S": block_s, "BLOCK_B": block_b, "BLOCK_F": block_f}


def _selector_grad(x, dscore, s):
    b = x.shape[0]
    n, f = s.shape
    ds = torch.empty_like(s)
    args = (x, dscore, ds, b, n, f, x.stride(0))

    def first():  # the tile is worked out here only: triton.cdiv and friends cost host time per call
        block_f = min(next_power_of_2(f), 256)
        grid, consts = (n, cdiv(f, block_f)), (16, block_f)
        return _selector_grad_kernel[grid](*args, *consts, num_warps=4), grid, consts, {"BLOCK_F": block_f}

    _SELECTOR.launch((b, n, f, x.stride(0), x.dtype, s.dtype, aligned(x, dscore, ds), x.device), args, first)
    return ds


# ------------------------------------------------------------------------ public API and custom ops


def _op_forward(x: torch.Tensor, s: torch.Tensor, hard: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                          torch.Tensor]:
    return _select_scale(x, s, hard)


def _op_backward(x: torch.Tensor, s: torch.Tensor, p: torch.Tensor, du: torch.Tensor, dv: torch.Tensor,
                 hard: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _select_scale_backward(x, s, p, du, dv, hard)


def _fake_forward(x, s, hard):
    b, (n, f) = x.shape[0], s.shape
    u = x.new_empty((b, n * f))
    return u, torch.empty_like(u), x.new_empty((b, n), dtype=torch.float32), x.new_empty(b if hard else 0,
                                                                                          dtype=torch.int64)


def _fake_backward(x, s, p, du, dv, hard):
    return x.new_empty((x.shape[0], s.numel())), s.new_empty(0 if hard else s.shape)


def _op_selector_gradient(x: torch.Tensor, s: torch.Tensor, p: torch.Tensor, dv: torch.Tensor, z: torch.Tensor,
                          dy: torch.Tensor) -> torch.Tensor:
    return _selector_gradient(x, s, p, dv, z, dy)


_OPS = {"forward": register_op("fragmented_select_scale", _op_forward, _fake_forward),
        "backward": register_op("fragmented_select_scale_backward", _op_backward, _fake_backward),
        "selector": register_op("fragmented_selector_gradient", _op_selector_gradient,
                                lambda x, s, p, dv, z, dy: torch.empty_like(s))}


def select_scale(x, s, hard: bool):
    """(u, v, p, idx) for x [B, in], S [N, F]; idx is [B] int64 for the hard selection, empty for the
    soft one. See the module docstring."""
    return _OPS["forward"](x, s, hard) if is_compiling() else _select_scale(x, s, hard)


def select_scale_backward(x, s, p, du, dv, hard: bool):
    """(dx [B, in] in x.dtype, dS [N, F] in S.dtype; empty for the hard selection)."""
    if is_compiling():
        return _OPS["backward"](x, s, p, du, dv, hard)
    return _select_scale_backward(x, s, p, du, dv, hard)


def selector_gradient(x, s, p, dv, z, dy):
    """dS [N, F] in S.dtype of the soft selection when x needs no gradient: from the expert path's
    per-fragment outputs z [N, B, out] (z_f = x_f W_f) and dy [B, out], with dv [B, in] of the
    low-rank path (see the module docstring); no dy W^T is formed."""
    return _OPS["selector"](x, s, p, dv, z, dy) if is_compiling() else _selector_gradient(x, s, p, dv, z, dy)


# ---------------------------------------------------------------------------------------- references


def select_scale_reference(x, s, hard: bool):
    """Plain torch, same math and dtypes as the kernel; idx is None for the soft selection."""
    b = x.shape[0]
    n, f = s.shape
    xf = x.reshape(b, n, f).float()
    scores = torch.einsum("bnf,nf->bn", xf, s.float())
    idx = None
    if hard:
        idx = scores.argmax(dim=1)
        p = (idx[:, None] == torch.arange(n, device=x.device)).float()
    else:
        p = torch.softmax(scores, dim=1)
    u = (xf * p[:, :, None]).to(x.dtype).reshape(b, n * f)
    v = (xf * (1 - p[:, :, None])).to(x.dtype).reshape(b, n * f)
    return u, v, p, idx


def select_scale_backward_reference(x, s, p, du, dv, hard: bool):
    """Plain torch, same math as the backward kernels (fp32 inside)."""
    b, (n, f) = x.shape[0], s.shape
    xf = x.reshape(b, n, f).float()
    du, dv, pe = du.reshape(b, n, f).float(), dv.reshape(b, n, f).float(), p[:, :, None]
    dx = du * pe + dv * (1 - pe)
    if hard:
        return dx.to(x.dtype).reshape(x.shape), s.new_zeros(0)
    dscore, ds = _selector_reference(p, ((du - dv) * xf).sum(-1), xf, s.dtype)
    dx = dx + dscore[:, :, None] * s.float()
    return dx.to(x.dtype).reshape(x.shape), ds


def selector_gradient_reference(x, s, p, dv, z, dy):
    """Plain torch, same math as selector_gradient (fp32 inside)."""
    b, (n, f) = x.shape[0], s.shape
    xf = x.reshape(b, n, f).float()
    dp = torch.einsum("nbo,bo->bn", z.float(), dy.float()) - (dv.reshape(b, n, f).float() * xf).sum(-1)
    return _selector_reference(p, dp, xf, s.dtype)[1]


def _selector_reference(p, dp, xf, dtype):
    """(dscore [B, N], dS [N, F] in dtype) from the gradient dp [B, N] of the selection p (softmax's
    backward) and the fragments xf [B, N, F] (fp32)."""
    dscore = p * (dp - (p * dp).sum(1, keepdim=True))
    return dscore, torch.einsum("bn,bnf->nf", dscore, xf).to(dtype)
