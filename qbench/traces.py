"""Kernel timelines of timed steps: torch.profiler traces and a compact CSV of their GPU work, read back.

`record_timeline(step, steps, out_dir, label, rank)` runs `steps` more steps under the profiler (after the timed
ones, so the timing itself never runs profiled) and writes
    <label>-rank<r>.json.gz   Chrome trace (chrome://tracing, Perfetto): CPU ops, kernels, NCCL
    <label>-rank<r>.csv       one row per GPU kernel / copy / phase range:
                              step, stream, start_us (from the step's first GPU event), dur_us, kind, name,
                              phase (the innermost phase range open on the host when it was launched)
Phases are profiler ranges (torch.profiler.record_function) opened inside a step; they land on the GPU timeline
too. `read_gpu_table(path)` reads such a CSV back (or the events of its .json.gz) and `gpu_totals(events, by)`
sums its GPU work per step, by kernel (with the phase the host launched it in) or by phase: what `qbench trace
FILE.csv` prints. `qbench moe`, `qbench fragmented` and `qbench switchback` write them with `--trace DIR`.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from qbench.errors import QbenchUsageError, read_text

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
COLUMNS = ("step", "stream", "start_us", "dur_us", "kind", "name", "phase")  # of a kernel CSV (write_gpu_table)
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


def record_training_steps(forward, backward, out_dir: str, label: str, before=None) -> Path:
    """record_timeline of 3 training steps of one layer, on rank 0: before() (drop the gradients), out =
    forward(), backward(out), the forward and the backward as profiler ranges ("forward", "backward"), so
    `qbench trace FILE --by phase` splits the GPU work between them; backward None: a forward alone."""
    import torch

    def step(_) -> None:
        if before is not None:
            before()
        with torch.profiler.record_function("forward"):
            out = forward()
        if backward is not None:
            with torch.profiler.record_function("backward"):
                backward(out)

    return record_timeline(step, 3, Path(out_dir), label, 0)


@dataclass(frozen=True)
class GpuEvent:
    """One row of a kernel table: step label ('' outside the traced steps), stream, start and duration (us, start
    from the step's first GPU event), kind (kernel, gpu_memcpy, gpu_memset, gpu_user_annotation), name, and phase:
    the innermost CPU range (a phase, not a step) open on any thread when the host launched it ('-' for none;
    None in a table written before phases were recorded)."""

    step: str
    stream: str
    start_us: float
    dur_us: float
    kind: str
    name: str
    phase: str | None = None


def gpu_events(trace: dict) -> list[GpuEvent]:
    """The GPU work and phase ranges of a Chrome trace, in start order, each tagged with the step (CPU range
    'step i') that launched it and with its phase: phases are found by launch time on the host, because a
    kernel that autograd's engine thread launches inside the calling thread's 'backward' range never enters
    that range's span on the GPU timeline."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ranges = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "user_annotation"]
    steps = sorted(r for r in ranges if r[2].startswith("step "))
    phases = [r for r in ranges if not r[2].startswith(("step ", "nccl:"))]
    launches = {e["args"].get("correlation"): e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    rows = []
    for e in events:
        if e.get("cat") not in GPU_KINDS:
            continue
        issued = launches.get(e.get("args", {}).get("correlation"), e["ts"])
        label = next((name for lo, hi, name in steps if lo <= issued <= hi), "")
        inside = [(hi - lo, name) for lo, hi, name in phases if lo <= issued <= hi]
        phase = "" if e["cat"] == PHASE_KIND else min(inside)[1] if inside else "-"
        rows.append((label, str(e.get("tid")), float(e["ts"]), float(e["dur"]), e["cat"], e["name"][:120], phase))
    first: dict[str, float] = {}
    for label, _, ts, *_ in rows:
        first[label] = min(first.get(label, ts), ts)
    return [GpuEvent(label, stream, round(ts - first[label], 1), round(dur, 1), kind, name, phase)
            for label, stream, ts, dur, kind, name, phase in sorted(rows, key=lambda r: r[2])]


def write_gpu_table(trace: dict, path: Path) -> None:
    """The kernel table (CSV) of a Chrome trace: gpu_events, one row each."""
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(COLUMNS)
        for e in gpu_events(trace):
            out.writerow([e.step, e.stream, f"{e.start_us:.1f}", f"{e.dur_us:.1f}", e.kind, e.name, e.phase])


def read_gpu_table(path: Path) -> list[GpuEvent]:
    """The rows of a kernel table written by write_gpu_table (or of one written before its `phase` column), or the
    events of the Chrome trace (.json.gz) it was made from; a file that is neither is a usage error."""
    if path.name.endswith(".json.gz"):
        return gpu_events(read_chrome_trace(path))
    rows = list(csv.reader(read_text(path).splitlines()))
    if not rows or tuple(rows[0]) not in (COLUMNS, COLUMNS[:-1]):
        raise QbenchUsageError(f"{path} is not a kernel table of a --trace run (its header must be "
                               f"{','.join(COLUMNS)}), nor a Chrome trace (.json.gz)")
    try:
        events = [GpuEvent(r[0], r[1], float(r[2]), float(r[3]), r[4], r[5], r[6] if len(r) > 6 else None)
                  for r in rows[1:]]
    except (ValueError, IndexError):
        raise QbenchUsageError(f"{path} has a row that is not {','.join(rows[0])} with numeric times") from None
    for number, e in enumerate(events, start=2):  # a profiler writes finite times and no negative duration
        if not (math.isfinite(e.start_us) and math.isfinite(e.dur_us) and e.dur_us >= 0):
            raise QbenchUsageError(f"{path}:{number}: start_us {e.start_us:g}, dur_us {e.dur_us:g}: times must be "
                                   "finite and durations >= 0")
    return events


def read_chrome_trace(path: Path) -> dict:
    """The Chrome trace (.json.gz) a --trace run wrote; anything else is a usage error naming the file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            trace = json.load(fh)
    except FileNotFoundError:
        raise QbenchUsageError(f"cannot read {path} (No such file or directory)") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError):
        raise QbenchUsageError(f"{path} is not a gzipped Chrome trace (JSON)") from None
    if not isinstance(trace, dict):
        raise QbenchUsageError(f"{path} is not a Chrome trace (a JSON object with traceEvents)")
    return trace


@dataclass(frozen=True)
class Total:
    """Work of one kernel or op (in one phase) or of one phase, per traced step: calls, ms (durations summed),
    share (of all the steps' summed GPU time; host: of the steps' time), us per call, and the host thread that
    ran it ('' for GPU work)."""

    name: str
    phase: str
    calls: float
    ms: float
    share: float
    us_per_call: float
    thread: str = ""


def gpu_totals(events: list[GpuEvent], by: str = "kernel") -> tuple[list[Total], int]:
    """(totals, largest first, and the number of traced steps) of the GPU work (kernels, copies, memsets)
    launched inside the traced steps, summed by kernel name and the phase it was launched in (by="kernel") or
    by that phase alone (by="phase"). A table without phases (written before they were recorded) takes the
    innermost phase range of the step holding the kernel's start on the GPU timeline. Durations are summed
    over streams: work that overlaps on two streams counts twice."""
    steps = sorted({e.step for e in events if e.step})
    ranges = [e for e in events if e.kind == PHASE_KIND and not e.name.startswith("nccl:")]
    sums: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e.step and e.kind != PHASE_KIND:
            phase = e.phase if e.phase is not None else _phase_on_gpu(e, ranges)
            key = (phase, "") if by == "phase" else (e.name, phase)
            sums.setdefault(key, []).append(e.dur_us)
    total_us = sum(sum(d) for d in sums.values())
    n = max(len(steps), 1)
    totals = [Total(name, phase, len(d) / n, sum(d) / n / 1e3, sum(d) / total_us if total_us else 0.0,
                       sum(d) / len(d)) for (name, phase), d in sums.items()]
    return sorted(totals, key=lambda t: (-t.ms, t.name)), len(steps)


def _phase_on_gpu(event: GpuEvent, ranges: list[GpuEvent]) -> str:
    inside = [p for p in ranges if p.step == event.step and p.start_us <= event.start_us <= p.start_us + p.dur_us]
    return min(inside, key=lambda p: p.dur_us).name if inside else "-"


def short_kernel_name(name: str, width: int = 72) -> str:
    """A kernel's name without the namespaces that repeat in every ATen kernel, cut to `width` characters."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "std::", "c10::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 1] + "…"
