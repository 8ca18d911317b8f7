"""DeepFlow's LSTM language-model step time: a pure function of (config, machine).

Layers: embedding -> L stacked LSTM layers of width D (G gates, unrolled S steps) -> softmax over a
vocabulary V (the projection to P is computed and printed but, as in DeepFlow, left out of the time).
Per-cell forward Cf and backward Cb times compose into a wavefront over layers and steps (section 7.2
of the reference); softmax and embedding run once over the whole sequence; R is the hidden weight
update (gradient clipping + apply) plus the data-parallel all-reduce of the LSTM weight gradients.
All times are seconds. Evaluation order and grouping follow DeepFlow exactly (printed digits); the
quirks a trace fixes (qbench.model.deepflow.quirks) change only the terms named at each fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from qbench.model.deepflow import parallel as par
from qbench.model.deepflow import quirks as q
from qbench.model.deepflow.gemm import gemm_time
from qbench.model.deepflow.machine import MEM_LATENCY, Machine, Trace, roofline


@dataclass
class Shape:
    """The model and scheduling values the time model reads (b = per-data-shard batch)."""

    B: int
    V: int
    L: int
    D: int
    P: int
    S: int
    G: int
    dp: int
    lp: int
    hlp: int
    kp: dict  # layer -> (type, dim1, dim2)

    @property
    def b(self) -> int:
        return math.ceil(self.B / self.dp)

    @property
    def Ks(self) -> int:
        return self.D  # softmax inner width: D, since the projection is left out (DeepFlow's proj = false)

    def hidden_shard(self) -> tuple[float, float]:
        """(rows, columns) of one device's part of the 2D x G*D gate weights: a column-row split (type 1)
        cuts the 2D input rows over h1, a row-column split (type 2) the G*D columns over h2."""
        kind, h1, h2 = self.kp["hidden"]
        return 2 * self.D / (h1 if kind == 1 else 1), self.G * self.D / (h2 if kind == 2 else 1)

    def softmax_shard(self) -> tuple[float, float]:
        """(rows, columns) of one device's part of the K_s x V softmax weights (type 1: K_s over s1,
        type 2: V over s2)."""
        kind, s1, s2 = self.kp["softmax"]
        return self.Ks / (s1 if kind == 1 else 1), self.V / (s2 if kind == 2 else 1)


def shape_of(cfg: dict) -> Shape:
    mp, sp = cfg["model_param"], cfg["scheduling_param"]
    kp = {n: (sp[f"kp_{n}_type"], sp[f"kp_{n}_dim1"], sp[f"kp_{n}_dim2"])
          for n in ("hidden", "softmax", "embedding", "projection")}
    return Shape(mp["batch_size"], mp["vocab_size"], mp["num_layers"], mp["layer_size"], mp["projection"],
                 mp["seq_len"], mp["num_gates"], sp["dp"], sp["lp"], sp["hlp"], kp)


@dataclass
class Components:
    """Per-component times (s); `time` is DeepFlow's Time, `shares` its decomposition."""

    Cf: float = 0.0
    Cb: float = 0.0
    R: float = 0.0
    W: float = 0.0
    softmax_f: float = 0.0
    softmax_b: float = 0.0
    embedding_f: float = 0.0
    embedding_b: float = 0.0
    projection_f: float = 0.0
    projection_b: float = 0.0
    apply_hidden: float = 0.0
    apply_projection: float = 0.0
    apply_softmax: float = 0.0
    allreduce_softmax: float = 0.0  # data-parallel all-reduce of the softmax weights (corrected model only)
    time: float = 0.0
    shares: dict = field(default_factory=dict)


def apply_grad(m: Machine, t: Trace, D0, D1, name: str) -> float:
    """Weight update of a D0 x D1 matrix (read weight, gradient and state, write back) plus clipping."""
    prec = m.prec
    fa = D0 * D1 * 3
    ma = (2 * D0 * D1 * prec) + (3 * D0 * D1 * prec) + (2 * D0 * D1 * prec)
    ta = roofline(m, t, fa, ma)
    tc = grad_clip(m, t, D0, D1, name)
    t.debug(f"({name}) applyGrad_flop: {fa:,}, applyGrad_mem: {ma:,}")
    t.debug(f"({name}) applyGrad_time: {ta:,}")
    t.debug("")
    return ta + tc


