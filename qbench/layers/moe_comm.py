"""Dispatch and combine of the MoE layer behind a small interface, and the per-step row plan.

`A2AExchange.start(out, inp, out_splits, in_splits)` moves rows between ranks with
all_to_all_single and uneven splits (rows, dim 0) and returns a handle with wait(); another
transport (issue 8's `--system blocks`) only needs the same method.

The plan of one step (host integers + device index tensors), for W ranks, L local experts, D chunks:
  seg[r][l]        rows this rank sends to rank r for its local expert l (0 for replicated experts)
  parts(c, D)      a segment of c rows split into D nearly equal chunk parts
  send buffer      chunk-major: chunk i, then destination r, then expert l, then that part's rows
  receive chunk i  source-major (s, l) as all_to_all delivers it; the experts want expert-major
                   (l, s), so `to_expert[i]` gathers rows into that order and `to_source[i]` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


def segment_gather(lengths: list[int], order: list[int], device):
    """Row index that reorders segments (given in storage order with `lengths`) into `order`."""
    import torch

    starts, acc = [], 0
    for n in lengths:
        starts.append(acc)
        acc += n
    lens = [lengths[s] for s in order]
    total = sum(lens)
    lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
    starts_t = torch.tensor([starts[s] for s in order], dtype=torch.int64, device=device)
    seg = torch.repeat_interleave(torch.arange(len(order), device=device), lens_t, output_size=total)
    base = torch.cumsum(lens_t, 0) - lens_t
    return starts_t[seg] + torch.arange(total, device=device) - base[seg]


@dataclass
class ChunkPlan:
    """What the experts of this rank receive in one chunk."""

    send_splits: list[int]  # [W] rows sent to each rank
    recv_splits: list[int]  # [W] rows received from each rank
    to_expert: Any  # gather index: received (source-major) -> expert-major
    to_source: Any  # gather index: expert-major -> received order
    offsets: Any  # int64 [L + 1] group offsets of the expert-major rows
    expert_rows: list[int] = field(default_factory=list)  # [L] rows per local expert


@dataclass
class StepPlan:
    world_size: int
    local_experts: int
    degree: int
    seg: list[list[int]]  # [W][L] sent rows per (destination, local expert)
    recv: list[list[int]]  # [W][L] received rows per (source, local expert)
    chunks: list[ChunkPlan]
    hot: list[int]  # replicated global expert ids (ordered)

    @property
    def send_rows(self) -> int:
        return sum(map(sum, self.seg))

    @property
    def recv_rows(self) -> int:
        return sum(map(sum, self.recv))


def exchange_counts(seg: list[list[int]], device, group=None) -> list[list[int]]:
    """Tell every rank how many rows it gets from us per local expert: all_to_all of [W, L] ints."""
    import torch
    import torch.distributed as dist

    send = torch.tensor(seg, dtype=torch.int64, device=device)
    recv = torch.empty_like(send)
    if dist.get_world_size(group) == 1:
        recv.copy_(send)
    else:
        dist.all_to_all_single(recv, send, group=group)
    return recv.tolist()


def chunk_plan(seg, recv, degree: int, i: int, device) -> ChunkPlan:
    W, L = len(seg), len(seg[0])
    sent = [[parts(seg[r][l], degree)[i] for l in range(L)] for r in range(W)]
    got = [[parts(recv[s][l], degree)[i] for l in range(L)] for s in range(W)]
    flat = [got[s][l] for s in range(W) for l in range(L)]
    expert_order = [s * L + l for l in range(L) for s in range(W)]
    to_expert = segment_gather(flat, expert_order, device)
    to_source = _inverse(to_expert)
    rows = [sum(got[s][l] for s in range(W)) for l in range(L)]
    offsets = _offsets(rows, device)
    return ChunkPlan([sum(x) for x in sent], [sum(x) for x in got], to_expert, to_source, offsets, rows)


def _inverse(index):
    import torch

    inv = torch.empty_like(index)
    inv[index] = torch.arange(index.numel(), device=index.device)
    return inv


def _offsets(rows: list[int], device):
    import torch

    acc, out = 0, [0]
    for n in rows:
        acc += n
        out.append(acc)
    return torch.tensor(out, dtype=torch.int64, device=device)


def send_rows(routing, seg, degree: int, local_experts: int, hot: list[int], device):
    """Row of every assignment in the chunk-major send buffer; -1 for dropped or replicated ones."""
    import torch

    W, L = len(seg), local_experts
    E = W * L
    part_start = [[0] * degree for _ in range(E)]
    base = [[0] * degree for _ in range(E)]
    row = 0
    for i in range(degree):
        for e in range(E):
            p = parts(seg[e // L][e % L], degree)
            part_start[e][i] = sum(p[:i])
            base[e][i] = row
            row += p[i]
    ps = torch.tensor(part_start, dtype=torch.int64, device=device)[routing.flat_e]  # [kT, D]
    bs = torch.tensor(base, dtype=torch.int64, device=device)[routing.flat_e]
    chunk = (ps[:, 1:] <= routing.pos.unsqueeze(1)).sum(1, keepdim=True)
    rows = bs.gather(1, chunk).squeeze(1) + routing.pos - ps.gather(1, chunk).squeeze(1)
    sent = routing.keep & ~_is_hot(routing.flat_e, hot)
    return torch.where(sent, rows, torch.full_like(rows, -1))


def hot_rows(routing, hot: list[int], kept_host: list[int], device):
    """Row of every assignment in the local replica buffer (grouped by hot expert); -1 otherwise,
    and the group offsets [N + 1] of that buffer."""
    import torch

    sizes = [kept_host[e] for e in hot]
    offsets = _offsets(sizes, device)
    slot = torch.full((routing.counts.numel(),), -1, dtype=torch.int64, device=device)
    if hot:
        slot[torch.tensor(hot, device=device)] = torch.arange(len(hot), device=device)
    h = slot[routing.flat_e]
    rows = offsets[h.clamp(min=0)] + routing.pos
    mine = (h >= 0) & routing.keep
    return torch.where(mine, rows, torch.full_like(rows, -1)), offsets, sum(sizes)


def _is_hot(flat_e, hot: list[int]):
    import torch

    if not hot:
        return torch.zeros_like(flat_e, dtype=torch.bool)
    return torch.isin(flat_e, torch.tensor(hot, dtype=flat_e.dtype, device=flat_e.device))


def hottest(global_kept: list[int], n: int) -> list[int]:
    """The n globally most-loaded experts, ties to the lower id (every rank agrees)."""
    ranked = sorted(range(len(global_kept)), key=lambda e: (-global_kept[e], e))
    return sorted(ranked[: min(n, len(global_kept))])
