"""Block plan of `qbench moe --system blocks`, and its all_to_all fallback transport.

Per rank r of W ranks, L local experts, E = W * L global experts, block size B (rows):
  counts_all [W, E] int64 (one all_gather of every rank's kept, non-replicated counts per expert):
      rows rank s sends to global expert e.
  Source layout of rank s: its kept rows sorted by global expert; expert e's rows start at
      src_off[s, e] = exclusive cumsum of counts_all[s]; S_s = counts_all[s].sum() rows. A rank's rows
      for one owner's experts are contiguous there.
  Owner r's local layout is packed: segments (l, s) (local expert l, e = r * L + l, source s) in
      l-major, then s order, each holding its c = counts_all[s, e] rows with no padding; R = sum of
      them (the rows r receives). Block b = (l, s, i), i in 0 .. ceil(c / B) - 1, is the unit of
      transfer: source rows src_off[s, e] + i * B ... + block_rows[b] (block_rows = min(B, c - i * B))
      land at local rows block_start[b] ... + block_rows[b]. Blocks are ordered l, then s, then i.
  offsets_local [L + 1]: first local row of each local expert (the grouped GEMMs' group offsets).

The plan is built on the device with tensor ops; its only host read (num_blocks, the remote count,
S and the fallback's split sizes, plus whatever small tensors the caller rides along) is one .tolist().

Transports move rows between a rank's source layout and the owners' packed layouts, fused with one
expert product each (both are collectives: every rank calls them):
  pull_matmul(src [S, K], w [L, K, N], bias [L, N] | None, plan) -> (out [R, N], gathered [R, K])
  matmul_push(a [R, K], w, bias, plan) -> rows [S, N] in this rank's source layout
`A2ATransport` does both with all_to_all_single and the grouped GEMM (the path for CPU/gloo and for
GPUs without symmetric memory); qbench/layers/moe_symm.py does them with peer loads/stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernels._common import use_triton
from kernels.grouped_gemm import grouped_matmul_forward
from qbench.layers.moe_comm import A2AExchange


@dataclass
class BlockPlan:
    """One step's block plan on owner `rank` (device tensors unless noted)."""

    block_size: int
    num_blocks: int  # host
    block_src: Any  # int32 [nb] source rank of block b
    block_row: Any  # int64 [nb] first row of the block in its source's layout
    block_rows: Any  # int32 [nb] valid rows, 1..B
    block_expert: Any  # int32 [nb] local expert l
    block_start: Any  # int64 [nb] first row of the block in this owner's packed local layout
    offsets_local: Any  # int64 [L + 1]
    src_rows: int  # host: S of this rank (rows it sends, all owners together)
    max_src_rows: int  # host: the largest S over ranks (symmetric buffers are sized by it)
    blocks_remote: int  # host: blocks with block_src != rank
    rank: int
    world_size: int
    num_local_experts: int
    counts_all: Any  # int64 [W, E]
    src_off: Any  # int64 [W, E] first row of (source, expert) in the source's layout
    send_splits: list[int]  # host [W]: rows this rank sends to each owner
    recv_splits: list[int]  # host [W]: real rows this rank receives from each source
    remote_rows: int = -1  # host: rows any rank sends to another rank (0: every block is local everywhere)
    hot: list[int] = field(default_factory=list)  # replicated global experts (not in counts_all)
    cache: dict = field(default_factory=dict)  # per-transport derived tensors

    @property
    def send_rows(self) -> int:  # names shared with the a2a layer's StepPlan (checks and stats)
        return self.src_rows

    @property
    def recv_rows(self) -> int:
        return sum(self.recv_splits)

    @property
    def all_local(self) -> bool:
        """No rank sends a row to another: every rank's packed local layout IS its source layout
        (S = R, same order), so the transports move nothing. The same answer on every rank."""
        return self.remote_rows == 0

    @property
    def gathered_rows(self) -> int:
        """Rows of this owner's packed local layout (what it receives, all sources together)."""
        return self.recv_rows


