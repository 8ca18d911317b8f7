"""THE timer of qbench: every measured time in the project comes from this module.

GPU: CUDA events around the timed region; warm-up calls (which also absorb Triton autotuning and
compilation) are excluded; the L2 cache is optionally flushed between repeats by overwriting a
buffer larger than L2; optional CUDA-graph replay for launch-bound work.
CPU: time.perf_counter around the region, same interface and same statistics (qbench.samples.Timing).
Multi-rank: a barrier before each step, all streams synchronized, and the maximum over ranks of
each step (one all-reduce after the loop, qbench.dist.max_over_ranks, so the collective never sits inside a
timed region).

All times are milliseconds. Samples are kept so that `qbench compare` can test significance.
torch is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from qbench.dist import max_over_ranks
from qbench.env import resolve_device
from qbench.samples import Timing

DEFAULT_BUDGET_MS = 250.0  # time budget per measured configuration when no repeat count is given
MIN_REPEAT = 5  # fewer samples make the percentiles meaningless
MAX_REPEAT = 2000  # caps tiny kernels so a sweep stays bounded
L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than the L2 of every current GPU (H100: 50 MB, H200: 60 MB)


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _repeat_count(one_call_ms: float, repeat: int | None, budget_ms: float | None) -> int:
    if repeat is not None:
        return max(1, int(repeat))
    budget = DEFAULT_BUDGET_MS if budget_ms is None else budget_ms
    estimate = max(one_call_ms, 1e-4)
    return int(min(MAX_REPEAT, max(MIN_REPEAT, budget / estimate)))


class _Clock:
    """One start/stop pair: CUDA events on GPU, perf_counter on CPU. external: events that a CUDA-graph
    capture records as event-record nodes (cudaEventRecordExternal), so that every replay re-records them;
    ordinary events are only ordering points inside a capture and time nothing."""

    def __init__(self, device: str, external: bool = False):
        self.device = device
        if device == "cuda":
            import torch

            self._start = torch.cuda.Event(enable_timing=True, external=external)
            self._end = torch.cuda.Event(enable_timing=True, external=external)

    def start(self) -> None:
        if self.device == "cuda":
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.device == "cuda":
            self._end.record()
        else:
            self._t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        """Valid after the device is synchronized."""
        if self.device == "cuda":
            return float(self._start.elapsed_time(self._end))
        return (self._t1 - self._t0) * 1e3


HOST_AHEAD_MS = 0.5  # longer than issuing any one benchmarked kernel call takes the host (0.1 ms measured)


def _spin(device: str, gpu_only: bool) -> Callable[[], None]:
    """A GPU spin of HOST_AHEAD_MS for gpu_only timing on CUDA, else nothing."""
    if not (gpu_only and device == "cuda"):
        return lambda: None
    import torch

    return functools.partial(torch.cuda._sleep, int(HOST_AHEAD_MS * 1e-3 * _sm_clock_hz()))


def _sm_clock_hz() -> float:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return float(getattr(props, "clock_rate", 1_980_000)) * 1e3  # kHz in the properties; H200 max 1.98 GHz


def _make_flush(device: str, flush_l2: bool) -> Callable[[], None]:
    if device != "cuda" or not flush_l2:
        return lambda: None
    import torch

    buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return buffer.zero_


_CAPTURE_STREAMS: dict[int, object] = {}  # one warm-up side stream per device, reused for every capture


def _capture_stream():
    """The side stream of the eager call before a capture. Reused: every new stream makes cuBLAS
    allocate another 32-64 MB workspace, which would inflate the peak memory of benches that use graphs."""
    import torch

    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[device]


def _graph_of(fn: Callable[[], object], prepare: Callable[[], None] | None = None) -> Callable[[], None]:
    """Capture fn into a CUDA graph (after fn has been warmed up) and return its replay. prepare() runs
    before the side-stream call and again right before the capture, outside both: a training step drops
    its gradients and kept outputs there, because a tensor of the ordinary pool freed inside the capture
    invalidates it (cudaErrorStreamCaptureInvalidated on an H200, torch 2.11); the captured step then
    allocates them from the graph's pool and every replay rewrites them."""
    import torch

    prepare = prepare or (lambda: None)
    stream = _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prepare()
        fn()  # one more eager call on the side stream, as CUDA-graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    prepare()
    with torch.cuda.graph(graph):  # torch's own (reused) capture stream, as its documentation does
        fn()
    return graph.replay


