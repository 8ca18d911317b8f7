"""The per-step row plan of the all-to-all MoE layer (dispatch, expert segments, combine).

The rows move with transport.A2AExchange. Where the step's shapes are static (`static_reason` gives
None: padded capacity, or world size 1 without capped capacity, and no replication) the split sizes
are known on the host without looking at the routing, and `static_plan` builds the plan without any
host synchronisation, so the step can run ahead of the device, compile and graph-capture. Otherwise
the plan of one step, for W ranks, L local experts, D chunks, is built on the device with tensor ops
(no loops over experts or chunks) and read to the host once (the split sizes NCCL needs):
  seg[r, l]        rows this rank sends to rank r for its local expert l (0 for replicated experts);
                   one all_to_all of these [W * L] counts tells every rank what it receives
  parts(c, D)      a segment of c rows split into D nearly equal chunk parts
  send buffer      chunk-major: chunk i, then destination r, then expert l, then that part's rows
  receive buffer   one tensor; chunk i's rows arrive source-major (s, l) as all_to_all delivers them.
                   The expert GEMMs take them in that order: W * L segments per chunk, segment s * L + l
                   multiplied by expert l (kernels/grouped_gemm.py), so no permutation is needed, and
                   the weight gradients run once over all chunks (D * W * L segments, `offsets_all`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def parts(count: int, degree: int) -> list[int]:
    """Split `count` rows into `degree` parts, the first count % degree parts one row longer."""
    q, r = divmod(count, degree)
    return [q + (1 if i < r else 0) for i in range(degree)]


def hottest(global_kept: list[int], n: int) -> list[int]:
    """The n globally most-loaded experts, ties to the lower id (host version of `hottest_device`)."""
    ranked = sorted(range(len(global_kept)), key=lambda e: (-global_kept[e], e))
    return sorted(ranked[: min(n, len(global_kept))])


@dataclass
class ChunkPlan:
    """What this rank sends and receives in one chunk."""

    send_splits: list[int]  # [W] rows sent to each rank
    recv_splits: list[int]  # [W] rows received from each rank
    offsets: Any  # int64 [W * L + 1] chunk-local segment offsets of the received rows, order (s, l)


@dataclass
class StepPlan:
    chunks: list[ChunkPlan]
    hot: list[int]  # replicated global expert ids (ordered)
    kept_counts: Any  # [E] kept assignments per expert on this rank: a host list, or (static plans) a
    #                   device tensor read on the first use of `kept`, outside the step
    send_rows: int
    recv_rows: int
    offsets_all: Any  # int64 [D * W * L + 1] segment offsets of all chunks in the one receive buffer

    @property
    def kept(self) -> list[int]:
        if not isinstance(self.kept_counts, list):
            self.kept_counts = self.kept_counts.tolist()
        return self.kept_counts


@dataclass
class DevicePlan:
    """The device half of a step plan, enqueued without a host synchronisation."""

    rows: Any  # [kT] row of every assignment in the send buffer, -1 when not sent
    hot_rows: Any  # [kT] row in the local replica buffer, -1 otherwise (None without replication)
    hot_offsets: Any  # [N + 1] group offsets of the replica buffer (None without replication)
    offsets: Any  # [D, W * L + 1] chunk-local segment offsets
    offsets_all: Any  # [D * W * L + 1]
    small: Any  # the few integers the host needs, read with one .tolist()
    degree: int
    world_size: int
    source: Any = None  # [send rows] token of every send-buffer row (fast path), or None
    hot_source: Any = None  # [replica rows] token of every replica-buffer row (fast path), or None
    pending: Any = None  # (pinned host copy of `small`, its event) once start_read ran on a GPU


def chunk_parts(counts, degree: int):
    """[n] counts -> [n, D] chunk parts, the first count % D parts one row longer (as `parts`)."""
    import torch

    c = counts.unsqueeze(1)
    if degree == 1:
        return c
    i = torch.arange(degree, device=counts.device)
    return c // degree + (i < c % degree)


def exchange_counts(seg, group=None, world_size: int | None = None):
    """[W * L] rows we send per (rank, local expert) -> [W * L] rows we receive per (source, expert)."""
    import torch
    import torch.distributed as dist

    if world_size == 1 or dist.get_world_size(group) == 1:
        return seg
    recv = torch.empty_like(seg)
    dist.all_to_all_single(recv, seg, group=group)
    return recv


def hottest_device(kept, n: int, group=None):
    """Ids (ascending) of the n globally most-loaded experts, ties to the lower id, on the device."""
    import torch
    import torch.distributed as dist

    total = kept.clone()
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    E = total.numel()
    key = total * E + (E - 1 - torch.arange(E, device=kept.device))  # unique keys: load, then low id
    return key.topk(min(n, E)).indices.sort().values


def send_rows(routing, sent, hot_mask):
    """Row of every assignment in the chunk-major send buffer; -1 for dropped or replicated ones.
    sent [E, D]: chunk parts of the rows sent per expert."""
    import torch

    e, pos = routing.flat_e, routing.pos
    if sent.shape[1] == 1:  # one chunk: the buffer is sorted by expert
        rows = (torch.cumsum(sent[:, 0], 0) - sent[:, 0])[e] + pos
    else:
        per_chunk = sent.sum(0)
        base = (torch.cumsum(per_chunk, 0) - per_chunk) + (torch.cumsum(sent, 0) - sent)  # [E, D] first row
        start = torch.cumsum(sent, 1) - sent  # [E, D] first position of each part in the expert's list
        st = start[e]
        chunk = (st[:, 1:] <= pos.unsqueeze(1)).sum(1, keepdim=True)
        rows = base[e].gather(1, chunk).squeeze(1) + pos - st.gather(1, chunk).squeeze(1)
    keep = routing.keep if hot_mask is None else routing.keep & ~hot_mask[e]
    return torch.where(keep, rows, -1)


def segment_offsets(got):
    """got [W * L, D] received chunk parts per (source, local expert) -> chunk-local segment offsets
    [D, W * L + 1] (received order is (s, l) inside each chunk) and the offsets of all chunks in one
    buffer [D * W * L + 1]."""
    import torch

    ends = torch.cumsum(got.t(), 1)  # [D, W * L]
    offsets = torch.nn.functional.pad(ends, (1, 0))
    totals = ends[:, -1]
    base = torch.cumsum(totals, 0) - totals
    offsets_all = torch.cat([(offsets[:, :-1] + base.unsqueeze(1)).reshape(-1), totals.sum().view(1)])
    return offsets, offsets_all


def hot_rows(routing, hot_ids):
    """Row of every assignment in the local replica buffer (grouped by hot expert), -1 otherwise,
    and the group offsets [N + 1] of that buffer."""
    import torch

    E = routing.kept.numel()
    slot = torch.full((E,), -1, dtype=torch.int64, device=hot_ids.device)
    slot[hot_ids] = torch.arange(hot_ids.numel(), device=hot_ids.device)
    sizes = routing.kept[hot_ids]
    offsets = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])
    h = slot[routing.flat_e]
    rows = offsets[h.clamp(min=0)] + routing.pos
    return torch.where((h >= 0) & routing.keep, rows, -1), offsets


def gather_counts(counts, world_size: int, group=None):
    """[E] per-expert counts of every rank -> [W, E] (one all_gather)."""
    import torch.distributed as dist

    if world_size == 1:
        return counts.unsqueeze(0)
    out = counts.new_empty(world_size * counts.numel())  # flat: gloo's all_gather_into_tensor wants 1-D
    dist.all_gather_into_tensor(out, counts.contiguous(), group=group)
    return out.view(world_size, -1)


def prepare(routing, world_size: int, degree: int, replicate_hot: int, group=None, rows=None,
            source=None, rank: int = 0) -> DevicePlan:
    """Everything of the plan that the device can build before the split sizes reach the host. Split
    sizes and offsets come from one kernel where Triton runs (kernels/moe_route.py), from tensor ops
    otherwise; rows/source: the routing kernel's send rows and their tokens (no replication; chunk-major
    in D chunks).
    With replication and one chunk, where Triton runs: one all_gather of the counts and the
    replication kernels (kernels/moe_hot.py) instead of an all_reduce, an all_to_all and ~40 ops."""
    import torch

    from kernels._common import use_triton

    kept = routing.kept
    if replicate_hot > 0 and degree == 1 and use_triton(kept):
        return _prepare_hot(routing, world_size, replicate_hot, group, rank)
    seg = torch.full_like(kept, routing.capacity) if routing.padded else kept
    hot_ids, hot_mask, hot_r, hot_off = None, None, None, None
    if replicate_hot > 0:
        hot_ids = hottest_device(kept, replicate_hot, group)
        hot_mask = torch.zeros(kept.shape, dtype=torch.bool, device=kept.device).index_fill_(0, hot_ids, True)
        seg = seg.masked_fill(hot_mask, 0)
        hot_r, hot_off = hot_rows(routing, hot_ids)
    got = exchange_counts(seg, group, world_size)
    seg_is_kept = hot_ids is None and not routing.padded
    small, offsets, offsets_all = _splits_and_offsets(seg, got, world_size, degree, seg_is_kept)
    if rows is None:
        rows = send_rows(routing, chunk_parts(seg, degree), hot_mask)
    if small.numel() == 2 * degree * world_size:  # the split sizes alone: the kept counts (and hot ids) after
        small = torch.cat([small, kept] if hot_ids is None else [small, kept, hot_ids])  # no hot ids: none to read
    return DevicePlan(rows, hot_r, hot_off, offsets, offsets_all, small, degree, world_size, source)


def _splits_and_offsets(seg, got, world_size: int, degree: int, seg_is_kept: bool):
    """(split sizes [2 * D * W], followed by seg [W * L] where seg_is_kept and the plan kernel runs: the start of
    the host read without a concatenation; offsets [D, W * L + 1]; offsets_all [D * W * L + 1])."""
    import torch

    from kernels._common import use_triton

    if use_triton(seg):
        from kernels.moe_plan import plan_offsets

        return plan_offsets(seg, got, world_size, degree, seg_after=seg_is_kept)
    sent, got = chunk_parts(seg, degree), chunk_parts(got, degree)
    splits = torch.stack([sent, got]).view(2, world_size, -1, degree).sum(2).transpose(1, 2).reshape(-1)
    return (splits, *segment_offsets(got))


def _prepare_hot(routing, world_size: int, replicate_hot: int, group, rank: int) -> DevicePlan:
    import torch

    from kernels.moe_hot import hot_plan
    from kernels.moe_plan import plan_offsets

    kept = routing.kept
    counts_all = gather_counts(kept, world_size, group)
    hp = hot_plan(counts_all, routing, rank, kept.numel() // world_size, replicate_hot, routing.weights.shape[0],
                  routing.padded)
    splits, offsets, offsets_all = plan_offsets(hp.seg, hp.got, world_size, 1)
    return DevicePlan(hp.rows, hp.hot_rows, hp.hot_offsets, offsets, offsets_all,
                      torch.cat([splits, kept, hp.hot_ids]), 1, world_size, hp.source, hp.hot_source)


def static_reason(capacity_factor: float, replicate_hot: int, world_size: int) -> str | None:
    """Why a step's shapes depend on its routing, so that the host must read the plan (None: static,
    and the step can run without a host synchronisation, compile with fullgraph and graph-capture)."""
    if replicate_hot > 0:
        return "hot-expert replication picks the replicated experts on the host every step"
    if capacity_factor < 0:
        return "capped capacity (capacity factor < 0) sizes the expert buffers from each step's counts"
    if capacity_factor == 0 and world_size > 1:
        return ("dropless routing: the host must learn each step's all-to-all split sizes "
                "(a capacity factor > 0 pads every split to a fixed size)")
    return None


def step_chunks(world_size: int, overlap_degree: int) -> int:
    """Chunks of a step: the overlap degree, 1 at world size 1 (no exchange to overlap the experts with)."""
    return overlap_degree if world_size > 1 else 1


def segments_from_routing(world_size: int, degree: int) -> bool:
    """Whether the routing kernel's send offsets are the step's expert segments (one rank, one chunk: the experts
    run on the send buffer itself), so that the plan launches nothing where the routing kernel gave them."""
    return world_size == 1 and degree == 1


def static_plan(routing, world_size: int, local_experts: int, degree: int, rows=None, source=None,
                send_offsets=None):
    """(StepPlan, DevicePlan) of a step whose shapes do not depend on its routing, without a host read:
    padded capacity (C rows per expert: every split holds L x C rows, chunk parts of C) or, at world
    size 1, dropless routing (every one of the k * T assignments kept, k * T rows). rows/source: the
    routing kernel's send rows and their tokens (one chunk), else built here with tensor ops;
    send_offsets: the routing kernel's expert offsets of the send buffer [E + 1], which at world size 1
    with one chunk are the expert segments themselves (no plan launch), or None."""
    import torch

    from kernels._common import use_triton

    W, L, D, kept = world_size, local_experts, degree, routing.kept
    cap = routing.capacity if routing.padded else None
    if cap is None and W > 1:
        raise ValueError(f"no static plan: {static_reason(0.0, 0, W)}")
    if send_offsets is not None and segments_from_routing(W, D):
        offsets, offsets_all = [send_offsets], send_offsets
    elif use_triton(kept):
        from kernels.moe_plan import plan_offsets

        _, offsets, offsets_all = plan_offsets(kept, kept, W, D, cap)
    else:
        offsets, offsets_all = segment_offsets(chunk_parts(kept if cap is None else torch.full_like(kept, cap), D))
    if rows is None:
        seg = kept if cap is None else torch.full_like(kept, cap)
        rows = send_rows(routing, chunk_parts(seg, D), None)
    per_rank = [L * p for p in parts(cap, D)] if cap is not None else [routing.flat_e.numel()]
    chunks = [ChunkPlan([n] * W, [n] * W, offsets[i]) for i, n in enumerate(per_rank)]
    total = W * sum(per_rank)
    plan = StepPlan(chunks, [], kept, total, total, offsets_all)
    return plan, DevicePlan(rows, None, None, offsets, offsets_all, None, D, W, source)


def start_read(dp: DevicePlan) -> None:
    """Start the step's host read without waiting: on a GPU, `small` is copied into pinned host memory
    on the current stream (non_blocking) and an event marks the copy's end, so that the caller can queue
    work that needs no host value before `finish` waits for it (the GPU then has work while the host
    waits and reads). On the CPU there is nothing to start."""
    import torch

    if not dp.small.is_cuda:
        return
    host = torch.empty(dp.small.shape, dtype=dp.small.dtype, pin_memory=True)  # the caching host allocator
    host.copy_(dp.small, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    dp.pending = (host, done)


def finish(dp: DevicePlan) -> StepPlan:
    """The one host synchronisation of a step: split sizes, kept counts and hot ids to the host (from the
    copy start_read made, once its event has passed, else read now)."""
    D, W = dp.degree, dp.world_size
    if dp.pending is not None:
        host, done = dp.pending
        done.synchronize()
        values = host.tolist()
    else:
        values = dp.small.tolist()
    send, recv = values[: D * W], values[D * W: 2 * D * W]
    E = (dp.offsets.shape[1] - 1)
    kept, hot = values[2 * D * W: 2 * D * W + E], values[2 * D * W + E:]
    chunks = [ChunkPlan(send[i * W:(i + 1) * W], recv[i * W:(i + 1) * W], dp.offsets[i]) for i in range(D)]
    return StepPlan(chunks, hot, kept, sum(send), sum(recv), dp.offsets_all)
