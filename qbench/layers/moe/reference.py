"""Single-process dense reference of the MoE layer, and the check of a distributed layer against it.

The reference computes, for this rank's tokens, out[t] = sum_j w[t, j] * keep[t, j] * FFN_e(x[t])
with e = idx[t, j], all in fp32, expert by expert, with the owners' current weights (broadcast one
expert at a time, so no rank ever holds all experts). Drops come from an independent loop in
Tutel's priority order (all first choices, then all second choices, in token order). Gradients of
a loss sum(out * dy): input and gate gradients per rank, expert gradients summed over ranks on the
owner (reduce), then compared with the layer's own gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from qbench.dtypes import ACTIVATION_DTYPES, tolerance, torch_dtype
from qbench.layers.moe.routing import capacity_limit

# max |layer - reference| / max |reference| allowed per torch dtype: qbench.dtypes' layer_peak tolerance
TOLERANCE = {torch_dtype(name): tolerance(name).layer_peak for name in ACTIVATION_DTYPES}


@dataclass
class CheckResult:
    errors: dict[str, float]
    tolerance: float
    dropped: int  # this rank's dropped assignments (layer)
    dropped_reference: int
    conservation: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        rows_ok = self.conservation.get("sent") == self.conservation.get("received") and (
            self.conservation.get("computed") == self.conservation.get("expected_computed"))
        return (all(v <= self.tolerance for v in self.errors.values()) and rows_ok
                and self.dropped == self.dropped_reference)

    def describe(self) -> str:
        worst = max(self.errors, key=self.errors.get) if self.errors else "-"
        return (f"max error {self.errors.get(worst, 0):.2e} in {worst} (tolerance {self.tolerance:g}); "
                f"dropped {self.dropped} vs {self.dropped_reference}; rows {self.conservation}")


def reference_keep(idx, capacity_factor: float, num_experts: int):
    """[T, k] bool: which assignments fit their expert's capacity (a plain loop, priority order)."""
    T, k = idx.shape
    if capacity_factor == 0:
        return torch.ones_like(idx, dtype=torch.bool)
    cap = capacity_limit(capacity_factor, T, k, num_experts)
    used = [0] * num_experts
    keep = [[False] * k for _ in range(T)]
    ids = idx.tolist()
    for j in range(k):
        for t in range(T):
            e = ids[t][j]
            if used[e] < cap:
                keep[t][j] = True
                used[e] += 1
    return torch.tensor(keep, device=idx.device)


def _expert_weights(layer, e: int):
    """fp32 copies of expert e's (w1, b1, w2, b2), broadcast from its owner, as grad leaves."""
    L = layer.opts.num_local_experts
    owner, l = divmod(e, L)
    out = []
    for p in (layer.w1, layer.b1, layer.w2, layer.b2):
        buf = p[l].detach().float().clone() if owner == layer.rank else p.new_empty(p.shape[1:], dtype=torch.float32)
        if layer.world_size > 1:
            dist.broadcast(buf, dist.get_global_rank(layer.group, owner) if layer.group else owner, group=layer.group)
        out.append(buf.requires_grad_())
    return out


def _ffn(x, w1, b1, w2, b2, activation: str):
    pre = x @ w1 + b1
    return (F.gelu(pre) if activation == "gelu" else F.relu(pre)) @ w2 + b2


def reference(layer, x, dy, idx):
    """(out, dx, [dWg, dbg], [dw1, db1, dw2, db2] of this rank's experts, dropped) in fp32."""
    T, k = idx.shape
    xr = x.detach().float().requires_grad_()
    gw = layer.gate.weight.detach().float().requires_grad_()
    gb = layer.gate.bias.detach().float().requires_grad_()
    w = torch.softmax((xr @ gw.t() + gb).gather(1, idx), dim=1)
    keep = reference_keep(idx, layer.opts.capacity_factor, layer.num_experts)
    out = torch.zeros(T, x.shape[1], device=x.device)
    dx_ffn = torch.zeros_like(out)
    dw = torch.zeros(T, k, device=x.device)
    L = layer.opts.num_local_experts
    owned = [torch.zeros((L, *p.shape[1:]), device=x.device) for p in (layer.w1, layer.b1, layer.w2, layer.b2)]
    for e in range(layer.num_experts):
        weights = _expert_weights(layer, e)
        tok, j = ((idx == e) & keep).nonzero(as_tuple=True)
        xe = x.detach()[tok].float().requires_grad_()
        ye = _ffn(xe, *weights, layer.opts.activation)
        we = w.detach()[tok, j].unsqueeze(1)
        out.index_add_(0, tok, ye.detach() * we)
        torch.autograd.backward(ye, dy[tok].float() * we)
        dx_ffn.index_add_(0, tok, xe.grad)
        dw[tok, j] = (dy[tok].float() * ye.detach()).sum(1)
        _reduce_to_owner(layer, e, [p.grad for p in weights], owned)
    torch.autograd.backward(w, dw)
    return out, xr.grad + dx_ffn, [gw.grad, gb.grad], owned, int((~keep).sum())


def _reduce_to_owner(layer, e: int, grads, owned) -> None:
    owner, l = divmod(e, layer.opts.num_local_experts)
    for g, slot in zip(grads, owned):
        if layer.world_size > 1:
            dist.reduce(g, dist.get_global_rank(layer.group, owner) if layer.group else owner, group=layer.group)
        if owner == layer.rank:
            slot[l] = g


def rel_error(got, want) -> float:
    scale = want.detach().float().abs().max().clamp_min(1e-12)
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / scale) if want.numel() else 0.0


def check_layer(layer, x, dy, choice=None) -> CheckResult:
    """Forward + backward of the layer against the dense reference (same weights, same routing);
    choice: forced expert ids [T, k] (MoELayer.forward) or None."""
    for p in layer.parameters():
        p.grad = None
    xl = x.detach().clone().requires_grad_()
    seen = []
    handle = layer.plan_hooks.register(lambda routing, plan: seen.append((routing, plan)))
    try:
        out = layer(xl, choice)
    finally:
        handle.remove()
    out.backward(dy)
    routing, plan = seen[-1]
    T = x.shape[0]
    idx = routing.idx
    ref_out, ref_dx, ref_gate, ref_experts, ref_dropped = reference(layer, x, dy, idx)
    errors = {"out": rel_error(out, ref_out), "dx": rel_error(xl.grad, ref_dx),
              "gate.weight": rel_error(layer.gate.weight.grad, ref_gate[0]),
              "gate.bias": rel_error(layer.gate.bias.grad, ref_gate[1])}
    for name, p, want in zip(("w1", "b1", "w2", "b2"), (layer.w1, layer.b1, layer.w2, layer.b2), ref_experts):
        errors[name] = rel_error(p.grad, want)
    dropped = int((~routing.keep).sum())
    hot_rows = sum(plan.kept[e] for e in plan.hot)
    expected = plan.send_rows + hot_rows if routing.padded else sum(plan.kept)
    counts = torch.tensor([plan.send_rows, plan.recv_rows, plan.recv_rows + hot_rows, expected], device=x.device)
    if layer.world_size > 1:
        dist.all_reduce(counts, group=layer.group)
    sent, received, computed, expected_all = counts.tolist()
    rows = {"sent": sent, "received": received, "computed": computed,
            "expected_computed": expected_all, "assignments": T * idx.shape[1]}
    return CheckResult(errors, TOLERANCE[x.dtype], dropped, ref_dropped, rows)
