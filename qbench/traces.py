"""Kernel timelines of timed steps: torch.profiler traces and a compact CSV of their GPU work, read back.

`record_timeline(step, steps, out_dir, label, rank)` runs `steps` more steps under the profiler (after the timed
ones, so the timing itself never runs profiled) and writes
    <label>-rank<r>.json.gz   Chrome trace (chrome://tracing, Perfetto): CPU ops, kernels, NCCL
    <label>-rank<r>.csv       one row per GPU kernel / copy / phase range:
                              step, stream, start_us (from the step's first GPU event), dur_us, kind, name
Phases are profiler ranges (torch.profiler.record_function) opened inside a step; they land on the GPU timeline
too. `read_gpu_table(path)` reads such a CSV back and `gpu_totals(events, by)` sums its GPU work per step, by
kernel (with the phase it ran in) or by phase: what `qbench trace FILE.csv` prints. `qbench moe --trace` and
`qbench fragmented --trace` write them.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from qbench.errors import QbenchUsageError, read_text

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
COLUMNS = ("step", "stream", "start_us", "dur_us", "kind", "name")  # of a kernel CSV (write_gpu_table)
PHASE_KIND = "gpu_user_annotation"  # a phase's range on the GPU timeline (NCCL's own ranges are named nccl:*)


def check_trace_dir(trace_dir: str | None) -> None:
    """--trace DIR must be a folder that can be made: the bench makes it with the first traces it writes, after
    the run directory exists, so DIR may lie inside the run directory (which must be empty when the run starts)."""
    import os
    import tempfile

    if trace_dir is None:
        return
    path = Path(trace_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise QbenchUsageError(f"--trace {trace_dir}: {existing} is a file; choose a folder")
    try:  # a folder made and removed at once: whether one can be made there (os.access says yes to root)
        os.rmdir(tempfile.mkdtemp(prefix=".qbench-trace-check-", dir=existing))
    except OSError as exc:
        raise QbenchUsageError(f"--trace {trace_dir}: cannot make the directory ({exc.strerror}); "
                               "choose another") from None


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


@dataclass(frozen=True)
class GpuEvent:
    """One row of a kernel CSV: step label ('' outside the traced steps), stream, start and duration (us,
    start from the step's first GPU event), kind (kernel, gpu_memcpy, gpu_memset, gpu_user_annotation)
    and name."""

    step: str
    stream: str
    start_us: float
    dur_us: float
    kind: str
    name: str


def read_gpu_table(path: Path) -> list[GpuEvent]:
    """The rows of a kernel CSV written by write_gpu_table; a file that is not one is a usage error."""
    if path.name.endswith(".json.gz"):
        raise QbenchUsageError(f"{path} is the Chrome trace (open it in Perfetto); give the kernel table beside it, "
                               f"{path.name.removesuffix('.json.gz')}.csv")
    lines = read_text(path).splitlines()
    rows = list(csv.reader(lines))
    if not rows or tuple(rows[0]) != COLUMNS:
        raise QbenchUsageError(f"{path} is not a kernel table of `qbench moe --trace` (its header must be "
                               f"{','.join(COLUMNS)})")
    try:
        return [GpuEvent(step, stream, float(start), float(dur), kind, name)
                for step, stream, start, dur, kind, name in rows[1:]]
    except ValueError:
        raise QbenchUsageError(f"{path} has a row that is not step,stream,start_us,dur_us,kind,name "
                               "with numeric times") from None


@dataclass(frozen=True)
class GpuTotal:
    """GPU work of one kernel (in one phase) or of one phase, per traced step: calls, ms (durations
    summed), share of all the steps' summed GPU time, and us per call."""

    name: str
    phase: str
    calls: float
    ms: float
    share: float
    us_per_call: float


def gpu_totals(events: list[GpuEvent], by: str = "kernel") -> tuple[list[GpuTotal], int]:
    """(totals, largest first, and the number of traced steps) of the GPU work (kernels, copies, memsets)
    launched inside the traced steps, summed by kernel name and the phase it ran in (by="kernel": the
    innermost phase range of its step holding its start, '-' for none) or by that phase alone (by="phase").
    Durations are summed over streams: work that overlaps on two streams counts twice."""
    steps = sorted({e.step for e in events if e.step})
    phases = [e for e in events if e.kind == PHASE_KIND and not e.name.startswith("nccl:")]
    sums: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e.step and e.kind != PHASE_KIND:
            phase = _phase_of(e, phases)
            key = (phase, "") if by == "phase" else (e.name, phase)
            sums.setdefault(key, []).append(e.dur_us)
    total_us = sum(sum(d) for d in sums.values())
    n = max(len(steps), 1)
    totals = [GpuTotal(name, phase, len(d) / n, sum(d) / n / 1e3, sum(d) / total_us if total_us else 0.0,
                       sum(d) / len(d)) for (name, phase), d in sums.items()]
    return sorted(totals, key=lambda t: (-t.ms, t.name)), len(steps)


def _phase_of(event: GpuEvent, phases: list[GpuEvent]) -> str:
    inside = [p for p in phases if p.step == event.step and p.start_us <= event.start_us <= p.start_us + p.dur_us]
    return min(inside, key=lambda p: p.dur_us).name if inside else "-"


def short_kernel_name(name: str, width: int = 72) -> str:
    """A kernel's name without the namespaces that repeat in every ATen kernel, cut to `width` characters."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "std::", "c10::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 1] + "…"
