"""`qbench train-check`: does a small decoder still train with each linear-layer variant? (config: the task,
presets and records; markov: the chain; loop: the training loop; table)."""

from qbench.benches.train_check.config import (  # noqa: F401
    BENCH,
    TRAIN_PRESETS,
    TrainConfig,
    measured_id,
    pending,
    resolve,
)
from qbench.benches.train_check.loop import run  # noqa: F401
from qbench.benches.train_check.table import table  # noqa: F401
