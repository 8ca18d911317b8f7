"""DeepFlow's memory requirement of an LSTM language model, and its parameter count.

Per layer: activations kept for the backward pass, weights, and pointwise temporaries, as element
counts (x prec for bytes). Computed per data shard (batch b = ceil(B / dp)) and per data shard per
model shard (dimensions divided by the kernel-parallel degrees). Memory sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.model.deepflow.lstm import Shape
from qbench.model.deepflow.quirks import MEMORY_PROJECTION, MODEL_SHARD_CATEGORIES


@dataclass(frozen=True)
class Layer:
    act: float
    wt: float
    pt: float

    def bytes(self, prec: int) -> float:
        return (self.act + self.wt + self.pt) * prec


@dataclass(frozen=True)
class Memory:
    """Bytes per layer and per category, total, and the overflow rate (total / device memory)."""

    hidden: float
    softmax: float
    projection: float
    embedding: float
    total: float
    weight: float
    activation: float
    pointwise: float
    overflow: float
    capacity: float

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


NONE = Layer(0, 0, 0)  # a layer the model does not have


def hidden(s: Shape, Lx, d1, d2, d3) -> Layer:
    return Layer(d1 * d2 * s.S * Lx, (d2 + 1) * d3 * Lx, (d1 * d2 / 2) * 9 * Lx * s.S)


def softmax(s: Shape, Bx, Px, Vx) -> Layer:
    return Layer(Bx * s.S * Vx, (Px + 1) * Vx, 2 * Bx * s.S * Vx + Bx * s.S)


def projection(s: Shape, Bx, Px, Dx) -> Layer:
    return Layer(Bx * s.S * Px, (Dx + 1) * Px, Bx * s.S * Px)


def embedding(s: Shape, Bx) -> Layer:
    return Layer(Bx * s.S * s.D, s.V * s.D, 0)


def _softmax_width(s: Shape, fixes: frozenset[str]) -> int:
    """Softmax input width in memory: DeepFlow takes P (the projection the time leaves out), the
    corrected model K_s = D, as its time and parameter count do."""
    return s.Ks if MEMORY_PROJECTION in fixes else s.P


def _no_projection(fixes: frozenset[str]) -> bool:
    return MEMORY_PROJECTION in fixes  # the corrected model has no projection layer anywhere


def _memory(layers: tuple[Layer, ...], prec: int, capacity: float, cats: tuple[Layer, ...]) -> Memory:
    """Bytes of (hidden, softmax, projection, embedding) layers; categories summed over `cats`."""
    h, sm, pj, em = (x.bytes(prec) for x in layers)
    total = h + sm + pj + em
    weight = sum(x.wt for x in cats) * prec
    act = sum(x.act for x in cats) * prec
    pt = sum(x.pt for x in cats) * prec
    return Memory(h, sm, pj, em, total, weight, act, pt, total / capacity, capacity)


def per_data_shard(s: Shape, prec: int, capacity: float, fixes: frozenset[str] = frozenset()) -> Memory:
    b = s.b
    proj = NONE if _no_projection(fixes) else projection(s, b, s.P, s.D)
    layers = (hidden(s, s.L, b, 2 * s.D, s.G * s.D), softmax(s, b, _softmax_width(s, fixes), s.V),
              proj, embedding(s, b))
    h, sm, pj, em = (x.bytes(prec) for x in layers)
    total = h + sm + em + pj  # DeepFlow's order of the sum (printed digits)
    weight = sum(x.wt for x in layers) * prec
    act = sum(x.act for x in layers) * prec
    pt = sum(x.pt for x in layers) * prec
    return Memory(h, sm, pj, em, total, weight, act, pt, total / capacity, capacity)


def per_model_shard(s: Shape, prec: int, capacity: float, fixes: frozenset[str] = frozenset()) -> Memory:
    """Dimensions divided by the kernel-parallel degrees (type 2 = row-column, otherwise column-row).
    Like DeepFlow, the category split (weight/activation/pointwise) is the per-data-shard one, unless
    the model-shard-categories quirk is fixed."""
    b = s.b
    ht, h1, h2 = s.kp["hidden"]
    st, s1, s2 = s.kp["softmax"]
    pt_, p1, p2 = s.kp["projection"]
    et, e1, e2 = s.kp["embedding"]
    hid = hidden(s, s.L / s.hlp, b / (h1 if ht == 2 else 1), 2 * s.D / (1 if ht == 2 else h1),
                 s.D * s.G / (h2 if ht == 2 else 1))
    smx = softmax(s, b / (s1 if st == 2 else 1), _softmax_width(s, fixes) / (1 if st == 2 else s1),
                  s.V / (s2 if st == 2 else 1))
    prj = NONE if _no_projection(fixes) else projection(
        s, b / (p1 if pt_ == 2 else 1), s.P / (p2 if pt_ == 2 else 1), s.D / (1 if pt_ == 2 else p1))
    emb = embedding(s, b / (e1 if et == 1 else e1 * e2))
    layers = (hid, smx, prj, emb)
    if MODEL_SHARD_CATEGORIES in fixes:
        return _memory(layers, prec, capacity, layers)
    h, sm, pj, em = (x.bytes(prec) for x in layers)
    total = h + sm + pj + em
    shard = per_data_shard(s, prec, capacity, fixes)
    return Memory(h, sm, pj, em, total, shard.weight, shard.activation, shard.pointwise, total / capacity,
                  capacity)


def parameter_count(s: Shape, fixes: frozenset[str] = frozenset()) -> int:
    """Embedding + LSTM (with bias) + projection (no bias; none when the memory-projection quirk is
    fixed) + softmax (with bias, inner width D)."""
    projection_params = 0 if _no_projection(fixes) else s.D * s.P
    return s.V * s.D + (2 * s.D + 1) * (s.G * s.D) * s.L + projection_params + (s.Ks + 1) * s.V
