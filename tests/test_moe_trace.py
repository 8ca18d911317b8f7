"""The kernel table of a profiler trace (qbench/benches/moe/trace.py): GPU events tagged with the step whose
CPU range launched them, times from that step's first GPU event, sorted."""

import csv

from qbench.benches.moe.trace import write_gpu_table


def _event(cat, name, ts, dur, tid=7, corr=None):
    args = {"correlation": corr} if corr is not None else {}
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_gpu_events_are_tagged_with_the_step_that_launched_them(tmp_path):
    trace = {"traceEvents": [
        _event("user_annotation", "step 0", 0, 100, tid=1),
        _event("user_annotation", "step 1", 200, 100, tid=1),
        _event("cuda_runtime", "cudaLaunchKernel", 10, 2, tid=1, corr=1),
        _event("cuda_runtime", "cudaLaunchKernel", 90, 2, tid=1, corr=2),  # launched in step 0, runs late
        _event("cuda_runtime", "cudaLaunchKernel", 210, 2, tid=1, corr=3),
        _event("kernel", "gemm", 50, 30, corr=1),
        _event("kernel", "combine", 250, 5, corr=2),
        _event("kernel", "nccl", 260, 40, tid=19, corr=3),
        _event("cpu_op", "aten::mm", 12, 3, tid=1),  # CPU ops are not GPU work
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5},  # not a complete event
    ]}
    path = tmp_path / "t.csv"
    write_gpu_table(trace, path)
    rows = list(csv.DictReader(path.open()))
    assert [(r["step"], r["name"], r["start_us"], r["stream"]) for r in rows] == [
        ("step 0", "gemm", "0.0", "7"), ("step 0", "combine", "200.0", "7"), ("step 1", "nccl", "0.0", "19")]
