import json
import warnings

import pytest

from qbench import store
from qbench.errors import QbenchUsageError
from tests.helpers import timed_record, write_run


def _records(n=3):
    return [
        timed_record({"m": 8 * (i + 1), "dtype": "fp16"}, [1.0 + i, 1.1 + i, 0.9 + i], tflops=10.0 * i)
        for i in range(n)
    ]


def test_round_trip_keeps_every_field(tmp_path):
    records = _records()
    run = write_run(tmp_path / "run", records)
    env, loaded = store.load_run(run)
    assert loaded == records
    assert env["gpu_name"] == "NVIDIA H200"
    assert all(r["schema_version"] == store.SCHEMA_VERSION for r in loaded)
    csv_text = (run / store.CSV_FILE).read_text().splitlines()
    assert csv_text[0].split(",")[:3] == ["bench", "case", "status"]
    assert len(csv_text) == 1 + len(records)


def test_case_id_is_stable_and_order_free():
    assert store.case_id({"b": 2, "a": 1.0}) == store.case_id({"a": 1, "b": 2}) == "a=1/b=2"


def test_crash_truncated_last_line_is_skipped_with_warning(tmp_path):
    run = write_run(tmp_path / "run", _records())
    with open(run / store.RECORDS_FILE, "a") as fh:
        fh.write('{"schema_version": 1, "bench": "toy", "metr')  # killed mid-write
    with pytest.warns(UserWarning, match="partial last line"):
        _, loaded = store.load_run(run)
    assert len(loaded) == 3


def test_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    run = write_run(tmp_path / "run", _records())
    lines = (run / store.RECORDS_FILE).read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / store.RECORDS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(QbenchUsageError, match="line 2"):
        store.load_run(run)


def test_refuses_to_overwrite_a_run_unless_append_or_force(tmp_path):
    run = write_run(tmp_path / "run", _records(2))
    with pytest.raises(QbenchUsageError, match="--append"):
        store.RunWriter(run, {})
    with store.RunWriter(run, {"gpu_name": "other"}, append=True) as writer:
        writer.write(_records(1)[0])
    env, loaded = store.load_run(run)
    assert len(loaded) == 3 and env["gpu_name"] == "NVIDIA H200"  # append keeps the first env
    with store.RunWriter(run, {"gpu_name": "new"}, force=True) as writer:
        writer.write(_records(1)[0])
    env, loaded = store.load_run(run)
    assert len(loaded) == 1 and env["gpu_name"] == "new"


def test_records_reach_disk_before_close(tmp_path):
    writer = store.RunWriter(tmp_path / "run", {})
    writer.write(_records(1)[0])
    text = (tmp_path / "run" / store.RECORDS_FILE).read_text()
    assert json.loads(text)["bench"] == "toy"
    writer.close()


def test_missing_path_and_non_run_are_clear_errors(tmp_path):
    with pytest.raises(QbenchUsageError, match="does not exist"):
        store.load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(QbenchUsageError, match="not a qbench run"):
        store.load_run(tmp_path / "empty")
    with pytest.raises(QbenchUsageError, match="holds no qbench runs"):
        store.find_runs(tmp_path / "empty")


def test_load_frame_from_a_parent_folder_of_runs(tmp_path):
    write_run(tmp_path / "a", _records(2))
    write_run(tmp_path / "b", _records(3))
    frame = store.load_frame(tmp_path)
    assert len(frame) == 5
    assert set(frame["run"]) == {str(tmp_path / "a"), str(tmp_path / "b")}
    assert "param.m" in frame.columns and "time" in frame.columns


def test_non_finite_metrics_are_stored_as_null(tmp_path):
    rec = store.make_record("toy", {"m": 1}, {"time": float("nan")})
    run = write_run(tmp_path / "run", [rec])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, loaded = store.load_run(run)
    assert loaded[0]["metrics"]["time"] is None


def test_bad_status_is_rejected():
    with pytest.raises(ValueError):
        store.make_record("toy", {}, {}, status="fine")


def test_no_directory_is_created_until_the_first_record(tmp_path):
    writer = store.RunWriter(tmp_path / "run", {})
    writer.close()  # e.g. the bench rejected its input before measuring anything
    assert not (tmp_path / "run").exists()
