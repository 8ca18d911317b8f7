"""A dense transformer layer stack in DeepFlow's style: every GEMM through DeepFlow's tiled GEMM model and
roofline (qbench.model.deepflow.gemm), pointwise kernels through the roofline, collectives through its ring model.

Shapes (per data shard b = B / dp sequences of s tokens, T = b*s tokens, t = tensor-parallel degree,
h hidden, a heads, f MLP width, V vocabulary); a GEMM (A, B, C) is output A x C, inner B:
  qkv      (T, h, 3h/t)                  scores  (s, h/a, s) x b*a/t     context (s, s, h/a) x b*a/t
  proj     (T, h/t, h)                   mlp_up  (T, h, f/t)             mlp_down (T, f/t, h)
  logits   (T, h, V/t), once after the stack
Backward of each GEMM is two GEMMs of the same flop (input and weight gradient). With activation
recomputation the layer forward runs again before its backward; the logits are not recomputed.

Flop check (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", eq. for a training iteration with recomputation): with f = 4h the GEMM flop of
one iteration is exactly 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). Without recomputation the layers give
72 B s l h^2 (1 + s/(6h)) and the logits still 6 B s h V (so the V term inside 72's parentheses is
V/(12 l h), not V/(16 l h)).

Memory (bytes per device): weights, gradients and two Adam states (4 x params x prec), plus the
activations of Korthikanti et al. 2022 (s b h (10 + 24/t + 5 a s / (h t)) bytes per layer at 2-byte
precision, scaled by prec / 2; 2 s b h prec per layer with full recomputation), for every layer of
a pipeline stage and the whole data shard (a GPipe schedule keeps all micro-batches in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from qbench.model.deepflow.gemm import gemm_time
from qbench.model.deepflow.lstm import apply_grad
from qbench.model.deepflow.machine import Machine, Trace, roofline
from qbench.model.deepflow.parallel import collective

KEYS = ("batch", "seq", "layers", "hidden", "heads", "vocab", "ffn", "recompute", "dp", "tp", "pp")
# GPT-3 XL (Brown et al. 2020: 24 layers, d_model 2048, 16 heads, 2048 tokens), batch 512, GPT-2 vocabulary
DEFAULT = {"batch": 512, "seq": 2048, "layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200}


@dataclass(frozen=True)
class Transformer:
    batch: int  # B, global batch in sequences
    seq: int  # s
    layers: int  # l
    hidden: int  # h
    heads: int  # a
    vocab: int  # V
    ffn: int = 0  # f; 0 means 4h
    recompute: bool = True
    dp: int = 1
    tp: int = 1  # tensor (Megatron) parallel: QKV/MLP-up column split, proj/MLP-down row split
    pp: int = 1  # pipeline stages over the layers

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def b(self) -> int:
        return self.batch // self.dp

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass
class Result:
    shape: Transformer
    time: float  # s per iteration
    parts: dict = field(default_factory=dict)  # component -> s
    memory: float = 0.0  # bytes per device
    capacity: float = 0.0
    parameters: int = 0

    @property
    def fits(self) -> bool:
        return self.memory <= self.capacity


def validate(x: Transformer) -> Transformer:
    """ValueError naming the field when the shape or a split cannot be expressed."""
    for key in KEYS:
        value = getattr(x, key)
        if key != "recompute" and (isinstance(value, bool) or not isinstance(value, int) or value < 0
                                   or (value == 0 and key != "ffn")):
            raise ValueError(f"transformer {key} must be a positive integer, not {value!r}")
    checks = [(x.hidden % x.heads, f"heads = {x.heads} must divide hidden = {x.hidden}"),
              (x.batch % x.dp, f"dp = {x.dp} must divide batch = {x.batch}"),
              (x.heads % x.tp, f"tp = {x.tp} must divide heads = {x.heads}"),
              (x.f % x.tp, f"tp = {x.tp} must divide the MLP width {x.f}"),
              (x.vocab % x.tp, f"tp = {x.tp} must divide vocab = {x.vocab}"),
              (x.layers % x.pp, f"pp = {x.pp} must divide layers = {x.layers}")]
    for bad, message in checks:
        if bad:
            raise ValueError(f"transformer: {message}")
    return x


def layer_gemms(x: Transformer) -> list[tuple[str, float, float, float, float]]:
    """(name, A, B, C, count) of one layer's forward GEMMs on one device."""
    T, h, t, a, s = x.b * x.seq, x.hidden, x.tp, x.heads, x.seq
    return [("qkv", T, h, 3 * h / t, 1), ("scores", s, h / a, s, x.b * a / t), ("context", s, s, h / a, x.b * a / t),
            ("proj", T, h / t, h, 1), ("mlp_up", T, h, x.f / t, 1), ("mlp_down", T, x.f / t, h, 1)]


def logits_gemm(x: Transformer) -> tuple[str, float, float, float, float]:
    return ("logits", x.b * x.seq, x.hidden, x.vocab / x.tp, 1)


def gemm_flops(x: Transformer) -> float:
    """GEMM flop of one training iteration over the whole model and global batch (all devices)."""
    whole = replace(x, dp=1, tp=1, pp=1)
    layer = sum(2 * A * B * C * n for _, A, B, C, n in layer_gemms(whole))
    _, A, B, C, n = logits_gemm(whole)
    passes = 4 if x.recompute else 3  # forward, two backward GEMMs, and the recomputed forward
    return layer * passes * x.layers + 2 * A * B * C * n * 3


