"""`--system blocks`: the MoE layer with block dispatch fused into the expert GEMMs (MixMoE's design).

Per rank (W ranks, L local experts, the block plan below):
    gate + route exactly as MoELayer  ->  counts_all [W, E] (one all_gather)  ->  block plan
    x_src [S, d]: this rank's kept, non-replicated assignments sorted by global expert
    AG  pre, X = pull_matmul(x_src, W1, b1)      owners pull their blocks and multiply (X: gathered rows)
        act = act(pre)
    GA  y_src  = matmul_push(act, W2, b2)         owners multiply and push rows back to their sources
    out[t] = sum_j weight[t, j] * y[t, j]  (y from y_src, or from the hot replicas; drops add 0)
Backward (reverse): dact, dY = pull_matmul(dy_src, W2^T); dpre = act'(dact, pre);
    dW2 = wgrad(act, dY), db2 = sum dY, dW1 = wgrad(X, dpre), db1 = sum dpre over offsets_local
    (X, dY: the gathered rows, packed); dx_src = matmul_push(dpre, W1^T).
Hot experts (--replicate-hot N): as the a2a layer, the N globally most-loaded experts are computed on
every rank for its own rows with their owners' weights (replicas.Replicas), and left out of counts_all.
Phases (hooks.py): gate, plan, ag, experts, ga, combine, replicas; backward_ag, backward_experts,
backward_ga.

The block plan:
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
Rows move through a transport (transport.py: symmetric memory, or the all_to_all fallback).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from kernels._common import use_triton
from kernels.moe_hot import hot_plan
from qbench.layers.moe import plan as plans
from qbench.layers.moe.experts import ExpertConfig, _act, _act_backward, ffn_forward, hot_backward
from qbench.layers.moe.layer import MoELayer, _Combine, gather_tokens
from qbench.layers.moe.options import MoEOptions
from qbench.layers.moe.transport import make_transport


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
    kept: list[int] = field(default_factory=list)  # host: this rank's kept assignments per expert
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
    from kernels.moe_plan import block_counts, block_list

    W = counts_all.shape[0]
    src_off, firsts, offsets, small = block_counts(counts_all, rank, L, B)
    (nb, n_remote, S, S_max, remote_rows), send, recv, out = _host_values(torch.cat([small, *extra]), W, extra)
    src, row, rows, expert, start = block_list(counts_all, src_off, firsts, rank, L, B, nb)
    plan = BlockPlan(B, nb, src, row, rows, expert, start, offsets, S, S_max, n_remote, rank, W, L, counts_all,
                     src_off, send, recv, remote_rows)
    return plan, out


def _build_plan_ops(counts_all, rank: int, num_local_experts: int, block_size: int, extra):
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


def reference_plan(counts_all, rank: int, num_local: int, block_size: int, device=None):
    """The block list of owner `rank`, built on the host from counts_all [W, E] (rows rank s sends to
    global expert e): blocks ordered local expert, then source, then position; each covers up to
    block_size rows of the source's layout (experts sorted, src_off = exclusive cumsum of counts) and
    lands at the next free row of the owner's packed local layout.
    Returns a plain object with the BlockPlan fields the kernels and transports read (the plan of
    build_plan, by plain loops on the host: what kernel tests and the transport tests take)."""
    counts = [[int(c) for c in row] for row in counts_all.tolist()]
    W = len(counts)
    src_off = [[sum(row[:e]) for e in range(len(row))] for row in counts]
    fields = {"block_src": [], "block_row": [], "block_rows": [], "block_expert": [], "block_start": []}
    offsets = []
    for l in range(num_local):
        offsets.append(sum(fields["block_rows"]))
        e = rank * num_local + l
        for s in range(W):
            for start in range(0, counts[s][e], block_size):
                n = min(block_size, counts[s][e] - start)
                for key, v in zip(fields, (s, src_off[s][e] + start, n, l, sum(fields["block_rows"]))):
                    fields[key].append(v)
    total = sum(fields["block_rows"])
    remote = sum(c for s, row in enumerate(counts) for e, c in enumerate(row) if e // num_local != s)
    dtypes = {"block_src": torch.int32, "block_row": torch.int64, "block_rows": torch.int32,
              "block_expert": torch.int32, "block_start": torch.int64}
    tensors = {k: torch.tensor(v, dtype=dtypes[k], device=device) for k, v in fields.items()}
    return SimpleNamespace(block_size=block_size, num_blocks=len(fields["block_src"]), gathered_rows=total,
                           offsets_local=torch.tensor(offsets + [total], dtype=torch.int64, device=device),
                           counts_all=counts_all, src_rows=sum(counts[rank]), remote_rows=remote,
                           all_local=remote == 0,
                           blocks_remote=sum(1 for s in fields["block_src"] if s != rank), **tensors)


class BlocksFunction(torch.autograd.Function):
    """(x_src [S, d], hot_x [H, d], weights) -> (y_src [S, d], hot_y [H, d]); `replicas` (Replicas or
    None, its broadcast started by the caller) brings the hot experts' weights and takes their
    gradients home (reduce started as soon as they exist, added at the end)."""

    @staticmethod
    def forward(ctx, x_src, hot_x, w1, b1, w2, b2, plan, hot_offsets, cfg, transport, replicas):
        ctx.plan, ctx.cfg, ctx.transport, ctx.hot_offsets = plan, cfg, transport, hot_offsets
        ctx.replicas, ctx.hot_saved = replicas, None
        with cfg.phase("ag"):
            pre, gathered = transport.pull_matmul(x_src, w1, b1, plan)
        with cfg.phase("experts"):
            act = _act(pre, cfg.activation)
        with cfg.phase("ga"):
            y_src = transport.matmul_push(act, w2, b2, plan)
        hot_y = hot_x.new_empty((0, hot_x.shape[1]))
        if replicas is not None:
            with cfg.phase("experts"):
                rw = replicas.weights()
                hpre, hact, hot_y = ffn_forward(hot_x, hot_offsets, *rw, cfg)
            ctx.hot_saved = (hot_x, hpre, hact, rw[0], rw[2])
        ctx.save_for_backward(gathered, pre, act, w1, w2)
        return y_src, hot_y

    @staticmethod
    def backward(ctx, dy_src, d_hot):
        X, pre, act, w1, w2 = ctx.saved_tensors
        plan, cfg, transport, replicas = ctx.plan, ctx.cfg, ctx.transport, ctx.replicas
        L, off, backend = w1.shape[0], plan.offsets_local, cfg.backend
        d_hot_x = None
        if replicas is not None:
            with cfg.phase("backward_experts"):
                d_hot_x, *hot_grads = hot_backward(d_hot, ctx.hot_saved, ctx.hot_offsets, cfg)
            with cfg.phase("replicas"):
                replicas.reduce(*hot_grads)
        with cfg.phase("backward_ag"):
            dact, dY = transport.pull_matmul(dy_src.contiguous(), w2.transpose(1, 2), None, plan)
        with cfg.phase("backward_experts"):
            from kernels.grouped_gemm import grouped_wgrad_bias

            dpre = _act_backward(dact, pre, act, cfg.activation)
            grads = (*grouped_wgrad_bias(X, dpre, off, L, backend=backend),
                     *grouped_wgrad_bias(act, dY, off, L, backend=backend))
        with cfg.phase("backward_ga"):
            dx_src = transport.matmul_push(dpre, w1.transpose(1, 2), None, plan)
        if replicas is not None:
            with cfg.phase("replicas"):
                replicas.add_to(*grads)
        ctx.hot_saved = ctx.replicas = None
        return (dx_src, d_hot_x, *grads, None, None, None, None, None)


class BlocksMoELayer(MoELayer):
    """MoELayer (same parameters, gate, routing, initialisation, hot-expert choice) whose expert
    step runs over a block plan and a transport ("symm" where available, else "a2a")."""

    def __init__(self, opts: MoEOptions, *, rank: int, world_size: int, dtype, device, seed: int = 0,
                 group=None, block_size: int = 64, transport: str = "auto", local_world_size: int | None = None):
        super().__init__(opts, rank=rank, world_size=world_size, dtype=dtype, device=device, seed=seed,
                         group=group)
        self.block_size = block_size
        self.transport, self.transport_reason = make_transport(transport, group, str(device), opts.gemm,
                                                               local_world_size)

    def static_reason(self) -> str | None:
        """Never static: the block list's length (and the transports' buffers) come from each step's
        counts, read on the host once per step."""
        return "the blocks system sizes its block list from each step's counts, on the host"

    def forward(self, x, choice=None):  # choice: see MoELayer.forward
        shape = x.shape
        x2, weights = self._operands(x)
        with self.phase_hooks.phase("gate"):  # source layout = rows sorted by expert, unpadded
            routing, rows, source, _ = self._gate_route(x2, with_rows=self.opts.replicate_hot == 0, padded=False,
                                                        choice=choice)
        with self.phase_hooks.phase("plan"):
            plan, hot = self._plan(routing, rows, source)
            self._tell_plan(routing, plan)
        replicas = self._start_replicas(plan.hot, weights)  # first: the broadcast runs beside what follows
        into = getattr(self.transport, "source_buffer", None)  # symm: gather straight into the pull buffer
        use = into is not None and hot.source is not None and not plan.all_local  # all local: x_src is kept
        into = into(plan, x2.shape[1], x2.dtype) if use else None
        x_src = gather_tokens(x2, hot.rows, plan.src_rows, False, hot.source, into)
        hot_x = x2[:0]
        if plan.hot:
            hot_x = gather_tokens(x2, hot.hot_rows, sum(hot.kept[e] for e in plan.hot), False, hot.hot_source)
        cfg = ExpertConfig(self.opts.activation, self.opts.gemm, None, self.phase_hooks)
        y_src, hot_y = BlocksFunction.apply(x_src, hot_x, *weights, plan, hot.hot_offsets, cfg, self.transport,
                                            replicas)
        with self.phase_hooks.phase("combine"):
            return self._combine(routing, hot.rows, hot.hot_rows, y_src, hot_y).reshape(shape)

    def _plan(self, routing, rows=None, source=None):
        """Counts exchange (one all_gather), hot experts, block plan (one host read), and every
        assignment's row in the source layout (-1: dropped or replicated) and in the replica buffer
        (-1: not replicated), with the inverse maps where the kernels made them."""
        kept, L, n_hot = routing.kept, self.opts.num_local_experts, self.opts.replicate_hot
        counts_all = plans.gather_counts(kept, self.world_size, self.group)
        hot = _Hot(rows, source)
        hot_ids = kept.new_empty(0)
        if n_hot > 0 and use_triton(kept):
            hp = hot_plan(counts_all, routing, self.rank, L, n_hot, routing.weights.shape[0], padded=False)
            counts_all, hot_ids = hp.masked, hp.hot_ids
            hot = _Hot(hp.rows, hp.source, hp.hot_rows, hp.hot_source, hp.hot_offsets)
        elif n_hot > 0:
            hot_ids = plans.hottest_device(kept, n_hot, self.group)
            counts_all = counts_all.index_fill(1, hot_ids, 0)
            hot.hot_rows, hot.hot_offsets = plans.hot_rows(routing, hot_ids)
        plan, (hot.kept, hot_list) = build_plan(counts_all, self.rank, L, self.block_size, extra=(kept, hot_ids))
        plan.hot, plan.kept = hot_list, hot.kept
        if hot.rows is None:  # tensor-op path: rows from the plan's source offsets
            e, src_off = routing.flat_e, plan.src_off[self.rank]
            sent = routing.keep & (counts_all[self.rank][e] > 0)  # kept and not replicated
            hot.rows = torch.where(sent, src_off[e] + routing.pos, -1)
        return plan, hot

    def _combine(self, routing, rows, hot_rows, y_src, hot_y):
        source, where = y_src, rows  # rows < 0 (dropped or replicated) add nothing
        if hot_rows is not None:
            source = torch.cat([y_src, hot_y])
            where = torch.where(hot_rows >= 0, y_src.shape[0] + hot_rows, rows)
        return _Combine.apply(source, where, routing.weights, False)


@dataclass
class _Hot:
    """Rows of one step's assignments (see BlocksMoELayer._plan) and the host kept counts."""

    rows: Any = None
    source: Any = None
    hot_rows: Any = None
    hot_source: Any = None
    hot_offsets: Any = None
    kept: list = field(default_factory=list)
