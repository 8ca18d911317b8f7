import json
import re
import threading
import warnings
from pathlib import Path

import pytest

from qbench import env, store
from qbench.cli import main
from qbench.errors import QbenchUsageError, QbenchWarning
from tests.helpers import timed_record, write_run

FIXTURES = Path(__file__).parent / "fixtures"


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


def test_corrupt_line_in_the_middle_is_left_out_and_named_or_refused_when_strict(tmp_path):
    run = write_run(tmp_path / "run", _records())
    lines = (run / store.RECORDS_FILE).read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / store.RECORDS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.warns(QbenchWarning, match=r"results.jsonl:2: not valid JSON"):
        _, loaded = store.load_run(run)
    assert [r["case"] for r in loaded] == [r["case"] for i, r in enumerate(_records()) if i != 1]
    with pytest.raises(QbenchUsageError, match=r"results.jsonl:2: not valid JSON"), store.strict_reading():
        store.load_run(run)


def test_refuses_to_overwrite_a_run_unless_append_or_force(tmp_path):
    run = write_run(tmp_path / "run", _records(2))
    with pytest.raises(QbenchUsageError, match="--append"):
        store.RunWriter(run, {})
    with store.RunWriter(run, {"gpu_name": "other"}, append=True) as writer:
        writer.write(_records(3)[2])  # a case the run does not hold yet
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


def test_every_record_names_the_source_it_was_made_by(tmp_path):
    run = write_run(tmp_path / "run", _records(2))
    env_json, loaded = store.load_run(run)
    assert {r["source_hash"] for r in loaded} == {env.own_source_hash()}
    assert re.fullmatch(r"[0-9a-f]{64}", loaded[0]["source_hash"])


def test_autotune_picks_noted_during_the_run_land_in_env_json(tmp_path):
    env.note_autotune("stale", {"M": 1}, {"BLOCK": 8})  # noted before the run: not its pick
    with store.RunWriter(tmp_path / "run", {"gpu_name": "x"}) as writer:
        env.note_autotune("int8_matmul", {"M": 64, "N": 96, "K": 32}, {"BLOCK_M": 32, "num_warps": 4})
        writer.write(_records(1)[0])
    picks = json.loads((tmp_path / "run" / store.ENV_FILE).read_text())["autotune"]
    want = {"kernel": "int8_matmul", "key": {"K": 32, "M": 64, "N": 96}, "config": {"BLOCK_M": 32, "num_warps": 4}}
    assert picks == [want]
    with store.RunWriter(tmp_path / "run", {}, append=True) as writer:  # an appended run adds and replaces picks
        env.note_autotune("int8_matmul", {"M": 64, "N": 96, "K": 32}, {"BLOCK_M": 64, "num_warps": 8})
        env.note_autotune("quantize", {"M": 64}, {"BLOCK": 128})
        writer.write(_records(2)[1])
    picks = json.loads((tmp_path / "run" / store.ENV_FILE).read_text())["autotune"]
    assert [(p["kernel"], p["config"]) for p in picks] == [
        ("int8_matmul", {"BLOCK_M": 64, "num_warps": 8}), ("quantize", {"BLOCK": 128})
    ]


def test_autotune_picks_reach_env_json_with_each_record(tmp_path):
    """Picks are stored as the records that ran with them are written, not only at close(): a run killed
    on the spot (SIGKILL, the OOM killer) still names its kernels' configs."""
    writer = store.RunWriter(tmp_path / "run", {"gpu_name": "x"})

    def kernels():
        return [p["kernel"] for p in json.loads((tmp_path / "run" / store.ENV_FILE).read_text()).get("autotune", [])]

    env.note_autotune("int8_matmul", {"M": 64}, {"BLOCK_M": 32})
    writer.write(_records(1)[0])
    assert kernels() == ["int8_matmul"]
    env.note_autotune("quantize", {"M": 64}, {"BLOCK": 128})
    writer.write(_records(2)[1])
    assert kernels() == ["int8_matmul", "quantize"]
    writer.close()
    assert kernels() == ["int8_matmul", "quantize"]


def test_default_run_names_are_unique_and_sort_by_start_time(tmp_path):
    names = [store.default_run_dir("moe", tmp_path).name for _ in range(200)]  # all within a few microseconds
    assert len(set(names)) == len(names)
    stamps = [re.fullmatch(r"moe-(\d{8}T\d{6}\.\d{6}Z)-[0-9a-f]{4}", n).group(1) for n in names]
    assert stamps == sorted(stamps)