def grad_clip(m: Machine, t: Trace, D0, D1, name: str) -> float:
    """Global-norm clipping: a norm pass (read once) and a scale pass (read + write)."""
    prec = m.prec
    norm_f, norm_m = D0 * D1 * 2, (D0 * D1 * 1) * prec
    clip_f, clip_m = D0 * D1 * 2, (D0 * D1 * 2) * prec
    fc, mc = norm_f + clip_f, norm_m + clip_m
    tc = roofline(m, t, fc, mc)
    t.debug(f"({name}) gradclip_flop: {fc:,}, gradclip_mem: {mc:,}")
    t.debug(f"({name}) gradclip_time: {tc:,}")
    t.debug("")
    return tc


def cell_forward(m: Machine, t: Trace, s: Shape) -> float:
    """Cf: gate GEMM [x_t, h_{t-1}] (b x 2D) . W (2D x G*D), then the pointwise gate math (15 launches)."""
    if s.kp["hidden"][0] in (1, 2):
        return _cell_kp(m, t, s, forward=True)
    b, D, G, prec = s.b, s.D, s.G, m.prec
    tg = gemm_time(m, t, b, 2 * D, G * D, "Cf")
    fp = ((b * D) * G) * (1 + 5 / 4 + 1)  # bias add, 5/4 non-linearities per gate, multiply-add
    mp = (((prec * b) * D) * G) * (3 * 2 + 2 * 5 / 4)
    tp = roofline(m, t, fp, mp) + 15 * m.O
    t.debug(f"Hidden point_flop: {int(fp):,}, point_mem: {int(mp):,}")
    t.debug("")
    t.debug(f"Hidden point_time: {tp}")
    t.debug("")
    return tg + tp


def cell_backward(m: Machine, t: Trace, s: Shape) -> float:
    """Cb: input-gradient and weight-gradient GEMMs, pointwise backward + weight-gradient accumulation."""
    if s.kp["hidden"][0] in (1, 2):
        return _cell_kp(m, t, s, forward=False)
    b, D, G, prec = s.b, s.D, s.G, m.prec
    t_act = gemm_time(m, t, b, G * D, 2 * D, "Cb_act")
    t_wt = gemm_time(m, t, 2 * D, b, G * D, "Cb_wt")
    bd = b * D * G if t.fixed(q.CB_POINTWISE_GATES) else b * D  # gate elements; DeepFlow drops G here
    acc = (2 * D * G * D) * 3  # 3 passes over the 2D x G*D weight gradient: elements, as DeepFlow counts
    if t.fixed(q.CB_ACCUM_PREC):
        acc = acc * prec  # bytes
    fp = (bd * 3.25) + (2 * D * G * D)
    mp = (prec * bd * 8.5) + acc
    tp = roofline(m, t, fp, mp) + 15 * m.O
    t.debug(f"(gr) Hidden point_flop: {int(fp):,}, point_mem: {int(mp):,}")
    t.debug(f"Hidden point_time: {tp}")
    t.debug("")
    return (t_act + t_wt) + tp


def _cell_kp(m: Machine, t: Trace, s: Shape, forward: bool) -> float:
    """Kernel-parallel cell: type 1 splits the inner 2D over h1; type 2 rows over h1, gates over h2."""
    kind, h1, h2 = s.kp["hidden"]
    b, D, G, prec = s.b, s.D, s.G, m.prec
    if kind == 1:
        x = b * (G * D / h1)
        fp, mp, comm = x * 4, prec * b * (G * D / h1) * 11, x * 3 / m.IB
    else:
        x = (b / h1) * (G * D / h2)
        fp, mp = x * 4, prec * (b / h1) * (G * D / h2) * 11
        rows = b / h1 if forward or t.fixed(q.CB_KP2_ROWS) else b  # DeepFlow's backward exchanges all b rows
        comm = x * 3 / m.IB if forward else rows * (G * D / h2) * 3 / m.IB
    if forward:
        if kind == 1:
            g, r = par.f_kp1(m, t, b, 2 * D, G * D, h1, "Cf_kp1")
        else:
            g, r = par.f_kp2(m, t, b, 2 * D, G * D, h1, h2, "Cf_kp2")
        tp = roofline(m, t, fp, mp) + m.O + comm
        return g + r + tp
    tp = roofline(m, t, fp, mp) + m.O + comm
    if kind == 1:
        g, r = par.b_kp1(m, t, b, 2 * D, G * D, h1, "Cb_kp1")
    else:
        g, r = par.b_kp2(m, t, b, 2 * D, G * D, h1, h2, "Cb_kp2")
    t.debug(f"(gr) Hidden point_flop: {int(fp):,}, point_mem: {int(mp):,}")
    t.debug("")
    return g + r + tp


