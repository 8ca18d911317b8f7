"""The MoE combine (weighted sum of every token's k expert outputs) and its backward, one kernel each.

For T tokens, k choices, assignment a = j * T + t and rows[a] its row in src (-1: dropped):
    out[t]     = sum_j w[t, j] * src[rows[a]]                      [T, d]   (fp32 sums)
    d_src[r]   = w[t, j] * dout[t]          for r = rows[a]         [S, d]   (other rows zero)
    d_w[t, j]  = <src[rows[a]], dout[t]>                            [T, k]   (fp32)
With w = None the same forward is the backward of gathering token rows into the send buffer
(dx[t] = sum_j d_send[rows[a]]), so the layer needs no index_add with atomics.
Rows must be distinct (apart from -1): every assignment owns its row.
Eager calls launch directly and replay compiled kernels per shape (kernels._common.launch.LaunchCache);
while torch.compile traces they are custom ops (torch.ops.qbench.moe_combine, moe_combine_backward).
The torch references (no Triton here) have static shapes too: no boolean-mask indexing, so they
neither synchronise with the device nor break a compiled graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, interpreting, is_compiling, register_op, use_triton
from kernels._common.launch import LaunchCache, aligned

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


_COMBINE = LaunchCache("moe_combine")
_BACKWARD = LaunchCache("moe_combine_backward")


def combine_rows(src, rows, weights, tokens: int):
    """out [T, d] = sum_j weights[t, j] * src[rows[j * T + t]] (weights None: plain sum), no autograd."""
    if is_compiling():
        return _OPS["combine"](src, rows, weights, tokens)
    return _combine(src, rows, weights, tokens)


def combine_backward(src, rows, weights, dout, zero_unused: bool):
    """(d_src [S, d] in src.dtype, d_weights [T, k] fp32) of combine_rows; zero_unused: rows of src that
    no assignment reads get zero gradient (else they are left unwritten)."""
    if is_compiling():
        return _OPS["backward"](src, rows, weights, dout, zero_unused)
    return _combine_backward(src, rows, weights, dout, zero_unused)


def _combine(src, rows, weights, tokens: int):
    d = src.shape[1]
    k = rows.numel() // tokens if tokens else 0
    if not use_triton(src):
        return combine_reference(src, rows, weights, tokens)
    out = src.new_empty((tokens, d))
    if tokens and d:
        w = out
        if weights is not None:
            w = weights if weights.dtype == torch.float32 and weights.is_contiguous() else weights.float().contiguous()
        grid = (cdiv(tokens, BT), cdiv(d, BD))
        args, consts = (src, rows, w, out, tokens, d), (k, weights is not None, BT, BD)
        key = (tokens, d, k, weights is not None, src.dtype, aligned(src, rows, w, out), src.device)
        _COMBINE.launch(key, args, lambda: (_combine_kernel[grid](*args, *consts), grid, consts, {}))
    return out


def _combine_backward(src, rows, weights, dout, zero_unused: bool):
    T, d = dout.shape
    k = rows.numel() // T if T else 0
    if not use_triton(src):
        return combine_backward_reference(src, rows, weights, dout, zero_unused)
    d_src = torch.zeros_like(src) if zero_unused else torch.empty_like(src)
    dw = torch.empty((T, k), dtype=torch.float32, device=src.device)
    if T and d:
        w = weights if weights.dtype == torch.float32 and weights.is_contiguous() else weights.float().contiguous()
        dout = dout if dout.is_contiguous() else dout.contiguous()
        grid = (cdiv(T, BT),)
        args, consts = (src, rows, w, dout, d_src, dw, T, d), (k, BT, BD)
        key = (T, d, k, src.dtype, dout.dtype, aligned(src, rows, w, dout, d_src, dw), src.device)
        _BACKWARD.launch(key, args, lambda: (_combine_backward_kernel[grid](*args, *consts), grid, consts, {}))
    return d_src, dw


def _op_combine(src: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None, tokens: int) -> torch.Tensor:
    return _combine(src, rows, weights, tokens)


def _op_backward(src: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, dout: torch.Tensor,
                 zero_unused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _combine_backward(src, rows, weights, dout, zero_unused)


def _fake_backward(src, rows, weights, dout, zero_unused):
    T = dout.shape[0]
    return torch.empty_like(src), src.new_empty((T, rows.numel() // T if T else 0), dtype=torch.float32)


_OPS = {"combine": register_op("moe_combine", _op_combine,
                               lambda src, rows, w, tokens: src.new_empty((tokens, src.shape[1]))),
        "backward": register_op("moe_combine_backward", _op_backward, _fake_backward)}


# ---------------------------------------------------------------------------------------- references


def _taken(src, rows):
    """[kT, d] fp32: src[rows[a]] for every assignment, zero where rows[a] < 0 (no mask indexing)."""
    picked = src.index_select(0, rows.clamp(min=0)).float()
    return picked * (rows >= 0).unsqueeze(1)


def combine_reference(src, rows, weights, tokens: int):
    """Plain torch combine_rows (fp32 sums, result in src.dtype)."""
    d = src.shape[1]
    k = rows.numel() // tokens if tokens else 0
    if not tokens or not src.shape[0]:
        return src.new_zeros((tokens, d))
    taken = _taken(src, rows).view(k, tokens, d)
    if weights is not None:
        taken = taken * weights.t().float().unsqueeze(-1)
    return taken.sum(0).to(src.dtype)


def combine_backward_reference(src, rows, weights, dout, zero_unused: bool):
    """Plain torch combine_backward: d_src rows scattered (every read row owns one assignment)."""
    T, d = dout.shape
    k = rows.numel() // T if T else 0
    d_src = torch.zeros_like(src)  # zero_unused or not: rows nobody reads are zero here
    if not T or not src.shape[0]:
        return d_src, torch.zeros((T, k), dtype=torch.float32, device=src.device)
    ok = (rows >= 0).unsqueeze(1)
    t = torch.arange(k * T, device=src.device) % T
    w = weights.t().reshape(-1).float().unsqueeze(1)
    g = dout.float().index_select(0, t)  # [kT, d]
    # dropped assignments write row 0 with a zero contribution: index_add keeps every row's own sum
    d_src32 = torch.zeros(src.shape, dtype=torch.float32, device=src.device)
    d_src32.index_add_(0, rows.clamp(min=0), g * w * ok)
    dots = (_taken(src, rows) * g).sum(1)
    return d_src.copy_(d_src32), dots.view(k, T).t().contiguous()
