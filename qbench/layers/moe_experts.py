"""The expert-parallel core of the MoE layer: dispatch -> expert FFN -> combine, pipelined in chunks.

Expert FFN of L local experts on rows sorted by expert (offsets [L + 1]):
    pre = x W1[g] + b1[g]  [rows, h];  a = act(pre);  y = a W2[g] + b2[g]  [rows, d]
both products one grouped GEMM each (kernels/grouped_gemm.py). The backward is written out (weight
gradients with the grouped weight-gradient kernel, input gradients with the forward kernel on W^T)
so that it pipelines like the forward:

    forward   start dispatch a2a of every chunk (async) | replicas | per chunk: wait, FFN, start combine
    backward  start a2a of every chunk's output gradient | replicas | per chunk: wait, FFN', start a2a
NCCL runs the all-to-alls on its own stream, so chunk i+1's transfer overlaps chunk i's GEMMs; with
degree 1 nothing overlaps. Replicated ("hot") experts compute this rank's own rows locally, with
weights broadcast from their owners (`Replicate`), while the dispatch is in flight.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from kernels.grouped_gemm import grouped_bias_grad, grouped_matmul_forward, grouped_matmul_wgrad


@dataclass
class ExpertConfig:
    activation: str  # "gelu" | "relu"
    backend: str  # grouped GEMM backend: "auto" | "triton" | "torch" | "reference"
    exchange: Any  # A2AExchange (or another transport with the same start())
    timer: Any = None  # PhaseTimer or None

    def phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()


def _act(pre, activation: str):
    import torch.nn.functional as F

    return F.gelu(pre) if activation == "gelu" else F.relu(pre)


def _act_backward(grad, pre, act, activation: str):
    import torch

    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, pre)
    return torch.ops.aten.threshold_backward(grad, act, 0)


def ffn_forward(x, offsets, w1, b1, w2, b2, cfg: ExpertConfig):
    pre = grouped_matmul_forward(x, w1, offsets, b1, backend=cfg.backend)
    act = _act(pre, cfg.activation)
    return pre, act, grouped_matmul_forward(act, w2, offsets, b2, backend=cfg.backend)


def ffn_backward(dy, saved, offsets, w1, w2, cfg: ExpertConfig):
    """Gradients (dx, dw1, db1, dw2, db2) of ffn_forward for output gradient dy [rows, d]."""
    x, pre, act = saved
    G = w1.shape[0]
    dw2 = grouped_matmul_wgrad(act, dy, offsets, G, backend=cfg.backend)
    db2 = grouped_bias_grad(dy, offsets, G, backend=cfg.backend)
    dact = grouped_matmul_forward(dy, w2.transpose(1, 2), offsets, backend=cfg.backend)
    dpre = _act_backward(dact, pre, act, cfg.activation)
    dw1 = grouped_matmul_wgrad(x, dpre, offsets, G, backend=cfg.backend)
    db1 = grouped_bias_grad(dpre, offsets, G, backend=cfg.backend)
    dx = grouped_matmul_forward(dpre, w1.transpose(1, 2), offsets, backend=cfg.backend)
    return dx, dw1, db1, dw2, db2


def _accumulate(total, grads):
    if total is None:
        return list(grads)
    for a, b in zip(total, grads):
        a.add_(b)
    return total


def _pipeline(chunks_in, plan, direction: str, compute, cfg: ExpertConfig):
    """Run one direction of the chunked exchange: a2a in (async, all chunks), per chunk wait ->
    compute(i, rows) -> a2a back (async); returns the concatenated returned rows."""
    import torch

    forward = direction == "forward"
    like = chunks_in[0]
    inbound = [like.new_empty((sum(c.recv_splits), like.shape[1])) for c in plan.chunks]
    with cfg.phase("dispatch" if forward else "backward_a2a"):
        handles = [cfg.exchange.start(inbound[i], chunks_in[i].contiguous(), c.recv_splits, c.send_splits)
                   for i, c in enumerate(plan.chunks)]
    yield  # the caller runs the replicas here, overlapping the transfers just started
    outbound, back_handles = [], []
    for i, c in enumerate(plan.chunks):
        with cfg.phase("dispatch" if forward else "backward_a2a"):
            handles[i].wait()
        with cfg.phase("experts" if forward else "backward_experts"):
            rows = compute(i, inbound[i].index_select(0, c.index))
            rows = torch.empty_like(inbound[i]).index_copy_(0, c.index, rows)  # back to received order
        out = torch.empty_like(chunks_in[i])
        with cfg.phase("combine" if forward else "backward_a2a"):
            back_handles.append(cfg.exchange.start(out, rows.contiguous(), c.send_splits, c.recv_splits))
        outbound.append(out)
    with cfg.phase("combine" if forward else "backward_a2a"):
        for h in back_handles:
            h.wait()
    yield torch.cat(outbound) if outbound else chunks_in[0].new_empty((0, chunks_in[0].shape[1]))


def _make_expert_parallel():
    import torch

    class ExpertParallel(torch.autograd.Function):
        """(send [S, d], hot_x [H, d], expert and replica weights) -> (back [S, d], hot_y [H, d])."""

        @staticmethod
        def forward(ctx, send, hot_x, w1, b1, w2, b2, rw1, rb1, rw2, rb2, plan, hot_offsets, cfg):
            ctx.plan, ctx.cfg, ctx.hot_offsets = plan, cfg, hot_offsets
            ctx.saved, ctx.hot_saved = [], None
            ctx.save_for_backward(w1, w2, rw1, rw2)
            chunks_in = send.split([sum(c.send_splits) for c in plan.chunks])

            def compute(i, xe):
                pre, act, y = ffn_forward(xe, plan.chunks[i].offsets, w1, b1, w2, b2, cfg)
                ctx.saved.append((xe, pre, act))
                return y

            steps = _pipeline(chunks_in, plan, "forward", compute, cfg)
            next(steps)
            hot_y = hot_x.new_empty((0, hot_x.shape[1]))
            if rw1 is not None:
                with cfg.phase("experts"):
                    pre, act, hot_y = ffn_forward(hot_x, hot_offsets, rw1, rb1, rw2, rb2, cfg)
                ctx.hot_saved = (hot_x, pre, act)
            back = next(steps)
            return back, hot_y

        @staticmethod
        def backward(ctx, d_back, d_hot):
            w1, w2, rw1, rw2 = ctx.saved_tensors
            plan, cfg = ctx.plan, ctx.cfg
            grads = None

            def compute(i, dye):
                nonlocal grads
                dx, *g = ffn_backward(dye, ctx.saved[i], plan.chunks[i].offsets, w1, w2, cfg)
                grads = _accumulate(grads, g)
                return dx

            d_chunks = d_back.contiguous().split([sum(c.send_splits) for c in plan.chunks])
            steps = _pipeline(d_chunks, plan, "backward", compute, cfg)
            next(steps)
            d_hot_x, hot_grads = None, [None] * 4
            if rw1 is not None:
                with cfg.phase("backward_experts"):
                    d_hot_x, *hot_grads = ffn_backward(d_hot.contiguous(), ctx.hot_saved, ctx.hot_offsets,
                                                       rw1, rw2, cfg)
            d_send = next(steps)
            ctx.saved = ctx.hot_saved = None
            return (d_send, d_hot_x, *grads, *hot_grads, None, None, None)

    return ExpertParallel


def _make_replicate():
    import torch
    import torch.distributed as dist

    class Replicate(torch.autograd.Function):
        """Hot experts' weights from their owners (broadcast); replica gradients summed back (reduce)."""

        @staticmethod
        def forward(ctx, w1, b1, w2, b2, hot, local_experts, rank, group):
            ctx.hot, ctx.L, ctx.rank, ctx.group = hot, local_experts, rank, group
            ctx.shapes = [tuple(t.shape) for t in (w1, b1, w2, b2)]
            outs = []
            for t in (w1, b1, w2, b2):
                buf = torch.empty((len(hot), *t.shape[1:]), dtype=t.dtype, device=t.device)
                for h, e in enumerate(hot):
                    if e // local_experts == rank:
                        buf[h].copy_(t[e % local_experts])
                outs.append(buf)
            for buf in outs:
                _collective_per_expert(buf, hot, local_experts, group, dist.broadcast)
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            results = []
            for g, shape in zip(grads, ctx.shapes):
                g = g.contiguous()
                _collective_per_expert(g, ctx.hot, ctx.L, ctx.group, dist.reduce)
                full = torch.zeros(shape, dtype=g.dtype, device=g.device)
                for h, e in enumerate(ctx.hot):
                    if e // ctx.L == ctx.rank:
                        full[e % ctx.L] += g[h]
                results.append(full)
            return (*results, None, None, None, None)

    return Replicate


def _collective_per_expert(buf, hot, local_experts, group, op) -> None:
    """Broadcast (or reduce) slot h of buf from (to) the owner of hot expert hot[h], asynchronously."""
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return
    handles = []
    for h, e in enumerate(hot):
        owner = dist.get_global_rank(group, e // local_experts) if group is not None else e // local_experts
        handles.append(op(buf[h], owner, group=group, async_op=True))
    for handle in handles:
        handle.wait()


class _Lazy:
    cache: dict[str, Any] = {}

    @classmethod
    def get(cls, name: str):
        if name not in cls.cache:
            cls.cache[name] = {"ep": _make_expert_parallel, "rep": _make_replicate}[name]()
        return cls.cache[name]


def expert_parallel(send, hot_x, weights, replicas, plan, hot_offsets, cfg: ExpertConfig):
    """Apply the expert-parallel Function; weights = (w1, b1, w2, b2), replicas the same or Nones."""
    return _Lazy.get("ep").apply(send, hot_x, *weights, *replicas, plan, hot_offsets, cfg)


def replicate(weights, hot: list[int], local_experts: int, rank: int, group=None):
    return _Lazy.get("rep").apply(*weights, hot, local_experts, rank, group)
