"""Block GEMMs across peer GPUs: pull token blocks and multiply (AG), multiply and push back (GA).

The expert FFN of `qbench moe --system blocks` works on blocks of at most B rows (B = 64 by default).
Every block comes from ONE source rank and covers contiguous rows of that rank's source layout, so a
block is one peer base pointer plus a row range (coalesced loads and stores). Per owner rank, with
nb blocks, L local experts and the plan's per-block tensors (all [nb], on the device):
    block_src int32 (source rank), block_row int64 (first row in the source layout),
    block_rows int32 (1..B valid rows), block_expert int32 (local expert l),
    block_start int64 (first row in the owner's packed local layout, R rows in all, no padding)
For every block b and j < block_rows[b], with p = block_start[b] + j (local row):

    gather_matmul:  gathered[p] = src[block_src[b]][block_row[b] + j]
                    out[p]      = gathered[p] @ w[block_expert[b]] (+ bias[block_expert[b]])
                    optionally out = act(pre) with pre stored too (relu, or gelu with erf)
    matmul_scatter: dst[block_src[b]][block_row[b] + j] = a[p] @ w[block_expert[b]] (+ bias)
    gather_rows:    the gather alone (copy), for the unfused path: gather, then the grouped GEMM
    scatter_rows:   dst[block_src[b]][block_row[b] + j] = out[p] (copy), for the unfused push: the
                    grouped GEMM, then scatter

Shapes: sources [S_s, K] (row stride shared by all peers, unit column stride), w [L, K, N] any strided
view (w^T of the backward passes without a copy), bias [L, N] or None, out [R, N], gathered [R, K];
fp16 / bf16 / fp32, fp32 accumulation. Peers are reached through an int64 device table of their base
addresses (symmetric memory on GPUs); tests pass several local tensors instead, and the
references take a Python list of tensors standing in for the peers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from kernels._common import ACTIVATIONS, cdiv, dot_accumulate, dot_rows, ieee, interpreting, upcast, use_triton

# A program owns one block (BM = B rounded up to a power of two rows) and one N tile. Interpreter
# runs (CPU tests) use tiny tiles to stay fast; GPU configs are the Hopper tensor-core shapes for
# 64-row tiles (wide N tiles: every extra N tile re-reads the block's A rows over NVLink).
if interpreting():
    _CONFIGS = [triton.Config({"BN": 16, "BK": 16}, num_warps=1, num_stages=1)]
    _COPY_CONFIGS = [triton.Config({"BK": 16}, num_warps=1)]
else:
    _CONFIGS = [  # two configs keep the autotuning (compile) time of a multi-rank run short
        triton.Config({"BN": 256, "BK": 64}, num_warps=8, num_stages=3),
        triton.Config({"BN": 128, "BK": 64}, num_warps=4, num_stages=4),
    ]
    _COPY_CONFIGS = [triton.Config({"BK": 256}, num_warps=4), triton.Config({"BK": 512}, num_warps=8)]


@dataclass(frozen=True)
class PeerTable:
    """Peers' buffers as the kernels see them: offsets int64 [W] (device), peer p's buffer starts
    offsets[p] elements after `anchor` (a tensor of the peers' dtype on this device: element offsets
    keep the pointers typed and their alignment known); `row_stride` elements per row, unit column
    stride; aligned: every buffer and row starts on a 16-byte boundary."""

    offsets: Any
    anchor: Any
    row_stride: int
    aligned: bool

    @property
    def dtype(self):
        return self.anchor.dtype


def make_peer_table(addresses: list[int], anchor, row_stride: int) -> PeerTable:
    """PeerTable of buffers at these device addresses (bytes), relative to `anchor`."""
    import torch

    size, base = anchor.element_size(), anchor.data_ptr()
    if any((a - base) % size for a in addresses):
        raise ValueError("peer buffers must be aligned to their element size")
    aligned = all(a % 16 == 0 for a in addresses + [base]) and (row_stride * size) % 16 == 0
    offsets = torch.tensor([(a - base) // size for a in addresses], dtype=torch.int64, device=anchor.device)
    return PeerTable(offsets, anchor, row_stride, aligned)


@triton.jit
def _block_of_program(bsrc_ptr, brow_ptr, brows_ptr, bexp_ptr, bstart_ptr, N, BN: tl.constexpr):
    """This program's N tile (block-major order: a block's N tiles run side by side, so its rows stay
    hot), and its block's source rank, first source row, valid rows, local expert and first local row."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BN)
    blk = pid // n_tiles
    pid_n = pid % n_tiles
    return (pid_n, tl.load(bsrc_ptr + blk), tl.load(brow_ptr + blk), tl.load(brows_ptr + blk),
            tl.load(bexp_ptr + blk), tl.load(bstart_ptr + blk))


