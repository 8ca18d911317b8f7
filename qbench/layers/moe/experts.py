"""The expert-parallel core of the MoE layer: dispatch -> expert FFN -> combine, pipelined in chunks.

Expert FFN of L local experts on rows in segments (segment s uses expert s % L; offsets [R * L + 1]):
    pre = x W1[g] + b1[g]  [rows, h];  a = act(pre);  y = a W2[g] + b2[g]  [rows, d]
both products one grouped GEMM each (kernels/grouped_gemm.py). The backward is written out so that
it pipelines like the forward: per chunk only the input-gradient path (dact, dpre, dx) runs before
that chunk's all-to-all starts; the weight gradients run once over all chunks at the end (the
received rows of every chunk live in one buffer), so a higher degree D adds no weight-gradient work.

    forward   (the caller started the replicas' weight broadcast) | start dispatch a2a of every chunk
              (async) | per chunk: wait, FFN, start combine | replicas' FFN
    backward  start a2a of every chunk's output gradient | replicas' backward, start their reduce |
              per chunk: wait, dx path, start a2a | weight gradients of all chunks (overlapping the
              last transfers) | add the replicas' gradients
NCCL runs the all-to-alls on its own stream, so chunk i+1's transfer overlaps chunk i's GEMMs; with
degree 1 nothing overlaps. Replicated ("hot") experts compute this rank's own rows locally with their
owners' weights (replicas.py: one broadcast per owner on a second communicator,
started by the layer before the dispatch), after the local experts, while the combine is in flight;
their gradients go home with one reduce per owner, started as soon as they exist, so that it overlaps
the input-gradient path and the weight gradients.
The layer runs every step's experts inside one autograd node of its own (layer._Experts: gather, experts,
combine): ExchangedExperts where rows cross ranks, and at world size 1 without replication, where nothing
moves, ffn_forward / ffn_backward on the send buffer itself, no exchange and no copies.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from kernels.grouped_gemm import (
    grouped_matmul_act,
    grouped_matmul_act_grad,
    grouped_matmul_forward,
    grouped_wgrad_bias,
)
from qbench.layers.moe.hooks import HookList


@dataclass
class ExpertConfig:
    activation: str  # "gelu" | "relu"
    backend: str  # grouped GEMM backend: "auto" | "triton" | "torch" | "reference"
    exchange: Any  # A2AExchange (or another transport with the same start())
    phases: HookList | None = None  # the layer's phase hooks (hooks.py); None inside a compiled graph

    def phase(self, name: str):
        return self.phases.phase(name) if self.phases is not None else contextlib.nullcontext()


def _act(pre, activation: str, out=None):
    if out is None:
        out = torch.empty_like(pre)
    if activation == "gelu":
        return torch.ops.aten.gelu.out(pre, out=out)
    return torch.clamp_min(pre, 0, out=out)


def _act_backward(grad, pre, act, activation: str, out=None):
    if out is None:
        out = torch.empty_like(pre)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward.grad_input(grad, pre, grad_input=out)
    return torch.ops.aten.threshold_backward.grad_input(grad, act, 0, grad_input=out)


def ffn_forward(x, offsets, w1, b1, w2, b2, cfg: ExpertConfig, out=None):
    """(pre, act, y) of the expert FFN (the activation fused into the first product by the pointer kernel,
    after it on Hopper's TMA kernel: kernels.grouped_gemm._launch_fwd); `out` =
    (pre, act, y) buffers to write into, or None."""
    pre_o, act_o, y_o = out if out is not None else (None, None, None)
    pre, act = grouped_matmul_act(x, w1, offsets, b1, cfg.activation, backend=cfg.backend,
                                  out=None if out is None else (pre_o, act_o))
    return pre, act, grouped_matmul_forward(act, w2, offsets, b2, backend=cfg.backend, out=y_o)


def ffn_input_grad(dy, pre, act, offsets, w1, w2, cfg: ExpertConfig, out=None):
    """(dpre, dx) of ffn_forward for output gradient dy [rows, d] (the activation's backward applied to
    dy @ w2^T in its epilogue, or in place in dpre's buffer after it on Hopper: no other buffer holds d
    act); out = (dpre, dx) buffers or None."""
    dpre_o, dx_o = out if out is not None else (None, None)
    dpre = grouped_matmul_act_grad(dy, w2.transpose(1, 2), offsets, pre, cfg.activation, backend=cfg.backend,
                                   out=dpre_o)
    return dpre, grouped_matmul_forward(dpre, w1.transpose(1, 2), offsets, backend=cfg.backend, out=dx_o)


def ffn_weight_grads(x, act, dy, dpre, offsets, num_experts: int, cfg: ExpertConfig):
    """(dw1, db1, dw2, db2) over every segment of `offsets` at once (each bias gradient fused into its
    weight gradient's pass over the output gradient)."""
    G, backend = num_experts, cfg.backend
    return (*grouped_wgrad_bias(x, dpre, offsets, G, backend=backend),
            *grouped_wgrad_bias(act, dy, offsets, G, backend=backend))


def ffn_backward(dy, saved, offsets, w1, w2, cfg: ExpertConfig):
    """Gradients (dx, dw1, db1, dw2, db2) of ffn_forward for output gradient dy [rows, d]."""
    x, pre, act = saved
    dpre, dx = ffn_input_grad(dy, pre, act, offsets, w1, w2, cfg)
    return (dx, *ffn_weight_grads(x, act, dy, dpre, offsets, w1.shape[0], cfg))


def _chunked(plan, rows: int, like, width: int):
    """One [rows, width] buffer and its per-chunk views (chunk i: plan.chunks[i]'s received rows)."""
    buf = like.new_empty((rows, width))
    return buf, _received(plan, buf)


def _received(plan, t):
    """t [received rows, ...] per chunk: the tensor itself for one chunk (no split op to dispatch)."""
    return [t] if len(plan.chunks) == 1 else t.split([sum(c.recv_splits) for c in plan.chunks])


def _sent(plan, t):
    """t [sent rows, ...] per chunk (as _received)."""
    return [t] if len(plan.chunks) == 1 else t.split([sum(c.send_splits) for c in plan.chunks])


def _start(cfg, phase: str, outs, ins, chunks, inbound: bool):
    """Start one all-to-all per chunk (async); inbound: rows come to this rank's experts."""
    with cfg.phase(phase):
        return [cfg.exchange.start(o, i, c.recv_splits if inbound else c.send_splits,
                                   c.send_splits if inbound else c.recv_splits)
                for o, i, c in zip(outs, ins, chunks)]


def _wait(cfg, phase: str, handles) -> None:
    with cfg.phase(phase):
        for h in handles:
            h.wait()


class ExchangedExperts:
    """The experts of a step whose rows cross ranks (world size > 1, or with replicas), forward and backward as the
    module docstring says: send [S, d] -> back [S, d] (this rank's rows, back from the experts that computed them),
    hot_x [H, d] -> hot_y [H, d] (the replicated experts' rows of this rank, or None without replicas). Called by
    the layer's autograd node (layer._Experts), which gathers the send buffer before and combines after; this
    object carries what the backward needs from the forward. replicas: a replicas.Replicas (it brings the hot
    experts' weights and takes their gradients home) or None; hot_offsets: the replica buffer's group offsets."""

    def __init__(self, plan, cfg: ExpertConfig, replicas=None, hot_offsets=None):
        self.plan, self.cfg, self.replicas, self.hot_offsets = plan, cfg, replicas, hot_offsets
        self.saved = self.hot_saved = None

    def forward(self, send, hot_x, w1, b1, w2, b2):
        """(back [S, d], hot_y [H, d] or None)."""
        plan, cfg, replicas = self.plan, self.cfg, self.replicas
        R, d, h = plan.recv_rows, send.shape[1], w1.shape[2]
        x, x_c = _chunked(plan, R, send, d)
        waits = _start(cfg, "dispatch", x_c, _sent(plan, send), plan.chunks, inbound=True)
        (pre, pre_c), (act, act_c), (_, y_c) = (_chunked(plan, R, send, n) for n in (h, h, d))
        back = torch.empty_like(send)
        backs, back_c = [], _sent(plan, back)
        for i, c in enumerate(plan.chunks):
            _wait(cfg, "dispatch", waits[i:i + 1])
            with cfg.phase("experts"):
                ffn_forward(x_c[i], c.offsets, w1, b1, w2, b2, cfg, out=(pre_c[i], act_c[i], y_c[i]))
            backs += _start(cfg, "combine", back_c[i:i + 1], y_c[i:i + 1], [c], inbound=False)
        hot_y = None
        if replicas is not None:  # while the combine is in flight
            with cfg.phase("experts"):
                rw = replicas.weights()
                hpre, hact, hot_y = ffn_forward(hot_x, self.hot_offsets, *rw, cfg)
            self.hot_saved = (hot_x, hpre, hact, rw[0], rw[2])
        _wait(cfg, "combine", backs)
        self.saved = (w1, w2, x, pre, act)
        return back, hot_y

    def backward(self, d_back, d_hot):
        """(d_send [S, d], d_hot_x [H, d] or None, (dw1, db1, dw2, db2)) for the gradients of back and hot_y."""
        w1, w2, x, pre, act = self.saved
        plan, cfg, replicas = self.plan, self.cfg, self.replicas
        R, d, h = plan.recv_rows, d_back.shape[1], w1.shape[2]
        d_back = d_back.contiguous()
        dy, dy_c = _chunked(plan, R, d_back, d)
        waits = _start(cfg, "backward_a2a", dy_c, _sent(plan, d_back), plan.chunks, inbound=True)
        d_hot_x = None
        if replicas is not None:  # while the output gradient is in flight
            with cfg.phase("backward_experts"):
                d_hot_x, *hot_grads = hot_backward(d_hot, self.hot_saved, self.hot_offsets, cfg)
            with cfg.phase("replicas"):  # its own communicator: runs beside the exchanges
                replicas.reduce(*hot_grads)
        (dpre, dpre_c), dx_c = _chunked(plan, R, d_back, h), _chunked(plan, R, d_back, d)[1]
        pre_c, act_c = _received(plan, pre), _received(plan, act)
        d_send = torch.empty_like(d_back)
        backs, send_c = [], _sent(plan, d_send)
        for i, c in enumerate(plan.chunks):
            _wait(cfg, "backward_a2a", waits[i:i + 1])
            with cfg.phase("backward_experts"):
                ffn_input_grad(dy_c[i], pre_c[i], act_c[i], c.offsets, w1, w2, cfg, out=(dpre_c[i], dx_c[i]))
            backs += _start(cfg, "backward_a2a", send_c[i:i + 1], dx_c[i:i + 1], [c], inbound=False)
        with cfg.phase("backward_experts"):
            grads = ffn_weight_grads(x, act, dy, dpre, plan.offsets_all, w1.shape[0], cfg)
        _wait(cfg, "backward_a2a", backs)
        if replicas is not None:
            with cfg.phase("replicas"):
                replicas.add_to(*grads)
        self.saved = self.hot_saved = self.replicas = None
        return d_send, d_hot_x, grads


def hot_backward(d_hot, saved, hot_offsets, cfg: ExpertConfig):
    """(d_hot_x, dw1, db1, dw2, db2) of the replicas' FFN; saved = (hot_x, pre, act, rw1, rw2)."""
    hot_x, pre, act, rw1, rw2 = saved
    d_hot = torch.zeros_like(hot_x) if d_hot is None else d_hot.contiguous()  # hot_y unused: not materialized
    return ffn_backward(d_hot, (hot_x, pre, act), hot_offsets, rw1, rw2, cfg)
