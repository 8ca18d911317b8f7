"""Records of schema 1 load in today's tidy form (qbench/migration), their units are today's declarations
(qbench.metrics.registry.declared_units), and a record that cannot be migrated is one line naming its file and line."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_qbench, write_run

from qbench import record_schema, store, units
from qbench.metrics import FIELDS
from qbench.metrics.registry import declared
from qbench.migration.registry import migrate

ROOT = Path(__file__).resolve().parent.parent
OLD_SWITCHBACK = ROOT / "results" / "switchback-h200-modes" / "run1" / store.RECORDS_FILE  # schema 1


def _old_lines(count: int) -> list[dict]:
    return [json.loads(line) for line in OLD_SWITCHBACK.read_text().splitlines()[:count]]


def test_a_schema_1_switchback_record_becomes_tidy_records_of_declared_metrics():
    old = _old_lines(1)[0]
    assert old["schema_version"] == 1 and "time_global" in old["metrics"]
    records, problems = record_schema.parse_lines(json.dumps(old) + "\n", "f.jsonl", migrate)
    assert problems == [] and len(records) > 10
    switchback = declared()["switchback"]
    for rec in records:
        assert rec["schema_version"] == record_schema.SCHEMA_VERSION and rec["bench"] == "switchback"
        assert {"variant", "exec", "timing"} <= set(rec["params"]), rec["params"]
        assert rec["case"] == store.case_id(rec["params"])
        assert rec["units"] == {m: switchback[m].unit for m in rec["metrics"]}, rec["case"]


def test_a_record_that_does_not_migrate_is_one_line_naming_file_and_line(tmp_path, capsys):
    good, bad = _old_lines(2)
    bad["metrics"]["bogus_wide_key"] = 1.0  # no tidy place in qbench/migration/switchback.py
    text = json.dumps(good) + "\n" + json.dumps(bad) + "\n"
    records, problems = record_schema.parse_lines(text, "run/results.jsonl", migrate)
    assert {store.measured_id(r, FIELDS) for r in records} == {store.case_id(good["params"])}
    assert problems == ["run/results.jsonl:2: the switchback record of schema 1 does not migrate: switchback: "
                        "no tidy place for the wide key 'bogus_wide_key' (qbench/migration/switchback.py)"]
    run = tmp_path / "run"
    run.mkdir()
    (run / store.RECORDS_FILE).write_text(json.dumps(bad) + "\n")
    code, out, err = run_qbench(capsys, ["summary", run])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"{run / store.RECORDS_FILE}:1:" in err and "bogus_wide_key" in err


def test_a_family_record_reads_with_its_declared_units_and_others_keep_theirs(tmp_path):
    """A unit stored beside a declared metric is replaced by the declaration (its direction is the family's);
    a record of an imported bench keeps what it stored, and a name nobody declared has no unit, never ms."""
    family = {"schema_version": 2, "bench": "switchback", "params": {"m": 1, "variant": "16bit", "exec": "eager",
              "timing": "per_step"}, "metrics": {"step_ms": 1.0}, "units": {"step_ms": units.S}}
    foreign = store.make_record("tritonbench", {"x": 1}, {"latency": 2.0, "odd_ms_name": 3.0},
                                units={"latency": units.MS})
    run = tmp_path / "run"
    run.mkdir()
    (run / store.RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in (family, foreign)))
    first, second = store.read_records(run)
    assert first["units"] == {"step_ms": declared()["switchback"]["step_ms"].unit} == {"step_ms": units.MS}
    assert second["units"] == {"latency": units.MS}


def test_a_run_in_todays_schema_loads_unchanged(tmp_path):
    rec = store.make_record("switchback", {"m": 2, "variant": "fp8", "exec": "graph", "timing": "loop"},
                            {"step_ms": 0.5})
    [loaded] = store.read_records(write_run(tmp_path / "run", [rec]))
    assert {k: loaded[k] for k in rec} == rec
