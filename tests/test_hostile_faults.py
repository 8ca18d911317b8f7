"""Faults of processes and run directories: a launcher killed with SIGKILL takes its ranks with it; a run
killed before its first record can be rerun with the same --out or finished with --resume; a read-only run
is named as such; figures of a run go beside the runs, not into it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench import store
from tests.helpers import run_qbench as qbench

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ("from qbench import dist; import hostile_ranks, sys; list(dist.launch(hostile_ranks.note_pid_and_wait, "
          "(sys.argv[1],), world_size=2, backend='gloo', device='cpu', timeout_s=600))")


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.dist
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the ranks")
def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path)], env=env, cwd=ROOT)
    try:
        pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
        assert _wait(lambda: all(f.exists() and f.read_text() for f in pid_files), 120), "the ranks never started"
        ranks = [int(f.read_text()) for f in pid_files]
        assert all(_alive(pid) for pid in ranks)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        assert _wait(lambda: not any(_alive(pid) for pid in ranks), 10), "ranks outlived their launcher"
    finally:
        launcher.kill()
        for f in tmp_path.glob("rank*.pid"):
            if f.read_text() and _alive(int(f.read_text())):
                os.kill(int(f.read_text()), signal.SIGKILL)


def test_die_with_parent_ends_a_process_whose_launcher_is_gone():
    """A rank that starts after its launcher already died (the race before the signal is armed) exits."""
    code = "import os; from qbench import dist; dist.die_with_parent(os.getppid() + 10**6); print('survived')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "survived" not in done.stdout



def _killed_before_first_record(path: Path) -> Path:
    """What a run killed between claiming its directory and its first record leaves: env.json alone."""
    path.mkdir()
    (path / store.ENV_FILE).write_text(json.dumps({"gpu_name": None}), encoding="utf-8")
    return path


RECORD = store.make_record("toy", {"m": 1}, {"time": 1.0}, units={"time": "ms"})


def test_a_run_killed_before_its_first_record_can_be_rerun_with_the_same_out(tmp_path):
    run = _killed_before_first_record(tmp_path / "run")
    with store.RunWriter(run, {"gpu_name": "new"}) as writer:
        writer.write(RECORD)
    env, records = store.load_run(run)
    assert env["gpu_name"] == "new" and [r["case"] for r in records] == [RECORD["case"]]


def test_a_run_killed_before_its_first_record_can_be_resumed(tmp_path):
    from qbench.runner import resumed

    run = _killed_before_first_record(tmp_path / "run")
    assert resumed("toy", str(run), True, False) == frozenset()  # nothing finished: everything runs
    with store.RunWriter(run, {}, append=True, bench="toy") as writer:
        writer.write(RECORD)
    assert len(store.load_run(run)[1]) == 1


def test_a_live_run_before_its_first_record_is_not_taken_over(tmp_path):
    first = store.RunWriter(tmp_path / "run", {"writer": 1})  # claimed, measuring, no record yet
    try:
        with pytest.raises(store.QbenchUsageError, match="not empty"):
            store.RunWriter(tmp_path / "run", {"writer": 2})
        with pytest.raises(store.QbenchUsageError, match="another run is writing"):
            store.RunWriter(tmp_path / "run", {"writer": 2}, append=True)
    finally:
        first.close()


def test_a_directory_with_other_files_is_still_refused(tmp_path):
    run = _killed_before_first_record(tmp_path / "run")
    (run / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(store.QbenchUsageError, match="not empty"):
        store.RunWriter(run, {})
    assert (run / "notes.txt").exists() and (run / store.ENV_FILE).exists()


@pytest.mark.parametrize("errno_name", ["EACCES", "EROFS"])
def test_appending_to_a_read_only_run_is_named_before_anything_runs(errno_name, tmp_path, capsys, monkeypatch):
    """Root ignores file modes, so the read-only file system is simulated where qbench first writes."""
    import errno

    seed = ROOT / "tests" / "fixtures" / "seed_bnb_info.jsonl"
    run = tmp_path / "run"
    assert qbench(capsys, ["import", seed, "--out", run])[0] == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if Path(path).parent == run and flags & os.O_CREAT:
            raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store.os, "open", refuse)
    for flag in ("--append", "--force"):
        code, _, err = qbench(capsys, ["import", seed, "--out", run, flag])
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"run directory {run} is read-only" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_plot_of_a_run_writes_beside_the_runs_not_into_the_run(tmp_path, capsys, monkeypatch):
    run = ROOT / "results" / "fragmented-h200-clocks-797e89f" / "run1"
    before = sorted(p.name for p in run.iterdir())
    monkeypatch.chdir(tmp_path)
    code, _, err = qbench(capsys, ["plot", run])
    assert code == 0, err
    assert (tmp_path / "runs" / "plots" / "run1-fragmented.png").is_file()
    assert sorted(p.name for p in run.iterdir()) == before
