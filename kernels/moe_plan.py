"""The step plans of the MoE layers in one small launch each (per rank, W ranks, L local experts).

  _plan_kernel          grid (1), the all-to-all layer: from the rows sent (seg [W * L]) and received
                        (got [W * L]) per (rank, local expert) -- or CAP rows everywhere when the send
                        buffers are padded -- the split sizes of each of D chunks, the chunk-local
                        segment offsets and the offsets of all chunks in one receive buffer (as
                        qbench/layers/moe/plan.py's tensor ops)
  _block_counts_kernel  grid (1), the blocks layer: block and row counts of a block plan
  _block_list_kernel    grid (L * W), the blocks layer: every block's source, rows, expert and place
`plan_offsets` replays its compiled kernel (kernels._common.launch.LaunchCache) and is a custom op while
torch.compile traces; the blocks kernels sit between host reads (the block count sizes the list).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import interpreting, is_compiling, next_power_of_2, register_op
from kernels._common.launch import LaunchCache, aligned


@triton.jit
def _plan_kernel(seg_ptr, got_ptr, splits_ptr, off_ptr, off_all_ptr, W, L, D, CAP,
                 PADDED: tl.constexpr, SEG_AFTER: tl.constexpr, BW: tl.constexpr, BE: tl.constexpr):
    # seg [W * L] rows sent per (destination, local expert); got [W * L] rows received per (source,
    # local expert); PADDED: both are CAP everywhere (seg and got are not read). Chunk i of a count c
    # holds c // D + (i < c % D) rows. SEG_AFTER: seg is also copied after the 2 * D * W split sizes.
    x = tl.arange(0, BE)
    r = tl.arange(0, BW)
    n = W * L
    ok = x < n
    if PADDED:
        seg = tl.where(ok, tl.zeros((BE,), dtype=tl.int64) + CAP, 0)
        got = seg
    else:
        seg = tl.load(seg_ptr + x, mask=ok, other=0)
        got = tl.load(got_ptr + x, mask=ok, other=0)
    if SEG_AFTER:
        tl.store(splits_ptr + 2 * D * W + x, seg, mask=ok)
    member = (x[None, :] // L == r[:, None]) & ok[None, :]  # [BW, BE] entry x belongs to rank r
    base = tl.zeros((1,), dtype=tl.int64)
    for i in range(D):
        sent_i = seg // D + (i < seg % D).to(tl.int64)
        got_i = got // D + (i < got % D).to(tl.int64)
        tl.store(splits_ptr + i * W + r, tl.sum(tl.where(member, sent_i[None, :], 0), 1), mask=r < W)
        tl.store(splits_ptr + (D + i) * W + r, tl.sum(tl.where(member, got_i[None, :], 0), 1), mask=r < W)
        ends = tl.cumsum(got_i, 0)
        tl.store(off_ptr + i * (n + 1) + 1 + x, ends, mask=ok)
        tl.store(off_ptr + i * (n + 1) + x, tl.zeros((BE,), dtype=tl.int64), mask=x == 0)
        tl.store(off_all_ptr + i * n + x, base + ends - got_i, mask=ok)
        base += tl.sum(got_i, 0)
    tl.store(off_all_ptr + D * n + x, tl.zeros((BE,), dtype=tl.int64) + base, mask=x == 0)


_PLAN = LaunchCache("moe_plan")


def _plan(seg, got, world_size: int, degree: int, cap: int, seg_after: bool = False):
    n, W, D = seg.numel(), world_size, degree
    dev = seg.device
    splits = torch.empty(2 * D * W + (n if seg_after else 0), dtype=torch.int64, device=dev)
    offsets = torch.empty((D, n + 1), dtype=torch.int64, device=dev)
    offsets_all = torch.empty(D * n + 1, dtype=torch.int64, device=dev)
    args = (seg, got, splits, offsets, offsets_all, W, n // W, D, max(cap, 0))
    consts = (cap >= 0, seg_after, next_power_of_2(W), next_power_of_2(n))

    def first():
        return _plan_kernel[(1,)](*args, *consts), (1,), consts, {"BW": consts[2], "BE": consts[3]}

    _PLAN.launch((n, W, D, cap, seg_after, aligned(seg, got, splits, offsets, offsets_all), dev), args, first)
    return splits, offsets, offsets_all


def _op_plan(seg: torch.Tensor, got: torch.Tensor, world_size: int, degree: int, cap: int,
             seg_after: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _plan(seg, got, world_size, degree, cap, seg_after)


def _fake_plan(seg, got, world_size, degree, cap, seg_after):
    n = seg.numel()
    return (seg.new_empty(2 * degree * world_size + (n if seg_after else 0)), seg.new_empty((degree, n + 1)),
            seg.new_empty(degree * n + 1))


_PLAN_OP = register_op("moe_plan_offsets", _op_plan, _fake_plan)


def plan_offsets(seg, got, world_size: int, degree: int, cap: int | None = None, seg_after: bool = False):
    """(splits [2 * D * W]: send splits of chunk 0..D-1 then receive splits, offsets [D, W * L + 1],
    offsets_all [D * W * L + 1]) from seg and got [W * L] int64 (as plan.prepare / segment_offsets);
    cap: every count is cap (padded send buffers: seg and got are then only read for their size);
    seg_after: splits also holds a copy of seg after the split sizes ([2 * D * W + W * L]), so that a
    step whose host read needs both reads one tensor without a concatenation (an op less per step)."""
    cap = -1 if cap is None else cap
    if is_compiling():
        return _PLAN_OP(seg, got, world_size, degree, cap, seg_after)
    return _plan(seg, got, world_size, degree, cap, seg_after)


@triton.jit
def _block_counts_kernel(counts_ptr, src_off_ptr, first_ptr, start_ptr, off_local_ptr, small_ptr, W, L, RANK, B,
                         BW: tl.constexpr, BL: tl.constexpr):
    # counts [W, E] (E = W * L): rows source s sends to global expert e. One program.
    s = tl.arange(0, BW)
    l = tl.arange(0, BL)
    s_ok = s < W
    l_ok = l < L
    run = tl.zeros((BW,), dtype=tl.int64)  # per-source running row count over experts
    sent_to = tl.zeros((BW,), dtype=tl.int64)  # rows this rank sends to owner r (indexed by r)
    recv = tl.zeros((BW,), dtype=tl.int64)  # rows each source sends to this rank's experts
    nb = tl.sum(tl.zeros((BL,), dtype=tl.int64), 0)  # this rank's blocks
    local = tl.sum(tl.zeros((BL,), dtype=tl.int64), 0)  # ... of them from itself
    remote_all = tl.sum(tl.zeros((BL,), dtype=tl.int64), 0)  # rows any rank sends to another (all owners)
    for r in range(W):  # owners in order: expert e = r * L + l
        c = tl.load(counts_ptr + s[:, None] * (W * L) + r * L + l[None, :],
                    mask=s_ok[:, None] & l_ok[None, :], other=0)  # [BW, BL]
        excl = tl.cumsum(c, 1) - c + run[:, None]
        tl.store(src_off_ptr + s[:, None] * (W * L) + r * L + l[None, :], excl, mask=s_ok[:, None] & l_ok[None, :])
        run += tl.sum(c, 1)
        remote_all += tl.sum(tl.sum(tl.where(s[:, None] != r, c, 0), 1), 0)
        mine = tl.sum(tl.where(s[:, None] == RANK, c, 0), 0)  # [BL] this rank's rows to owner r
        sent_to += tl.where(s == r, tl.sum(mine, 0), 0)
        if r == RANK:
            # segments (l, s) ordered l-major, then s: first block and first packed local row
            nblk = (c + B - 1) // B  # [BW, BL] blocks of (source s, my expert l)
            per_l = tl.sum(nblk, 0)  # [BL]
            l_first = tl.cumsum(per_l, 0) - per_l  # first block of expert l
            rows_l = tl.sum(c, 0)  # [BL] rows of expert l
            l_row = tl.cumsum(rows_l, 0) - rows_l  # first local row of expert l
            seg = l[None, :] * W + s[:, None]
            ok = s_ok[:, None] & l_ok[None, :]
            tl.store(first_ptr + seg, l_first[None, :] + tl.cumsum(nblk, 0) - nblk, mask=ok)
            tl.store(start_ptr + seg, l_row[None, :] + tl.cumsum(c, 0) - c, mask=ok)
            tl.store(off_local_ptr + 1 + l, l_row + rows_l, mask=l_ok)
            tl.store(off_local_ptr + l, tl.zeros((BL,), dtype=tl.int64), mask=l == 0)
            nb = tl.sum(per_l, 0)
            local = tl.sum(tl.sum(tl.where(s[:, None] == RANK, nblk, 0), 1), 0)
            recv = tl.sum(c, 1)
    # small = [nb, remote blocks, S (mine), max S, send splits [W], recv splits [W], remote rows (all)]
    tl.store(small_ptr + 0, nb)
    tl.store(small_ptr + 1, nb - local)
    tl.store(small_ptr + 2, tl.sum(tl.where(s == RANK, run, 0), 0))
    tl.store(small_ptr + 3, tl.max(tl.where(s_ok, run, 0), 0))
    tl.store(small_ptr + 4 + s, sent_to, mask=s_ok)
    tl.store(small_ptr + 4 + W + s, recv, mask=s_ok)
    tl.store(small_ptr + 4 + 2 * W, remote_all)


@triton.jit
def _block_list_kernel(counts_ptr, src_off_ptr, first_ptr, seg_start_ptr, src_out, row_out, rows_out, expert_out,
                       start_out, W, L, RANK, B, BI: tl.constexpr):
    # one program per segment (local expert l, source s): its blocks i = 0 .. ceil(c / B) - 1
    seg = tl.program_id(0)
    l = seg // W
    s = seg % W
    e = RANK * L + l
    c = tl.load(counts_ptr + s * (W * L) + e)
    start = tl.load(src_off_ptr + s * (W * L) + e)
    first = tl.load(first_ptr + seg)
    local = tl.load(seg_start_ptr + seg)
    n = (c + B - 1) // B
    for i0 in range(0, n, BI):
        i = i0 + tl.arange(0, BI)
        ok = i < n
        b = first + i
        tl.store(src_out + b, s.to(tl.int32) + tl.zeros((BI,), dtype=tl.int32), mask=ok)
        tl.store(row_out + b, start + i * B, mask=ok)
        tl.store(rows_out + b, tl.minimum(c - i * B, B).to(tl.int32), mask=ok)
        tl.store(expert_out + b, l.to(tl.int32) + tl.zeros((BI,), dtype=tl.int32), mask=ok)
        tl.store(start_out + b, local + i * B, mask=ok)


def block_counts(counts_all, rank: int, num_local_experts: int, block_size: int):
    """Everything of a block plan that needs no host value: (src_off [W, E], first block and first
    packed local row of every segment (l, s) [L * W] each, offsets_local [L + 1], small [5 + 2W]:
    blocks, remote blocks, S, max S, send splits, receive splits, rows any rank sends to another
    rank) from counts_all [W, E] int64."""
    W, E = counts_all.shape
    L, dev = num_local_experts, counts_all.device
    counts = counts_all.contiguous()
    src_off = torch.empty_like(counts)
    first, seg_start = (torch.empty(L * W, dtype=torch.int64, device=dev) for _ in range(2))
    offsets = torch.empty(L + 1, dtype=torch.int64, device=dev)
    small = torch.empty(5 + 2 * W, dtype=torch.int64, device=dev)
    _block_counts_kernel[(1,)](counts, src_off, first, seg_start, offsets, small, W, L, rank, block_size,
                               BW=next_power_of_2(W), BL=next_power_of_2(L))
    return src_off, (first, seg_start), offsets, small


def block_list(counts_all, src_off, firsts, rank: int, num_local_experts: int, block_size: int, num_blocks: int):
    """(block_src int32, block_row int64, block_rows int32, block_expert int32, block_start int64), each
    [num_blocks]; firsts = (first block, first local row) of every segment, from block_counts."""
    W = counts_all.shape[0]
    dev = counts_all.device
    src, rows, expert = (torch.empty(num_blocks, dtype=torch.int32, device=dev) for _ in range(3))
    row, start = (torch.empty(num_blocks, dtype=torch.int64, device=dev) for _ in range(2))
    if num_blocks:
        _block_list_kernel[(num_local_experts * W,)](counts_all.contiguous(), src_off, *firsts, src, row, rows,
                                                     expert, start, W, num_local_experts, rank, block_size,
                                                     BI=16 if interpreting() else 128)
    return src, row, rows, expert, start