def time_fn(
    fn: Callable[[], object],
    *,
    device: str | None = None,
    warmup: int = 3,
    repeat: int | None = None,
    budget_ms: float | None = None,
    flush_l2: bool = True,
    cuda_graph: bool = False,
    gpu_only: bool = False,
    observe: Callable[[], None] | None = None,
) -> Timing:
    """Time fn() and return one sample (ms) per repeat.

    warmup calls run first and are never timed (at least one, so that JIT compilation and autotuning
    stay out of the numbers). Without `repeat` the count is chosen so the samples take about
    `budget_ms`. With flush_l2 (GPU only) a 256 MB buffer is overwritten before each repeat, outside
    the timed region, so every repeat starts from a cold L2 as it would inside a real model.
    gpu_only (kernel benchmarks): before each repeat the GPU spins for HOST_AHEAD_MS, so the host has
    enqueued fn's launches before the start event fires and the sample is the kernels' GPU time even
    when issuing them takes longer than running them. Without it (layer steps) a host-bound call is
    timed as the training loop sees it. observe() (e.g. qbench.telemetry.GpuReadings) is called after
    each timed call is issued, outside the timed span.
    """
    device = resolve_device(device)
    _warm_up({"fn": fn}, device, warmup)
    call = _graph_of(fn) if (cuda_graph and device == "cuda") else fn
    ahead = HOST_AHEAD_MS if gpu_only and device == "cuda" else 0.0  # each repeat's spin counts against the budget
    spin = _spin(device, gpu_only)
    return _sample({"fn": call}, device, repeat, budget_ms, flush_l2, lambda _: spin(), ahead, observe)["fn"]


def time_interleaved(fns: dict[str, Callable[[], object]], *, device: str | None = None, warmup: int = 3,
                     repeat: int | None = None, budget_ms: float | None = None, flush_l2: bool = True,
                     observe: Callable[[], None] | None = None) -> dict[str, Timing]:
    """Time several calls against each other: one sample of each per round, in an order that rotates
    every round, so that a drift of the machine over the run (clocks, power, temperature, a busy host)
    falls on every call alike and their ratios (speed-ups) stay put. Same rules as time_fn (warm-up
    calls untimed, the L2 flushed before every sample, not gpu_only); `repeat` or `budget_ms` sets the
    rounds, the budget split between the calls.
    Each sample starts on an idle device (synchronized after the flush, outside the timed span): a call
    whose host issues its launches slower than the GPU runs them would otherwise get a head start from
    the GPU work its neighbour left queued (a CUDA-graph replay returns at once) and look faster than
    its host allows. observe() is called once per round, after the round's last call is issued."""
    device = resolve_device(device)
    _warm_up(fns, device, warmup)
    return _sample(fns, device, repeat, budget_ms, flush_l2, lambda _: _synchronize(device), 0.0, observe)


LOOP_BLOCK = 8  # back-to-back calls per sample of time_loops


def time_loops(fns: dict[str, Callable[[], object]], *, device: str | None = None, warmup: int = 3,
               repeat: int | None = None, budget_ms: float | None = None, block: int = LOOP_BLOCK,
               flush_l2: bool = True, observe: Callable[[], None] | None = None) -> dict[str, Timing]:
    """Each call's time per call inside a loop of it, as a training loop runs its steps: a sample is the
    mean of `block` calls issued back to back. Before each sample the L2 is flushed, the device
    synchronized and one untimed call issued, so the first timed call, like every later one, is issued
    while the call before it still runs on the GPU. So a call whose host is faster than its GPU work is
    timed at the GPU's pace (the host's lead hidden, as in a loop), and one whose host is slower at the
    host's pace. Blocks of the calls are interleaved, the order rotating every round (as time_interleaved
    does with single calls), so that a drift of the machine falls on every call alike, while each block
    runs in its own call's regime of clocks and power, as a loop of that call alone would.
    time_interleaved instead starts every call on an idle device: there a step pays the host's lead
    (the time until its first launch reaches the GPU, and the gaps while the GPU waits for the next) even
    when its host is faster than its GPU, and the calls of one round share one power regime."""
    device = resolve_device(device)
    _warm_up(fns, device, warmup)
    block = max(1, int(block))

    def settle(name: str) -> None:
        _synchronize(device)
        fns[name]()

    def blocks(fn):
        def run():
            for _ in range(block):
                fn()
        return run

    timings = _sample({name: blocks(fn) for name, fn in fns.items()}, device, repeat, budget_ms, flush_l2, settle,
                      0.0, observe)
    return {name: Timing(tuple(ms / block for ms in t.samples_ms), device) for name, t in timings.items()}


