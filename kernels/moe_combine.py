"""The MoE combine (weighted sum of every token's k expert outputs) and its backward, one kernel each.

For T tokens, k choices, assignment a = j * T + t and rows[a] its row in src (-1: dropped):
    out[t]     = sum_j w[t, j] * src[rows[a]]                      [T, d]   (fp32 sums)
    d_src[r]   = w[t, j] * dout[t]          for r = rows[a]         [S, d]   (other rows zero)
    d_w[t, j]  = <src[rows[a]], dout[t]>                            [T, k]   (fp32)
With w = None the same forward is the backward of gathering token rows into the send buffer
(dx[t] = sum_j d_send[rows[a]]), so the layer needs no index_add with atomics.
Rows must be distinct (apart from -1): every assignment owns its row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import interpreting, use_triton

BT, BD = (8, 16) if interpreting() else (32, 128)


@triton.jit
def _combine_kernel(src_ptr, rows_ptr, w_ptr, out_ptr, T, D,
                    K: tl.constexpr, HAS_W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    t_ok = t < T
    c_ok = c < D
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(K):
        row = tl.load(rows_ptr + j * T + t, mask=t_ok, other=-1)
        ok = (row >= 0)[:, None] & c_ok[None, :]
        y = tl.load(src_ptr + row[:, None].to(tl.int64) * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_W:
            y = y * tl.load(w_ptr + t * K + j, mask=t_ok, other=0.0)[:, None]
        acc += y
    tl.store(out_ptr + t[:, None].to(tl.int64) * D + c[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=t_ok[:, None] & c_ok[None, :])


@triton.jit
def _combine_backward_kernel(src_ptr, rows_ptr, w_ptr, dout_ptr, dsrc_ptr, dw_ptr, T, D,
                             K: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    t_ok = t < T
    for j in tl.static_range(K):
        row = tl.load(rows_ptr + j * T + t, mask=t_ok, other=-1)
        r_ok = row >= 0
        w = tl.load(w_ptr + t * K + j, mask=t_ok, other=0.0)
        dot = tl.zeros((BT,), dtype=tl.float32)
        for c0 in range(0, D, BD):
            c = c0 + tl.arange(0, BD)
            ok = r_ok[:, None] & (c < D)[None, :]
            g = tl.load(dout_ptr + t[:, None].to(tl.int64) * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
            y = tl.load(src_ptr + row[:, None].to(tl.int64) * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
            dot += tl.sum(g * y, 1)
            tl.store(dsrc_ptr + row[:, None].to(tl.int64) * D + c[None, :],
                     (g * w[:, None]).to(dsrc_ptr.dtype.element_ty), mask=ok)
        tl.store(dw_ptr + t * K + j, dot, mask=t_ok)


def combine_rows(src, rows, weights, tokens: int):
    """out [T, d] = sum_j weights[t, j] * src[rows[j * T + t]] (weights None: plain sum), no autograd."""
    import torch

    d = src.shape[1]
    k = rows.numel() // tokens if tokens else 0
    if not use_triton(src):
        taken = src.new_zeros((k * tokens, d), dtype=torch.float32)
        ok = rows >= 0
        taken[ok] = src[rows[ok]].float()
        taken = taken.view(k, tokens, d)
        if weights is not None:
            taken = taken * weights.t().float().unsqueeze(-1)
        return taken.sum(0).to(src.dtype)
    out = src.new_empty((tokens, d))
    if tokens and d:
        w = weights.float().contiguous() if weights is not None else out
        grid = (triton.cdiv(tokens, BT), triton.cdiv(d, BD))
        _combine_kernel[grid](src, rows, w, out, tokens, d, K=k, HAS_W=weights is not None, BT=BT, BD=BD)
    return out


def combine_backward(src, rows, weights, dout, zero_unused: bool):
    """(d_src [S, d] in src.dtype, d_weights [T, k] fp32) of combine_rows; zero_unused: rows of src that
    no assignment reads get zero gradient (else they are left unwritten)."""
    import torch

    T, d = dout.shape
    k = rows.numel() // T if T else 0
    d_src = torch.zeros_like(src) if zero_unused else torch.empty_like(src)
    dw = torch.empty((T, k), dtype=torch.float32, device=src.device)
    if not use_triton(src):
        ok = rows >= 0
        t = torch.arange(k * T, device=src.device) % T
        w = weights.t().reshape(-1).float()
        d_src[rows[ok]] = (dout.float()[t[ok]] * w[ok].unsqueeze(1)).to(src.dtype)
        dots = torch.zeros(k * T, dtype=torch.float32, device=src.device)
        dots[ok] = (src[rows[ok]].float() * dout.float()[t[ok]]).sum(1)
        return d_src, dots.view(k, T).t().contiguous()
    if T and d:
        _combine_backward_kernel[(triton.cdiv(T, BT),)](src, rows, weights.float().contiguous(), dout.contiguous(),
                                                        d_src, dw, T, d, K=k, BT=BT, BD=BD)
    return d_src, dw
