"""The distributed MoE layer over gloo at world sizes 1, 2 and 4 against the dense reference, the
failure path of the launcher, a two-node torchrun launch over loopback, and the command end to end."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench import dist
from tests import test_moe_workers as moe_workers  # spawned ranks import it by this name too
from tests.helpers import env_without_interpreter

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parent


def test_spawned_ranks_get_rank_and_world_size_as_arguments(monkeypatch):
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    seen = list(dist.launch(moe_workers.job_seen, world_size=2, backend="gloo", device="cpu", timeout_s=120))
    assert seen == [(0, 2, None, None)]  # rank 0's items; nothing of the job in its environment


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_layer_matches_dense_reference(world_size):
    cases = moe_workers.CASES_4 if world_size == 4 else moe_workers.CASES  # 4 ranks on 2 cores: fewer cases
    results = list(dist.launch(moe_workers.check_cases, (cases,), world_size=world_size, backend="gloo",
                               device="cpu"))
    assert len(results) == len(cases)
    bad = [(case, text) for case, ok, text, _, _ in results if not ok]
    assert not bad, f"{len(bad)} cases differ from the reference; first: {bad[0]}"
    for case, _, _, dropped, rows in results:
        assert rows["sent"] == rows["received"], (case, rows)  # token conservation across ranks
        if case[1] == 0.0:
            assert dropped == 0, case  # dropless drops nothing
    capped = [r for r in results if r[0][1] != 0.0]
    assert any(r[3] > 0 for r in capped), "no case dropped tokens: the capacity path was not exercised"


@pytest.mark.parametrize("world_size", [2, 4])
def test_replication_gives_the_same_outputs_and_gradients(world_size):
    [(hot, errors)] = list(dist.launch(moe_workers.replication_equal, world_size=world_size,
                                       backend="gloo", device="cpu"))
    assert len(hot) == 3
    # fp32, same weights: only the summation order of the replicas' gradients differs
    assert max(errors) < 1e-5, f"replication changed results: {errors}"


def test_replicated_experts_follow_autocast():
    """Replicas of hot experts under autocast: their weights go out in the autocast dtype and their gradients
    come home into the fp32 parameters, as the 16-bit layer computes them (see the world-size-1 twin in
    tests/test_moe_compile.py)."""
    [(dtypes, hot, errors)] = list(dist.launch(moe_workers.replication_under_autocast, world_size=2,
                                               backend="gloo", device="cpu"))
    assert dtypes == ["torch.bfloat16"] + ["torch.float32"] * 6 and len(hot) == 2
    assert max(errors) <= 1e-2, f"relative errors against the 16-bit layer: {errors}"


def test_a_frozen_rank_ends_the_run_with_the_rank_named():
    """A SIGSTOPped rank (whose peers wait for it in a collective with a 600 s timeout) ends the job once its
    heartbeat is heartbeat_s old, the rank named; the stopped process is killed."""
    start = time.monotonic()
    with pytest.raises(dist.RankFailure, match=r"^rank 1 stopped responding: no heartbeat for \d+ s") as failure:
        list(dist.launch(moe_workers.freeze_rank, (1,), world_size=2, backend="gloo", device="cpu", timeout_s=600,
                         heartbeat_s=4))
    elapsed = time.monotonic() - start
    assert elapsed < 45, f"took {elapsed:.0f} s"
    assert "\n" not in str(failure.value)


def test_failing_rank_ends_the_run_with_its_error():
    start = time.monotonic()
    with pytest.raises(dist.RankFailure, match="rank 1 failed: ValueError: deliberate failure on rank 1"):
        list(dist.launch(moe_workers.fail_on_rank, (1,), world_size=2, backend="gloo", device="cpu", timeout_s=60))
    assert time.monotonic() - start < 60


def _env(triton: bool = True):
    """The environment of a spawned command; triton=False drops the Triton interpreter (the layers then
    run their torch references: the command's own flow is under test, the kernels are tested elsewhere)."""
    env = dict(os.environ) if triton else env_without_interpreter()
    env.update(PYTHONPATH=str(ROOT.parent), OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def test_command_runs_and_prints_seed_lines(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "qbench", "moe", "--world-size", "2", "--num-local-experts", "2",
           "--model-dim", "64", "--hidden-size", "24", "--samples", "24", "--num-steps", "2", "--warmup", "1",
           "--a2a-ffn-overlap-degree", "2", "--model", "attn-moe", "--batch-size", "2", "--exec", "eager,compile",
           "--seed-format", "--device", "cpu", "--out", str(out), "--trace", str(out / "traces")]  # inside the run
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(triton=False), timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record, loop, skipped = (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())
    assert (record["params"]["timing"], loop["params"]["timing"], loop["status"]) == ("per_step", "loop", "ok")
    assert record["status"] == "ok" and record["params"]["model"] == "attn-moe" and record["params"]["exec"] == "eager"
    assert record["metrics"]["host_ms"] > 0
    # compile at world size 2 under DDP: skipped, with a one-line reason
    assert skipped["params"]["exec"] == "compile" and skipped["status"] == "skipped" and skipped["error"]
    for rank in (0, 1):  # --trace: every rank's profiled steps, with the layer's phases as ranges
        trace = json.loads(gzip.open(out / "traces" / f"a2a-L2-D2-hot0-randn-auto-rank{rank}.json.gz").read())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"step 0", "forward", "backward", "gate", "dispatch"} <= names, sorted(n for n in names if n)[:20]
        assert (out / "traces" / f"a2a-L2-D2-hot0-randn-auto-rank{rank}.csv").exists()
    assert len(record["samples"]["step_ms"]) == 2
    from qbench.importers.moe import STEP, SUMMARY

    steps = [line for line in proc.stdout.splitlines() if STEP.search(line)]
    assert len(steps) == 2 and any(SUMMARY.search(line) for line in proc.stdout.splitlines())


def test_world_size_1_runs_eager_and_compiled_steps(tmp_path):
    """Fixed capacity at world size 1: both modes checked against eager and timed, with their host time."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "qbench", "moe", "--world-size", "1", "--num-local-experts", "2",
           "--model-dim", "16", "--hidden-size", "16", "--samples", "16", "--num-steps", "2", "--warmup", "1",
           "--capacity-factor", "1.0", "--exec", "eager,compile", "--device", "cpu", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(triton=False), timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    records = [r for r in records if r["params"]["timing"] == "per_step"]
    assert [(r["params"]["exec"], r["status"]) for r in records] == [("eager", "ok"), ("compile", "ok")], records
    for r in records:
        assert r["metrics"]["host_ms"] > 0 and r["metrics"]["step_ms"] > 0
    assert "experts_ms" in records[0]["metrics"] and "forward_ms" in records[1]["metrics"]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_two_node_torchrun_launch_over_loopback(tmp_path):
    port = str(dist.free_port())
    out = tmp_path / "run"
    procs = []
    for node in (0, 1):
        cmd = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", port, "-m", "qbench", "moe",
               "--num-local-experts", "2", "--model-dim", "16", "--hidden-size", "24", "--samples", "16",
               "--num-steps", "2", "--warmup", "1", "--device", "cpu", "--out", str(out)]
        # output to files, not pipes: a node blocked on a full pipe that nobody reads yet would hold the
        # other node's torchrun at its exit barrier
        log = (tmp_path / f"node{node}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=_env(triton=False))
        procs.append((proc, log))
    logs = lambda: "\n".join(f"--- node {n}:\n" + (tmp_path / f"node{n}.log").read_text()[-1500:]  # noqa: E731
                              for n in (0, 1))
    try:
        for p, _ in procs:
            p.wait(timeout=240)
    except subprocess.TimeoutExpired:
        for p, _ in procs:
            p.kill()
        pytest.fail(f"the two-node run did not end within 240 s\n{logs()}")
    finally:
        for _, log in procs:
            log.close()
    assert all(p.returncode == 0 for p, _ in procs), logs()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["params"]["timing"] for r in records] == ["per_step", "loop"]  # one measurement, its two records
    assert all(r["params"]["world_size"] == 2 and r["status"] == "ok" for r in records)