def _warm_up(fns: dict, device: str, warmup: int) -> None:
    """warmup untimed calls of each (at least one: JIT compilation and autotuning stay out of the numbers)."""
    for fn in fns.values():
        for _ in range(max(1, warmup)):
            fn()
    _synchronize(device)


def _sample(fns: dict, device: str, repeat, budget_ms, flush_l2: bool, before, ahead_ms: float,
            observe: Callable[[], None] | None = None) -> dict[str, Timing]:
    """The timed samples of warmed-up calls: a probe round sets the round count (repeat, or budget_ms over
    the round's length, ahead_ms of `before` per call included); then per round one sample of each call,
    the order rotating every round, each after an L2 flush and before(name); observe() after each round."""
    names = list(fns)
    flush = _make_flush(device, flush_l2)

    def timed(name: str) -> _Clock:
        clock = _Clock(device)
        flush()
        before(name)
        clock.start()
        fns[name]()
        clock.stop()
        return clock

    probe = [timed(name) for name in names]
    _synchronize(device)
    rounds = _repeat_count(sum(c.elapsed_ms() + ahead_ms for c in probe), repeat, budget_ms)
    clocks: dict[str, list[_Clock]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            clocks[name].append(timed(name))
        if observe is not None:
            observe()
    _synchronize(device)
    return {name: Timing(tuple(c.elapsed_ms() for c in clocks[name]), device) for name in names}


HOST_SETTLE = 2  # untimed calls that open each block of host_time, after its wait on the device
HOST_BLOCK = 8  # timed calls per block: with the settling calls, 10 steps of at most ~100 launches each stay
#                 under the ~1000 launches a CUDA stream queues before the host has to wait for a free slot


def host_time(fn: Callable[[], object], *, device: str | None = None, warmup: int = 3, repeat: int = 20,
              phases: PhaseTimer | None = None) -> Timing:
    """CPU time (ms) spent issuing one call of fn, as a training loop issues its steps: back to back,
    never waiting on the device. The calls run in blocks: the device is synchronized (outside every
    timed span), HOST_SETTLE untimed calls follow, then up to HOST_BLOCK timed ones, so the GPU work a
    block queues never fills the launch queue (which would hold the host back and time the GPU).
    Why the settling calls: the first calls after the host has waited on the device are slower and by
    how much depends on how long it waited, which would make the number follow the GPU time of the
    step (on an H200 host, nn.Linear forward + backward at 131072 x 4096 -> 16384 fp16 took 1.45 ms
    of host time as the first call after a synchronize and 0.25 ms back to back; 8192 x 1024 -> 4096:
    0.32 and 0.19 ms). On a CPU device each sample is the call's time.
    phases: a PhaseTimer on the host clock (device "cpu") that fn's regions record into; it keeps one
    step per timed call (the regions of the warm-up and settling calls are dropped)."""
    device = resolve_device(device)
    keep = phases.next_step if phases is not None else (lambda: None)
    drop = phases.drop_step if phases is not None else (lambda: None)
    for _ in range(max(1, warmup)):
        fn()
        drop()
    samples: list[float] = []
    while len(samples) < max(1, repeat):
        _synchronize(device)
        for _ in range(HOST_SETTLE):
            fn()
            drop()
        for _ in range(min(HOST_BLOCK, max(1, repeat) - len(samples))):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
            keep()
    _synchronize(device)
    return Timing(tuple(samples), device)


def backward_thread(name: str):
    """A context in which autograd runs backward on `name`'s thread: "device" (PyTorch's default: one engine
    thread per GPU, which the calling thread hands each backward to) or "calling" (the thread that calls
    backward(), torch.autograd.set_multithreading_enabled(False)). A layer whose backward is Python (an
    autograd Function) then runs it without the hand-over to another thread; see the README, fragmented."""
    import torch

    return torch.autograd.set_multithreading_enabled(name == "device")


def graph_replay(fn: Callable[[], object], prepare: Callable[[], None] | None = None) -> Callable[[], None]:
    """fn (already warmed up) captured into one CUDA graph; returns its replay (GPU only). See _graph_of
    for prepare (set a training step's gradients to None outside the capture)."""
    return _graph_of(fn, prepare)


@dataclass
class PhaseTimer:
    """Named regions inside one step (gate, dispatch, experts, ...), one sample per region per step.

    Use `with timer.phase("dispatch"): ...` inside a step and `timer.next_step()` between steps;
    `results_ms()` synchronizes once and returns {phase: [ms per step]} (a phase entered twice in a
    step counts the sum). On GPU the events are recorded on the current stream.
    A step captured into a CUDA graph (`captured=True`: its events become record nodes of the graph)
    is timed by `replay_ms()` after each replay: the phases of that replay.
    """

    device: str = "cpu"
    captured: bool = False
    _steps: list[dict[str, list[_Clock]]] = field(default_factory=lambda: [{}])

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        clock = _Clock(self.device, external=self.captured)
        clock.start()
        try:
            yield
        finally:
            clock.stop()
            self._steps[-1].setdefault(name, []).append(clock)

    def next_step(self) -> None:
        self._steps.append({})

    def discard(self) -> None:
        """Forget everything recorded so far (used after warm-up steps)."""
        self._steps = [{}]

    def drop_step(self) -> None:
        """Forget the current step's regions (an untimed call)."""
        self._steps[-1] = {}

    def results_ms(self) -> dict[str, list[float]]:
        _synchronize(self.device)
        steps = [s for s in self._steps if s]
        names = sorted({name for step in steps for name in step})
        return {name: [sum(c.elapsed_ms() for c in step.get(name, [])) for step in steps] for name in names}

    def replay_ms(self) -> dict[str, float]:
        """{phase: ms} of the captured step's latest replay (the one step recorded while capturing)."""
        _synchronize(self.device)
        (step,) = [s for s in self._steps if s]
        return {name: sum(c.elapsed_ms() for c in clocks) for name, clocks in sorted(step.items())}


def time_ranks(
    step: Callable[[int], object],
    *,
    steps: int,
    warmup: int = 10,
    device: str | None = None,
    group=None,
    on_warmup_end: Callable[[], None] | None = None,
    observe: Callable[[], None] | None = None,
    block: int = 1,
) -> Timing:
    """Time a distributed step: barrier, start, step(i), synchronize, stop; max over ranks per step.

    step(i) gets the step index (warm-up steps get negative indices). on_warmup_end lets the caller
    reset its own PhaseTimer so that phases and steps cover the same steps. Every rank returns the
    same Timing (samples = per-step maxima over ranks). observe() is called after each timed step is
    issued, outside the timed span's host work.
    block > 1 times the step inside a loop of it, as time_loops does for one process: a sample is the
    mean of `block` steps issued back to back after one untimed step (so the first timed step, like
    every later one, is issued while the step before it still runs: the host's lead is hidden wherever
    the host issues a step faster than the GPU runs it, as in a training loop); `steps` samples.
    """
    import torch.distributed as dist

    device = resolve_device(device)
    distributed = dist.is_available() and dist.is_initialized()
    for i in range(warmup):
        step(i - warmup)
    _synchronize(device)
    if on_warmup_end is not None:
        on_warmup_end()
    local = []
    block = max(1, int(block))
    for i in range(steps):
        if distributed:
            dist.barrier(group=group)
        _synchronize(device)
        if block > 1:
            step(i)  # untimed: the timed block starts behind a running step
        clock = _Clock(device)
        clock.start()
        for _ in range(block):
            step(i)
        clock.stop()
        if observe is not None:
            observe()
        _synchronize(device)
        local.append(clock.elapsed_ms() / block)
    return Timing(tuple(max_over_ranks(local, group)), device)
