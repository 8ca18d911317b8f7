"""qbench.load: one tidy row per record and metric, params as columns; `import qbench` stays free of torch and
pandas; the layers import from one place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
from helpers import timed_record, write_run

import qbench
from qbench import store, units

ROOT = Path(__file__).resolve().parent.parent


def test_one_row_per_record_and_metric_with_params_unit_samples(tmp_path):
    ok = timed_record({"m": 8, "dtype": "fp16"}, [1.0, 2.0, 3.0], tflops=12.5)
    bad = store.make_record("toy", {"m": 16, "dtype": "fp16"}, status="error", error="mismatch")
    run = write_run(tmp_path / "run", [ok, bad], git_commit="a" * 40, time_utc="2026-11-27T00:00:00+00:00")
    frame = qbench.load(run)
    assert len(frame) == 3  # two metrics of the ok record, one row for the error record
    assert list(frame.columns[:6]) == ["run", "gpu", "commit", "time", "bench", "case"]
    assert list(frame.columns[-5:]) == ["metric", "value", "unit", "status", "samples"]
    time = frame[frame.metric == "time"].iloc[0]
    assert (time["m"], time["dtype"], time["value"], time["unit"]) == (8, "fp16", 2.0, units.MS)
    assert time.samples == [1.0, 2.0, 3.0] and time.gpu == "NVIDIA H200" and time.commit == "a" * 40
    assert frame[frame.metric == "tflops"].iloc[0].samples == []
    error = frame[frame.status == "error"].iloc[0]
    assert error["m"] == 16 and pd.isna(error["metric"])


def test_a_param_named_like_a_column_keeps_its_value(tmp_path):
    rec = store.make_record("toy", {"metric": "x", "run": 3}, {"t": 1.0}, units={"t": units.MS})
    frame = qbench.load(write_run(tmp_path / "run", [rec]))
    row = frame.iloc[0]
    assert (row["param.metric"], row["param.run"], row["metric"]) == ("x", 3, "t")


def test_a_parent_folder_loads_every_run_and_files_are_imported(tmp_path, fixtures_dir):
    for name in ("a", "b"):
        write_run(tmp_path / "runs" / name, [timed_record({"m": 8}, [1.0])])
    assert sorted(set(qbench.load(tmp_path / "runs").run)) == [str(tmp_path / "runs" / n) for n in ("a", "b")]
    assert set(qbench.load(fixtures_dir / "tritonbench_output.json").bench) == {"tritonbench"}


def test_import_qbench_loads_neither_torch_nor_pandas_and_layers_are_lazy():
    code = ("import sys, qbench, qbench.cli, qbench.layers\n"
            "assert 'torch' not in sys.modules and 'pandas' not in sys.modules, 'eager import'\n"
            "assert callable(qbench.load) and 'pandas' not in sys.modules\n"
            "from qbench.layers import SwitchBackLinear, FragmentedLinear, MoELayer\n"
            "assert 'torch' in sys.modules\n"
            "print(SwitchBackLinear.__module__, FragmentedLinear.__module__, MoELayer.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["qbench.layers.switchback", "qbench.layers.fragmented", "qbench.layers.moe.layer"]


def test_every_exported_layer_name_exists():
    import importlib

    for name, module in qbench.layers.EXPORTS.items():
        assert hasattr(importlib.import_module(f"qbench.layers.{module}"), name), name


def test_exec_variant_and_timing_are_columns_of_every_frame(tmp_path):
    """They are params of tidy records (qbench.metrics.FIELDS), placed after the record's id; a run whose
    records lack them (an imported bench, a family without variants) still has the columns, empty."""
    tidy_rec = store.make_record("toy", {"m": 8, "exec": "graph", "variant": "16bit", "timing": "loop"},
                                 {"t": 1.0}, units={"t": units.MS})
    plain = store.make_record("toy", {"m": 16}, {"t": 2.0}, units={"t": units.MS})
    frame = qbench.load(write_run(tmp_path / "run", [tidy_rec, plain]))
    assert list(frame.columns[6:10]) == ["exec", "variant", "timing", "m"]
    assert frame.iloc[0][["exec", "variant", "timing"]].tolist() == ["graph", "16bit", "loop"]
    assert frame.iloc[1][["exec", "variant", "timing"]].isna().all()
    assert list(qbench.load([]).columns) == ["run", "gpu", "commit", "time", "bench", "case", "exec", "variant",
                                             "timing", "metric", "value", "unit", "status", "samples"]


def test_a_schema_1_switchback_run_loads_with_its_fields_as_columns():
    """A committed run written before records were tidy: its metric names spelt variant, exec and timing;
    through the migration they are columns, and one (variant, exec, timing) picks one graphed step time."""
    frame = qbench.load(ROOT / "results" / "switchback-h200-modes" / "run1")
    assert {"16bit", "switchback", "fp8"} <= set(frame.variant) and set(frame["exec"]) == {"eager", "compile", "graph"}
    picked = frame[(frame.variant == "16bit") & (frame["exec"] == "graph") & (frame.timing == "per_step")
                   & (frame.metric == "step_ms")]
    assert len(picked) == picked.case.nunique() > 0 and set(picked.unit) == {units.MS}