def megatron_flops(x: Transformer) -> float:
    """Narayanan et al. 2021: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with recomputation; without it the
    layers give 72 B s l h^2 (1 + s/(6h)) and the logits 6 B s h V. Valid for f = 4h."""
    B, s, l, h, V = x.batch, x.seq, x.layers, x.hidden, x.vocab
    if x.recompute:
        return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h**2 * (1 + s / (6 * h)) + 6 * B * s * h * V


def parameter_count(x: Transformer) -> int:
    """Layers (QKV, projection, MLP with biases, two layer norms), final norm, token + position embeddings."""
    h, f = x.hidden, x.f
    return x.layers * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h + (x.vocab + x.seq) * h


def _gemms_time(m: Machine, t: Trace, gemms, backward: bool) -> float:
    """Batched GEMMs (count > 1) pay one launch: count x (time - O) + O."""
    total = 0.0
    for name, A, B, C, n in gemms:
        shapes = [(A, C, B, "_act"), (B, A, C, "_wt")] if backward else [(A, B, C, "")]
        for a, b, c, tag in shapes:
            total += n * (gemm_time(m, t, a, b, c, name + tag) - m.O) + m.O
    return total


def _pointwise(m: Machine, t: Trace, x: Transformer) -> float:
    """One layer's forward pointwise kernels (2 layer norms, softmax, GELU, 2 residual adds), each read +
    write once; flop per element: layer norm 8, softmax 5, GELU 8, add 1 (usual kernel counts)."""
    T, h, p = x.b * x.seq, x.hidden, m.prec
    n_soft, n_gelu = x.b * (x.heads / x.tp) * x.seq**2, T * x.f / x.tp
    kernels = [(8 * T * h, 2 * T * h * p)] * 2 + [(5 * n_soft, 2 * n_soft * p), (8 * n_gelu, 2 * n_gelu * p)]
    kernels += [(T * h, 3 * T * h * p)] * 2
    return sum(roofline(m, t, fl, by) + m.O for fl, by in kernels)


def evaluate(x: Transformer, m: Machine, fixes: frozenset[str] = frozenset()) -> Result:
    """Seconds per training iteration on one device of the dp x tp x pp grid (pipeline = GPipe with one
    sequence per micro-batch; backward pointwise work taken as twice the forward's). `fixes`: the DeepFlow
    quirks of its building blocks to correct (only the small-collective one applies here)."""
    x, t = validate(x), Trace(False, fixes)
    T, h, p = x.b * x.seq, x.hidden, m.prec
    fwd = _gemms_time(m, t, layer_gemms(x), False) + _pointwise(m, t, x)
    bwd = _gemms_time(m, t, layer_gemms(x), True) + 2 * _pointwise(m, t, x)
    tp_comm = 4 * collective(m, t, T, h, x.tp, m.IB, False, True)  # 2 all-reduces forward, 2 backward
    per_layer = fwd * (2 if x.recompute else 1) + bwd + tp_comm
    micro = x.b  # one sequence per micro-batch
    stack = per_layer * (x.layers / x.pp) * (micro + x.pp - 1) / micro
    hop = 0 if x.pp == 1 else 2 * (micro + x.pp - 1) * (x.seq * h * p / m.IB + m.ll)
    logit = logits_gemm(x)
    head = _gemms_time(m, t, [logit], False) + _gemms_time(m, t, [logit], True)
    head += 3 * (roofline(m, t, 5 * T * logit[3], 2 * T * logit[3] * p) + m.O)  # softmax + its backward
    embed = 2 * (2 * T * h * p / m.mem_bw + m.O)  # gather forward, scatter-add backward
    params = parameter_count(x)
    local = params / (x.tp * x.pp)
    update = apply_grad(m, t, local, 1, "transformer")
    allreduce = collective(m, t, local, 1, x.dp, m.IB, False, True)
    parts = {"layers": stack, "pipeline transfer": hop, "logits": head, "embedding": embed,
             "weight update": update, "data-parallel all-reduce": allreduce}
    return Result(x, sum(parts.values()), parts, memory(x, p), m.mem_size, params)


def memory(x: Transformer, prec: int) -> float:
    """Bytes per device: weights + gradients + 2 optimizer states, and the stage's activations."""
    s, b, h, a, t = x.seq, x.b, x.hidden, x.heads, x.tp
    state = 4 * parameter_count(x) / (x.tp * x.pp) * prec
    if x.recompute:
        act = 2 * s * b * h * prec / t  # the layer input only (sequence parallel would split it; kept)
    else:
        act = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * prec / 2
    return state + act * x.layers / x.pp


def from_params(params: dict) -> Transformer:
    """A Transformer from KEY=VALUE settings over the GPT-3 XL default; ValueError names a bad key."""
    unknown = [k for k in params if k not in KEYS]
    if unknown:
        raise ValueError(f"--shape {unknown[0]}: unknown key; use {', '.join(KEYS)}")
    return validate(Transformer(**{**DEFAULT, **params}))
