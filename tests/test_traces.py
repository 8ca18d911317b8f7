"""The kernel table of a profiler trace (qbench/traces.py): GPU events tagged with the step and the phase whose
CPU ranges were open when the host launched them, times from that step's first GPU event, sorted; read back (the
CSV, an older CSV without phases, or the Chrome trace itself) and summed per step by kernel or phase
(`qbench trace`)."""

import csv
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.traces import PHASE_KIND, GpuEvent, gpu_totals, read_gpu_table, write_gpu_table

ROOT = Path(__file__).resolve().parent.parent


def _event(cat, name, ts, dur, tid=7, corr=None):
    args = {"correlation": corr} if corr is not None else {}
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_gpu_events_are_tagged_with_the_step_and_phase_that_launched_them(tmp_path):
    trace = {"traceEvents": [
        _event("user_annotation", "step 0", 0, 100, tid=1),
        _event("user_annotation", "step 1", 200, 100, tid=1),
        _event("user_annotation", "backward", 205, 90, tid=1),  # the calling thread waits in backward()...
        _event("user_annotation", "gelu", 208, 4, tid=3),  # ...while the engine thread (3) runs a phase of its own
        _event("cuda_runtime", "cudaLaunchKernel", 10, 2, tid=1, corr=1),
        _event("cuda_runtime", "cudaLaunchKernel", 90, 2, tid=1, corr=2),  # launched in step 0, runs late
        _event("cuda_runtime", "cudaLaunchKernel", 210, 2, tid=3, corr=3),
        _event("cuda_driver", "cuLaunchKernelEx", 220, 2, tid=3, corr=4),
        _event("kernel", "gemm", 50, 30, corr=1),
        _event("kernel", "combine", 250, 5, corr=2),
        _event("kernel", "gelu_kernel", 255, 5, corr=3),
        _event("kernel", "nccl", 260, 40, tid=19, corr=4),
        _event(PHASE_KIND, "backward", 255, 45),
        _event("cpu_op", "aten::mm", 12, 3, tid=1),  # CPU ops are not GPU work
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5},  # not a complete event
    ]}
    path = tmp_path / "t.csv"
    write_gpu_table(trace, path)
    rows = list(csv.DictReader(path.open()))
    assert [(r["step"], r["name"], r["start_us"], r["stream"], r["phase"]) for r in rows] == [
        ("step 0", "gemm", "0.0", "7", "-"), ("step 0", "combine", "200.0", "7", "-"),
        ("step 1", "gelu_kernel", "0.0", "7", "gelu"), ("step 1", "backward", "0.0", "7", ""),
        ("step 1", "nccl", "5.0", "19", "backward")]
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert read_gpu_table(gz) == read_gpu_table(path)  # the Chrome trace reads as its table


def _row(step, start, dur, kind, name, stream="7"):
    return GpuEvent(step, stream, start, dur, kind, name)


def test_gpu_totals_sum_each_kernel_per_step_in_the_innermost_phase_it_started_in():
    events = [_row("", 0.0, 50.0, "kernel", "barrier")]  # outside the traced steps: left out
    for step in ("step 0", "step 1"):
        events += [
            _row(step, 0.0, 100.0, PHASE_KIND, "experts"),
            _row(step, 10.0, 20.0, PHASE_KIND, "gelu"),  # nested in experts: the innermost wins
            _row(step, 0.0, 60.0, PHASE_KIND, "nccl:all_to_all"),  # NCCL's own range is no phase
            _row(step, 0.0, 40.0, "kernel", "gemm"),
            _row(step, 50.0, 40.0, "kernel", "gemm"),
            _row(step, 12.0, 6.0, "kernel", "gelu_kernel"),
            _row(step, 150.0, 10.0, "gpu_memcpy", "copy"),  # after every phase
        ]
    by_kernel, steps = gpu_totals(events)
    assert steps == 2
    assert [(t.name, t.phase, t.calls, t.ms) for t in by_kernel] == [
        ("gemm", "experts", 2.0, 0.08), ("copy", "-", 1.0, 0.01), ("gelu_kernel", "gelu", 1.0, 0.006)]
    assert sum(t.share for t in by_kernel) == pytest.approx(1.0)
    assert by_kernel[0].us_per_call == 40.0
    by_phase, _ = gpu_totals(events, by="phase")
    assert [(t.name, t.calls, t.ms) for t in by_phase] == [("experts", 2.0, 0.08), ("-", 1.0, 0.01),
                                                           ("gelu", 1.0, 0.006)]


def test_read_gpu_table_reads_back_what_write_gpu_table_wrote(tmp_path):
    trace = {"traceEvents": [_event("user_annotation", "step 0", 0, 100, tid=1),
                             _event("user_annotation", "forward", 5, 50, tid=1),
                             _event("cuda_runtime", "cudaLaunchKernel", 10, 2, tid=1, corr=1),
                             _event("kernel", "gemm<[x]>", 50, 30, corr=1)]}
    path = tmp_path / "t.csv"
    write_gpu_table(trace, path)
    assert read_gpu_table(path) == [GpuEvent("step 0", "7", 0.0, 30.0, "kernel", "gemm<[x]>", "forward")]


def test_phases_recorded_at_launch_win_over_the_gpu_ranges_and_old_tables_fall_back_to_them(tmp_path):
    events = [_row("step 0", 0.0, 10.0, PHASE_KIND, "forward"),
              GpuEvent("step 0", "7", 2.0, 5.0, "kernel", "k", "backward")]
    assert [(t.name, t.phase) for t in gpu_totals(events)[0]] == [("k", "backward")]
    old = tmp_path / "old.csv"  # written before the phase column
    old.write_text("step,stream,start_us,dur_us,kind,name\nstep 0,7,0.0,10.0,gpu_user_annotation,forward\n"
                   "step 0,7,2.0,5.0,kernel,k\n")
    assert [(t.name, t.phase) for t in gpu_totals(read_gpu_table(old))[0]] == [("k", "forward")]


def test_trace_command_prints_a_committed_trace_per_step(tmp_path):
    """The kernel table of a committed 4-rank trace: 3 traced steps, the total row, brackets as written."""
    path = ROOT / "tests/fixtures/moe_trace_4rank_hot4_rank0.csv"
    done = subprocess.run([sys.executable, "-m", "qbench", "trace", str(path), "--top", "3", "--markdown"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| kernel | phase | calls | ms | share | us/call |"
    assert lines[2].startswith("| _grouped_wgrad_kernel | backward_experts | 8 | 0.5532 | 18.6% | 69.15 |")
    assert lines[5].startswith("| (")  # the rest in one row
    assert lines[6].startswith("| total |") and "| 100% |" in lines[6]
    assert "3 traced steps" in done.stdout
    by_phase = subprocess.run([sys.executable, "-m", "qbench", "trace", str(path), "--by", "phase"],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert by_phase.returncode == 0, by_phase.stderr
    assert "backward_experts" in by_phase.stdout and "ncclDevKernel" not in by_phase.stdout
