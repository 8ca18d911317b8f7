"""MoE routing in two small launches instead of ~50 tensor ops (the step plan: kernels/moe_plan.py).

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
                     counts / kept per expert; without replication also the row of every
                     assignment in the send buffer and the inverse map source[row] = token: sorted
                     by expert with one chunk; with D chunks chunk-major,
                     chunk c holding part c of every expert's C rows (qbench.layers.moe.plan.parts)
  _weights_grad_kernel  grid (T / BT): backward of the weights, d_logits [T, E] (zero off the choices)
Eager calls launch directly and replay compiled kernels per shape (kernels._common.launch.LaunchCache);
while torch.compile traces, the routing and its backward are custom ops (torch.ops.qbench.moe_route,
moe_route_weights_backward) inside the same autograd.Function.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, interpreting, is_compiling, next_power_of_2, register_op
from kernels._common.launch import LaunchCache, aligned

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
                      rows_ptr, source_ptr, send_off_ptr, T, E, NB, CAP,
                      K: tl.constexpr, ROWS: tl.constexpr, PADDED: tl.constexpr, CHUNKS: tl.constexpr,
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
    if ROWS:  # no replication: rows sorted by expert (padded: CAP rows per expert), or chunk-major
        sizes = tl.where(e_ok, tl.zeros((BE,), dtype=tl.int32) + CAP, 0) if PADDED else kept  # send rows per expert
        if CHUNKS > 1:  # chunk c holds part c of every expert's rows, experts in order
            row = _chunked_row(choice, pos, e, sizes, CHUNKS)
        else:
            ends = tl.cumsum(sizes, 0)
            first = ends - sizes
            row = tl.sum(first[None, :] * hits, 1) + pos
            if pid == 0:  # the send buffer's expert offsets [E + 1]
                tl.store(send_off_ptr + 1 + e, ends.to(tl.int64), mask=e_ok)
                tl.store(send_off_ptr + e, tl.zeros((BE,), dtype=tl.int64), mask=e == 0)
        row = tl.where(keep, row, -1)
        tl.store(rows_ptr + a, row.to(tl.int64), mask=t_ok)
        tl.store(source_ptr + row, t.to(tl.int64), mask=t_ok & keep)


@triton.jit
def _chunked_row(choice, pos, e, sizes, CHUNKS: tl.constexpr):
    """Row of the assignment at position pos [BT] of expert `choice` [BT] in a chunk-major send buffer:
    expert e' sends sizes[e'] rows ([BE], 0 past E; e = arange(BE)), split into CHUNKS parts, the first
    sizes % CHUNKS one row longer (plan.parts); chunk c holds part c of expert 0, 1, ..., E - 1, after the
    parts of every expert in the chunks before (plan.send_rows' layout)."""
    mine = e[None, :] == choice[:, None]  # [BT, BE]
    n = tl.sum(tl.where(mine, sizes[None, :], 0), 1)  # rows of the assignment's expert
    q = n // CHUNKS
    r = n % CHUNKS
    longer = r * (q + 1)  # the rows of the longer parts
    c = tl.where(pos < longer, pos // (q + 1), r + (pos - longer) // tl.maximum(q, 1))  # its chunk
    start = c * q + tl.minimum(c, r)  # its part's first position in the expert's list
    qs = sizes[None, :] // CHUNKS
    rs = sizes[None, :] % CHUNKS
    earlier = c[:, None] * qs + tl.minimum(c[:, None], rs)  # [BT, BE] every expert's rows in chunks before c
    part = qs + (c[:, None] < rs).to(tl.int32)  # [BT, BE] every expert's part in chunk c
    before = tl.sum(earlier, 1) + tl.sum(tl.where(e[None, :] < choice[:, None], part, 0), 1)
    return before + (pos - start)


def io_bytes(tokens: int, experts: int, k: int, elem: int) -> int:
    """Bytes the two routing launches read and write with send rows: the logits [T, E] (elem bytes each); per
    assignment the int64 id, position, expert, send row and source token, the fp32 weight and the keep flag
    (the per-block histogram, a few kB, left out). What `qbench model calibrate` rates the kernels by and
    `qbench explain` predicts them from."""
    return tokens * experts * elem + tokens * k * (5 * 8 + 4 + 1)


def choose_and_position(logits, k: int, cap: int | None, padded: bool, forced=None, rows: bool = False,
                        chunks: int = 1):
    """Routing of one step: (idx [T, k], weights [T, k] fp32, flat_e, pos, keep [kT], counts, kept [E],
    rows [kT] | None, source [S] | None, send_offsets [E + 1] | None). weights = softmax over the k chosen
    logits, differentiable w.r.t. logits. cap None: dropless. rows/source only when rows=True (no
    replication): source[row] = token of that send-buffer row (padded rows read token T: the appended zero
    row); the buffer is sorted by expert, or with chunks > 1 chunk-major (plan.send_rows' layout).
    send_offsets: with rows and one chunk, where each expert's rows start in the send buffer (its last entry
    the buffer's size): at world size 1 the expert segments, so that the step needs no plan launch."""
    if chunks > 1 and not rows:
        raise ValueError("chunks > 1 orders the send rows: pass rows=True")
    cap = -1 if cap is None else cap
    if torch.is_grad_enabled() and logits.requires_grad:
        out = RouteFunction.apply(logits, k, cap, padded, forced, rows, chunks)
    else:
        out = _route_any(logits, k, cap, padded, forced, rows, chunks)
    if not rows:
        return (*out[:7], None, None, None)
    return (*out[:9], out[9] if out[9].numel() else None)


def _route_any(logits, k: int, cap: int, padded: bool, forced, rows: bool, chunks: int):
    if is_compiling():
        return _OPS["route"](logits, k, cap, padded, forced, rows, chunks)
    return _route(logits, k, cap, padded, forced, rows, chunks)


_CHOOSE = LaunchCache("moe_route_choose")
_POSITIONS = LaunchCache("moe_route_positions")


def _route(logits, k: int, cap: int, padded: bool, forced, rows: bool, chunks: int, one_buffer: bool = True):
    # Two launches when T > 0 (none when T == 0): every output below is written by a kernel, so
    # they are allocated with torch.empty (zeros / full only where no kernel runs). cap < 0: dropless.
    # one_buffer: the int64 outputs are parts of one allocation (two host calls instead of seven: the step's
    # host time is spent per op); a custom op's outputs may not alias each other, so it allocates each.
    T, E = logits.shape
    dev = logits.device
    nb = cdiv(T, BLOCK_TOKENS)
    total = E * cap if padded else k * T
    offsets = E + 1 if rows and chunks == 1 else 0
    sizes = (0 if forced is not None else T * k, k * T, k * T, E, E, k * T if rows else 0, total if rows else 0,
             offsets)
    if one_buffer:
        ints = torch.empty(sum(sizes), dtype=torch.int64, device=dev).split(sizes)
    else:
        ints = [torch.empty(n, dtype=torch.int64, device=dev) for n in sizes]
    chosen, flat_e, pos, counts, kept, row_of, source, send_off = ints
    idx = forced.to(torch.int64).contiguous() if forced is not None else chosen.view(T, k)
    weights = torch.empty((T, k), dtype=torch.float32, device=dev)
    hist = torch.empty((k * nb, E), dtype=torch.int32, device=dev)
    keep = torch.empty(k * T, dtype=torch.int8, device=dev)
    limit = cap if cap >= 0 else k * T + 1
    fill = rows and padded  # padded send rows that no assignment fills read token T (the zero row)
    if not T:
        counts.zero_()
        kept.zero_()
        if offsets:  # padded: cap rows per expert whatever the tokens
            send_off.copy_(torch.arange(E + 1, device=dev) * (cap if padded else 0))
        if fill:
            source.fill_(T)
    if T:
        _launch_route(logits, (idx, weights, hist, flat_e, pos, keep, counts, kept),
                      (row_of, source, send_off if offsets else flat_e) if rows else (flat_e, flat_e, flat_e),
                      (k, forced is not None, rows, padded, limit, total if fill else 0, chunks if rows else 1))
    return idx, weights, flat_e, pos, keep.view(torch.bool), counts, kept, row_of, source, send_off


def _launch_route(logits, outs, send, flags) -> None:
    """_choose_kernel then _positions_kernel; send = (row of every assignment, source of every row, the
    send offsets), each flat_e where not written; flags = (k, forced, rows, padded, capacity limit, rows to
    fill, chunks of the send rows)."""
    idx, weights, hist, flat_e, pos, keep, counts, kept = outs
    row_of, source, send_off = send
    k, forced, rows, padded, limit, fill, chunks = flags
    T, E = logits.shape
    nb = cdiv(T, BLOCK_TOKENS)
    BE = next_power_of_2(E)
    key = (T, E, logits.stride(0), logits.dtype, flags, logits.device,
           aligned(logits, idx, weights, hist, flat_e, pos, keep, counts, kept, row_of, source, send_off))
    args = (logits, idx, weights, hist, source, T, E, nb, logits.stride(0), fill, T)
    consts = (k, forced, BLOCK_TOKENS, BE, next_power_of_2(k), BLOCK_FILL)
    _CHOOSE.launch(key, args, lambda: (_choose_kernel[(nb,)](*args, *consts), (nb,), consts, {}))
    args = (idx, hist, flat_e, pos, keep, counts, kept, row_of, source, send_off, T, E, nb, limit)
    consts = (k, rows, padded, chunks, BLOCK_TOKENS, BE, 16)
    _POSITIONS.launch(key, args, lambda: (_positions_kernel[(k * nb,)](*args, *consts), (k * nb,), consts, {}))


class RouteFunction(torch.autograd.Function):
    """Routing with differentiable combine weights (the other outputs are integers or masks);
    backward: one launch of _weights_grad_kernel. cap < 0: dropless."""

    @staticmethod
    def forward(ctx, logits, k, cap, padded, forced, rows, chunks):
        out = _route_any(logits, k, cap, padded, forced, rows, chunks)
        ctx.save_for_backward(out[0], out[1])
        ctx.num_experts, ctx.logits_dtype = logits.shape[1], logits.dtype
        ctx.mark_non_differentiable(*out[:1], *out[2:])
        ctx.set_materialize_grads(False)  # no zero gradients for the integer outputs
        return out

    @staticmethod
    def backward(ctx, _d_idx, d_weights, *_rest):
        if d_weights is None:
            return None, None, None, None, None, None, None
        idx, weights = ctx.saved_tensors
        d_logits = weights_backward(idx, weights, d_weights, ctx.num_experts, ctx.logits_dtype)
        return d_logits, None, None, None, None, None, None


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


_WEIGHTS_GRAD = LaunchCache("moe_route_weights_grad")


def weights_backward(idx, weights, d_weights, num_experts: int, dtype):
    """d_logits [T, E] (dtype) from the gradient of the combine weights [T, k]: zero except at the
    chosen ids (every entry is written, so no zero fill)."""
    if is_compiling():
        return _OPS["weights_backward"](idx, weights, d_weights, num_experts, dtype)
    return _weights_backward(idx, weights, d_weights, num_experts, dtype)


def _weights_backward(idx, weights, d_weights, num_experts: int, dtype):
    T, k = idx.shape
    d_logits = torch.empty((T, num_experts), dtype=dtype, device=idx.device)
    if not T:
        return d_logits
    d_weights = d_weights if d_weights.is_contiguous() else d_weights.contiguous()
    BE = next_power_of_2(num_experts)
    BT = max(1, min(BLOCK_TOKENS, 8192 // BE))  # keep the [BT, BE] tile of the row small
    args, grid = (idx, weights, d_weights, d_logits, T, num_experts), (cdiv(T, BT),)
    consts = (k, BT, BE, next_power_of_2(k))
    key = (T, num_experts, k, dtype, d_weights.dtype, aligned(idx, weights, d_weights, d_logits), idx.device)
    _WEIGHTS_GRAD.launch(key, args, lambda: (_weights_grad_kernel[grid](*args, *consts), grid, consts, {}))
    return d_logits


# ------------------------------------------------------------------------------------ custom ops


def _op_route(logits: torch.Tensor, k: int, cap: int, padded: bool, forced: torch.Tensor | None,
              rows: bool, chunks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor]:
    out = _route(logits, k, cap, padded, forced, rows, chunks, one_buffer=False)
    # a custom op's outputs may not alias its inputs: the forced ids pass through as idx
    return (out[0].clone() if forced is not None and out[0].data_ptr() == forced.data_ptr() else out[0], *out[1:])


def _fake_route(logits, k, cap, padded, forced, rows, chunks):
    T, E = logits.shape
    ints = lambda *shape: logits.new_empty(shape, dtype=torch.int64)  # noqa: E731
    total = E * cap if padded else k * T
    return (ints(T, k), logits.new_empty((T, k), dtype=torch.float32), ints(k * T), ints(k * T),
            logits.new_empty(k * T, dtype=torch.bool), ints(E), ints(E), ints(k * T if rows else 0),
            ints(total if rows else 0), ints(E + 1 if rows and chunks == 1 else 0))


def _op_weights_backward(idx: torch.Tensor, weights: torch.Tensor, d_weights: torch.Tensor, num_experts: int,
                         dtype: torch.dtype) -> torch.Tensor:
    return _weights_backward(idx, weights, d_weights, num_experts, dtype)


_OPS = {"route": register_op("moe_route", _op_route, _fake_route),
        "weights_backward": register_op("moe_route_weights_backward", _op_weights_backward,
                                        lambda idx, w, g, e, dtype: idx.new_empty((idx.shape[0], e), dtype=dtype))}
