"""`qbench compare OLD NEW` pairs a run written before records were tidy (schema 1, metric names spelling
variant, exec and timing) with one written today (schema 2): through the migration both sides hold the same
(case, metric) cells, so every value finds its counterpart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_qbench, write_run

from qbench import store
from tests.test_switchback_cli import _env

ROOT = Path(__file__).resolve().parent.parent
# `qbench switchback --pairs 32x64 --batch-sizes 16 --repeat 1 --device cpu` run by the code of 3dac7c0
# (schema 1: one wide record of 74 metrics)
OLD_CPU = ROOT / "tests" / "fixtures" / "switchback_cpu_schema1_3dac7c0"
OLD_H200 = ROOT / "results" / "switchback-h200-modes" / "run1"  # schema 1, committed


def _cells(run) -> set[tuple[str, str]]:
    return {(rec["case"], metric) for rec in store.read_records(run) for metric in rec["metrics"]}


def _compared(capsys, old, new) -> list[dict]:
    code, out, err = run_qbench(capsys, ["compare", old, new, "--json"])
    assert code == 0, err
    return json.loads(out)["rows"]


def test_the_fixture_is_a_schema_1_run():
    line = json.loads((OLD_CPU / store.RECORDS_FILE).read_text().splitlines()[0])
    assert line["schema_version"] == 1 and "time_global" in line["metrics"] and "variant" not in line["params"]


@pytest.mark.slow
def test_an_old_cpu_run_pairs_with_one_made_today(tmp_path, capsys):
    new = tmp_path / "new"
    res = subprocess.run([sys.executable, "-m", "qbench", "switchback", "--pairs", "32x64", "--batch-sizes", "16",
                          "--repeat", "1", "--device", "cpu", "--out", str(new)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=_env())
    assert res.returncode == 0, res.stderr
    old_cells, new_cells = _cells(OLD_CPU), _cells(new)
    assert old_cells == new_cells, (sorted(old_cells - new_cells)[:5], sorted(new_cells - old_cells)[:5])
    rows = _compared(capsys, OLD_CPU, new)
    assert {(r["case"], r["metric"]) for r in rows} == old_cells
    assert all(r["reference_value"] is not None and r["candidate_value"] is not None for r in rows)
    assert {r["case"].split("variant=")[1].split("/")[0] for r in rows} >= {"16bit", "switchback"}


def test_a_committed_old_run_pairs_with_its_records_written_today(tmp_path, capsys):
    """The H200 run's records, read through the migration and written by today's writer: the same cells,
    each the same value (ratio 1, '=')."""
    env, records = store.load_run(OLD_H200)
    new = write_run(tmp_path / "new", records, gpu=env["gpu_name"])
    assert {json.loads(line)["schema_version"] for line in (new / store.RECORDS_FILE).read_text().splitlines()} == {
        store.SCHEMA_VERSION}
    rows = _compared(capsys, OLD_H200, new)
    assert {(r["case"], r["metric"]) for r in rows} == _cells(OLD_H200)
    assert {r["marker"] for r in rows if r["unit"] not in ("count", "flag")} == {"="}
    assert all(r["ratio"] == 1.0 for r in rows if r["reference_value"])
