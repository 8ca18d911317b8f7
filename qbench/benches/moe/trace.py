"""Kernel timelines of MoE steps: torch.profiler traces per rank and a compact CSV of the GPU work.

`record_timeline(step, steps, out_dir, label, rank)` (`trace_steps` for a layer) runs `steps` more
steps under the profiler (after the timed ones, so the timing itself never runs profiled) and writes
    <label>-rank<r>.json.gz   Chrome trace (chrome://tracing, Perfetto): CPU ops, kernels, NCCL
    <label>-rank<r>.csv       one row per GPU kernel / copy / phase range:
                              step, stream, start_us (from the step's first GPU event), dur_us, kind, name
Phases appear as ranges because `PhaseMarks` stands in for the layer's PhaseTimer while tracing.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


class PhaseMarks:
    """Duck-typed PhaseTimer whose phases are profiler ranges (they land on the GPU timeline too)."""

    def phase(self, name: str):
        import torch

        return torch.profiler.record_function(name)

    def next_step(self) -> None:
        return None


def record_timeline(step, steps: int, out_dir: Path, label: str, rank: int) -> Path:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            if dist.is_initialized():
                dist.barrier()
            with torch.profiler.record_function(f"step {i}"):
                step(i)
            if cuda:
                torch.cuda.synchronize()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"{label}-rank{rank}.json"
    prof.export_chrome_trace(str(raw))
    table = out_dir / f"{label}-rank{rank}.csv"
    write_gpu_table(json.loads(raw.read_text()), table)
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return table


def write_gpu_table(trace: dict, path: Path) -> None:
    """GPU events of a Chrome trace, each tagged with the step (CPU range 'step i') that launched it."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("step "))
    launches = {e["args"].get("correlation"): e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    rows = []
    for e in events:
        if e.get("cat") not in GPU_KINDS:
            continue
        issued = launches.get(e.get("args", {}).get("correlation"), e["ts"])
        label = next((name for lo, hi, name in steps if lo <= issued <= hi), "")
        rows.append([label, e.get("tid"), float(e["ts"]), float(e["dur"]), e["cat"], e["name"]])
    first = {}
    for label, _, ts, *_ in rows:
        first[label] = min(first.get(label, ts), ts)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["step", "stream", "start_us", "dur_us", "kind", "name"])
        for label, stream, ts, dur, kind, name in sorted(rows, key=lambda r: r[2]):
            out.writerow([label, stream, f"{ts - first[label]:.1f}", f"{dur:.1f}", kind, name[:120]])


def trace_steps(moe, make_step, out_dir: Path, label: str, rank: int, steps: int = 3) -> Path:
    """After the timed steps: `steps` more under the profiler, with the layer's phases as profiler
    ranges; make_step(phase) -> step(i) builds the step as the bench times it. Writes
    <label>-rank<r>.json.gz and .csv into out_dir (record_timeline)."""
    marks = PhaseMarks()
    moe.timer = marks
    try:
        return record_timeline(make_step(marks.phase), steps, out_dir, label, rank)
    finally:
        moe.timer = None
