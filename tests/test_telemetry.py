"""NVML readings through fakes of its calls (the logic, not timings): throttle reasons OR-ed over a timing's
rounds into throttle_reasons_<what>, nothing without nvidia-ml-py, the run's one warning when clocks moved and
samples spread, and `summary --spreads` naming the power-capped cells."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import write_run

from qbench import store, telemetry, units
from qbench.cli import main

REAL_READ_REASONS = telemetry.read_reasons


@pytest.fixture
def fake_nvml(monkeypatch):
    """A GPU whose NVML answers from lists: clock, power and reasons per reading."""
    state = {"clock": [1980.0, 1755.0, 1600.0], "power": [650.0, 700.0, 700.0], "reasons": [0x0, 0x4, 0x80]}
    monkeypatch.setattr(telemetry, "_readable", lambda: True)
    monkeypatch.setattr(telemetry, "read_clock_mhz", lambda: state["clock"].pop(0))
    monkeypatch.setattr(telemetry, "read_power_w", lambda: state["power"].pop(0))
    monkeypatch.setattr(telemetry, "read_reasons", lambda: state["reasons"].pop(0))
    return state


def test_reasons_of_every_round_are_or_ed_beside_the_clock_and_power(fake_nvml):
    readings = telemetry.GpuReadings("cuda")
    for _ in range(3):
        readings()
    got = readings.metrics("step")
    assert got == {"sm_clock_mhz_step": 1755.0, "power_w_step": 700.0, "throttle_reasons_step": 0x84}
    assert telemetry.reason_names(got["throttle_reasons_step"]) == ["sw_power_cap", "hw_power_brake_slowdown"]
    from qbench.metrics.common import TELEMETRY

    assert {m.name: m.unit for m in TELEMETRY}["throttle_reasons"] == units.FLAG  # informative: no verdict


def test_without_nvidia_ml_py_no_reasons_are_recorded(fake_nvml, monkeypatch):
    monkeypatch.setattr(telemetry, "read_reasons", REAL_READ_REASONS)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    readings = telemetry.GpuReadings("cuda")
    readings()
    assert set(readings.metrics("step")) == {"sm_clock_mhz_step", "power_w_step"}


def test_no_gpu_no_readings():
    readings = telemetry.GpuReadings("cpu")
    readings()
    assert readings.metrics("step") == {}


def _record(case_m: int, clock: float, samples: list[float], reasons: int | None = None) -> dict:
    metrics = {"time": sorted(samples)[len(samples) // 2], "sm_clock_mhz_step": clock}
    if reasons is not None:
        metrics["throttle_reasons_step"] = reasons
    return store.make_record("toy", {"m": case_m}, metrics, units={"time": units.MS}, samples={"time": samples})


STEADY = [1.0, 1.01, 0.99, 1.0, 1.005, 0.995]
NOISY = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1]


def test_the_warning_needs_both_moving_clocks_and_wide_samples():
    assert telemetry.stability_warning([_record(8, 1980, NOISY), _record(16, 1980, NOISY)]) is None  # locked
    assert telemetry.stability_warning([_record(8, 1980, STEADY), _record(16, 1600, STEADY)]) is None  # quiet
    assert telemetry.stability_warning([_record(8, 1980, NOISY)]) is None
    text = telemetry.stability_warning([_record(8, 1980, NOISY), _record(16, 1600, STEADY, reasons=0x4)])
    assert "1600-1980 MHz" in text and "1 records ran power-capped" in text and "m=8" in text


def test_summary_spreads_names_power_capped_cells(tmp_path, capsys):
    runs = []
    for i in range(2):
        slower = [x * (1 + i / 10) for x in STEADY]
        recs = [_record(8, 1980, STEADY), _record(16, 1700, slower, reasons=0x4 if i else 0)]
        runs.append(str(write_run(tmp_path / f"run{i}", recs)))
    with pytest.raises(SystemExit) as exc:
        main(["summary", *runs, "--across-runs", "median", "--spreads", "--json"])
    assert exc.value.code == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 1 and "1 cells: m=16 (step in " in notes[0] and "run1" in notes[0] and "run0" not in notes[0]


def test_a_run_prints_the_warning_once(tmp_path, capsys):
    from qbench import report
    from qbench.runner import run_and_store

    records = [_record(8, 1980, NOISY), _record(16, 1600, NOISY), _record(32, 1700, NOISY)]
    run_and_store("toy", None, records, total=3, out=str(tmp_path / "run"), append=False, force=False,
                  as_json=False, table=lambda recs: report.records_table(recs, ["m"], ["time"]))
    err = capsys.readouterr().err
    assert err.count("clocks not locked") == 1 and "1600-1980 MHz" in err


def test_moe_records_the_throttle_reasons_of_its_timings():
    """The MoE bench's telemetry (one rank here, no process group: the reductions are the identity) keeps the
    reasons its readings saw beside the clock and power, and leaves them out where NVML gave none."""
    from qbench.benches.moe.steps import _telemetry
    from qbench.telemetry import GpuReadings

    readings = GpuReadings("cpu")
    readings.clock_mhz, readings.power_w, readings.reasons = [1755.0, 1980.0], [600.0, 650.0], 0x4 | 0x1
    out = _telemetry(readings, "loop")
    assert out["throttle_reasons_loop"] == [5.0] and telemetry.reason_names(out["throttle_reasons_loop"][0])
    readings.reasons = None
    without = _telemetry(readings, "loop")
    assert "throttle_reasons_loop" not in without and "power_w_loop" in without
