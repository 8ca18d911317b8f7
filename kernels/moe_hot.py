"""The replication ("hot expert") part of an MoE step plan in two launches instead of ~40 tensor ops.

With `--replicate-hot N` the N globally most-loaded experts are computed on every rank for that
rank's own rows. Before the step's one host synchronisation the plan only moves a few kilobytes, so
its cost is the host's launch time per op (~17 us each on the H200 hosts): this file replaces the
tensor-op chain of qbench/layers/moe/plan.py: hottest_device / hot_rows / send_rows with two kernels.

Inputs (per rank: T tokens, k choices, E = W * L experts, assignments a = j * T + t):
  counts_all [W, E] int64  kept assignments of every rank per expert (one all_gather)
  flat_e, pos [kT] int64, keep [kT] bool  the routing (expert, position in its list, kept)
  _hot_choice_kernel  grid (1): global loads, the N hottest experts (ties to the lower id, as
      plan.hottest), their slots, and everything per expert the rows need:
      slot [E] (-1 or the replica slot), hot_ids [N] ascending, seg [E] rows this rank sends per
      expert (cap when padded, 0 for hot experts), first [E] = exclusive cumsum of seg (send-buffer
      row of each expert's first row), hot_off [N + 1] replica-buffer offsets (this rank's kept rows),
      got [W * L] rows each source sends to this rank's experts (order (s, l), 0 for hot ones),
      masked [W, E] counts_all with the hot experts' columns zeroed
  _hot_rows_kernel  grid (kT / BA): every assignment's send row (-1: dropped or replicated) and
      replica row (-1: not replicated), and the inverse maps source[row] = token, hot_source[row] = token
Eager calls replay compiled kernels per shape (kernels._common.launch.LaunchCache); while torch.compile traces,
the plan is one custom op (torch.ops.qbench.moe_hot_plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, interpreting, is_compiling, next_power_of_2, register_op
from kernels._common.launch import LaunchCache, aligned

BLOCK_ASSIGNMENTS = 16 if interpreting() else 1024


@triton.jit
def _expert_totals(counts_ptr, e, ok, W, E):
    total = tl.zeros(e.shape, dtype=tl.int64)
    for s in range(W):
        total += tl.load(counts_ptr + s * E + e, mask=ok, other=0)
    return total


@triton.jit
def _hot_choice_kernel(counts_ptr, slot_ptr, hot_ptr, seg_ptr, first_ptr, hot_off_ptr, got_ptr, masked_ptr,
                       W, E, L, RANK, N, CAP,
                       PADDED: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BL: tl.constexpr):
    e = tl.arange(0, BE)
    ok = e < E
    # Unique keys: load first, then the lower id; the N largest keys are the hot experts.
    key = _expert_totals(counts_ptr, e, ok, W, E) * E + (E - 1 - e)
    higher = tl.zeros((BE,), dtype=tl.int32)
    for c0 in range(0, E, BC):  # [BE, BC] comparisons per pass keeps the tile small for large E
        c = c0 + tl.arange(0, BC)
        c_ok = c < E
        kc = _expert_totals(counts_ptr, c, c_ok, W, E) * E + (E - 1 - c)
        higher += tl.sum((c_ok[None, :] & (kc[None, :] > key[:, None])).to(tl.int32), 1)
    hot = ok & (higher < N)
    h = hot.to(tl.int64)
    slot = tl.where(hot, tl.cumsum(h, 0) - h, -1)
    tl.store(slot_ptr + e, slot, mask=ok)
    tl.store(hot_ptr + slot, e.to(tl.int64), mask=hot)
    mine = tl.load(counts_ptr + RANK * E + e, mask=ok, other=0)
    seg = tl.where(hot | ~ok, 0, CAP if PADDED else mine)
    tl.store(seg_ptr + e, seg, mask=ok)
    tl.store(first_ptr + e, tl.cumsum(seg, 0) - seg, mask=ok)
    sizes = tl.where(hot, mine, 0)
    tl.store(hot_off_ptr + slot, tl.cumsum(sizes, 0) - sizes, mask=hot)
    tl.store(hot_off_ptr + N + e, tl.zeros((BE,), dtype=tl.int64) + tl.sum(sizes, 0), mask=e == 0)
    for s in range(W):
        c = tl.load(counts_ptr + s * E + e, mask=ok, other=0)
        tl.store(masked_ptr + s * E + e, tl.where(hot, 0, c), mask=ok)
    # got [s * L + l]: what source s sends to my expert l = RANK * L + l (CAP per expert when padded)
    l = tl.arange(0, BL)
    l_ok = l < L
    mine_hot = tl.sum(((e[None, :] == RANK * L + l[:, None]) & hot[None, :]).to(tl.int32), 1) > 0  # [BL]
    for s in range(W):
        c = tl.load(counts_ptr + s * E + RANK * L + l, mask=l_ok, other=0)
        c = tl.where(mine_hot, 0, CAP if PADDED else c)
        tl.store(got_ptr + s * L + l, c, mask=l_ok)


@triton.jit
def _hot_rows_kernel(flat_e_ptr, pos_ptr, keep_ptr, slot_ptr, first_ptr, hot_off_ptr,
                     rows_ptr, source_ptr, hot_rows_ptr, hot_source_ptr, T, KT, BA: tl.constexpr):
    a = tl.program_id(0) * BA + tl.arange(0, BA)
    ok = a < KT
    e = tl.load(flat_e_ptr + a, mask=ok, other=0)
    pos = tl.load(pos_ptr + a, mask=ok, other=0)
    kept = ok & (tl.load(keep_ptr + a, mask=ok, other=0) != 0)
    slot = tl.load(slot_ptr + e, mask=ok, other=-1)
    token = (a % T).to(tl.int64)
    sent = kept & (slot < 0)
    row = tl.load(first_ptr + e, mask=sent, other=0) + pos
    tl.store(rows_ptr + a, tl.where(sent, row, -1), mask=ok)
    tl.store(source_ptr + row, token, mask=sent)
    local = kept & (slot >= 0)
    hot_row = tl.load(hot_off_ptr + tl.maximum(slot, 0), mask=local, other=0) + pos
    tl.store(hot_rows_ptr + a, tl.where(local, hot_row, -1), mask=ok)
    tl.store(hot_source_ptr + hot_row, token, mask=local)


@dataclass
class HotPlan:
    """Device tensors of the replication plan (see the module docstring for shapes)."""

    hot_ids: Any
    seg: Any
    got: Any
    masked: Any
    hot_offsets: Any
    rows: Any  # [kT] send-buffer row, -1: dropped or replicated
    source: Any  # [upper bound] token of every send row (padded rows: T, the appended zero row)
    hot_rows: Any  # [kT] replica-buffer row, -1 otherwise
    hot_source: Any  # [kT] token of every replica row (the first sum(hot kept) entries are valid)


def hot_plan(counts_all, routing, rank: int, num_local_experts: int, n_hot: int, tokens: int,
             padded: bool) -> HotPlan:
    """The replication plan of one step from counts_all [W, E] (kept per rank and expert) and this
    rank's Routing (flat_e, pos, keep, capacity): two launches, no host synchronisation. padded: send
    buffers hold `routing.capacity` rows per (non-hot) expert."""
    args = (counts_all, routing.flat_e, routing.pos, routing.keep, rank, num_local_experts, n_hot, tokens, padded,
            routing.capacity if padded else 0)
    return HotPlan(*(_OP(*args) if is_compiling() else _hot_plan(*args)))


_CHOICE = LaunchCache("moe_hot_choice")
_ROWS = LaunchCache("moe_hot_rows")


def _hot_plan(counts_all, flat_e, pos, keep, rank: int, L: int, n_hot: int, tokens: int, padded: bool, cap: int):
    W, E = counts_all.shape
    dev, kT = counts_all.device, flat_e.numel()
    counts = counts_all.contiguous()
    n = min(n_hot, E)
    slot, seg, first = (torch.empty(E, dtype=torch.int64, device=dev) for _ in range(3))
    hot_ids = torch.empty(n, dtype=torch.int64, device=dev)
    hot_off = torch.empty(n + 1, dtype=torch.int64, device=dev)
    got = torch.empty(W * L, dtype=torch.int64, device=dev)
    masked = torch.empty_like(counts)
    BE = next_power_of_2(E)
    args = (counts, slot, hot_ids, seg, first, hot_off, got, masked, W, E, L, rank, n, cap)
    consts = (padded, BE, min(BE, 16 if interpreting() else 64), next_power_of_2(L))
    key = (W, E, L, rank, n, cap, padded, aligned(*args[:8]), dev)
    _CHOICE.launch(key, args, lambda: (_hot_choice_kernel[(1,)](*args, *consts), (1,), consts, {}))
    rows, hot_rows, hot_source = (torch.empty(kT, dtype=torch.int64, device=dev) for _ in range(3))
    total = E * cap if padded else kT
    source = (torch.full((total,), tokens, dtype=torch.int64, device=dev) if padded
              else torch.empty(total, dtype=torch.int64, device=dev))
    if kT:
        args = (flat_e, pos, keep, slot, first, hot_off, rows, source, hot_rows, hot_source, tokens, kT)
        grid = (cdiv(kT, BLOCK_ASSIGNMENTS),)
        key = (kT, tokens, aligned(*args[:10]), dev)
        _ROWS.launch(key, args, lambda: (_hot_rows_kernel[grid](*args, BA=BLOCK_ASSIGNMENTS), grid,
                                         (BLOCK_ASSIGNMENTS,), {}))
    return hot_ids, seg, got, masked, hot_off, rows, source, hot_rows, hot_source


def _op_hot_plan(counts_all: torch.Tensor, flat_e: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor, rank: int,
                 L: int, n_hot: int, tokens: int, padded: bool, cap: int) -> list[torch.Tensor]:
    return list(_hot_plan(counts_all, flat_e, pos, keep, rank, L, n_hot, tokens, padded, cap))


def _fake_hot_plan(counts_all, flat_e, pos, keep, rank, L, n_hot, tokens, padded, cap):
    W, E = counts_all.shape
    ints = lambda n: counts_all.new_empty(n)  # noqa: E731
    n, kT = min(n_hot, E), flat_e.numel()
    return [ints(n), ints(E), ints(W * L), torch.empty_like(counts_all), ints(n + 1), ints(kT),
            ints(E * cap if padded else kT), ints(kT), ints(kT)]


_OP = register_op("moe_hot_plan", _op_hot_plan, _fake_hot_plan)
