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
    (padding rows of X and dY are zero, so no masks); dx_src = matmul_push(dpre, W1^T).
Hot experts (--replicate-hot N): as the a2a layer, the N globally most-loaded experts are computed on
every rank for its own rows with their owners' weights (`replicate`), and left out of counts_all.
Phases (PhaseTimer): gate, plan, ag, experts, ga, combine; backward_ag, backward_experts, backward_ga.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from qbench.layers import moe_comm as comm
from qbench.layers.moe import MoELayer, MoEOptions, _Combine, _gather_rows, _GatherTokens
from qbench.layers.moe_blocks import build_plan, make_transport
from qbench.layers.moe_experts import ExpertConfig, _act, _act_backward, ffn_backward, ffn_forward, replicate


class BlocksFunction(torch.autograd.Function):
    """(x_src [S, d], hot_x [H, d], weights, replica weights) -> (y_src [S, d], hot_y [H, d])."""

    @staticmethod
    def forward(ctx, x_src, hot_x, w1, b1, w2, b2, rw1, rb1, rw2, rb2, plan, hot_offsets, cfg, transport):
        ctx.plan, ctx.cfg, ctx.transport, ctx.hot_offsets = plan, cfg, transport, hot_offsets
        with cfg.phase("ag"):
            pre, gathered = transport.pull_matmul(x_src, w1, b1, plan)
        with cfg.phase("experts"):
            # padding rows: every transport multiplies zero rows there (pre = b1, finite), and the
            # zero padding of gathered X and dY keeps them out of every weight gradient
            act = _act(pre, cfg.activation)
            hot_y, ctx.hot_saved = hot_x.new_empty((0, hot_x.shape[1])), None
            if rw1 is not None:
                hpre, hact, hot_y = ffn_forward(hot_x, hot_offsets, rw1, rb1, rw2, rb2, cfg)
                ctx.hot_saved = (hot_x, hpre, hact)
        with cfg.phase("ga"):
            y_src = transport.matmul_push(act, w2, b2, plan)
        ctx.save_for_backward(gathered, pre, act, w1, w2, rw1, rw2)
        return y_src, hot_y

    @staticmethod
    def backward(ctx, dy_src, d_hot):
        X, pre, act, w1, w2, rw1, rw2 = ctx.saved_tensors
        plan, cfg, transport = ctx.plan, ctx.cfg, ctx.transport
        L, off, backend = w1.shape[0], plan.offsets_local, cfg.backend
        with cfg.phase("backward_ag"):
            dact, dY = transport.pull_matmul(dy_src.contiguous(), w2.transpose(1, 2), None, plan)
        with cfg.phase("backward_experts"):
            from kernels.grouped_gemm import grouped_bias_grad, grouped_matmul_wgrad

            dpre = _act_backward(dact, pre, act, cfg.activation)  # padding rows: dY = 0, so dact = 0
            grads = (grouped_matmul_wgrad(X, dpre, off, L, backend=backend),
                     grouped_bias_grad(dpre, off, L, backend=backend),
                     grouped_matmul_wgrad(act, dY, off, L, backend=backend),
                     grouped_bias_grad(dY, off, L, backend=backend))
            d_hot_x, hot_grads = None, [None] * 4
            if rw1 is not None:
                d_hot_x, *hot_grads = ffn_backward(d_hot.contiguous(), ctx.hot_saved, ctx.hot_offsets,
                                                   rw1, rw2, cfg)
        with cfg.phase("backward_ga"):
            dx_src = transport.matmul_push(dpre, w1.transpose(1, 2), None, plan)
        ctx.hot_saved = None
        return (dx_src, d_hot_x, *grads, *hot_grads, None, None, None, None)


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
            plan, rows_t, hot_rows, hot_offsets, kept = self._plan(routing, with_rows=rows is None)
            rows = rows if rows is not None else rows_t
            self.last = {"routing": routing, "plan": plan, "kept": kept}
        weights = (self.w1, self.b1, self.w2, self.b2)
        replicas, hot_x = (None,) * 4, x2[:0]
        if source is not None:
            x_src = _GatherTokens.apply(x2, source[:plan.src_rows], rows, False)
        else:
            x_src = _gather_rows(x2, rows, plan.src_rows, False)
        if plan.hot:
            hot_x = _gather_rows(x2, hot_rows, sum(kept[e] for e in plan.hot), False)
            replicas = replicate(weights, plan.hot, self.opts.num_local_experts, self.rank, self.group)
        cfg = ExpertConfig(self.opts.activation, self.opts.gemm, None, self.timer)
        y_src, hot_y = BlocksFunction.apply(x_src, hot_x, *weights, *replicas, plan, hot_offsets, cfg,
                                            self.transport)
        with self._phase("combine"):
            return self._combine(routing, rows, hot_rows, y_src, hot_y).reshape(shape)

    def _plan(self, routing, with_rows: bool = True):
        """Counts exchange, hot experts, block plan (one host read), and every assignment's row in the
        source layout (-1: dropped or replicated) and in the replica buffer (-1: not replicated)."""
        kept, hot_ids, hot_r, hot_off = routing.kept, routing.kept.new_empty(0), None, None
        counts = kept
        if self.opts.replicate_hot > 0:
            hot_ids = comm.hottest_device(kept, self.opts.replicate_hot, self.group)
            counts = kept.index_fill(0, hot_ids, 0)
            hot_r, hot_off = comm.hot_rows(routing, hot_ids)
        counts_all = _all_gather(counts, self.world_size, self.group)
        plan, (kept_host, hot) = build_plan(counts_all, self.rank, self.opts.num_local_experts,
                                            self.block_size, extra=(kept, hot_ids))
        plan.hot = hot
        if not with_rows:
            return plan, None, hot_r, hot_off, kept_host
        src_off = plan.src_off[self.rank]
        e = routing.flat_e
        sent = routing.keep & (counts[e] > 0)  # kept and not replicated (a replicated expert counts 0)
        rows = torch.where(sent, src_off[e] + routing.pos, -1)
        return plan, rows, hot_r, hot_off, kept_host

    def _combine(self, routing, rows, hot_rows, y_src, hot_y):
        source, where = y_src, rows  # rows < 0 (dropped or replicated) add nothing
        if hot_rows is not None:
            source = torch.cat([y_src, hot_y])
            where = torch.where(hot_rows >= 0, y_src.shape[0] + hot_rows, rows)
        return _Combine.apply(source, where, routing.weights, False)


def _all_gather(counts, world_size: int, group=None):
    """[E] per-expert counts of every rank -> [W, E] (one all_gather)."""
    if world_size == 1:
        return counts.unsqueeze(0)
    out = counts.new_empty(world_size * counts.numel())  # flat: gloo's all_gather_into_tensor wants 1-D
    dist.all_gather_into_tensor(out, counts.contiguous(), group=group)
    return out.view(world_size, -1)
