"""`qbench train-check` metrics: one record per variant, a small decoder trained on a Markov chain whose
best achievable loss (its conditional entropy) is known; losses in nats per token. The record's samples
hold `loss_curve`, the mean loss of each window of `curve_every` steps."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric
from qbench.metrics.block import VARIANTS  # noqa: F401  (the same linear layers, trained)

BENCH = "train_check"

METRICS = (
    Metric("final_loss", units.NATS, "mean loss of the last 10% of the steps"),
    Metric("initial_loss", units.NATS, "mean loss of the first curve_every steps"),
    Metric("uniform_loss", units.NATS, "ln(vocab): the loss of a uniform guess"),
    Metric("entropy_floor", units.NATS, "the chain's conditional entropy: the best achievable loss"),
    Metric("gap_to_floor", units.NATS, "final_loss - entropy_floor"),
    Metric("gap_to_reference", units.NATS, "final_loss - the 16bit variant's final_loss (same weights, batches)"),
    Metric("curve_every", units.COUNT, "steps per window of the loss curve sample"),
)