def split_softmax_inner(t: Trace, s: Shape) -> int:
    """Inner width of a split softmax GEMM: DeepFlow takes P (2048 in the seed) although the unsplit
    softmax takes K_s = D (19968), so a split looked ~10x cheaper; the corrected model takes K_s."""
    return s.Ks if t.fixed(q.SOFTMAX_SPLIT_INNER) else s.P


def softmax_forward(m: Machine, t: Trace, s: Shape) -> float:
    """Logits GEMM (b*S x K_s . K_s x V) for the whole sequence, then the softmax itself (4 launches)."""
    kind, s1, s2 = s.kp["softmax"]
    bs, V, prec = s.b * s.S, s.V, m.prec
    if kind == -1:
        tg = gemm_time(m, t, bs, s.Ks, V, "softmax_f")
        fp, mp = bs * (3 * V - 1), prec * s.b * s.S * (7 * V)
        tp = roofline(m, t, fp, mp) + 4 * m.O
        t.debug(f"Softmax point_flop: {int(fp):,}, point_mem: {int(mp):,}")
        t.debug(f"point_time: {tp}")
        t.debug("")
        return tg + tp
    inner = split_softmax_inner(t, s)
    if kind == 1:
        g, r = par.f_kp1(m, t, bs, inner, V, s1, "softmax_f_kp1")
        fp, mp, comm = bs * (V / s1) * 3, prec * bs * (V / s1) * 7, prec * bs * s1 / m.IB
    else:
        g, r = par.f_kp2(m, t, bs, inner, V, s1, s2, "softmax_f_kp2")
        fp, mp = (bs / s1) * (V / s2) * 3, prec * (bs / s1) * (V / s2) * 7
        comm = prec * (bs / s1) * s2 / m.IB
    tp = roofline(m, t, fp, mp) + m.O + comm
    t.debug(f"Softmax point_flop: {int(fp):,}, point_mem: {int(mp):,}")
    t.debug(f"Softmax GEMM_time: {g:,}, point_time: {tp:,}")
    t.debug("")
    return g + r + tp if kind == 1 else g + tp + r


def softmax_backward(m: Machine, t: Trace, s: Shape) -> float:
    """Weight- and input-gradient GEMMs of the logits, and the softmax backward pointwise work."""
    kind, s1, s2 = s.kp["softmax"]
    bs, V, prec = s.b * s.S, s.V, m.prec
    if kind == -1:
        t_wt = gemm_time(m, t, s.Ks, bs, V, "softmax_b_wt")
        t_act = gemm_time(m, t, bs, V, s.Ks, "softmax_b_act")
        fp, mp = bs * V * 5, prec * bs * V * 11
        tp = roofline(m, t, fp, mp) + 4 * m.O
        t.debug(f"(gr) Softmax point_flop: {int(fp):,}, point_mem: {int(mp):,}")
        t.debug(f"(gr) Softmax point_time: {tp}")
        t.debug("")
        return (t_wt + t_act) + tp
    if kind == 1:
        fp, mp = bs * (V / s1) * 5, prec * bs * ((11 * V) / s1)
    else:
        fp, mp = (bs / s1) * (V / s2) * 5, prec * (bs / s1) * ((11 * V) / s2)
    tp = roofline(m, t, fp, mp) + m.O
    if kind == 1:
        g, r = par.b_kp1(m, t, bs, split_softmax_inner(t, s), V, s1, "softmax_b_kp1")
    else:
        g, r = par.b_kp2(m, t, bs, s.Ks, V, s1, s2, "softmax_b_kp2")
    t.debug(f"(gr) Softmax point_flop: {int(fp):,}, point_mem: {int(mp):,}")
    t.debug("")
    return r + g + tp