@pytest.mark.parametrize("existing_empty_dir", [False, True])
def test_writers_racing_on_one_path_never_share_it(tmp_path, existing_empty_dir):
    """Eight runs start at once on one --out: exactly one gets it, the others are refused at once (all
    claims happen before any record is written, as when each run measures before its first record)."""
    target = tmp_path / "run"
    if existing_empty_dir:
        target.mkdir()
    start, claimed, outcome = threading.Barrier(8), threading.Barrier(8), {}

    def start_run(i: int) -> None:
        start.wait()
        try:
            writer = store.RunWriter(target, {"writer": i})
        except QbenchUsageError as exc:
            writer, outcome[i] = None, str(exc)
        claimed.wait()
        if writer is not None:
            with writer:
                writer.write(_records(1)[0])
            outcome[i] = "won"

    threads = [threading.Thread(target=start_run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, got in outcome.items() if got == "won"]
    assert len(winners) == 1, outcome
    assert all("not empty" in got for i, got in outcome.items() if i not in winners)
    env_json, loaded = store.load_run(target)
    assert env_json["writer"] == winners[0] and len(loaded) == 1


def test_a_second_run_on_the_same_out_is_refused_before_the_first_writes(tmp_path):
    first = store.RunWriter(tmp_path / "run", {"writer": 1})  # still measuring: no record yet
    with pytest.raises(QbenchUsageError, match="not empty"):
        store.RunWriter(tmp_path / "run", {"writer": 2})
    with first:
        first.write(_records(1)[0])
    env_json, loaded = store.load_run(tmp_path / "run")
    assert env_json["writer"] == 1 and len(loaded) == 1


def test_an_unused_claim_on_an_existing_empty_directory_leaves_it_empty(tmp_path):
    (tmp_path / "run").mkdir()
    store.RunWriter(tmp_path / "run", {}).close()
    assert (tmp_path / "run").is_dir() and not any((tmp_path / "run").iterdir())


def test_append_and_force_together_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(QbenchUsageError, match="only one"):
        store.RunWriter(tmp_path / "run", {}, append=True, force=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(FIXTURES / "seed_deepflow.txt"), "--out", str(tmp_path / "x"), "--append", "--force"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--append" in err
    assert not (tmp_path / "x").exists()


def test_append_refuses_a_run_of_another_bench(tmp_path):
    run = write_run(tmp_path / "run", _records(2))
    before = (run / store.RECORDS_FILE).read_text()
    with pytest.raises(QbenchUsageError, match="holds a toy run, not moe"):
        store.RunWriter(run, {}, append=True, bench="moe")
    with pytest.raises(QbenchUsageError, match="not moe"):  # a writer not told its bench checks each record
        with store.RunWriter(run, {}, append=True) as writer:
            writer.write(store.make_record("moe", {"world_size": 2}, {"step_ms": 1.0}))
    assert (run / store.RECORDS_FILE).read_text() == before


def test_appending_an_existing_case_replaces_it(tmp_path):
    old = _records(3)
    run = write_run(tmp_path / "run", old)
    again = timed_record(old[1]["params"], [5.0, 5.0, 5.0])
    with store.RunWriter(run, {}, append=True, bench="toy") as writer:
        writer.write(again)
    _, loaded = store.load_run(run)
    assert [r["case"] for r in loaded] == [old[0]["case"], old[2]["case"], old[1]["case"]]
    assert loaded[-1]["metrics"]["time"] == 5.0
    assert len((run / store.CSV_FILE).read_text().splitlines()) == 1 + 3


def test_appending_after_a_crash_drops_the_partial_line(tmp_path):
    run = write_run(tmp_path / "run", _records(2))
    with open(run / store.RECORDS_FILE, "a") as fh:
        fh.write('{"schema_version": 1, "bench": "to')  # killed mid-write
    with store.RunWriter(run, {}, append=True) as writer:
        writer.write(_records(3)[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, loaded = store.load_run(run)
    assert len(loaded) == 3


def test_unusable_out_paths_are_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(QbenchUsageError, match="is not a directory"):
        store.RunWriter(tmp_path / "file", {})
    with pytest.raises(QbenchUsageError, match="cannot create run directory"):
        store.RunWriter(tmp_path / "file" / "run", {})


def test_a_run_that_stopped_before_its_first_record_is_named_empty(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / store.ENV_FILE).write_text("{}")
    with pytest.raises(QbenchUsageError, match="empty run"):
        store.load_run(tmp_path / "run")


def test_a_run_without_out_lands_under_the_ignored_runs_folder():
    """A user's runs go to runs/, which .gitignore names, so they never reach results/ (the committed
    reference runs the README indexes) nor dirty a checkout."""
    root = Path(__file__).resolve().parent.parent
    assert store.default_run_dir("switchback").parts[0] == store.RUNS_ROOT == "runs"
    assert f"/{store.RUNS_ROOT}/" in (root / ".gitignore").read_text().splitlines()