@triton.jit
def _peer_rows(anchor_ptr, table_ptr, src, rows, row_stride, ALIGNED: tl.constexpr):
    """Pointers [BM] to `rows` of peer `src`'s buffer: the anchor pointer plus the peer's element
    offset from the table. ALIGNED (checked by the launcher: 16-byte aligned buffers and row strides)
    tells the compiler that every row starts on a 16-byte boundary, so that row loads and stores are
    vectorised (an offset read from memory is otherwise assumed odd: 2-byte scalar accesses)."""
    off = tl.load(table_ptr + src) + rows.to(tl.int64) * row_stride
    if ALIGNED:
        off = tl.multiple_of(off, 16 // (anchor_ptr.dtype.element_ty.primitive_bitwidth // 8))
    return anchor_ptr + off


@triton.jit
def _epilogue(acc, b_ptr, l, cols, N, sbl, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        bias = tl.load(b_ptr + l.to(tl.int64) * sbl + cols, mask=cols < N, other=0.0)
        acc += bias[None, :].to(tl.float32)
    return acc


@triton.jit
def _activate(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # exact (erf) GELU, as F.gelu
    return x


@triton.autotune(configs=_CONFIGS, key=["N", "K", "BM", "HAS_BIAS", "ACT", "STORE_GATHERED", "IEEE", "UPCAST"])
@triton.jit
def _gather_matmul_kernel(
    table_ptr, anchor_ptr, w_ptr, b_ptr, out_ptr, pre_ptr, gath_ptr,
    bsrc_ptr, brow_ptr, brows_ptr, bexp_ptr, bstart_ptr,
    N, K, s_src, swl, swk, swn, sbl, s_out, s_gath,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_GATHERED: tl.constexpr, ALIGNED: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    pid_n, src, row0, nrows, l, start = _block_of_program(bsrc_ptr, brow_ptr, brows_ptr, bexp_ptr, bstart_ptr,
                                                          N, BN)
    # The source rank's buffer: an address from the table, typed like the gathered rows.
    js = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    cols = pid_n * BN + tl.arange(0, BN)
    valid = js < nrows
    a_tile = _peer_rows(anchor_ptr, table_ptr, src, row0 + js, s_src, ALIGNED)[:, None] + ks[None, :]
    w_tile = w_ptr + l.to(tl.int64) * swl + ks[:, None] * swk + cols[None, :] * swn
    local = start + js  # rows of this block in the local layout (valid for js < nrows)
    g_tile = gath_ptr + local[:, None] * s_gath + ks[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + ks) < K
        a = tl.load(a_tile, mask=valid[:, None] & k_ok[None, :], other=0.0)  # rows past the block -> 0
        if STORE_GATHERED:
            if pid_n == 0:
                tl.store(g_tile, a, mask=valid[:, None] & k_ok[None, :])
        b = tl.load(w_tile, mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
        acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        a_tile += BK
        g_tile += BK
        w_tile += BK * swk
    acc = _epilogue(acc, b_ptr, l, cols, N, sbl, HAS_BIAS)
    keep = valid[:, None] & (cols[None, :] < N)
    dst = local[:, None] * s_out + cols[None, :]
    if ACT != 0:
        tl.store(pre_ptr + dst, acc.to(pre_ptr.dtype.element_ty), mask=keep)
        acc = _activate(acc, ACT)
    tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=keep)


@triton.autotune(configs=_CONFIGS, key=["N", "K", "BM", "HAS_BIAS", "IEEE", "UPCAST"])
@triton.jit
def _matmul_scatter_kernel(
    a_ptr, w_ptr, b_ptr, table_ptr, anchor_ptr,
    bsrc_ptr, brow_ptr, brows_ptr, bexp_ptr, bstart_ptr,
    N, K, s_a, swl, swk, swn, sbl, s_dst,
    HAS_BIAS: tl.constexpr, ALIGNED: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    pid_n, src, row0, nrows, l, start = _block_of_program(bsrc_ptr, brow_ptr, brows_ptr, bexp_ptr, bstart_ptr,
                                                          N, BN)
    js = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    cols = pid_n * BN + tl.arange(0, BN)
    valid = js < nrows
    a_tile = a_ptr + (start + js)[:, None] * s_a + ks[None, :]
    w_tile = w_ptr + l.to(tl.int64) * swl + ks[:, None] * swk + cols[None, :] * swn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + ks) < K
        a = tl.load(a_tile, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_tile, mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
        acc = dot_accumulate(a, b, acc, IEEE, UPCAST)
        a_tile += BK
        w_tile += BK * swk
    acc = _epilogue(acc, b_ptr, l, cols, N, sbl, HAS_BIAS)
    # The result rows go straight to the source rank's buffer (a peer store over NVLink).
    dst = _peer_rows(anchor_ptr, table_ptr, src, row0 + js, s_dst, ALIGNED)[:, None] + cols[None, :]
    tl.store(dst, acc.to(a_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


@triton.autotune(configs=_COPY_CONFIGS, key=["K", "BM", "TO_PEERS"])
@triton.jit
def _copy_rows_kernel(
    table_ptr, anchor_ptr, local_ptr, bsrc_ptr, brow_ptr, brows_ptr, bstart_ptr, K, s_peer, s_local,
    TO_PEERS: tl.constexpr, ALIGNED: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    # One program per (block, K tile): the block's rows between its source's buffer and the local
    # packed rows; gather (peer -> local) or, TO_PEERS, scatter (local -> peer).
    pid = tl.program_id(0)
    k_tiles = tl.cdiv(K, BK)
    blk = pid // k_tiles
    ks = (pid % k_tiles) * BK + tl.arange(0, BK)
    js = tl.arange(0, BM)
    ok = (js < tl.load(brows_ptr + blk))[:, None] & (ks < K)[None, :]
    peer = _peer_rows(anchor_ptr, table_ptr, tl.load(bsrc_ptr + blk), tl.load(brow_ptr + blk) + js, s_peer,
                      ALIGNED)[:, None] + ks[None, :]
    local = local_ptr + (tl.load(bstart_ptr + blk) + js)[:, None] * s_local + ks[None, :]
    if TO_PEERS:
        tl.store(peer, tl.load(local, mask=ok), mask=ok)
    else:
        tl.store(local, tl.load(peer, mask=ok), mask=ok)


# ---------------------------------------------------------------------------------------------
# Launchers. `peers` is a PeerTable, or a list of local tensors standing in for the peers (tests).
# `plan` is any object with block_size, num_blocks (host int) and the four per-block tensors.


def peer_table(peers):
    """A PeerTable from a list of same-dtype, same-row-stride tensors (their data pointers)."""
    if isinstance(peers, PeerTable):
        return peers
    first = peers[0]
    for t in peers:
        if t.dtype != first.dtype or t.dim() != 2 or (t.shape[0] > 1 and t.stride(0) != first.stride(0)):
            raise ValueError("peer buffers need one dtype and one row stride ([rows, K] views)")
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError("peer buffers need unit column stride")
    anchor = max(peers, key=lambda t: t.numel())  # an empty tensor may have no address
    return make_peer_table([t.data_ptr() for t in peers], anchor, first.stride(0))


def _bm(plan) -> int:
    return dot_rows(plan.block_size)


def _check_w(w, bias, K: int) -> None:
    if w.dim() != 3 or w.shape[1] != K:
        raise ValueError(f"w must be [L, K={K}, N], got {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0], w.shape[2]):
        raise ValueError(f"bias must be [L, N] = {(w.shape[0], w.shape[2])}, got {tuple(bias.shape)}")


def _blocks(plan):
    return plan.block_src, plan.block_row, plan.block_rows, plan.block_expert, plan.block_start


def gather_matmul(peers, plan, w, bias=None, *, out=None, gathered=None, activation=None, pre=None):
    """AG: pull every block's rows from its source and multiply by its expert's weights.

    peers: PeerTable or list of [S_s, K] tensors; w [L, K, N] (strided view allowed); bias [L, N] | None.
    Returns (out [R, N], gathered [R, K]), R = plan.gathered_rows; with activation ("relu" | "gelu")
    out = act(pre) and `pre` ([R, N], required) receives the pre-activation.
    """
    import torch

    table = peer_table(peers)
    K, N = w.shape[1], w.shape[2]
    _check_w(w, bias, K)
    if activation is not None and pre is None:
        raise ValueError("a fused activation needs the `pre` buffer for the pre-activation")
    rows, dev = plan.gathered_rows, w.device
    out = torch.empty((rows, N), dtype=table.dtype, device=dev) if out is None else out
    gathered = torch.empty((rows, K), dtype=table.dtype, device=dev) if gathered is None else gathered
    if not use_triton(w, out):
        return gather_matmul_reference(peers, plan, w, bias, out=out, gathered=gathered,
                                       activation=activation, pre=pre)
    if rows == 0:
        return out, gathered
    b = bias if bias is not None else out  # dummy pointer when HAS_BIAS is false
    grid = lambda meta: (plan.num_blocks * cdiv(N, meta["BN"]),)
    _gather_matmul_kernel[grid](
        table.offsets, table.anchor, w, b, out, pre if pre is not None else out, gathered, *_blocks(plan),
        N, K, table.row_stride, w.stride(0), w.stride(1), w.stride(2),
        bias.stride(0) if bias is not None else 0, out.stride(0), gathered.stride(0),
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[activation], STORE_GATHERED=True, ALIGNED=table.aligned,
        IEEE=ieee(table.dtype), UPCAST=upcast(table.dtype), BM=_bm(plan),
    )
    return out, gathered


def matmul_scatter(a, w, bias, peers, plan) -> None:
    """GA: every block's rows of a [R, K] times its expert's w[l] (+ bias[l]) are stored to rows
    block_row[b] ... of source rank block_src[b]'s buffer. peers: PeerTable | list."""
    table = peer_table(peers)
    K, N = w.shape[1], w.shape[2]
    _check_w(w, bias, K)
    if not use_triton(a, w):
        return matmul_scatter_reference(a, w, bias, peers, plan)
    if plan.num_blocks == 0 or N == 0:
        return None
    a = a if a.stride(1) == 1 else a.contiguous()
    b = bias if bias is not None else a
    grid = lambda meta: (plan.num_blocks * cdiv(N, meta["BN"]),)
    _matmul_scatter_kernel[grid](
        a, w, b, table.offsets, table.anchor, *_blocks(plan),
        N, K, a.stride(0), w.stride(0), w.stride(1), w.stride(2),
        bias.stride(0) if bias is not None else 0, table.row_stride,
        HAS_BIAS=bias is not None, ALIGNED=table.aligned, IEEE=ieee(a.dtype), UPCAST=upcast(a.dtype),
        BM=_bm(plan),
    )
    return None


def gather_rows(peers, plan, gathered=None):
    """The gather alone: gathered [R, K], for gather-then-grouped-GEMM."""
    if gathered is None:
        raise ValueError("gather_rows needs the `gathered` output [R, K]")
    if not use_triton(gathered):
        return gather_rows_reference(peers, plan, gathered)
    _copy_rows(peers, plan, gathered, to_peers=False)
    return gathered


def scatter_rows(out, peers, plan) -> None:
    """The push alone: every block's rows of out [R, K] to their source's buffer."""
    if not use_triton(out):
        return scatter_rows_reference(out, peers, plan)
    _copy_rows(peers, plan, out if out.stride(1) == 1 else out.contiguous(), to_peers=True)
    return None


def _copy_rows(peers, plan, local, to_peers: bool) -> None:
    table = peer_table(peers)
    K = local.shape[1]
    if plan.num_blocks == 0 or K == 0:
        return
    grid = lambda meta: (plan.num_blocks * cdiv(K, meta["BK"]),)
    _copy_rows_kernel[grid](
        table.offsets, table.anchor, local, plan.block_src, plan.block_row, plan.block_rows, plan.block_start,
        K, table.row_stride, local.stride(0), TO_PEERS=to_peers, ALIGNED=table.aligned, BM=_bm(plan),
    )


# ---------------------------------------------------------------------------------------------
# References: the same math in plain torch, with a Python list of tensors standing in for the peers.


def _host_blocks(plan):
    """(source, source row, rows, local expert, local row) of every block, as host ints."""
    n = plan.num_blocks
    return list(zip(*[[int(v) for v in t[:n].tolist()] for t in _blocks(plan)]))


def gather_rows_reference(peers, plan, gathered):
    for s, row, n, _, p in _host_blocks(plan):
        gathered[p : p + n] = peers[s][row : row + n].to(gathered.device)
    return gathered


def scatter_rows_reference(out, peers, plan) -> None:
    for s, row, n, _, p in _host_blocks(plan):
        peers[s][row : row + n] = out[p : p + n].to(peers[s].device)


def gather_matmul_reference(peers, plan, w, bias=None, *, out=None, gathered=None, activation=None, pre=None):
    """Plain torch AG: gather the blocks, then one fp32 matmul per block."""
    import torch
    import torch.nn.functional as F

    K, N = w.shape[1], w.shape[2]
    rows, dtype, dev = plan.gathered_rows, peers[0].dtype, w.device
    gathered = torch.empty((rows, K), dtype=dtype, device=dev) if gathered is None else gathered
    gather_rows_reference(peers, plan, gathered)
    acc = torch.empty((rows, N), dtype=torch.float32, device=dev)
    for _, _, n, l, p in _host_blocks(plan):
        acc[p : p + n] = gathered[p : p + n].float() @ w[l].float()
        if bias is not None:
            acc[p : p + n] += bias[l].float()
    if activation is not None:
        pre.copy_(acc)
        acc = F.gelu(acc) if activation == "gelu" else F.relu(acc)
    out = torch.empty((rows, N), dtype=dtype, device=dev) if out is None else out
    out.copy_(acc)
    return out, gathered


def matmul_scatter_reference(a, w, bias, peers, plan) -> None:
    """Plain torch GA: each block's rows, multiplied in fp32, written into its source's tensor."""
    for s, row, n, l, p in _host_blocks(plan):
        y = a[p : p + n].float() @ w[l].float()
        if bias is not None:
            y += bias[l].float()
        peers[s][row : row + n] = y.to(peers[s].dtype)
