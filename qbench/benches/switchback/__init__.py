"""`qbench switchback`: int8 SwitchBack layers against the 16-bit linear layer, component by component
(sweep, components, peers), at module level in three execution modes (modules), and as a table."""

from qbench.benches.switchback.sweep import (  # noqa: F401
    BENCH,
    SwitchbackConfig,
    finished,
    measured_id,
    pending,
    plan,
    resolve,
    run,
)
from qbench.benches.switchback.table import table  # noqa: F401
