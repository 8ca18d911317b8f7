"""Routing of the MoE layer: inputs, the gate's top-k (or a forced choice), capacity and drops.

Assignments of one rank are numbered a = j * T + t (choice j of token t), so that every first
choice ranks before every second choice when an expert is over capacity (Tutel's priority).
Capacity (Tutel's semantics, per rank, T tokens, k choices, E experts):
    cf > 0: capacity = k * int(cf * ceil(T / E)) rows per expert, buffers padded to it;
    cf = 0: dropless, no padding (uneven all-to-all splits make padding unnecessary);
    cf < 0: min(k * int(-cf * ceil(T / E)), needed) rows, no padding.
Routing kinds (a recorded parameter):
    randn      inputs ~ N(0, 1), the gate routes (Tutel's inputs, near-uniform);
    rand-skew  inputs ~ U[0, 1) as in the seeds, the gate routes (a few experts take most tokens);
    uniform    inputs ~ N(0, 1), balanced forced choice: every expert gets T*k/E assignments;
    zipf:S     inputs ~ N(0, 1), forced choice, expert of popularity rank i drawn with p ~ 1/i^S;
    trace:FILE inputs ~ N(0, 1), forced choice read from FILE (rows of k expert ids, cycled).
With a forced choice the combine weights are still the gate's softmax at the chosen experts.
Locality P (`locality_choices`, with randn or uniform inputs): a forced choice in which each of a
token's k distinct experts lives on the token's own rank with probability P, else on a uniformly
drawn other rank, the expert uniform within that rank (among those the token has not taken yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROUTING_KINDS = ("randn", "rand-skew", "uniform", "zipf", "trace")


@dataclass(frozen=True)
class RoutingSpec:
    kind: str
    zipf_s: float = 0.0
    trace: str = ""

    @property
    def label(self) -> str:
        if self.kind == "zipf":
            return f"zipf:{self.zipf_s:g}"
        return f"trace:{self.trace}" if self.kind == "trace" else self.kind


def parse_routing(text: str) -> RoutingSpec:
    """'randn' | 'rand-skew' | 'uniform' | 'zipf:1.2' | 'trace:routes.txt'; ValueError otherwise."""
    kind, _, arg = str(text).partition(":")
    if kind not in ROUTING_KINDS:
        raise ValueError(f"unknown routing {text!r}; choose from randn, rand-skew, uniform, zipf:S, trace:FILE")
    if kind == "zipf":
        try:
            s = float(arg)
        except ValueError:
            raise ValueError(f"{text!r}: zipf needs an exponent, like zipf:1.2") from None
        if not s > 0:
            raise ValueError(f"{text!r}: the zipf exponent must be > 0")
        return RoutingSpec("zipf", zipf_s=s)
    if kind == "trace":
        if not arg:
            raise ValueError(f"{text!r}: give the trace file, like trace:routes.txt")
        return RoutingSpec("trace", trace=arg)
    if arg:
        raise ValueError(f"routing {kind!r} takes no argument")
    return RoutingSpec(kind)


def load_trace(path: str, top_k: int, num_experts: int):
    """Rows of k expert ids (text: whitespace/comma separated; .npy; .pt) -> int64 tensor [N, k]."""
    import numpy as np
    import torch

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"trace file {path} does not exist")
    if file.suffix == ".npy":
        data = np.load(file)
    elif file.suffix == ".pt":
        data = torch.load(file, map_location="cpu").numpy()
    else:
        data = np.loadtxt(file, delimiter="," if "," in file.read_text()[:1000] else None, ndmin=2)
    table = torch.as_tensor(np.asarray(data), dtype=torch.int64)
    if table.dim() != 2 or table.shape[1] != top_k or table.shape[0] == 0:
        raise ValueError(f"trace {path}: need rows of top_k = {top_k} expert ids, got shape {tuple(table.shape)}")
    if table.min() < 0 or table.max() >= num_experts:
        raise ValueError(f"trace {path}: expert ids must lie in 0..{num_experts - 1}")
    return table


def make_input(spec: RoutingSpec, tokens: int, dim: int, *, generator, device, dtype):
    import torch

    draw = torch.rand if spec.kind == "rand-skew" else torch.randn
    return draw(tokens, dim, generator=generator, device=device).to(dtype)


def forced_choices(spec: RoutingSpec, tokens: int, k: int, experts: int, *, rank: int, step: int,
                   trace=None, device="cpu"):
    """Expert ids [T, k] chosen by the routing kind itself, or None when the gate decides."""
    import torch

    if spec.kind in ("randn", "rand-skew"):
        return None
    gen = torch.Generator().manual_seed(1_000_003 * (step + 1) + rank)
    t = torch.arange(tokens).unsqueeze(1)
    if spec.kind == "uniform":
        shift = int(torch.randint(experts, (1,), generator=gen))
        idx = (t * k + torch.arange(k) + shift) % experts
    elif spec.kind == "zipf":
        popular = torch.randperm(experts, generator=torch.Generator().manual_seed(12345))
        p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** spec.zipf_s
        drawn = torch.multinomial(p.expand(tokens, experts), k, replacement=False, generator=gen)
        idx = popular[drawn]
    else:
        rows = (rank * tokens + step * tokens * 7919 + t.squeeze(1)) % trace.shape[0]
        idx = trace[rows]
    return idx.to(device)


def locality_choices(tokens: int, k: int, local_experts: int, world_size: int, p: float, *, rank: int,
                     step: int, device="cpu"):
    """Expert ids [T, k] under locality p (module docstring); needs local_experts >= k so that a rank
    always has an expert the token has not taken yet. Independent draws per (token, choice), so the
    fraction of local choices is Binomial(T * k, p) / (T * k)."""
    import torch

    T, L, W = tokens, local_experts, world_size
    gen = torch.Generator().manual_seed(2_000_029 * (step + 1) + rank)
    taken = torch.zeros(T, W, L, dtype=torch.bool)
    rows, picks = torch.arange(T), []
    for _ in range(k):
        owner = torch.full((T,), rank, dtype=torch.int64)
        if W > 1:
            other = (rank + 1 + torch.randint(W - 1, (T,), generator=gen)) % W  # uniform over the others
            owner = torch.where(torch.rand(T, generator=gen) < p, owner, other)
        scores = torch.rand(T, L, generator=gen).masked_fill(taken[rows, owner], -1.0)
        local = scores.argmax(1)  # uniform over the rank's experts not taken yet
        taken[rows, owner, local] = True
        picks.append(owner * L + local)
    return torch.stack(picks, 1).to(device)


def capacity_limit(capacity_factor: float, tokens: int, k: int, experts: int) -> int:
    """Tutel's per-expert capacity k * int(|cf| * ceil(T / E)) (at least 1 row)."""
    return max(1, k * int(abs(capacity_factor) * math.ceil(tokens / experts)))


