"""MoE routing and step plan in three small launches instead of ~50 tensor ops.

Before its one host synchronisation an MoE step only moves a few kilobytes, so its time there is
the host's cost of launching many tiny kernels (about 0.8 ms for ~50 of them on an H200 host).
These kernels compute the same values as qbench/layers/moe/routing.route and plan.prepare.

Per rank: T tokens, E experts, k choices, assignments a = j * T + t (every first choice ranks before
every second choice: Tutel's priority when an expert is over capacity), token blocks of BT.
  _choose_kernel     grid (T / BT): top-k expert ids per token (or the forced ids), the combine
                     weights (fp32 softmax over the k chosen logits) and, per (choice j, block b),
                     an expert histogram hist[j * nb + b, E]; with a padded send buffer it also
                     fills every source row with the zero row's index T
  _positions_kernel  grid (k * nb): position of every assignment in its expert's list = the
                     histogram rows before (j, b) + the rank inside the block; keep = pos < capacity;
                     counts / kept per expert; with one chunk and no replication also the row of
                     every assignment in the expert-sorted send buffer and the inverse map
                     source[row] = token
  _plan_kernel       grid (1): from the rows sent (seg [E]) and received (got [W * L]) per (rank,
                     local expert): split sizes of every chunk, chunk-local segment offsets and
                     the offsets of all chunks in one receive buffer (as plan.prepare)
  _weights_grad_kernel  grid (T / BT): backward of the weights, d_logits [T, E] (zero off the choices)
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from kernels._common import interpreting

BLOCK_TOKENS = 16 if interpreting() else 128
BLOCK_FILL = 64 if interpreting() else 1024  # int64 entries one program fills per step


@triton.jit
def _choose_kernel(logits_ptr, idx_ptr, w_ptr, hist_ptr, fill_ptr, T, E, NB, stride_t, FILL_N, FILL_V,
                   K: tl.constexpr, FORCED: tl.constexpr, BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr,
                   BF: tl.constexpr):
    pid = tl.program_id(0)
    t = pid * BT + tl.arange(0, BT)
    e = tl.arange(0, BE)
    kk = tl.arange(0, BK)
    t_ok = t < T
    e_ok = e < E
    row = t.to(tl.int64) * stride_t
    if not FORCED:
        vals = tl.load(logits_ptr + row[:, None] + e[None, :], mask=t_ok[:, None] & e_ok[None, :],
                       other=float("-inf")).to(tl.float32)
    chosen = tl.full((BT, BK), float("-inf"), tl.float32)  # fp32 logit of choice j in column j
    for j in tl.static_range(K):
        if FORCED:
            choice = tl.load(idx_ptr + t * K + j, mask=t_ok, other=0).to(tl.int32)
            top = tl.load(logits_ptr + row + choice, mask=t_ok, other=0.0).to(tl.float32)
        else:
            top = tl.max(vals, 1)
            choice = tl.min(tl.where(vals == top[:, None], e[None, :], BE), 1)  # lowest id among equals
            choice = tl.minimum(choice, E - 1)  # a row of NaNs matches nothing: keep the id in range
            vals = tl.where(e[None, :] == choice[:, None], float("-inf"), vals)
            tl.store(idx_ptr + t * K + j, choice.to(tl.int64), mask=t_ok)
        chosen = tl.where((kk[None, :] == j) & t_ok[:, None], top[:, None], chosen)
        hits = ((e[None, :] == choice[:, None]) & t_ok[:, None]).to(tl.int32)
        tl.store(hist_ptr + (j * NB + pid) * E + e, tl.sum(hits, 0), mask=e_ok)
    # Combine weights: softmax over the k chosen logits in fp32 (columns >= K hold -inf: exp gives 0).
    k_ok = kk[None, :] < K
    top = tl.where(t_ok, tl.max(chosen, 1), 0.0)  # rows past T: all -inf, keep them NaN-free
    p = tl.where(k_ok, tl.exp(chosen - top[:, None]), 0.0)
    w = p / tl.where(t_ok, tl.sum(p, 1), 1.0)[:, None]
    tl.store(w_ptr + t[:, None] * K + kk[None, :], w, mask=t_ok[:, None] & k_ok)
    # Padded send buffers: every row first reads FILL_V (the zero row); _positions_kernel, launched
    # after this one, overwrites the rows that assignments fill. Program pid fills its share.
    for f0 in range(pid * BF, FILL_N, NB * BF):
        f = f0 + tl.arange(0, BF)
        tl.store(fill_ptr + f, tl.zeros((BF,), dtype=tl.int64) + FILL_V, mask=f < FILL_N)


@triton.jit
def _positions_kernel(idx_ptr, hist_ptr, flat_e_ptr, pos_ptr, keep_ptr, counts_ptr, kept_ptr,
                      rows_ptr, source_ptr, T, E, NB, CAP,
                      K: tl.constexpr, ROWS: tl.constexpr, PADDED: tl.constexpr,
                      BT: tl.constexpr, BE: tl.constexpr, BR: tl.constexpr):
    pid = tl.program_id(0)  # (choice j, token block b) in priority order
    j = pid // NB
    b = pid % NB
    e = tl.arange(0, BE)
    e_ok = e < E
    # Expert totals and the histogram rows before this program's row, [BE] each.
    before = tl.zeros((BE,), dtype=tl.int32)
    total = tl.zeros((BE,), dtype=tl.int32)
    for r0 in range(0, K * NB, BR):
        r = r0 + tl.arange(0, BR)
        h = tl.load(hist_ptr + r[:, None] * E + e[None, :], mask=(r[:, None] < K * NB) & e_ok[None, :], other=0)
        total += tl.sum(h, 0)
        before += tl.sum(tl.where(r[:, None] < pid, h, 0), 0)
    t = b * BT + tl.arange(0, BT)
    t_ok = t < T
    choice = tl.load(idx_ptr + t * K + j, mask=t_ok, other=0).to(tl.int32)
    hits = ((e[None, :] == choice[:, None]) & t_ok[:, None]).to(tl.int32)  # [BT, BE]
    earlier = tl.cumsum(hits, 0) - hits  # same-expert assignments earlier in this block
    pos = tl.sum((earlier + before[None, :]) * hits, 1)
    keep = pos < CAP
    a = j * T + t
    tl.store(flat_e_ptr + a, choice.to(tl.int64), mask=t_ok)
    tl.store(pos_ptr + a, pos.to(tl.int64), mask=t_ok)
    tl.store(keep_ptr + a, keep.to(tl.int8), mask=t_ok)
    kept = tl.minimum(total, CAP)
    if pid == 0:
        tl.store(counts_ptr + e, total.to(tl.int64), mask=e_ok)
        tl.store(kept_ptr + e, kept.to(tl.int64), mask=e_ok)
    if ROWS:  # one chunk, no replication: rows sorted by expert (padded: CAP rows per expert)
        if PADDED:
            first = e * CAP
        else:
            first = tl.cumsum(kept, 0) - kept
        row = tl.sum(first[None, :] * hits, 1) + pos
        row = tl.where(keep, row, -1)
        tl.store(rows_ptr + a, row.to(tl.int64), mask=t_ok)
        tl.store(source_ptr + row, t.to(tl.int64), mask=t_ok & keep)


@triton.jit
def _plan_kernel(seg_ptr, got_ptr, splits_ptr, off_ptr, off_all_ptr, W, L, D,
                 BW: tl.constexpr, BE: tl.constexpr):
    # seg [W * L] rows sent per (destination, local expert); got [W * L] rows received per (source,
    # local expert). Chunk i of a count c holds c // D + (i < c % D) rows.
    x = tl.arange(0, BE)
    r = tl.arange(0, BW)
    n = W * L
    ok = x < n
    seg = tl.load(seg_ptr + x, mask=ok, other=0)
    got = tl.load(got_ptr + x, mask=ok, other=0)
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


def choose_and_position(logits, k: int, cap: int | None, padded: bool, forced=None, rows: bool = False):
    """Routing of one step: (idx [T, k], weights [T, k] fp32, flat_e, pos, keep [kT], counts, kept [E],
    rows [kT] | None, source [S] | None). weights = softmax over the k chosen logits, differentiable
    w.r.t. logits. cap None: dropless. rows/source only when rows=True (one chunk, no replication):
    source[row] = token of that send-buffer row (padded rows read token T: the appended zero row)."""
    import torch

    if torch.is_grad_enabled() and logits.requires_grad:
        return _route_function().apply(logits, k, cap, padded, forced, rows)
    return _route(logits, k, cap, padded, forced, rows)


def _route(logits, k: int, cap: int | None, padded: bool, forced, rows: bool):
    # Two launches when T > 0 (none when T == 0): every output below is written by a kernel, so
    # they are allocated with torch.empty (zeros / full only where no kernel runs).
    import torch

    T, E = logits.shape
    dev = logits.device
    nb = triton.cdiv(T, BLOCK_TOKENS)
    BE = triton.next_power_of_2(E)
    idx = (forced.to(torch.int64).contiguous() if forced is not None
           else torch.empty((T, k), dtype=torch.int64, device=dev))
    weights = torch.empty((T, k), dtype=torch.float32, device=dev)
    hist = torch.empty((k * nb, E), dtype=torch.int32, device=dev)
    flat_e, pos = (torch.empty(k * T, dtype=torch.int64, device=dev) for _ in range(2))
    keep = torch.empty(k * T, dtype=torch.int8, device=dev)
    counts, kept = ((torch.empty if T else torch.zeros)(E, dtype=torch.int64, device=dev) for _ in range(2))
    limit = cap if cap is not None else k * T + 1
    total = E * cap if padded else k * T
    row_of = torch.empty(k * T, dtype=torch.int64, device=dev) if rows else flat_e
    fill = rows and padded  # padded send rows that no assignment fills read token T (the zero row)
    source = torch.empty(total, dtype=torch.int64, device=dev) if rows else flat_e
    if fill and not T:
        source.fill_(T)
    if T:
        _choose_kernel[(nb,)](logits, idx, weights, hist, source, T, E, nb, logits.stride(0),
                              total if fill else 0, T, K=k, FORCED=forced is not None, BT=BLOCK_TOKENS, BE=BE,
                              BK=triton.next_power_of_2(k), BF=BLOCK_FILL)
        _positions_kernel[(k * nb,)](idx, hist, flat_e, pos, keep, counts, kept, row_of, source, T, E, nb, limit,
                                     K=k, ROWS=rows, PADDED=padded, BT=BLOCK_TOKENS, BE=BE, BR=16)
    return (idx, weights, flat_e, pos, keep.view(torch.bool), counts, kept, (row_of if rows else None),
            (source if rows else None))


@functools.cache
def _route_function():
    """autograd.Function over _route, built on first use (torch is imported only when a kernel runs).
    Only the weights are differentiable; backward: one launch of _weights_grad_kernel."""
    import torch

    class RouteFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, k, cap, padded, forced, rows):
            out = _route(logits, k, cap, padded, forced, rows)
            ctx.save_for_backward(out[0], out[1])
            ctx.logits_shape, ctx.logits_dtype = logits.shape, logits.dtype
            ctx.set_materialize_grads(False)  # no zero gradients for the integer outputs
            return out

        @staticmethod
        def backward(ctx, _d_idx, d_weights, *_rest):
            if d_weights is None:
                return None, None, None, None, None, None
            idx, weights = ctx.saved_tensors
            d_logits = weights_backward(idx, weights, d_weights, ctx.logits_shape[1], ctx.logits_dtype)
            return d_logits, None, None, None, None, None

    return RouteFunction


@triton.jit
def _weights_grad_kernel(idx_ptr, w_ptr, g_ptr, d_ptr, T, E,
                         K: tl.constexpr, BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr):
    # Softmax backward over the k chosen logits, scattered into the full row of E logits:
    # d[t, idx[t, j]] += w_j * (g_j - sum_i w_i g_i), in fp32, one rounding to the logits' dtype.
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    e = tl.arange(0, BE)
    kk = tl.arange(0, BK)
    t_ok = t < T
    ok = t_ok[:, None] & (kk[None, :] < K)
    w = tl.load(w_ptr + t[:, None] * K + kk[None, :], mask=ok, other=0.0)
    g = tl.load(g_ptr + t[:, None] * K + kk[None, :], mask=ok, other=0.0).to(tl.float32)
    ids = tl.load(idx_ptr + t[:, None] * K + kk[None, :], mask=ok, other=-1).to(tl.int32)
    d = w * (g - tl.sum(w * g, 1)[:, None])  # [BT, BK]
    row = tl.zeros((BT, BE), dtype=tl.float32)
    for j in tl.static_range(K):
        dj = tl.sum(tl.where(kk[None, :] == j, d, 0.0), 1)
        ej = tl.sum(tl.where(kk[None, :] == j, ids, 0), 1)
        row += tl.where(e[None, :] == ej[:, None], dj[:, None], 0.0)  # a repeated id accumulates
    tl.store(d_ptr + t[:, None].to(tl.int64) * E + e[None, :], row.to(d_ptr.dtype.element_ty),
             mask=t_ok[:, None] & (e[None, :] < E))


def weights_backward(idx, weights, d_weights, num_experts: int, dtype):
    """d_logits [T, E] (dtype) from the gradient of the combine weights [T, k]: zero except at the
    chosen ids (every entry is written, so no zero fill)."""
    import torch

    T, k = idx.shape
    d_logits = torch.empty((T, num_experts), dtype=dtype, device=idx.device)
    BE = triton.next_power_of_2(num_experts)
    BT = max(1, min(BLOCK_TOKENS, 8192 // BE))  # keep the [BT, BE] tile of the row small
    if T:
        _weights_grad_kernel[(triton.cdiv(T, BT),)](idx, weights, d_weights.contiguous(), d_logits, T,
                                                    num_experts, K=k, BT=BT, BE=BE, BK=triton.next_power_of_2(k))
    return d_logits


def plan_offsets(seg, got, world_size: int, degree: int):
    """(splits [2 * D * W]: send splits of chunk 0..D-1 then receive splits, offsets [D, W * L + 1],
    offsets_all [D * W * L + 1]) from seg and got [W * L] (as plan.prepare / segment_offsets)."""
    import torch

    n, W, D = seg.numel(), world_size, degree
    dev = seg.device
    splits = torch.empty(2 * D * W, dtype=torch.int64, device=dev)
    offsets = torch.empty((D, n + 1), dtype=torch.int64, device=dev)
    offsets_all = torch.empty(D * n + 1, dtype=torch.int64, device=dev)
    _plan_kernel[(1,)](seg, got, splits, offsets, offsets_all, W, n // W, D,
                       BW=triton.next_power_of_2(W), BE=triton.next_power_of_2(n))
    return splits, offsets, offsets_all


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
    import torch

    W, E = counts_all.shape
    L, dev = num_local_experts, counts_all.device
    counts = counts_all.contiguous()
    src_off = torch.empty_like(counts)
    first, seg_start = (torch.empty(L * W, dtype=torch.int64, device=dev) for _ in range(2))
    offsets = torch.empty(L + 1, dtype=torch.int64, device=dev)
    small = torch.empty(5 + 2 * W, dtype=torch.int64, device=dev)
    _block_counts_kernel[(1,)](counts, src_off, first, seg_start, offsets, small, W, L, rank, block_size,
                               BW=triton.next_power_of_2(W), BL=triton.next_power_of_2(L))
    return src_off, (first, seg_start), offsets, small


def block_list(counts_all, src_off, firsts, rank: int, num_local_experts: int, block_size: int, num_blocks: int):
    """(block_src int32, block_row int64, block_rows int32, block_expert int32, block_start int64), each
    [num_blocks]; firsts = (first block, first local row) of every segment, from block_counts."""
    import torch

    W = counts_all.shape[0]
    dev = counts_all.device
    src, rows, expert = (torch.empty(num_blocks, dtype=torch.int32, device=dev) for _ in range(3))
    row, start = (torch.empty(num_blocks, dtype=torch.int64, device=dev) for _ in range(2))
    if num_blocks:
        _block_list_kernel[(num_local_experts * W,)](counts_all.contiguous(), src_off, *firsts, src, row, rows,
                                                     expert, start, W, num_local_experts, rank, block_size,
                                                     BI=16 if interpreting() else 128)
    return src, row, rows, expert, start
