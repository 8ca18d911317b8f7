"""FragmentedLinear's selector prologue in one kernel: scores, selection and both scaled inputs.

Math, for one row x [in] viewed as N fragments x_f [F] (F = in/N), selector weights S [N, F]:
    score_f = <x_f, S_f>                    (fp32)
    soft:  p = softmax_f(score)             hard: p = one_hot(argmax_f score)  (first index on ties)
    u_f = x_f * p_f      (the expert path's input: one dense matmul with W [in, out] follows)
    v_f = x_f * (1 - p_f) (the low-rank path's input)
Shapes: x [B, in] (row stride free, unit column stride), S [N, F] -> u, v [B, in] in x.dtype,
p [B, N] fp32, idx [B] int64 (hard only). One program per row holds the whole row as an [N, F]
tile, so one launch replaces the einsum, softmax (or argmax + one-hot), and the two scalings.
Rows wider than MAX_TILE padded elements use the torch reference (same math).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import use_triton

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


def _blocks(n: int, f: int) -> tuple[int, int]:
    return triton.next_power_of_2(n), triton.next_power_of_2(f)


def select_scale(x, s, hard: bool):
    """(u, v, p, idx) for x [B, in], S [N, F]; idx is None for the soft selection. See the docstring."""
    import torch

    b = x.shape[0]
    n, f = s.shape
    block_n, block_f = _blocks(n, f)
    if not use_triton(x, s) or block_n * block_f > MAX_TILE or x.stride(1) != 1 or b == 0:
        return select_scale_reference(x, s, hard)
    s = s.contiguous()
    u = torch.empty((b, n * f), dtype=x.dtype, device=x.device)
    v = torch.empty_like(u)
    p = torch.empty((b, n), dtype=torch.float32, device=x.device)
    idx = torch.empty(b, dtype=torch.int64, device=x.device) if hard else p  # p: unused dummy pointer
    warps = 8 if block_n * block_f >= 4096 else 4
    _select_scale_kernel[(b,)](x, s, u, v, p, idx, n, f, x.stride(0), HARD=hard,
                               BLOCK_N=block_n, BLOCK_F=block_f, num_warps=warps)
    return u, v, p, (idx if hard else None)


def select_scale_reference(x, s, hard: bool):
    """Plain torch, same math and dtypes as the kernel."""
    import torch

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