def projection(m: Machine, t: Trace, s: Shape) -> tuple[float, float]:
    """(forward, backward) of the b*S x D . D x P projection; printed, not part of the time."""
    kind, p1, p2 = s.kp["projection"]
    bs, D, P = s.b * s.S, s.D, s.P
    if kind == -1:
        fwd = gemm_time(m, t, bs, D, P, "projection")
        bwd = gemm_time(m, t, P, bs, D, "projection_b_wt") + gemm_time(m, t, bs, P, D, "projection_b_act")
        return fwd, bwd
    if kind == 1:
        g, r = par.f_kp1(m, t, bs, D, P, p1, "projection_f")
        gb, rb = par.b_kp1(m, t, bs, D, P, p1, "projection_b")
    else:  # DeepFlow times the backward with the forward block (unless fixed)
        g, r = par.f_kp2(m, t, bs, D, P, p1, p2, "projection_f")
        backward = par.b_kp2 if t.fixed(q.PROJECTION_B_KP2) else par.f_kp2
        gb, rb = backward(m, t, bs, D, P, p1, p2, "projection_b")
    return g + r, gb + rb


def embedding(m: Machine, t: Trace, s: Shape) -> tuple[float, float]:
    """(forward, backward): gather / scatter of b*S rows of width D, plus the data-parallel exchange."""
    prec = m.prec
    me = 2 * (s.b * s.D * s.S * prec)
    fwd = (me / m.mem_bw + MEM_LATENCY) + m.O
    t.debug(f"Embedding_mem: {int(me):,}")
    me_b = 2 * s.b * s.D * s.S * prec
    t_mem = (me_b / m.mem_bw + MEM_LATENCY) + m.O
    t_comm = 0 if s.dp == 1 else ((prec * s.b * s.D * s.S) / m.IB + m.ll) * 2 * (s.dp - 1)
    t.debug(f"(gr) Embedding_mem: {int(me_b):,}")
    return fwd, t_comm + t_mem


def compose(c: Components, s: Shape) -> None:
    """Time = non-recurrent part + the wavefront over L layers x S steps in hlp pipeline stages."""
    T0 = (((c.softmax_f + c.softmax_b) + c.embedding_f) + c.embedding_b) + 0  # projection left out
    T0 = T0 + c.apply_softmax
    if c.allreduce_softmax:  # only the corrected model has this term (exact: DeepFlow's sum, digit for digit)
        T0 = T0 + c.allreduce_softmax
    L, S, hlp, W, Cf, Cb, R = s.L, s.S, s.hlp, c.W, c.Cf, c.Cb, c.R
    a = L + (L / hlp) * (S - 1)
    cc = L + (L / hlp) * (S - 2) + 1
    n = S + hlp - 2
    if W <= Cf * L / hlp:
        kf, kw1 = a, hlp - 1
        kb, kw2, kr = (a, hlp - 1, 1) if Cb >= R else (cc, 0, L / hlp)
    elif W >= Cb * L / hlp:
        kf, kw1, kw2 = L, n, n
        kb, kr = (L, 1) if Cb >= R else (L - L / hlp + 1, L / hlp)
    else:
        kf, kw1 = L, n
        kb, kw2, kr = (a, hlp - 1, 1) if Cb >= R else (cc, 0, L / hlp)
    delta = kf * Cf + W * kw1 + kb * Cb + (W * kw2 if kw2 else 0)
    delta = delta + (R if kr == 1 else R * kr)
    c.time = T0 + delta
    c.shares = {"lstm forward": kf * Cf, "lstm backward": kb * Cb, "inter-layer transfer": W * (kw1 + kw2),
                "hidden weight update": kr * R, "softmax forward": c.softmax_f,
                "softmax backward": c.softmax_b, "embedding": c.embedding_f + c.embedding_b,
                "softmax weight update": c.apply_softmax}
    if c.allreduce_softmax:
        c.shares["softmax all-reduce"] = c.allreduce_softmax
