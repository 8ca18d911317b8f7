"""`qbench fragmented`: FragmentedLinear against dense and structured baselines (config: the sweep;
gate: correctness; steps: timing in each execution mode; cost: flops, bytes, units; sweep: records;
seed: the original report layout)."""

from qbench.benches.fragmented.config import (  # noqa: F401
    BASELINES,
    BENCH,
    TASKS,
    VARIANTS,
    Case,
    FragmentedConfig,
    measured_id,
    pending,
    plan,
    resolve,
)
from qbench.benches.fragmented.cost import forward_cost  # noqa: F401
from qbench.benches.fragmented.gate import TIE_GAP, gate  # noqa: F401
from qbench.benches.fragmented.seed import format_seed  # noqa: F401
from qbench.benches.fragmented.sweep import build, measure, run  # noqa: F401
from qbench.benches.fragmented.table import seed_report, table  # noqa: F401