def build_plan(counts_all, rank: int, num_local_experts: int, block_size: int, extra=()):
    """(BlockPlan, host values of `extra`) from counts_all [W, E]; one host read in all.
    extra: 1-D int64 device tensors read in the same .tolist() (concatenated, returned as lists).
    Two small kernels (kernels/moe_route.py) where Triton runs, tensor ops otherwise."""
    if use_triton(counts_all):
        return _build_plan_kernels(counts_all, rank, num_local_experts, block_size, extra)
    return _build_plan_ops(counts_all, rank, num_local_experts, block_size, extra)


def _host_values(small, W: int, extra):
    """small [5 + 2W] (block_counts) + extra -> ([nb, remote blocks, S, max S, remote rows], send
    splits, receive splits, extra values)."""
    values = small.tolist()  # the plan's only host synchronisation
    rest, out = values[5 + 2 * W:], []
    for t in extra:
        out.append(rest[:t.numel()])
        rest = rest[t.numel():]
    return values[:4] + [values[4 + 2 * W]], values[4:4 + W], values[4 + W:4 + 2 * W], out


def _build_plan_kernels(counts_all, rank: int, L: int, B: int, extra):
    import torch

    from kernels.moe_route import block_counts, block_list

    W = counts_all.shape[0]
    src_off, firsts, offsets, small = block_counts(counts_all, rank, L, B)
    (nb, n_remote, S, S_max, remote_rows), send, recv, out = _host_values(torch.cat([small, *extra]), W, extra)
    src, row, rows, expert, start = block_list(counts_all, src_off, firsts, rank, L, B, nb)
    plan = BlockPlan(B, nb, src, row, rows, expert, start, offsets, S, S_max, n_remote, rank, W, L, counts_all,
                     src_off, send, recv, remote_rows)
    return plan, out


def _build_plan_ops(counts_all, rank: int, num_local_experts: int, block_size: int, extra):
    import torch

    W, E = counts_all.shape
    L, B, dev = num_local_experts, block_size, counts_all.device
    src_off = torch.cumsum(counts_all, 1) - counts_all
    mine = counts_all[:, rank * L:(rank + 1) * L]  # [W, L] rows source s sends to my expert l
    nblk = (mine.t() + B - 1) // B  # [L, W] blocks of (l, s)
    remote = nblk.sum() - nblk[:, rank].sum()
    owner = torch.arange(E, device=dev) // L
    remote_all = (counts_all * (owner.unsqueeze(0) != torch.arange(W, device=dev).unsqueeze(1))).sum()
    small = torch.cat([nblk.sum().view(1), remote.view(1), counts_all[rank].sum().view(1),
                       counts_all.sum(1).max().view(1), counts_all[rank].view(W, L).sum(1), mine.sum(1),
                       remote_all.view(1), *extra])
    (nb, n_remote, S, S_max, remote_rows), send, recv, out = _host_values(small, W, extra)
    flat, sizes = nblk.reshape(-1), mine.t().reshape(-1)  # per segment (l, s): blocks, rows
    seg = torch.repeat_interleave(torch.arange(L * W, device=dev), flat, output_size=nb)
    first = torch.cumsum(flat, 0) - flat  # first block of segment (l, s)
    seg_start = torch.cumsum(sizes, 0) - sizes  # first packed local row of segment (l, s)
    i = torch.arange(nb, device=dev) - first[seg]
    l, s = seg // W, seg % W
    rows = torch.clamp(sizes[seg] - i * B, max=B)
    offsets = torch.cat([flat.new_zeros(1), torch.cumsum(mine.sum(0), 0)])
    plan = BlockPlan(B, nb, s.to(torch.int32), src_off[s, rank * L + l] + i * B, rows.to(torch.int32),
                     l.to(torch.int32), seg_start[seg] + i * B, offsets, S, S_max, n_remote, rank, W, L, counts_all,
                     src_off, send, recv, remote_rows)
    return plan, out


