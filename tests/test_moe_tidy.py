"""moe and grouped_gemm records in tidy form: a CPU run writes only declared metrics, with variant, exec and
timing as params; every committed schema-1 moe run loads through the migration into the same form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qbench import store
from qbench.cli import main
from qbench.metrics import registry as declared
from qbench.migration import grouped as grouped_migration
from qbench.migration import moe as moe_migration
from qbench.migration.registry import migrate

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted(p.parent for p in (ROOT / "results").rglob("results.jsonl")
                   if '"bench": "moe"' in p.read_text() or '"bench": "grouped_gemm"' in p.read_text())
SMALL = ["--device", "cpu", "--model-dim", "16", "--hidden-size", "24", "--samples", "32", "--num-local-experts", "2",
         "--num-steps", "3", "--warmup", "1"]


def assert_tidy(records: list[dict]) -> None:
    """Every record of a measurement: declared metrics with their declared units, no mode, timing or variant
    spelt in a metric name, and exec, variant and timing as params (error records without metrics: exec and
    variant at least)."""
    for r in records:
        bench, params = r["bench"], r["params"]
        assert "system" not in params and {"exec", "variant"} <= set(params), params
        assert params["variant"] in declared.variants()[bench], params
        if r["metrics"]:
            assert params["timing"] in declared.TIMINGS, params
        for name in r["metrics"]:
            assert r["units"][name] == declared.metric(bench, name).unit, (bench, name)
            assert declared.hidden_dimension(bench, name) is None, (bench, name)


def _run(tmp_path, capsys, *args) -> list[dict]:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["moe", *SMALL, "--out", str(out), *args])
    assert exc.value.code == 0, capsys.readouterr().err[-2000:]
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.usefixtures("torch_path")
def test_world_size_1_writes_a_per_step_and_a_loop_record_of_declared_metrics(tmp_path, capsys):
    records = _run(tmp_path, capsys, "--world-size", "1")
    assert_tidy(records)
    assert [(r["params"]["variant"], r["params"]["exec"], r["params"]["timing"], r["status"]) for r in records] == [
        ("a2a", "eager", "per_step", "ok"), ("a2a", "eager", "loop", "ok")]
    step, loop = (r["metrics"] for r in records)
    assert step["step_ms"] > 0 and step["experts_ms"] > 0 and step["host_ms"] > 0 and step["tflops"] > 0
    assert 0 <= step["check_max_rel_error"] < 1e-4  # fp32 on the CPU against the dense reference
    assert set(loop) == {"step_ms", "tflops"} and loop["step_ms"] > 0
    assert {store.measured_id(r, moe_migration.MEASURED_APART) for r in records} == {
        store.measured_id(records[0], moe_migration.MEASURED_APART)}  # one measurement


@pytest.mark.usefixtures("torch_path")
@pytest.mark.dist
def test_world_size_2_over_gloo_adds_one_record_per_rank_for_blocks(tmp_path, capsys):
    records = _run(tmp_path, capsys, "--world-size", "2", "--variant", "a2a,blocks", "--locality", "0.5")
    assert_tidy(records)
    assert all(r["status"] == "ok" and r["params"]["world_size"] == 2 for r in records), records
    where = [(r["params"]["variant"], r["params"]["timing"], r["params"].get("rank")) for r in records]
    assert where == [("a2a", "per_step", None), ("a2a", "loop", None), ("blocks", "per_step", None),
                     ("blocks", "loop", None), ("blocks", "per_step", 0), ("blocks", "per_step", 1)]
    a2a, blocks, rank0 = records[0]["metrics"], records[2]["metrics"], records[4]["metrics"]
    assert a2a["dispatch_ms"] > 0 and a2a["backward_exchange_ms"] > 0  # the layer's backward_a2a phase
    assert blocks["block_count"] >= blocks["remote_block_count"] > 0 and blocks["ag_ms"] > 0
    assert set(rank0) == {"block_count", "remote_block_count", "remote_fraction", "ag_ms", "ga_ms",
                          "backward_ag_ms", "backward_ga_ms"}
    assert len(records[4]["samples"]["ag_ms"]) == 3  # one per timed step, for the seed's AG / GA lines


def test_a_schema_1_record_splits_by_timing_and_rank():
    wide = {"step_time": 2.0, "loop_step_time": 1.5, "loop_tflops": 9.0, "backward_a2a_time": 0.2,
            "host_backward_a2a_ms": 0.01, "sm_clock_mhz_step": 1980.0, "sm_clock_mhz_loop": 1700.0,
            "step_time_instrumented": 2.1, "host_ms_instrumented": 0.4, "blocks_total": 12.0, "blocks_remote": 3.0,
            "blocks_rank1": 12.0, "remote_blocks_rank1": 3.0, "remote_fraction_rank1": 0.25, "ag_fwd_ms_rank1": 0.3}
    samples = {"step_time": [2.0, 2.1], "loop_step_time": [1.5], "ag_time_rank1": [0.3, 0.31]}
    record = store.make_record("moe", {"world_size": 2, "system": "blocks", "exec": "eager"}, device="cuda")
    record.update(schema_version=1, metrics=wide, samples=samples)
    step, loop, rank = migrate(record)
    assert step["params"] == {"world_size": 2, "exec": "eager", "variant": "blocks", "timing": "per_step"}
    assert step["metrics"] == {"step_ms": 2.0, "backward_exchange_ms": 0.2, "host_backward_exchange_ms": 0.01,
                               "sm_clock_mhz": 1980.0, "step_instrumented_ms": 2.1, "host_instrumented_ms": 0.4,
                               "block_count": 12.0, "remote_block_count": 3.0}
    assert loop["params"]["timing"] == "loop" and loop["metrics"] == {"step_ms": 1.5, "tflops": 9.0,
                                                                      "sm_clock_mhz": 1700.0}
    assert (step["samples"], loop["samples"]) == ({"step_ms": [2.0, 2.1]}, {"step_ms": [1.5]})
    assert rank["params"]["rank"] == 1 and rank["metrics"] == {"block_count": 12.0, "remote_block_count": 3.0,
                                                                "remote_fraction": 0.25, "ag_ms": 0.3}
    assert rank["samples"] == {"ag_ms": [0.3, 0.31]} and rank["units"]["ag_ms"] == "ms"
    assert len({r["case"] for r in (step, loop, rank)}) == 3


def test_an_error_record_keeps_one_record_with_tidy_params():
    record = store.make_record("moe", {"world_size": 4, "system": "tutel", "exec": "eager"}, status="error",
                               error="reference check failed")
    record["schema_version"] = 1
    (tidy,) = migrate(record)
    assert tidy["params"] == {"world_size": 4, "exec": "eager", "variant": "tutel"} and tidy["status"] == "error"
    assert tidy["case"] == store.case_id(tidy["params"])


def test_a_schema_1_grouped_record_becomes_one_record_per_kernel():
    wide = {"tma_ms": 1.0, "pointer_ms": 1.5, "dense_ms": 0.8, "tma_tflops": 3.0, "pointer_tflops": 2.0,
            "dense_tflops": 3.7, "speedup_tma": 1.5, "tma_rel_err": 1e-3, "pointer_rel_err": 2e-3,
            "tma_max_abs_err": 0.01, "pointer_max_abs_err": 0.02, "tma_vs_pointer_rel_err": 1e-3,
            "tma_first_call_ms": 900.0, "pointer_first_call_ms": 700.0}
    record = store.make_record("grouped_gemm", {"shape": "a fwd x@w1", "dtype": "bf16"}, device="cuda")
    record.update(schema_version=1, metrics=wide, samples={"tma_ms": [1.0, 1.1]})
    tma, pointer, dense = migrate(record)
    assert_tidy([tma, pointer, dense])
    assert [r["params"]["variant"] for r in (tma, pointer, dense)] == ["tma", "pointer", "dense"]
    assert tma["metrics"]["speedup"] == 1.5 and tma["samples"] == {"kernel_ms": [1.0, 1.1]}
    assert dense["metrics"] == {"kernel_ms": 0.8, "tflops": 3.7}
    assert sum(len(m) for _, m, _ in grouped_migration.tidy({}, wide)) == len(wide)  # every value kept
    with pytest.raises(KeyError, match="tma_gbps"):
        grouped_migration.tidy({}, {"tma_gbps": 1.0})


@pytest.mark.parametrize("run", COMMITTED, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_moe_run_loads_in_tidy_form(run):
    _, records = store.load_run(run)
    moe = [r for r in records if r["bench"] in ("moe", "grouped_gemm")]
    assert moe and all(r["schema_version"] == 2 for r in moe)
    assert_tidy(moe)
    ok = [r for r in moe if r["status"] == "ok"]
    assert all(r["params"]["timing"] in ("per_step", "loop") for r in ok)
    assert any("step_ms" in r["metrics"] for r in ok)


def test_committed_runs_are_found():
    assert len(COMMITTED) >= 10  # every moe reference run under results/


def test_summary_of_an_old_run_by_the_new_names(capsys):
    runs = [str(ROOT / "results/moe-h200x4-hostcut-bb3a09d/dropless" / f"run{i}") for i in (1, 2, 3)]
    with pytest.raises(SystemExit) as exc:
        main(["summary", *runs, "--across-runs", "median", "--metric", "step_ms", "-k", "exec=eager", "--json"])
    printed = capsys.readouterr()
    assert exc.value.code in (0, None), printed.err
    summary = json.loads(printed.out)
    assert summary["fixed"]["exec"] == "eager" and summary["fixed"]["variant"] == "a2a"
    rows = summary["rows"]
    assert {r["metric"] for r in rows} == {"step_ms"} and all(r["unit"] == "ms" and r["value"] > 0 for r in rows)
    assert {r["params"]["timing"] for r in rows} == {"per_step", "loop"}  # old loop_step_time: timing loop