@dataclass
class Routing:
    """One step's routing on one rank (device tensors unless noted)."""

    idx: Any  # [T, k] int64 expert ids
    weights: Any  # [T, k] combine weights, differentiable (softmax over the k chosen logits)
    flat_e: Any  # [k*T] expert of assignment a = j*T + t
    pos: Any  # [k*T] position of the assignment in its expert's priority list
    keep: Any  # [k*T] bool, False for dropped assignments
    counts: Any  # [E] assignments per expert before capacity
    kept: Any  # [E] assignments per expert after capacity
    capacity: int | None  # rows per expert (None: dropless)
    padded: bool  # buffers padded to `capacity` (cf > 0)
    logits: Any = None  # [T, E] the gate's logits where `weights` are outside the autograd graph and the
    #                     step takes their gradient to the logits itself (kernels.moe_route.weights_backward)

    def detached(self) -> Routing:
        """The same routing with weights cut from the autograd graph: what a layer may keep after its
        step. Kept with its graph, it would keep the step's AccumulateGrad nodes alive, and the next
        backward would then join their (earlier) stream: an eager step pays a sync, and a CUDA-graph
        capture fails ("operation would make the legacy stream depend on a capturing blocking stream")."""
        return replace(self, weights=self.weights.detach(), logits=None)


def route(logits, k: int, capacity_factor: float, forced=None) -> Routing:
    """Top-k (or forced) choice, softmax weights over the k chosen logits, capacity and drops."""
    import torch

    tokens, experts = logits.shape
    if forced is None:
        vals, idx = logits.topk(k, dim=1)
    else:
        idx = forced
        vals = logits.gather(1, idx)
    weights = torch.softmax(vals.float(), dim=1)
    flat_e = idx.t().reshape(-1)
    # Position of every assignment in its expert's priority list without a sort or a host sync
    # (bincount reads its max to the host): running count per expert along the assignments, [E, kT]
    # so that the scan runs over the innermost dimension (a scan over dim 0 of [kT, E] is ~100x slower).
    hits = torch.zeros((experts, flat_e.numel()), dtype=torch.int32, device=flat_e.device)
    running = hits.scatter_(0, flat_e.unsqueeze(0), 1).cumsum(1, dtype=torch.int32)  # [E, kT]
    counts = running[:, -1].long() if flat_e.numel() else torch.zeros(experts, dtype=torch.int64, device=flat_e.device)
    pos = running.gather(0, flat_e.unsqueeze(0)).squeeze(0).long() - 1
    if capacity_factor == 0:
        cap, keep, kept = None, torch.ones_like(flat_e, dtype=torch.bool), counts
    else:
        cap = capacity_limit(capacity_factor, tokens, k, experts)
        keep, kept = pos < cap, counts.clamp(max=cap)
    return Routing(idx, weights, flat_e, pos, keep, counts, kept, cap, capacity_factor > 0)
