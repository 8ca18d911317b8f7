"""The analysis commands slice tidy records by their fields: `--ratio-to variant=16bit -k exec=graph
-k timing=per_step` is "each variant over nn.Linear, graphed, per shape", -k name=value keeps one whole
parameter, and --target and --spreads judge cells chosen the same way. Read from a committed schema-1 run
(through the migration) and checked against its records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_qbench

from qbench import store
from qbench.analysis import patterns

ROOT = Path(__file__).resolve().parent.parent
RUNS = [ROOT / "results" / "switchback-h200-modes" / f"run{i}" for i in (1, 2, 3)]
GRAPHED = ["-k", "exec=graph", "-k", "timing=per_step"]


def _summary(capsys, *args) -> dict:
    code, out, err = run_qbench(capsys, ["summary", *args, "--json"])
    assert code == 0, err
    return json.loads(out)


def _shape(params: dict) -> tuple:
    return tuple(params[k] for k in ("batch_size", "dim_in", "dim_out"))


def test_ratio_to_16bit_graphed_per_step_is_each_variants_step_over_nn_linears(capsys):
    got = _summary(capsys, RUNS[0], "--metric", "step_ms", "--ratio-to", "variant=16bit", *GRAPHED)
    steps = {(r["params"]["variant"], _shape(r["params"])): r["metrics"]["step_ms"]
             for r in store.read_records(RUNS[0])
             if (r["params"]["exec"], r["params"]["timing"]) == ("graph", "per_step") and "step_ms" in r["metrics"]}
    rows = got["rows"]
    assert {r["params"]["variant"] for r in rows} == {v for v, _ in steps} - {"16bit"}
    assert len(rows) == len(steps) - len({s for _, s in steps})  # every non-16bit record, once
    for row in rows:
        shape = _shape(row["params"])
        assert row["value"] == pytest.approx(steps[row["params"]["variant"], shape] / steps["16bit", shape])
    assert got["fixed"]["exec"] == "graph" and got["fixed"]["timing"] == "per_step"


def test_k_name_value_keeps_that_whole_parameter(capsys):
    got = _summary(capsys, RUNS[0], "--metric", "step_ms", "-k", "variant=fp8", *GRAPHED)
    assert len(got["rows"]) == 18 and got["fixed"]["variant"] == "fp8"  # one record per shape: not fp8_all
    keep = patterns.matcher(["variant=fp8"])
    assert keep("switchback/exec=graph/variant=fp8/wm=4") and keep("switchback/variant=fp8 step_ms")
    assert not keep("switchback/variant=fp8_all/wm=4") and patterns.matcher(["variant=fp8.*"])("s/variant=fp8_all")


def test_target_and_spreads_judge_the_cells_the_fields_pick(capsys):
    got = _summary(capsys, *RUNS, "--metric", "step_over_kernels", *GRAPHED, "-k", "variant=switchback",
                   "--across-runs", "median", "--target", "step_over_kernels:0.95..1.05")
    [target] = got["targets"]
    inside = [r for r in got["rows"] if 0.95 <= float(f"{r['value']:.4g}") <= 1.05]
    assert target["cells"] == len(got["rows"]) == 18 and target["met"] == len(inside)
    code, out, err = run_qbench(capsys, ["summary", *RUNS, *GRAPHED, "--across-runs", "median", "--spreads"])
    assert code == 0 and "step_ms" in out and "largest spread" in out, err
