"""fragmented, block, train_check and model in tidy form: CPU runs of `qbench fragmented`, `qbench block` and
`qbench train-check` write only declared metrics, with variant and exec as params and no metric name that
spells one; every committed run of these families loads in the new form (qbench/migration)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from qbench import store
from qbench.cli import main
from qbench.metrics import registry as metrics
from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("fragmented", "block", "train_check", "model")
OLD_PARAMS = ("layer", "mode", "model")  # what fragmented, block and train_check called them before
COMMANDS = {
    "fragmented": ["fragmented", "--sizes", "64", "--batch-sizes", "2", "--fragments", "2", "--steps", "1",
                   "--warmup", "0"],
    "block": ["block", "--preset", "tiny", "--batch-sizes", "2", "--layers", "1", "--steps", "1",
              "--variants", "16bit,switchback"],
    "train_check": ["train-check", "--preset", "lm-tiny", "--steps", "10", "--layers", "1",
                    "--variants", "16bit,fp8"],
}


def assert_tidy(record: dict) -> None:
    bench, params = record["bench"], record["params"]
    metrics.check(bench, record["metrics"])  # UndeclaredMetric names the first undeclared one
    hidden = {name: word for name in record["metrics"] if (word := metrics.hidden_dimension(bench, name))}
    assert not hidden, f"{record['case']}: metric names spelling a mode or variant: {hidden}"
    assert record["units"] == metrics.units_of(bench, record["metrics"])
    assert not [k for k in OLD_PARAMS if k in params], params


@pytest.mark.parametrize("bench", list(COMMANDS))
def test_a_cpu_run_writes_declared_metrics_with_variant_and_exec(bench, tmp_path):
    """The command as a CPU user runs it (the layers' torch path): its records are under test here."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "qbench", *COMMANDS[bench], "--device", "cpu", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=env_without_interpreter(PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    _, records = store.load_run(out)
    assert records and {r["bench"] for r in records} == {bench}
    for rec in records:
        assert rec["status"] == "ok", rec["error"]
        assert rec["params"]["variant"] in metrics.variants()[bench] and rec["params"]["exec"] == "eager"
        assert_tidy(rec)


def committed_runs() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "results").rglob(store.RECORDS_FILE))


def test_every_committed_run_of_these_families_loads_tidy():
    seen = set()
    for run in committed_runs():
        for rec in store.load_run(run)[1]:
            if rec["bench"] in ("switchback_model", "switchback_train"):
                pytest.fail(f"{run}: bench {rec['bench']} not migrated")
            if rec["bench"] in FAMILIES:
                seen.add(rec["bench"])
                assert_tidy(rec)
    assert seen == set(FAMILIES)  # the walk found a run of each


def test_old_names_migrate_to_the_vocabulary():
    """One committed record of each renamed family, before and after: params and metrics renamed, values kept."""
    import json

    from qbench.migration.registry import migrate

    def first(path: str) -> dict:
        return json.loads((ROOT / "results" / path / store.RECORDS_FILE).read_text().splitlines()[0])

    old = first("fragmented-h100")
    (new,) = migrate(old)
    assert (old["params"]["layer"], new["params"]["variant"]) == ("linear", "dense")
    assert new["params"]["task"] == old["params"]["mode"] and new["case"] == store.case_id(new["params"])
    assert new["metrics"]["forward_replay_ms"] == old["metrics"]["forward_graph_ms"]
    assert new["samples"]["forward_replay_ms"] == old["samples"]["forward_graph_ms"]
    old = [json.loads(line) for line in (ROOT / "results/switchback-h100-vit-h" / store.RECORDS_FILE).open()][1]
    (new,) = migrate(old)
    assert (new["bench"], new["params"]["preset"]) == ("block", old["params"]["model"])
    assert new["metrics"]["step_speedup"] == old["metrics"]["speedup_step"]
    assert new["metrics"]["sm_clock_mhz"] == old["metrics"]["sm_clock_mhz_step"]
    train_check = ROOT / "results/switchback-h200-model/train-check" / store.RECORDS_FILE
    old = [json.loads(line) for line in train_check.open()][1]
    (new,) = migrate(old)
    assert (new["bench"], new["params"]["exec"]) == ("train_check", "eager")
    assert new["metrics"]["gap_to_reference"] == old["metrics"]["gap_to_16bit"]


def test_a_fragmented_run_in_the_earlier_form_pairs_with_one_made_today(tmp_path, capsys):
    """The same CPU run written back in the schema-1 form (params layer with linear for dense, mode) reads in the
    tidy form, so `qbench compare OLD NEW` pairs every case and metric of the two."""
    import json

    new = tmp_path / "new"
    with pytest.raises(SystemExit) as exc:
        main([*COMMANDS["fragmented"], "--tasks", "train", "--device", "cpu", "--out", str(new)])
    assert exc.value.code == 0, capsys.readouterr().err
    capsys.readouterr()
    old = tmp_path / "old"
    old.mkdir()
    (old / "env.json").write_text((new / "env.json").read_text())
    lines = []
    for line in (new / store.RECORDS_FILE).read_text().splitlines():
        rec = json.loads(line)
        p = rec["params"]
        variant = p.pop("variant")
        p["layer"], p["mode"] = {"dense": "linear"}.get(variant, variant), p.pop("task")
        rec.update(schema_version=1, bench="fragmented", case=store.case_id(p))
        lines.append(json.dumps(rec))
    (old / store.RECORDS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(old), str(new), "--json"])
    out, err = capsys.readouterr()
    assert exc.value.code in (0, 1), err
    rows = json.loads(out)["rows"]
    cells = {(r["case"], m) for r in store.load_run(new)[1] for m in r["metrics"]}
    assert {(r["case"], r["metric"]) for r in rows} == cells
    assert all(r["reference_value"] == r["candidate_value"] for r in rows)