def local_rows(plan: BlockPlan):
    """Packed local row of every row this rank receives, [R] int64, in all_to_all's order (source s,
    then local expert l, then row j): row j of segment (l, s) sits at seg_start(l, s) + j."""
    import torch

    if "local_rows" in plan.cache:
        return plan.cache["local_rows"]
    W, L, r = plan.world_size, plan.num_local_experts, plan.rank
    mine = plan.counts_all[:, r * L:(r + 1) * L]  # [W, L]
    sizes = mine.t().reshape(-1)  # order (l, s)
    first = (torch.cumsum(sizes, 0) - sizes).view(L, W)
    lens = mine.reshape(-1)  # order (s, l)
    R = plan.recv_rows
    seg = torch.repeat_interleave(torch.arange(W * L, device=lens.device), lens, output_size=R)
    j = torch.arange(R, device=lens.device) - (torch.cumsum(lens, 0) - lens)[seg]
    plan.cache["local_rows"] = first[seg % L, seg // L] + j
    return plan.cache["local_rows"]


def local_pull(src, w, bias, plan: BlockPlan, backend: str):
    """pull_matmul when plan.all_local: the source rows are the gathered rows (no copy, no exchange)."""
    return grouped_matmul_forward(src, w, plan.offsets_local, bias, backend=backend), src


class A2ATransport:
    """The block plan over all_to_all_single: rows for owner r are contiguous in the source layout,
    so the send buffer is the source layout itself (split sizes = rows per owner); the owner puts
    what it receives in its packed local layout, runs the grouped GEMM over offsets_local, and the
    push gathers the rows back into all_to_all order."""

    name = "a2a"

    def __init__(self, group=None, backend: str = "auto"):
        self.exchange, self.backend = A2AExchange(group), backend

    def pull_matmul(self, src, w, bias, plan: BlockPlan):
        if plan.all_local:
            return local_pull(src, w, bias, plan, self.backend)
        recv = src.new_empty((plan.recv_rows, src.shape[1]))
        self.exchange.start(recv, src.contiguous(), plan.recv_splits, plan.send_splits).wait()
        gathered = src.new_empty((plan.gathered_rows, src.shape[1])).index_copy_(0, local_rows(plan), recv)
        return grouped_matmul_forward(gathered, w, plan.offsets_local, bias, backend=self.backend), gathered

    def matmul_push(self, a, w, bias, plan: BlockPlan):
        out = grouped_matmul_forward(a, w, plan.offsets_local, bias, backend=self.backend)
        if plan.all_local:
            return out
        rows = out.index_select(0, local_rows(plan))
        back = out.new_empty((plan.src_rows, out.shape[1]))
        self.exchange.start(back, rows, plan.send_splits, plan.recv_splits).wait()
        return back


def make_transport(kind: str, group=None, device: str = "cpu", backend: str = "auto"):
    """kind "auto": the symmetric-memory transport where it says it can run, else all_to_all;
    "a2a" / "symm" force one (symm raises when it is unavailable); "symm-fused-ga" / "symm-fused":
    symm with the push (and the pull) fused into the GEMM (moe_symm.MODES). Returns (transport, reason)."""
    if kind == "a2a":
        return A2ATransport(group, backend), "forced"
    try:
        from qbench.layers.moe_symm import SymmTransport, symm_available
    except ImportError as exc:
        if kind.startswith("symm"):
            raise RuntimeError(f"the symmetric-memory transport is not installed: {exc}") from None
        return A2ATransport(group, backend), "no symmetric-memory transport module"
    ok, reason = symm_available(group, device)
    if not ok:
        if kind.startswith("symm"):
            raise RuntimeError(f"symmetric memory unavailable: {reason}")
        return A2ATransport(group, backend), reason
    mode = kind.removeprefix("symm-") if kind.startswith("symm-") else "split"
    return SymmTransport(group=group, device=device, backend=backend, mode=mode), reason
