"""The host side of a profiler trace (qbench/host_trace.py, `qbench trace FILE.json.gz --host`): each thread's
top-level ops in their phases, the calling thread's time between them split into waiting on another thread's ops
and the rest, per step (the first traced step left out), so that the calling thread's rows add up to the step."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.host_trace import BETWEEN, WAITING, host_totals
from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent


def _event(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}


def _step(offset):
    """One step of 100 us at `offset` on thread 1; its backward (40..90) runs on thread 2 from 45 to 85."""
    o = offset
    return [
        _event("user_annotation", f"step {o // 1000}", o, 100),
        _event("user_annotation", "forward", o + 0, 40),
        _event("user_annotation", "backward", o + 40, 50),
        _event("cpu_op", "aten::linear", o + 5, 20),
        _event("cpu_op", "aten::addmm", o + 10, 10),  # inside aten::linear: not top-level
        _event("cuda_runtime", "cudaLaunchKernel", o + 30, 4),
        _event("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", o + 45, 25, tid=2),
        _event("user_annotation", "backward_experts", o + 50, 10, tid=2),
        _event("cpu_op", "autograd::engine::evaluate_function: TBackward0", o + 75, 10, tid=2),
        _event("cpu_op", "aten::_foreach_add_", o + 92, 6),
    ]


def _totals(by="kernel"):
    trace = {"traceEvents": _step(0) + _step(1000) + _step(2000)}
    return host_totals(trace, by)


def test_the_calling_threads_rows_add_up_to_the_step_and_waits_are_split_from_python():
    totals, steps, step_ms = _totals()
    assert steps == 2 and step_ms == pytest.approx(0.1)  # the first step left out
    rows = {(t.thread, t.name, t.phase): t for t in totals}
    calling = [t for t in totals if t.thread == "calling"]
    assert sum(t.ms for t in calling) == pytest.approx(step_ms)
    assert rows["calling", "aten::linear", "forward"].ms == pytest.approx(0.020)  # addmm inside it: not counted
    assert ("calling", "aten::addmm", "forward") not in rows
    # backward 40..90 on the calling thread has no op of its own: 45..70 and 75..85 it waits on thread 2
    assert rows["calling", WAITING, "backward"].ms == pytest.approx(0.035)
    assert rows["calling", BETWEEN, "backward"].ms == pytest.approx(0.015)
    # the engine thread's ops, in the calling thread's phase (its own range opens inside the node), and its gap
    assert rows["autograd engine", "autograd::engine::evaluate_function: AddmmBackward0", "backward"].ms == \
        pytest.approx(0.025)
    assert rows["autograd engine", BETWEEN, "backward"].ms == pytest.approx(0.005)
    assert rows["calling", "aten::_foreach_add_", "-"].calls == 1


def test_by_phase_sums_each_threads_time_in_each_phase():
    totals, _, step_ms = _totals("phase")
    rows = {(t.thread, t.phase): t.ms for t in totals}
    assert rows["calling", "backward"] == pytest.approx(0.050)
    assert rows["calling", "forward"] == pytest.approx(0.040)
    assert sum(ms for (thread, _), ms in rows.items() if thread == "calling") == pytest.approx(step_ms)


def test_trace_host_on_a_cpu_runs_trace_and_refuses_a_kernel_table(tmp_path):
    """A CPU run's Chrome trace has its host ops; --host prints them with the step row, and a CSV is refused."""
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "qbench", "moe", "--world-size", "1", "--device", "cpu", "--dtype",
                          "fp32", "--num-local-experts", "2", "--model-dim", "32", "--hidden-size", "48", "--samples",
                          "64", "--num-steps", "2", "--warmup", "1", "--out", str(out), "--trace", str(out / "traces")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300, env=env_without_interpreter())
    assert run.returncode == 0, run.stderr[-2000:]
    (trace,) = sorted((out / "traces").glob("*.json.gz"))
    done = subprocess.run([sys.executable, "-m", "qbench", "trace", str(trace), "--host", "--markdown"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| thread | host op | phase | calls | ms | share | us/call |"
    assert any("| calling | aten::linear |" in line for line in lines)
    assert lines[next(i for i, line in enumerate(lines) if line.startswith("| step |"))].endswith("| 100% |  |")
    totals, steps, step_ms = host_totals(json.loads(gzip.open(trace).read()))
    assert steps == 2 and sum(t.ms for t in totals if t.thread == "calling") == pytest.approx(step_ms)
    refused = subprocess.run([sys.executable, "-m", "qbench", "trace", str(trace.with_suffix("").with_suffix(".csv")),
                              "--host"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "Chrome trace" in refused.stderr
