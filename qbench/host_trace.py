"""Where the host time of traced steps goes, from the Chrome traces (.json.gz) that `--trace DIR` writes: the CPU
side of what qbench.traces reads for the GPU.

A traced step is the CPU range 'step i' on the thread that calls it. Within it, every thread's host work is its
top-level profiler events (an aten op, an autograd node or Function, a CUDA runtime or driver call: one not inside
another of the same thread), each in the innermost phase range open on its thread when it started. The calling
thread's time between its top-level events shows as rows of their own, one per phase: waiting, where another
thread runs ops meanwhile (a backward that autograd's engine thread runs), else Python (the layer's own code,
argument checks, kernel launchers' bookkeeping). So a thread's rows add up to the time it was busy, and shares
are of the step (the engine thread's rows lie within the calling thread's wait):
    calling thread   the step's whole range
    other threads    from the start of their first to the end of their last op in the step (autograd's engine
                     thread runs the backward there while the calling thread waits in backward())
The profiler's own bookkeeping lengthens every op a little (about a microsecond each): the totals are a map of
the host time, not a measurement of it; host_ms and host_<phase>_ms in the records are that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qbench.traces import Total

HOST_KINDS = ("cpu_op", "cuda_runtime", "cuda_driver")
RANGE_KIND = "user_annotation"  # profiler ranges: the steps and the layer's phases
BETWEEN = "(between ops)"  # the calling thread's own time outside its ops: Python
WAITING = "(waiting on another thread)"  # its time outside its ops while another thread runs ops


@dataclass(frozen=True)
class HostEvent:
    tid: str
    ts: float  # us
    dur: float  # us
    name: str


def _complete(trace: dict, kinds) -> list[HostEvent]:
    """The trace's complete events of these kinds, their start in us from the trace's first whole us: a start
    counted from the clock's zero (about 5e12 us) is a double that holds only whole ns, so ends and gaps summed
    over a step would be off by about a ns per op; the profiler writes ns, and rounding to them restores it."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    base = math.floor(min((float(e["ts"]) for e in events), default=0.0))
    return [HostEvent(str(e.get("tid")), round(float(e["ts"]) - base, 3), float(e["dur"]), str(e["name"]))
            for e in events if e.get("cat") in kinds]


def _top_level(events: list[HostEvent]) -> list[HostEvent]:
    """The events of one thread that no other of its events encloses, in start order."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e.ts, -e.dur)):
        if e.ts >= end:
            out.append(e)
            end = e.ts + e.dur
    return out


def _phase(e: HostEvent, phases: list[HostEvent]) -> str:
    """The innermost phase open on e's thread when it started, else on any thread (autograd's engine thread
    opens the layer's backward phases inside its nodes, within the calling thread's 'backward')."""
    open_then = [p for p in phases if p.ts <= e.ts <= p.ts + p.dur]
    own = [(p.dur, p.name) for p in open_then if p.tid == e.tid]
    inside = own or [(p.dur, p.name) for p in open_then]
    return min(inside)[1] if inside else "-"


def _thread_names(steps: list[HostEvent], ops: list[HostEvent]) -> dict[str, str]:
    calling = {s.tid for s in steps}
    names = {tid: "calling" for tid in calling}
    for e in ops:
        if e.tid not in names:
            names[e.tid] = "autograd engine" if e.name.startswith("autograd::engine") else f"thread {e.tid}"
        elif names[e.tid].startswith("thread") and e.name.startswith("autograd::engine"):
            names[e.tid] = "autograd engine"
    return names


def host_totals(trace: dict, by: str = "kernel") -> tuple[list[Total], int, float]:
    """(totals, largest first, the number of steps they cover, and the step's ms) of the host work inside the
    traced steps, by thread, op and phase (by="kernel": by op) or by thread and phase (by="phase"), with the
    calling thread's time between its ops as rows (module docstring). The first traced step is left out where
    there are more: it pays the profiler's start (several times a later step)."""
    ranges = _complete(trace, (RANGE_KIND,))
    steps = sorted((r for r in ranges if r.name.startswith("step ")), key=lambda r: r.ts)
    steps = steps[1:] if len(steps) > 1 else steps
    phases = [r for r in ranges if not r.name.startswith(("step ", "nccl:"))]
    ops = _complete(trace, HOST_KINDS)
    names = _thread_names(steps, ops)
    sums: dict[tuple[str, str, str], list[float]] = {}
    for step in steps:
        for (thread, name, phase), dur in _step_rows(step, ops, phases, names):
            sums.setdefault((thread, name if by == "kernel" else "", phase), []).append(dur)
    stepped = sum(s.dur for s in steps)
    n = max(len(steps), 1)
    totals = [Total(name, phase, len(d) / n, sum(d) / n / 1e3, sum(d) / stepped if stepped else 0.0, sum(d) / len(d),
                    thread) for (thread, name, phase), d in sums.items() if sum(d) > 0]
    return sorted(totals, key=lambda t: (-t.ms, t.thread, t.name)), len(steps), stepped / n / 1e3


def short_op_name(name: str, width: int = 64) -> str:
    """An op's name without the prefix autograd's engine gives every backward node, cut to `width` characters."""
    name = name.removeprefix("autograd::engine::evaluate_function: ")
    return name if len(name) <= width else name[:width - 1] + "\u2026"


def _step_rows(step: HostEvent, ops: list[HostEvent], phases: list[HostEvent], names: dict[str, str]):
    """((thread, op, phase), us) of every top-level op of one step, and of the calling thread's time between them
    (per phase: the one open at the middle of each gap), split into waiting on other threads' ops and the rest."""
    inside = [e for e in ops if step.ts <= e.ts <= step.ts + step.dur]
    tops = {tid: _top_level([e for e in inside if e.tid == tid]) for tid in {e.tid for e in inside} | {step.tid}}
    for tid, top in sorted(tops.items()):
        for e in top:
            yield (names[tid], e.name, _phase(e, phases)), e.dur
        others = [e for other, top_other in tops.items() if other != tid for e in top_other]
        span = (step.ts, step.ts + step.dur) if tid == step.tid else (top[0].ts, top[-1].ts + top[-1].dur)
        yield from _gaps(span, tid, top, others, phases, names[tid])


def _gaps(span: tuple[float, float], tid: str, top: list[HostEvent], others: list[HostEvent],
          phases: list[HostEvent], thread: str):
    """A thread's time in `span` outside its top-level ops, per gap and phase (a gap is cut where a phase range
    starts or ends): waiting (while other threads run ops) and between ops (the rest)."""
    edges = [(span[0], span[0])] + [(e.ts, e.ts + e.dur) for e in top] + [(span[1], span[1])]
    for (_, gap_start), (gap_end, _) in zip(edges, edges[1:]):
        inner = {t for p in phases for t in (p.ts, p.ts + p.dur) if gap_start < t < gap_end}
        cuts = sorted({gap_start, gap_end} | inner)
        for start, end in zip(cuts, cuts[1:]):  # each piece lies in one phase
            phase = _phase(HostEvent(tid, (start + end) / 2, 0.0, BETWEEN), phases)
            waiting = _covered(start, end, others)
            yield (thread, WAITING, phase), waiting
            yield (thread, BETWEEN, phase), end - start - waiting


def _covered(start: float, end: float, events: list[HostEvent]) -> float:
    """us of [start, end] that some event covers (events of several threads may overlap one another)."""
    covered, reach = 0.0, start
    for e in sorted(events, key=lambda e: e.ts):
        lo, hi = max(e.ts, reach), min(e.ts + e.dur, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered
