"""Distributed mixture-of-experts layer (expert parallel) and the seeds' attention + MoE model.

Per rank: T tokens [T, d], E = L x W experts (L local, W ranks), top-k.
    logits = x Wg + bg  [T, E] (fp32 when fp32_gate)  ->  top-k (or a forced choice), softmax over the k
    -> capacity / drops (routing.py)  ->  dispatch all-to-all with uneven splits  ->  expert FFN
    y = act(x W1 + b1) W2 + b2 of the L local experts, one grouped GEMM per product (experts.py)
    -> combine all-to-all  ->  out[t] = sum_j weight[t, j] * y[t, j]   (dropped assignments add 0)
Options: overlap degree D (chunked pipeline of dispatch / experts / combine), hot-expert replication
(the N globally most-loaded experts computed locally on every rank with their owners' weights),
grouped GEMM backend. Expert parameters carry `expert = True` so data parallelism can skip them.

Static shapes (`static_reason()` is None): with padded capacity (cf > 0), or at world size 1 without
capped capacity (dropless keeps all k * T assignments), and no replication, every buffer size and
split size is known before the routing runs. Such a step has no host synchronisation: it runs ahead
of the device, compiles with torch.compile(fullgraph=True) at world size 1 (the kernels are custom
ops) and captures into a CUDA graph. Otherwise the host must read the step's plan once (dropless at
world size > 1: the all-to-all's split sizes; capped capacity: the buffer sizes; replication: which
experts are hot), so that part of the step stays eager, and capturing it raises with that reason.
The gather, the experts (and their exchanges) and the combine are one autograd node (_Experts), which also takes
the combine weights' gradient to the gate's logits where the routing kernels ran outside autograd: a step's host
time is spent per op and per node. At world size 1 nothing is exchanged: the experts run on the send buffer (one
chunk, whatever D).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels._common import is_compiling, use_triton
from kernels.moe_combine import combine_backward, combine_rows
from kernels.moe_route import choose_and_position, weights_backward
from qbench.layers.autocast import autocast_dtype, in_autocast_dtype
from qbench.layers.moe import plan as plans
from qbench.layers.moe.experts import ExchangedExperts, ExpertConfig, ffn_backward, ffn_forward
from qbench.layers.moe.hooks import HookList
from qbench.layers.moe.options import MoEOptions
from qbench.layers.moe.replicas import Replicas
from qbench.layers.moe.routing import Routing, capacity_limit, route
from qbench.layers.moe.transport import A2AExchange


class MoELayer(nn.Module):
    def __init__(self, opts: MoEOptions, *, rank: int, world_size: int, dtype, device, seed: int = 0,
                 group=None):
        super().__init__()
        self.opts, self.rank, self.world_size, self.group = opts, rank, world_size, group
        L, d, h = opts.num_local_experts, opts.model_dim, opts.hidden_size
        self.num_experts = L * world_size
        gate_dtype = torch.float32 if opts.fp32_gate else dtype
        self.gate = nn.Linear(d, self.num_experts, device=device, dtype=gate_dtype)
        self.w1 = nn.Parameter(torch.empty(L, d, h, device=device, dtype=dtype))
        self.b1 = nn.Parameter(torch.empty(L, h, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(L, h, d, device=device, dtype=dtype))
        self.b2 = nn.Parameter(torch.empty(L, d, device=device, dtype=dtype))
        for p in (self.w1, self.b1, self.w2, self.b2):
            p.expert = True
        self.reset_parameters(seed)
        self.phase_hooks = HookList()  # fn(name) -> context around each phase of a step (hooks.py)
        self.plan_hooks = HookList()  # fn(routing, plan) after each forward's plan (hooks.py)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Gate identical on every rank (seed); expert e drawn from seed + e, so weights do not
        depend on the world size. Scale 1/sqrt(fan_in) keeps activations O(1)."""
        dev = self.w1.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        d, h = self.opts.model_dim, self.opts.hidden_size
        self.gate.weight.copy_(torch.randn(self.gate.weight.shape, generator=gen, device=dev) / d**0.5)
        self.gate.bias.copy_(torch.randn(self.gate.bias.shape, generator=gen, device=dev) * 0.1)
        for l in range(self.opts.num_local_experts):
            gen.manual_seed(seed + 7919 * (1 + self.rank * self.opts.num_local_experts + l))
            self.w1[l].copy_(torch.randn(d, h, generator=gen, device=dev) / d**0.5)
            self.b1[l].copy_(torch.randn(h, generator=gen, device=dev) * 0.1)
            self.w2[l].copy_(torch.randn(h, d, generator=gen, device=dev) / h**0.5)
            self.b2[l].copy_(torch.randn(d, generator=gen, device=dev) * 0.1)

    def static_reason(self) -> str | None:
        """Why this layer's step shapes depend on its routing (None: static; see the module docstring)."""
        return plans.static_reason(self.opts.capacity_factor, self.opts.replicate_hot, self.world_size)

    @property
    def degree(self) -> int:
        """Chunks of the step (plan.step_chunks)."""
        return plans.step_chunks(self.world_size, self.opts.a2a_ffn_overlap_degree)

    def forward(self, x, choice=None):
        """x [..., d] -> [..., d]; choice: expert ids [T, k] that replace the gate's top-k (forced routing;
        the combine weights stay the gate's softmax at the chosen experts), or None."""
        shape = x.shape
        x2, weights = self._operands(x)
        with self.phase_hooks.phase("gate"):  # the routing kernels outside autograd: _Experts takes their gradient
            routing, rows, source, offsets = self._gate_route(x2, with_rows=self._kernel_rows(), choice=choice,
                                                              chunks=self.degree, weights_node=False)
        with self.phase_hooks.phase("plan"):
            plan, dplan, sent = self._step_plan(x2, routing, rows, source, offsets)
            self._tell_plan(routing, plan)
        return _shaped(self._experts(x2, sent, weights, routing, plan, dplan), shape)

    def _local(self) -> bool:
        """Whether the step runs its experts on the send buffer itself: world size 1 without replication."""
        return self.world_size == 1 and self.opts.replicate_hot == 0

    def _tell_plan(self, routing, plan) -> None:
        """The plan hooks (not while torch.compile traces: a hook's side effects are not part of a graph)."""
        if self.plan_hooks and not is_compiling():
            self.plan_hooks(routing.detached(), plan)

    def _operands(self, x):
        """(x2 [T, d], expert weights (w1, b1, w2, b2)). Under torch.autocast, in its dtype, as nn.Linear
        takes its operands there (fp32 master weights, 16-bit products; the gradients reach the parameters
        through the casts); as they are otherwise."""
        x2, *weights = in_autocast_dtype(_shaped(x, (-1, x.shape[-1])), self.w1, self.b1, self.w2, self.b2)
        return x2, tuple(weights)

    def _step_plan(self, x2, routing, rows, source, offsets=None):
        """(StepPlan, DevicePlan, send buffer or None): without a host read where the shapes are static,
        else with the step's one host synchronisation (refused inside a CUDA graph capture, with the
        reason), started as soon as the plan is queued; where the send buffer's size is known without it
        (dropless, no replication: every one of the k * T assignments is sent), its gather is queued
        before the host waits, so that the GPU has that work while the host reads (outside autograd:
        _Experts takes its gradient)."""
        reason = self.static_reason()
        if reason is None:
            return (*plans.static_plan(routing, self.world_size, self.opts.num_local_experts, self.degree, rows,
                                       source, offsets), None)
        if x2.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"MoELayer cannot be captured in a CUDA graph: {reason}")
        dplan = plans.prepare(routing, self.world_size, self.degree, self.opts.replicate_hot, self.group, rows,
                              source, self.rank)
        plans.start_read(dplan)
        sent = None
        if self.opts.capacity_factor == 0 and self.opts.replicate_hot == 0 and dplan.source is not None:
            with torch.no_grad():
                sent = _gathered(x2, _first(dplan.source, dplan.rows.numel()), False)
        return plans.finish(dplan), dplan, sent  # the step's only host synchronisation

    def _experts(self, x2, sent, weights, routing, plan, dplan):
        """The gather, the experts and the combine as one autograd node (_Experts). The send buffer's tokens are
        the routing or plan kernels' (dplan.source) or built from the rows where torch routed; `sent`: the send
        buffer where _step_plan gathered it early, else None. Where rows cross ranks (ExchangedExperts), the
        replicas' weight broadcast starts first, and the hot experts' rows follow the send rows in one buffer."""
        n, tokens, padded = plan.send_rows, len(x2), routing.padded
        source = dplan.source if dplan.source is not None else token_source(dplan.rows, n, padded, tokens)
        source, exchanged, hot = _first(source, n), None, None
        if not self._local():
            replicas = self._start_replicas(plan.hot, weights)
            cfg = ExpertConfig(self.opts.activation, self.opts.gemm, A2AExchange(self.group), self.phase_hooks)
            exchanged = ExchangedExperts(plan, cfg, replicas, dplan.hot_offsets)
            if plan.hot:
                total = sum(plan.kept[e] for e in plan.hot)
                hot_source = dplan.hot_source if dplan.hot_source is not None else token_source(
                    dplan.hot_rows, total, False, tokens)
                hot = (dplan.hot_rows, _first(hot_source, total))
        return _Experts.apply(x2, routing.logits, routing.weights, routing.idx, *weights, dplan.rows, source, sent, hot,
                              plan.offsets_all, padded, self.opts.activation, self.opts.gemm,
                              self.phase_hooks or None, exchanged)

    def _kernel_rows(self) -> bool:
        """Whether the routing kernels give the send rows (in the layer's chunks): without replication."""
        return self.opts.replicate_hot == 0

    def _gate_route(self, x2, with_rows: bool, padded: bool | None = None, choice=None, chunks: int = 1,
                    weights_node: bool = True):
        """Gate and routing: (Routing, rows, source, send offsets). Where Triton runs, the routing kernels;
        with_rows then also gives every assignment's row in the send buffer (-1: dropped; sorted by expert,
        chunk-major in `chunks` chunks), each row's token (`padded` to the capacity when cf > 0 unless told
        otherwise) and, with one chunk, where each expert's rows start in it ([E + 1]); else rows = source
        = send offsets = None. choice: forced expert ids [T, k] or None. weights_node False: the routing
        kernels run outside autograd and the Routing keeps the logits, whose gradient from the weights the
        caller takes (_Experts)."""
        logits = self._gate_logits(x2)
        k, cf = self.opts.top_k, self.opts.capacity_factor
        if not use_triton(logits):
            return route(logits, k, cf, choice), None, None, None
        T, E = logits.shape
        cap = capacity_limit(cf, T, k, E) if cf != 0 else None
        # the weights (softmax over the k chosen logits, differentiable) come from the routing kernels
        padded = cf > 0 if padded is None else padded
        idx, weights, flat_e, pos, keep, counts, kept, rows, source, offsets = choose_and_position(
            logits if weights_node else logits.detach(), k, cap, padded, choice, rows=with_rows,
            chunks=chunks if with_rows else 1)
        routing = Routing(idx, weights, flat_e, pos, keep, counts, kept, cap, cf > 0, None if weights_node else logits)
        return routing, rows, source, offsets

    def _gate_logits(self, x2):
        """Logits [T, E] of x2 [T, d]: in the gate's dtype, or under autocast in the autocast dtype as
        nn.Linear runs there, except that an fp32 gate (fp32_gate) stays in fp32."""
        if autocast_dtype(x2) is None:
            return self.gate(x2 if x2.dtype == self.gate.weight.dtype else x2.to(self.gate.weight.dtype))
        if not self.opts.fp32_gate:
            return self.gate(x2)
        with torch.autocast(x2.device.type, enabled=False):
            return self.gate(x2.float())

    def _start_replicas(self, hot: list[int], weights):
        """Replicas of the hot experts with their weight broadcast started (None without hot experts).
        Started before anything else of the expert step, on the replicas' own communicator."""
        if not hot:
            return None
        with self.phase_hooks.phase("replicas"):
            replicas = Replicas(hot, self.opts.num_local_experts, self.rank, self.group)
            replicas.broadcast(*weights)
        return replicas


def _shaped(t, shape):
    """t reshaped to `shape` (-1 allowed only first), or t itself where it has that shape already: a 2-D input
    [T, d] then costs the step no view op forward and none backward (the step's host time is spent per op)."""
    if t.dim() == len(shape) and all(n == -1 or n == m for n, m in zip(shape, t.shape)):
        return t
    return t.reshape(shape)


def gather_tokens(x2, rows, total: int, padded: bool, source=None, out=None):
    """Buffer [total, d] whose row rows[a] is token a % T of x2 [T, d] (rows < 0 skipped), differentiable.
    source: the plan kernels' inverse map (token of every buffer row), else it is built here; out: a
    [total, d] buffer to gather into (used with `source` only)."""
    if source is not None:
        return _GatherTokens.apply(x2, _first(source, total), rows, padded, out)
    return _gathered(x2, token_source(rows, total, padded, x2.shape[0]), padded)


def _first(source, total: int):
    """The first `total` entries of a token map (the plan kernels' may be longer than the buffer: a padded plan's
    last rows), sliced only then (a slice is an op of the step's host time)."""
    return source if source.numel() == total else source[:total]


def token_source(rows, total: int, padded: bool, tokens: int):
    """The token of every row of a [total, d] buffer whose row rows[a] holds token a % T (assignment
    a = j * T + t; rows < 0 skipped): [total] int64, the inverse map the routing kernels give. Only padded
    buffers have rows that no assignment writes; those read token T, an appended zero row (their wgrad
    contribution is 0 * row, NaN for garbage)."""
    token = torch.arange(rows.numel(), device=rows.device) % tokens
    source = torch.full((total + 1,), tokens, dtype=torch.int64, device=rows.device) if padded else (
        torch.empty((total + 1,), dtype=torch.int64, device=rows.device))
    source.index_copy_(0, torch.where(rows >= 0, rows, total), token)
    return source[:total]


def _gathered(x2, source, padded: bool, out=None):
    """Rows x2[source] (source = T: the zero row appended to a padded buffer's table), into `out` when given."""
    table = torch.nn.functional.pad(x2, (0, 0, 0, 1)) if padded else x2
    return table.index_select(0, source) if out is None else torch.index_select(table, 0, source, out=out)


class _Combine(torch.autograd.Function):
    """out [T, d] = sum_j weights[t, j] * src[where[j * T + t]] (kernels/moe_combine.py); padded sources
    have rows nobody reads, whose gradient must be zero (they feed the experts' weight gradients)."""

    @staticmethod
    def forward(ctx, src, where, weights, padded: bool):
        ctx.save_for_backward(src, where, weights)
        ctx.padded = padded
        return combine_rows(src, where, weights, weights.shape[0])

    @staticmethod
    def backward(ctx, dout):
        src, where, weights = ctx.saved_tensors
        d_src, d_weights = combine_backward(src, where, weights, dout.contiguous(), ctx.padded)
        return d_src, None, d_weights.to(weights.dtype), None


class _Experts(torch.autograd.Function):
    """out [T, d] = sum_j weights[t, j] * E(send)[where[j * T + t]] (where < 0: dropped, adds nothing), the gather,
    the experts and the combine of a step in one autograd node: what a gather node, the experts' node and a combine
    node would compute one after the other, with one node's host cost instead of three (a step's host time is spent
    per op and per node, and the autograd engine thread runs every node's Python slower than the calling thread).
      send      x2[source] [S, d] (source = T: the zero row of a padded buffer), or `sent` where the caller gathered
                it already (outside autograd); with hot experts (`hot` = (hot_rows, hot_source)) their rows
                x2[hot_source] follow, and where = rows, else S + hot_rows
      E         exchanged (experts.ExchangedExperts: the rows cross ranks) or, None, the expert FFN on the send
                buffer itself, whose expert segments are `offsets` (world size 1)
    Backward: the combine's, the experts', then (x2 needing it) the gather's, each token summing its rows.
    logits: the gate's logits [T, E] where the weights [T, k] (ids idx) came from the routing kernels outside
    autograd: the weights' gradient then goes to the logits here (the routing's backward, one node less); None
    where the weights carry their own graph. phases: the layer's phase hooks, or None without any (a constant
    under torch.compile), around the experts, the combine and "backward_experts"."""

    @staticmethod
    def forward(ctx, x2, logits, weights, idx, w1, b1, w2, b2, rows, source, sent, hot, offsets, padded: bool,
                activation: str, backend: str, phases, exchanged):
        send = sent if sent is not None else _gathered(x2, source if hot is None else torch.cat([source, hot[1]]),
                                                        padded)
        cfg = ExpertConfig(activation, backend, None, phases)
        where = rows
        if exchanged is None:
            with cfg.phase("experts"):
                pre, act, y = ffn_forward(send, offsets, w1, b1, w2, b2, cfg)
            saved = (send, pre, act, offsets, w1, w2)
        else:
            S = source.numel()
            if hot is None:
                y, _ = exchanged.forward(send, None, w1, b1, w2, b2)
            else:
                back, hot_y = exchanged.forward(send[:S], send[S:], w1, b1, w2, b2)
                y = torch.cat([back, hot_y])
                where = torch.where(rows >= 0, rows, torch.where(hot[0] >= 0, S + hot[0], -1))
            saved = ()
        with cfg.phase("combine"):  # rows < 0 (dropped, or replicated with no replicas here) add nothing
            out = combine_rows(y, where, weights, weights.shape[0])
        ctx.save_for_backward(y, where, weights, idx, *saved)
        ctx.cfg, ctx.padded, ctx.exchanged, ctx.sent_rows = cfg, padded, exchanged, source.numel()
        ctx.logits = None if logits is None else (logits.shape[1], logits.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        y, where, weights, idx, *saved = ctx.saved_tensors
        d_y, d_weights = combine_backward(y, where, weights, dout.contiguous(), ctx.padded)
        if ctx.exchanged is None:
            send, pre, act, offsets, w1, w2 = saved
            with ctx.cfg.phase("backward_experts"):
                d_send, *grads = ffn_backward(d_y, (send, pre, act), offsets, w1, w2, ctx.cfg)
        else:
            S = ctx.sent_rows
            hot = d_y.shape[0] > S
            d_send, d_hot_x, grads = ctx.exchanged.backward(d_y[:S] if hot else d_y, d_y[S:] if hot else None)
            if d_hot_x is not None:
                d_send = torch.cat([d_send, d_hot_x])
            ctx.exchanged = None
        dx2 = combine_rows(d_send, where, None, weights.shape[0]) if ctx.needs_input_grad[0] else None
        d_logits = None
        if ctx.logits is not None and ctx.needs_input_grad[1]:
            d_logits = weights_backward(idx, weights, d_weights, *ctx.logits)
        d_weights = d_weights.to(weights.dtype) if ctx.needs_input_grad[2] else None
        return (dx2, d_logits, d_weights, None, *grads, *([None] * 10))


class _GatherTokens(torch.autograd.Function):
    """send [S, d] = token source[r] of x2 for every send row r (source = T: the zero row of a padded
    buffer); backward: each token sums its k rows (rows [kT], the combine kernel without weights)."""

    @staticmethod
    def forward(ctx, x2, source, rows, padded: bool, out=None):
        ctx.save_for_backward(rows)
        ctx.tokens = x2.shape[0]
        return _gathered(x2, source, padded, out)

    @staticmethod
    def backward(ctx, d_send):
        (rows,) = ctx.saved_tensors
        return combine_rows(d_send.contiguous(), rows, None, ctx.tokens), None, None, None, None


class MultiHeadSelfAttention(nn.Module):
    """The seeds' attention block: four d x d projections without bias, scaled dot-product attention."""

    def __init__(self, dim: int, heads: int, *, dtype, device):
        super().__init__()
        self.heads = heads
        for name in ("linear_q", "linear_k", "linear_v", "linear_o"):
            setattr(self, name, nn.Linear(dim, dim, bias=False, dtype=dtype, device=device))

    def forward(self, x):  # x [B, S, d]
        B, S, d = x.shape
        split = lambda t: t.view(B, S, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.linear_q(x)), split(self.linear_k(x)), split(self.linear_v(x))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.linear_o(att.transpose(1, 2).reshape(B, S, d))


class ExampleModel(nn.Module):
    """The seeds' ExampleModel: attention, then the MoE layer (no residual, as in the seed)."""

    def __init__(self, moe: MoELayer, heads: int):
        super().__init__()
        d = moe.opts.model_dim
        self.attn = MultiHeadSelfAttention(d, heads, dtype=moe.w1.dtype, device=moe.w1.device)
        self._moe_layer = moe

    def forward(self, x, choice=None):  # [B, S, d]; choice: see MoELayer.forward
        return self._moe_layer(self.attn(x), choice)


def expert_parameter_names(model: nn.Module) -> list[str]:
    """Names of expert parameters, which data-parallel all-reduce must skip."""
    return [name for name, p in model.named_parameters() if getattr(p, "expert", False)]
