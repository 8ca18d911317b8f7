"""qbench export (pytest-benchmark, Bencher BMF, nvbench) and qbench import of tritonbench and nvbench JSON,
each checked against a file the tool itself wrote or a sample written from its documented schema."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys

import pytest
from helpers import timed_record, write_run

from qbench import importers, store, units
from qbench.cli import main

SAMPLES_MS = [1.0, 1.2, 1.1, 1.3, 0.9]


@pytest.fixture
def run(tmp_path):
    recs = [timed_record({"m": 8, "dtype": "fp16"}, SAMPLES_MS, tflops=50.0),
            timed_record({"m": 16, "dtype": "fp16"}, [2.0, 2.2]),
            store.make_record("toy", {"m": 32, "dtype": "fp16"}, status="error", error="mismatch")]
    return write_run(tmp_path / "run", recs, git_commit="c" * 40, time_utc="2026-11-27T00:00:00+00:00")


def export(run, fmt, tmp_path) -> dict:
    out = tmp_path / f"{fmt}.json"
    with pytest.raises(SystemExit) as exc:
        main(["export", str(run), "--format", fmt, "--out", str(out)])
    assert exc.value.code == 0
    return json.loads(out.read_text())


def test_pytest_benchmark_layout_matches_the_tools_own_file(run, tmp_path, fixtures_dir):
    ours = export(run, "pytest-benchmark", tmp_path)
    theirs = json.loads((fixtures_dir / "pytest_benchmark_sample.json").read_text())
    assert set(ours) == set(theirs)
    assert set(ours["benchmarks"][0]) == set(theirs["benchmarks"][0])
    assert set(ours["benchmarks"][0]["stats"]) == set(theirs["benchmarks"][0]["stats"])
    assert len(ours["benchmarks"]) == 2  # the two ok records' time; tflops is no time, the error is left out
    first = ours["benchmarks"][0]
    stats = first["stats"]
    assert stats["median"] == pytest.approx(1.1e-3) and stats["rounds"] == 5
    assert stats["mean"] == pytest.approx(statistics.fmean(SAMPLES_MS) * 1e-3)
    assert stats["ops"] == pytest.approx(1 / stats["mean"]) and stats["min"] == pytest.approx(0.9e-3)
    assert first["params"] == {"m": 8, "dtype": "fp16"} and ours["commit_info"]["id"] == "c" * 40


@pytest.mark.skipif(shutil.which("pytest-benchmark") is None, reason="pytest-benchmark is not installed")
def test_pytest_benchmark_itself_reads_the_export(run, tmp_path):
    export(run, "pytest-benchmark", tmp_path)
    shown = subprocess.run(["pytest-benchmark", "compare", str(tmp_path / "pytest-benchmark.json")], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert "time[dtype=fp16/m=8]" in shown and "1,100.0000" in shown  # its median, in microseconds


def test_bmf_is_benchmark_measure_value_with_bounds(run, tmp_path):
    bmf = export(run, "bmf", tmp_path)
    assert set(bmf) == {"toy/dtype=fp16/m=8", "toy/dtype=fp16/m=16"}
    time = bmf["toy/dtype=fp16/m=8"]["time"]
    assert time["value"] == pytest.approx(1.1) and time["lower_value"] <= 1.1 <= time["upper_value"]
    assert bmf["toy/dtype=fp16/m=8"]["tflops"] == {"value": 50.0}  # no samples: no bounds
    for measures in bmf.values():
        for measure in measures.values():
            assert set(measure) <= {"value", "lower_value", "upper_value"}


def test_nvbench_export_reads_back_through_the_nvbench_importer(run, tmp_path):
    document = export(run, "nvbench", tmp_path)
    assert document["meta"]["version"]["json"]["string"] == "1.0.0"
    (bench,) = document["benchmarks"]
    assert bench["name"] == "toy/time" and [a["name"] for a in bench["axes"]] == ["m", "dtype"]
    env, records = importers.read_file(tmp_path / "nvbench.json")
    assert env["source"] == "nvbench" and env["gpu_name"] == "NVIDIA H200"
    by_m = {r["params"]["m"]: r for r in records}
    assert by_m[8]["metrics"]["gpu_time_ms"] == pytest.approx(statistics.fmean(SAMPLES_MS))
    assert by_m[8]["metrics"]["qbench_time_stored"] == pytest.approx(1.1e-3)
    assert by_m[8]["params"] == {"benchmark": "toy/time", "m": 8, "dtype": "fp16"}


def test_nvbench_sample_imports_each_measured_state(fixtures_dir):
    env, records = importers.read_file(fixtures_dir / "nvbench_output.json")
    assert importers.detect_format((fixtures_dir / "nvbench_output.json").read_text()) == "nvbench"
    assert env["gpu_name"] == "NVIDIA H100 80GB HBM3" and len(records) == 2  # the skipped state is left out
    first = records[0]
    assert first["params"] == {"benchmark": "copy", "T": "F32", "Elements": 1048576}
    assert first["metrics"]["gpu_time_ms"] == pytest.approx(5.9375e-3)
    assert first["metrics"]["global_memory_gbps"] == pytest.approx(1412.8)
    assert first["units"]["gpu_time_ms"] == units.MS and first["metrics"]["samples"] == 8432


def test_tritonbench_sample_imports_per_input_and_backend(fixtures_dir):
    path = fixtures_dir / "tritonbench_output.json"
    assert importers.detect_format(path.read_text()) == "tritonbench"
    env, records = importers.read_file(path)
    assert len(records) == 4  # two inputs x two backends; the -avg and -pass aggregates are not records
    found = {(r["params"]["x_val"], r["params"]["backend"]): r for r in records}
    tutorial = found[("(4096, 4096, 4096)", "triton_tutorial_matmul")]
    assert tutorial["metrics"] == {"latency": 0.2210, "tflops": 621.9, "speedup": 0.899}  # "0.2210 (±1.3%)" read
    assert tutorial["units"]["latency"] == units.MS and tutorial["units"]["tflops"] == units.TFLOPS
    assert tutorial["params"]["op"] == "gemm_fwd"


def test_imported_tritonbench_runs_compare(tmp_path, fixtures_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(fixtures_dir / "tritonbench_output.json"), str(fixtures_dir / "tritonbench_output.json"),
              "--metric", "latency", "--json"])
    assert exc.value.code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 4 and {r["marker"] for r in rows} == {"="}


def test_malformed_files_are_one_line_usage_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"benchmarks": [{"states": [{"axis_values": [], "summaries": {}}]}]}')
    code = subprocess.run([sys.executable, "-m", "qbench", "import", str(bad), "--format", "nvbench"],
                          capture_output=True, text=True)
    assert code.returncode == 2 and "older than file version 1.0" in code.stderr
    assert len(code.stderr.strip().splitlines()) == 1


def test_export_takes_one_run(tmp_path, capsys):
    for name in ("a", "b"):
        write_run(tmp_path / "runs" / name, [timed_record({"m": 8}, [1.0, 1.1])])
    with pytest.raises(SystemExit) as exc:
        main(["export", str(tmp_path / "runs"), "--format", "bmf"])
    assert exc.value.code == 2 and "holds 2 runs" in capsys.readouterr().err
