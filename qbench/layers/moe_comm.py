"""Dispatch and combine of the MoE layer behind a small interface, and the per-step row plan.

`A2AExchange.start(out, inp, out_splits, in_splits)` moves rows between ranks with
all_to_all_single and uneven splits (rows, dim 0) and returns a handle with wait(); another
transport (issue 8's `--system blocks`) only needs the same method.

The plan of one step, for W ranks, L local experts, D chunks, built on the device with tensor ops
(no loops over experts or chunks) and read to the host once (the split sizes NCCL needs):
  seg[r, l]        rows this rank sends to rank r for its local expert l (0 for replicated experts);
                   one all_to_all of these [W * L] counts tells every rank what it receives
  parts(c, D)      a segment of c rows split into D nearly equal chunk parts
  send buffer      chunk-major: chunk i, then destination r, then expert l, then that part's rows
  receive chunk i  source-major (s, l) as all_to_all delivers it; the experts want expert-major
                   (l, s), so `index` gathers rows into that order (and index_copy_ puts them back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class _Done:
    def wait(self) -> None:
        return None


class A2AExchange:
    """all_to_all_single with uneven splits; asynchronous so that chunks can pipeline."""

    def __init__(self, group=None):
        self.group = group

    def start(self, out, inp, out_splits: list[int], in_splits: list[int]):
        import torch.distributed as dist

        if dist.get_world_size(self.group) == 1:
            out.copy_(inp)
            return _Done()
        return dist.all_to_all_single(
            out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
            group=self.group, async_op=True,
        )


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
    index: Any  # int64 [received rows]: expert-major row j is received row index[j]
    offsets: Any  # int64 [L + 1] group offsets of the expert-major rows


@dataclass
class StepPlan:
    chunks: list[ChunkPlan]
    hot: list[int]  # replicated global expert ids (ordered)
    kept: list[int]  # [E] kept assignments per expert on this rank
    send_rows: int
    recv_rows: int


@dataclass
class DevicePlan:
    """The device half of a step plan, enqueued without a host synchronisation."""

    rows: Any  # [kT] row of every assignment in the send buffer, -1 when not sent
    hot_rows: Any  # [kT] row in the local replica buffer, -1 otherwise (None without replication)
    hot_offsets: Any  # [N + 1] group offsets of the replica buffer (None without replication)
    index: Any  # [bound] expert-major gather index of all chunks (valid up to the received rows)
    offsets: Any  # [D, L + 1]
    got: Any  # [W * L, D] received chunk parts (to rebuild `index` if the bound was too small)
    small: Any  # the few integers the host needs, read with one .tolist()
    degree: int
    world_size: int


def chunk_parts(counts, degree: int):
    """[n] counts -> [n, D] chunk parts, the first count % D parts one row longer (as `parts`)."""
    import torch

    c = counts.unsqueeze(1)
    if degree == 1:
        return c
    i = torch.arange(degree, device=counts.device)
    return c // degree + (i < c % degree)


def exchange_counts(seg, group=None):
    """[W * L] rows we send per (rank, local expert) -> [W * L] rows we receive per (source, expert)."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
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
    per_chunk = sent.sum(0)
    base = (torch.cumsum(per_chunk, 0) - per_chunk) + (torch.cumsum(sent, 0) - sent)  # [E, D] first row
    if sent.shape[1] == 1:
        rows = base[e, 0] + pos
    else:
        start = torch.cumsum(sent, 1) - sent  # [E, D] first position of each part in the expert's list
        st = start[e]
        chunk = (st[:, 1:] <= pos.unsqueeze(1)).sum(1, keepdim=True)
        rows = base[e].gather(1, chunk).squeeze(1) + pos - st.gather(1, chunk).squeeze(1)
    keep = routing.keep if hot_mask is None else routing.keep & ~hot_mask[e]
    return torch.where(keep, rows, -1)


def receive_index(got, world_size: int, degree: int, bound: int):
    """Expert-major gather index of every chunk (concatenated, chunk-local values, `bound` long) and
    the group offsets [D, L + 1]; got [W * L, D] received chunk parts per (source, local expert)."""
    import torch

    W, D = world_size, degree
    G = got.view(W, -1, D).permute(2, 0, 1)  # [D, W, L] storage order (s, l) inside chunk i
    flat = G.reshape(D, -1)
    start = (torch.cumsum(flat, 1) - flat).view_as(G)  # chunk-local first row of segment (s, l)
    lens = G.transpose(1, 2).reshape(-1)  # target order (i, l, s)
    end = torch.cumsum(lens, 0)
    j = torch.arange(bound, device=got.device)
    seg = torch.searchsorted(end, j, right=True).clamp(max=lens.numel() - 1)
    index = start.transpose(1, 2).reshape(-1)[seg] + j - (end - lens)[seg]
    rows = G.sum(1)  # [D, L]
    offsets = torch.cat([rows.new_zeros((D, 1)), torch.cumsum(rows, 1)], 1)
    return index, offsets


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


def prepare(routing, world_size: int, degree: int, replicate_hot: int, group=None) -> DevicePlan:
    """Everything of the plan that the device can build before the split sizes reach the host."""
    import torch

    kept = routing.kept
    seg = torch.full_like(kept, routing.capacity) if routing.padded else kept
    hot_ids, hot_mask, hot_r, hot_off = kept.new_empty(0), None, None, None
    if replicate_hot > 0:
        hot_ids = hottest_device(kept, replicate_hot, group)
        hot_mask = torch.zeros(kept.shape, dtype=torch.bool, device=kept.device).index_fill_(0, hot_ids, True)
        seg = seg.masked_fill(hot_mask, 0)
        hot_r, hot_off = hot_rows(routing, hot_ids)
    got = chunk_parts(exchange_counts(seg, group), degree)
    sent = chunk_parts(seg, degree)
    W = world_size
    splits = torch.cat([sent.view(W, -1, degree).sum(1).t().reshape(-1),
                        got.view(W, -1, degree).sum(1).t().reshape(-1)])
    # Upper bound of the received rows: every rank sends at most E * capacity (padded) or k * T rows.
    per_rank = kept.numel() * routing.capacity if routing.padded else routing.flat_e.numel()
    index, offsets = receive_index(got, W, degree, W * per_rank)
    rows = send_rows(routing, sent, hot_mask)
    return DevicePlan(rows, hot_r, hot_off, index, offsets, got, torch.cat([splits, kept, hot_ids]),
                      degree, W)


def finish(dp: DevicePlan) -> StepPlan:
    """The one host synchronisation of a step: split sizes, kept counts and hot ids to the host."""
    D, W = dp.degree, dp.world_size
    values = dp.small.tolist()
    send, recv = values[: D * W], values[D * W: 2 * D * W]
    E = dp.got.shape[0]
    kept, hot = values[2 * D * W: 2 * D * W + E], values[2 * D * W + E:]
    totals = [sum(recv[i * W:(i + 1) * W]) for i in range(D)]
    index = dp.index
    if sum(totals) > index.numel():  # ranks with more tokens than this one: rebuild at the exact size
        index, _ = receive_index(dp.got, W, D, sum(totals))
    chunks, first = [], 0
    for i in range(D):
        chunks.append(ChunkPlan(send[i * W:(i + 1) * W], recv[i * W:(i + 1) * W],
                                index[first:first + totals[i]], dp.offsets[i]))
        first += totals[i]
    return StepPlan(chunks, hot, kept, sum(send), sum(totals))
