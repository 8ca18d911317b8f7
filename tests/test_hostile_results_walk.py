"""Every committed run under results/ loads through `qbench summary` and pairs with itself through
`qbench compare`, with no left-out line: the loader's schema accepts every record qbench has written."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench import store
from tests.helpers import run_qbench as qbench

ROOT = Path(__file__).resolve().parent.parent
RUNS = sorted(p.parent for p in (ROOT / "results").rglob(store.RECORDS_FILE))



def test_there_are_committed_runs():
    """The walk finds the reference runs (one or three per family and GPU), so it checks something."""
    assert len(RUNS) >= 20, len(RUNS)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_a_committed_run_loads_and_compares_with_itself(run, capsys):
    """compare prints JSON: the join, ratios and U tests all run, without drawing thousands of table rows."""
    for args in (["summary", run, "--strict"], ["compare", run, run, "--strict", "--json"]):
        code, out, err = qbench(capsys, args)
        if code == 2 and "keep no samples or times; name metrics with --metric" in err:
            code, out, err = qbench(capsys, [*args, "--metric", "*"])  # e.g. a training check's losses
        assert code == 0, f"{args[0]}: {err}"
        assert "error:" not in err and "warning" not in err, err
        assert out.strip()
