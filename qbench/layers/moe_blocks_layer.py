"""`--system blocks`: the MoE layer with block dispatch fused into the expert GEMMs (MixMoE's design).

Per rank (W ranks, L local experts, block plan of qbench/layers/moe_blocks.py):
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
every rank for its own rows with their owners' weights (moe_replicas.Replicas), and left out of counts_all.
Phases (PhaseTimer): gate, plan, ag, experts, ga, combine, replicas; backward_ag, backward_experts,
backward_ga.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kernels._common import use_triton
from kernels.moe_hot import hot_plan
from qbench.layers import moe_comm as comm
from qbench.layers.moe import MoELayer, MoEOptions, _Combine, gather_tokens
from qbench.layers.moe_blocks import build_plan, make_transport
from qbench.layers.moe_experts import ExpertConfig, _act, _act_backward, ffn_forward, hot_backward


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
            from kernels.grouped_gemm import grouped_bias_grad, grouped_matmul_wgrad

            dpre = _act_backward(dact, pre, act, cfg.activation)
            grads = (grouped_matmul_wgrad(X, dpre, off, L, backend=backend),
                     grouped_bias_grad(dpre, off, L, backend=backend),
                     grouped_matmul_wgrad(act, dY, off, L, backend=backend),
                     grouped_bias_grad(dY, off, L, backend=backend))
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
                 group=None, block_size: int = 64, transport: str = "auto"):
        super().__init__(opts, rank=rank, world_size=world_size, dtype=dtype, device=device, seed=seed,
                         group=group)
        self.block_size = block_size
        self.transport, self.transport_reason = make_transport(transport, group, str(device), opts.gemm)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        with self._phase("gate"):  # source layout = rows sorted by expert, unpadded
            routing, rows, source = self._gate_route(x2, with_rows=self.opts.replicate_hot == 0, padded=False)
        with self._phase("plan"):
            plan, hot = self._plan(routing, rows, source)
            self.last = {"routing": routing, "plan": plan, "kept": hot.kept}
        weights = (self.w1, self.b1, self.w2, self.b2)
        replicas = self._start_replicas(plan.hot)  # first: the broadcast runs beside what follows
        into = getattr(self.transport, "source_buffer", None)  # symm: gather straight into the pull buffer
        use = into is not None and hot.source is not None and not plan.all_local  # all local: x_src is kept
        into = into(plan, x2.shape[1], x2.dtype) if use else None
        x_src = gather_tokens(x2, hot.rows, plan.src_rows, False, hot.source, into)
        hot_x = x2[:0]
        if plan.hot:
            hot_x = gather_tokens(x2, hot.hot_rows, sum(hot.kept[e] for e in plan.hot), False, hot.hot_source)
        cfg = ExpertConfig(self.opts.activation, self.opts.gemm, None, self.timer)
        y_src, hot_y = BlocksFunction.apply(x_src, hot_x, *weights, plan, hot.hot_offsets, cfg, self.transport,
                                            replicas)
        with self._phase("combine"):
            return self._combine(routing, hot.rows, hot.hot_rows, y_src, hot_y).reshape(shape)

    def _plan(self, routing, rows=None, source=None):
        """Counts exchange (one all_gather), hot experts, block plan (one host read), and every
        assignment's row in the source layout (-1: dropped or replicated) and in the replica buffer
        (-1: not replicated), with the inverse maps where the kernels made them."""
        kept, L, n_hot = routing.kept, self.opts.num_local_experts, self.opts.replicate_hot
        counts_all = comm.gather_counts(kept, self.world_size, self.group)
        hot = _Hot(rows, source)
        hot_ids = kept.new_empty(0)
        if n_hot > 0 and use_triton(kept):
            hp = hot_plan(counts_all, routing, self.rank, L, n_hot, routing.weights.shape[0], padded=False)
            counts_all, hot_ids = hp.masked, hp.hot_ids
            hot = _Hot(hp.rows, hp.source, hp.hot_rows, hp.hot_source, hp.hot_offsets)
        elif n_hot > 0:
            hot_ids = comm.hottest_device(kept, n_hot, self.group)
            counts_all = counts_all.index_fill(1, hot_ids, 0)
            hot.hot_rows, hot.hot_offsets = comm.hot_rows(routing, hot_ids)
        plan, (hot.kept, hot_list) = build_plan(counts_all, self.rank, L, self.block_size, extra=(kept, hot_ids))
        plan.hot = hot_list
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
