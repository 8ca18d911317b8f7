"""The training loop of `qbench train-check` (see config.py for the task and metrics)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from qbench.benches.train_check import config as train

CHECK_EVERY = train.CURVE_EVERY  # the host reads the losses (and looks for non-finite ones) this often


@dataclass
class Task:
    floor: float  # the chain's conditional entropy, nats per token
    tokens: Any  # int64 [steps, batch, seq + 1] on the device: every variant's batches, in order
    state: dict  # the 16-bit TinyLM's seeded initial weights (host copies)
    make: Any  # variant -> a fresh TinyLM on the device

    @classmethod
    def build(cls, preset, config) -> Task:
        import torch

        from qbench.benches.train_check import markov
        from qbench.dtypes import torch_dtype
        from qbench.layers.transformer import StackShape, TinyLM

        P = markov.transition_matrix(preset.vocab, preset.support, config.seed)
        pi = markov.stationary(P)
        seqs = markov.sample(P, pi, preset.steps * preset.batch_size, preset.seq + 1, config.seed + 1)
        tokens = seqs.reshape(preset.steps, preset.batch_size, preset.seq + 1).to(config.device)
        shape = StackShape(width=preset.width, mlp=preset.mlp, heads=preset.heads, layers=preset.layers, causal=True)

        def make(variant):
            return TinyLM(vocab=preset.vocab, seq=preset.seq, shape=shape, variant=variant, device=config.device,
                          dtype=torch_dtype(config.dtype))

        torch.manual_seed(config.seed)
        state = {k: v.detach().cpu().clone() for k, v in make("16bit").state_dict().items()}
        return cls(markov.entropy_rate(P, pi), tokens, state, make)


def schedule(steps: int):
    """lr multiplier per step: linear warm-up over 5% of the steps, then cosine decay to 0.1."""
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


def _optimizer(model, preset, device: str):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), fused=(device == "cuda") or None)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule(preset.steps))


def losses_of(task: Task, preset, config, variant: str) -> tuple[list[float], int | None]:
    """(loss per step, the first step whose loss is not finite or None). Stops at divergence."""
    import torch
    import torch.nn.functional as F

    from qbench.layers.transformer import build

    model = build(task.make, variant, task.state)
    opt, sched = _optimizer(model, preset, config.device)
    window, losses = [], []
    for step in range(preset.steps):
        batch = task.tokens[step]
        logits = model(batch[:, :-1])  # [B, seq, vocab]
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        (loss * batch[:, 1:].numel()).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.detach())
        if len(window) == CHECK_EVERY or step == preset.steps - 1:
            losses += torch.stack(window).tolist()  # one host read per window
            window = []
            bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
            if bad:
                return losses[: bad[0] + 1], bad[0]
    return losses, None


def measure(task: Task, preset, config, variant: str, reference_loss: float | None = None) -> dict:
    """The record of one variant; with the 16bit variant's final loss (16bit: its own), its gap_to_reference too."""
    from qbench.layers.transformer import unavailable

    reason = unavailable(variant, config.device)
    if reason:
        return train.record(config, preset, variant, status="skipped", error=reason)
    losses, diverged = losses_of(task, preset, config, variant)
    samples = {"loss_curve": train.curve([v if math.isfinite(v) else float("nan") for v in losses])}
    if diverged is not None:
        return train.record(config, preset, variant, samples=_finite(samples), status="error",
                            error=f"diverged: non-finite loss at step {diverged}")
    metrics = train.summary(losses, task.floor, preset.vocab)
    if variant == "16bit":
        reference_loss = metrics["final_loss"]
    if reference_loss is not None:
        metrics["gap_to_reference"] = metrics["final_loss"] - reference_loss
    return train.record(config, preset, variant, metrics, samples)


def _finite(samples: dict) -> dict:
    """JSON has no NaN: a window holding the non-finite loss is left out (the error names its step)."""
    return {k: [v for v in vals if math.isfinite(v)] for k, vals in samples.items()}


def run(config, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """One record per variant of a resolved config, 16bit (the reference of every gap) first."""
    preset = config.sizes
    task = Task.build(preset, config)
    reference = None
    for variant in config.variants:
        rec = measure(task, preset, config, variant, reference)
        if variant == "16bit" and rec["status"] == "ok":
            reference = rec["metrics"]["final_loss"]
        yield rec
