"""`qbench block`: a training step of a transformer block stack per linear-layer variant, in each execution
mode (config: presets, the sweep and its records; steps: the step in each exec; sweep: check and time; table)."""

from qbench.benches.block.config import (  # noqa: F401
    BENCH,
    PRESETS,
    VARIANTS,
    BlockConfig,
    Case,
    measured_id,
    pending,
    plan,
    resolve,
)
from qbench.benches.block.sweep import run  # noqa: F401
from qbench.benches.block.table import table  # noqa: F401
