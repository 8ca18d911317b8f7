"""`qbench train-check`: does a block stack still train with int8 / fp8 linear layers?

A tiny decoder (qbench.layers.transformer.TinyLM: embeddings, causal blocks whose linear layers are
the variant's, 16-bit LM head) learns next-token prediction on a fixed random Markov chain
(markov.py), whose best achievable loss, the chain's conditional entropy, is known exactly. Every
variant starts from the same weights and sees the same batches in the same order; eager execution.
Step: logits = model(x[:, :-1]); loss = cross-entropy with x[:, 1:] (mean over tokens, in fp32);
backward of loss x tokens per batch (a static loss scale, so fp16 gradients stay normal; AdamW's
update does not depend on it); AdamW (betas 0.9, 0.95), linear warm-up over 5% of the steps, then
cosine decay to 10% of the peak rate.
One record (bench "train_check") per variant, exec eager; metrics (nats per token): qbench/metrics/train.py;
samples["loss_curve"]: the mean loss of each window of CURVE_EVERY steps (curve_every says so).
A non-finite loss stops the variant: an error record ("diverged at step N") with the curve so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from qbench import store
from qbench.metrics.train import BENCH

CURVE_EVERY = 10


@dataclass(frozen=True)
class TrainPreset:
    vocab: int
    support: int  # non-zero transitions per row of the chain
    width: int
    mlp: int
    heads: int
    layers: int
    seq: int  # tokens predicted per sequence
    batch_size: int  # sequences per step
    steps: int
    lr: float


TRAIN_PRESETS = {
    # 8192 tokens a step, 600 steps (~5M tokens, ~16 per chain row a step): the final-loss mean over the
    # last 60 steps (~490k tokens) has a noise of ~0.0015 nats, and every variant sees the same batches,
    # so a gap to 16-bit of 0.005 nats stands out. (At a quarter of this width, vocab and tokens a step,
    # 300 steps on a CPU ended 0.15 nats above the floor, flat for the last 100 steps.)
    "lm-small": TrainPreset(vocab=512, support=8, width=512, mlp=2048, heads=8, layers=4, seq=128, batch_size=64,
                            steps=600, lr=1e-3),
    "lm-tiny": TrainPreset(vocab=16, support=3, width=32, mlp=128, heads=2, layers=2, seq=16, batch_size=8, steps=60,
                           lr=1e-2),  # the CPU default: seconds
}


@dataclass(frozen=True)
class TrainConfig:
    preset: str | None = None  # a TRAIN_PRESETS name; None: lm-small on a GPU, lm-tiny on the CPU
    variants: tuple[str, ...] = ("16bit", "switchback", "fp8", "fp8_all", "torchao")
    layers: int | None = None
    batch: int | None = None
    steps: int | None = None
    lr: float | None = None
    dtype: str = "bf16"
    device: str = "auto"
    seed: int = 0
    sizes: TrainPreset | None = None  # resolve(): the preset with the overrides applied


def resolve(config: TrainConfig) -> TrainConfig:
    """Device, preset and its overrides (16bit first: every gap is over it)."""
    from qbench.env import usable_device
    from qbench.errors import QbenchUsageError

    device = usable_device(config.device)
    name = config.preset or ("lm-small" if device == "cuda" else "lm-tiny")
    if name not in TRAIN_PRESETS:
        raise QbenchUsageError(f"train-check presets are {', '.join(TRAIN_PRESETS)}, not {name}")
    base = TRAIN_PRESETS[name]
    preset = replace(base, layers=config.layers or base.layers, batch_size=config.batch or base.batch_size,
                     steps=config.steps or base.steps, lr=config.lr or base.lr)
    variants = ("16bit", *(v for v in config.variants if v != "16bit"))
    return replace(config, preset=name, device=device, variants=variants, sizes=preset)


def pending(config: TrainConfig, done: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The variants run(config) trains: all of them (each gap is over the 16bit run of the same call, so a
    finished part is never reused; train-check has no --resume)."""
    return config.variants


def measured_id(record: dict) -> str:
    return record["case"]


def params(config: TrainConfig, preset: TrainPreset, variant: str) -> dict:
    """A record's params: the preset's name and sizes, the variant, and exec eager (the loop is never compiled)."""
    return {"preset": config.preset, "variant": variant, **preset.__dict__, "dtype": config.dtype,
            "seed": config.seed, "exec": "eager"}


def summary(losses: list[float], floor: float, vocab: int) -> dict:
    """Metrics of one finished run from its per-step losses (see the module docstring)."""
    last = max(1, len(losses) // 10)
    final = sum(losses[-last:]) / last
    first = losses[:CURVE_EVERY]
    return {"final_loss": final, "initial_loss": sum(first) / len(first), "entropy_floor": floor,
            "gap_to_floor": final - floor, "uniform_loss": math.log(vocab), "curve_every": CURVE_EVERY}


def curve(losses: list[float]) -> list[float]:
    """Mean loss of each window of CURVE_EVERY steps (the last window may be shorter)."""
    windows = [losses[i : i + CURVE_EVERY] for i in range(0, len(losses), CURVE_EVERY)]
    return [sum(w) / len(w) for w in windows]


def record(config, preset, variant, metrics=None, samples=None, status="ok", error=None) -> dict:
    """A record of one variant (units: qbench/metrics/train.py)."""
    return store.make_record(BENCH, params(config, preset, variant), metrics, samples=samples, status=status,
                             error=error, device=config.device)
