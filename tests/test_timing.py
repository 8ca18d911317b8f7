import time

import numpy as np
import pytest

from qbench import samples, timing


@pytest.mark.parametrize("q", [0, 20, 50, 80, 100])
def test_percentile_matches_numpy(q):
    values = list(np.random.default_rng(q).random(17))
    assert samples.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_time_fn_cpu_counts_warmup_and_repeats_and_measures_the_region():
    calls = []

    def work():
        calls.append(1)
        # about 2 ms of real CPU work (no sleep: the timer must see work, not scheduler latency)
        x = 0
        for i in range(60_000):
            x += i * i
        return x

    result = timing.time_fn(work, device="cpu", warmup=2, repeat=7)
    assert len(result.samples_ms) == 7
    assert len(calls) == 2 + 1 + 7  # warm-up, one probe to size the repeat count, the timed repeats
    assert result.min <= result.p20 <= result.median <= result.p80 <= max(result.samples_ms)
    assert 0.05 < result.median < 500
    assert set(result.summary()) == {"median", "p20", "p80", "mean", "min"}


def test_time_fn_budget_bounds_the_repeat_count():
    result = timing.time_fn(lambda: sum(range(1000)), device="cpu", budget_ms=5)
    assert timing.MIN_REPEAT <= len(result.samples_ms) <= timing.MAX_REPEAT


def test_phase_timer_sums_phases_per_step():
    timer = timing.PhaseTimer("cpu")
    for _ in range(3):
        with timer.phase("a"):
            sum(range(20_000))
        with timer.phase("b"):
            pass
        with timer.phase("a"):
            sum(range(20_000))
        timer.next_step()
    result = timer.results_ms()
    assert set(result) == {"a", "b"}
    assert len(result["a"]) == 3 and all(a > b for a, b in zip(result["a"], result["b"]))


def test_time_ranks_single_process_and_warmup_hook():
    seen, resets = [], []
    result = timing.time_ranks(seen.append, steps=4, warmup=2, device="cpu", on_warmup_end=lambda: resets.append(1))
    assert seen == [-2, -1, 0, 1, 2, 3]
    assert resets == [1] and len(result.samples_ms) == 4


@pytest.mark.gpu
def test_time_fn_cuda_events_flush_and_graph_replay():
    import torch

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    out = torch.empty_like(a)

    def matmul():
        torch.matmul(a, a, out=out)

    eager = timing.time_fn(matmul, device="cuda", repeat=20)
    graphed = timing.time_fn(matmul, device="cuda", repeat=20, cuda_graph=True)
    again = timing.time_fn(matmul, device="cuda", repeat=20, cuda_graph=True)
    assert eager.device == "cuda" and len(eager.samples_ms) == 20
    # 2*2048^3 flop at <= 1000 TFLOP/s is >= 17 us: the events measured GPU work, not launch time
    assert eager.median > 0.017 and graphed.median > 0.017
    assert len(timing._CAPTURE_STREAMS) == 1 and again.median > 0  # one capture stream, reused


@pytest.mark.gpu
def test_gpu_only_timing_leaves_out_the_hosts_issue_time():
    """A call whose host work (0.3 ms asleep) outlasts its GPU work: timed as the loop sees it, it takes
    the host's time; with gpu_only the GPU spins first, so only the kernel is timed."""
    import time as _time

    import torch

    from qbench.timing import time_fn

    x = torch.randn(1024, device="cuda")

    def slow_to_issue():
        _time.sleep(3e-4)
        x.add_(1.0)

    wall = time_fn(slow_to_issue, device="cuda", repeat=20, flush_l2=False).median
    gpu = time_fn(slow_to_issue, device="cuda", repeat=20, flush_l2=False, gpu_only=True).median
    assert wall >= 0.25 and gpu < 0.1, (wall, gpu)


def test_time_interleaved_rotates_the_order_and_times_each_call():
    """One sample of each call per round, the first call of a round rotating, each sample its own call's
    time (a slow and a fast call keep their ratio)."""
    order = []

    def make(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call

    result = timing.time_interleaved({"slow": make("slow", 0.004), "fast": make("fast", 0.001)}, device="cpu",
                                     warmup=1, repeat=6)
    timed = order[4:]  # after one warm-up and one probe call each
    assert len(timed) == 12 and all(sorted(timed[2 * r:2 * r + 2]) == ["fast", "slow"] for r in range(6))
    assert timed[0:2] == ["slow", "fast"] and timed[2:4] == ["fast", "slow"]
    assert len(result["slow"].samples_ms) == len(result["fast"].samples_ms) == 6
    assert result["slow"].median > 2.5 * result["fast"].median


def test_time_interleaved_starts_every_sample_on_a_synchronized_device(monkeypatch):
    """The device is synchronized right before each timed call (after the flush), so no sample inherits
    a head start from GPU work its neighbour left queued."""
    events = []
    monkeypatch.setattr(timing, "_synchronize", lambda device: events.append("sync"))
    calls = {name: (lambda name=name: events.append(name)) for name in ("a", "b")}
    timing.time_interleaved(calls, device="cpu", warmup=1, repeat=3)
    timed = events[events.index("sync") + 1:]  # from the first sync after the warm-up on
    assert timed.count("a") == timed.count("b") == 4  # one probe sample and three rounds each
    assert all(timed[i - 1] == "sync" for i, e in enumerate(timed) if e != "sync")


@pytest.mark.gpu
def test_time_interleaved_gives_a_host_bound_call_no_head_start():
    """A host-bound call (0.3 ms asleep before its kernel) next to a CUDA-graph-like neighbour that leaves
    5 ms of GPU work queued and returns at once still takes the host's time."""
    import time as _time

    import torch

    x = torch.randn(1024, device="cuda")
    cycles = int(5e-3 * timing._sm_clock_hz())

    def slow_to_issue():
        _time.sleep(3e-4)
        x.add_(1.0)

    got = timing.time_interleaved({"busy": lambda: torch.cuda._sleep(cycles), "slow": slow_to_issue},
                                  device="cuda", repeat=10, flush_l2=False)
    assert got["slow"].median >= 0.25 and got["busy"].median >= 2.0, (got["slow"].median, got["busy"].median)


def test_host_time_times_calls_back_to_back_after_settling_calls(monkeypatch):
    """Samples come from calls issued back to back: each block starts with a synchronize and untimed
    settling calls, and the first calls after a wait (slow here, as on a GPU host) are never timed."""
    events = []
    monkeypatch.setattr(timing, "_synchronize", lambda device: events.append("sync"))
    since_sync = {"calls": 0}

    def call():
        if events and events[-1] == "sync":
            since_sync["calls"] = 0
        since_sync["calls"] += 1
        events.append("call")
        time.sleep(0.02 if since_sync["calls"] <= timing.HOST_SETTLE else 0.001)

    got = timing.host_time(call, device="cpu", warmup=1, repeat=11)
    assert len(got.samples_ms) == 11 and max(got.samples_ms) < 15, got.samples_ms
    blocks = "".join("s" if e == "sync" else "c" for e in events[1:]).split("s")[1:-1]
    settle = timing.HOST_SETTLE
    assert [len(b) for b in blocks] == [settle + timing.HOST_BLOCK, settle + 11 - timing.HOST_BLOCK]


def test_time_loops_times_blocks_issued_back_to_back_after_one_untimed_call(monkeypatch):
    """Each sample: a synchronize, one untimed call, then `block` calls of the same function back to back;
    blocks of the functions interleaved, the first of a round rotating; one sample per round each."""
    events = []
    monkeypatch.setattr(timing, "_synchronize", lambda device: events.append("|"))
    calls = {name: (lambda name=name: events.append(name)) for name in ("a", "b")}
    got = timing.time_loops(calls, device="cpu", warmup=1, repeat=3, block=4)
    blocks = [b for b in "".join(events).split("|") if b][1:]  # the warm-up calls ("ab") left out
    assert blocks == ["aaaaa", "bbbbb"] + ["aaaaa", "bbbbb", "bbbbb", "aaaaa", "aaaaa", "bbbbb"]  # probe, 3 rounds
    assert len(got["a"].samples_ms) == len(got["b"].samples_ms) == 3


def test_time_loops_sample_is_the_time_per_call_past_the_first(monkeypatch):
    """A sample is the block's time over its calls; the first call after a wait (slow here, as the first
    step after a synchronize is on a GPU host) is the untimed one."""
    since_sync = {"calls": 0}
    monkeypatch.setattr(timing, "_synchronize", lambda device: since_sync.update(calls=0))

    def call():
        since_sync["calls"] += 1
        time.sleep(0.03 if since_sync["calls"] == 1 else 0.002)

    got = timing.time_loops({"step": call}, device="cpu", warmup=1, repeat=4, block=5)["step"]
    assert len(got.samples_ms) == 4 and all(1.9 <= ms < 5 for ms in got.samples_ms), got.samples_ms


@pytest.mark.gpu
def test_time_loops_hides_a_host_faster_than_its_gpu_work_and_keeps_a_slower_one():
    """A step that takes 0.3 ms to issue 2 ms of GPU work runs at the GPU's pace in a loop (time_interleaved,
    starting it on an idle device, adds the host's lead); one that takes 0.6 ms to issue 0.05 ms of GPU
    work runs at the host's pace."""
    import time as _time

    import torch

    gpu_bound_cycles, host_bound_cycles = (int(s * timing._sm_clock_hz()) for s in (2e-3, 5e-5))

    def gpu_bound():
        _time.sleep(3e-4)
        torch.cuda._sleep(gpu_bound_cycles)

    def host_bound():
        _time.sleep(6e-4)
        torch.cuda._sleep(host_bound_cycles)

    calls = {"gpu_bound": gpu_bound, "host_bound": host_bound}
    loops = timing.time_loops(calls, device="cuda", repeat=10, flush_l2=False)
    idle = timing.time_interleaved(calls, device="cuda", repeat=10, flush_l2=False)
    assert loops["gpu_bound"].median < 0.9 * idle["gpu_bound"].median, (loops["gpu_bound"], idle["gpu_bound"])
    assert loops["host_bound"].median >= 0.55, loops["host_bound"].median


def test_phase_timer_replay_ms_reads_the_one_captured_step():
    """replay_ms: the phases of the one step recorded while capturing, a phase entered twice summed;
    a timer holding more than one step (not a captured step) is refused."""
    timer = timing.PhaseTimer("cpu", captured=True)
    for name, seconds in (("a", 0.002), ("b", 0.001), ("a", 0.002)):
        with timer.phase(name):
            time.sleep(seconds)
    got = timer.replay_ms()
    assert list(got) == ["a", "b"] and got["a"] >= 4.0 and 1.0 <= got["b"] < got["a"], got
    timer.next_step()
    with timer.phase("a"):
        pass
    with pytest.raises(ValueError):
        timer.replay_ms()


@pytest.mark.gpu
def test_phase_timer_times_the_phases_of_every_graph_replay():
    """Phases recorded while capturing a CUDA graph time each replay: a sleeping kernel of ~2 ms inside
    one phase, nothing inside the other."""
    import torch

    timer = timing.PhaseTimer("cuda", captured=True)
    cycles = int(2e-3 * timing._sm_clock_hz())
    x = torch.zeros(16, device="cuda")

    def step():
        with timer.phase("sleep"):
            torch.cuda._sleep(cycles)
        with timer.phase("add"):
            x.add_(1.0)

    replay = timing.graph_replay(step, timer.discard)
    for _ in range(3):
        replay()
        got = timer.replay_ms()
        assert got["sleep"] >= 1.5 and got["add"] < 0.5, got


def test_observe_is_called_once_per_round_outside_the_samples():
    """time_fn calls observe after every timed call, time_interleaved after every round of calls."""
    seen = []
    got = timing.time_fn(lambda: seen.append("call"), device="cpu", warmup=1, repeat=4,
                         observe=lambda: seen.append("observe"))
    # warm-up call, probe call, then call/observe per repeat
    assert len(got.samples_ms) == 4 and seen == ["call", "call"] + ["call", "observe"] * 4
    seen.clear()
    timing.time_interleaved({"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}, device="cpu",
                            warmup=1, repeat=2, observe=lambda: seen.append("observe"))
    assert seen[4:] == ["a", "b", "observe", "b", "a", "observe"]  # after warm-up and the probe round


def test_gpu_readings_report_medians_and_nothing_without_a_reading():
    from qbench import units
    from qbench.telemetry import GpuReadings

    cpu = GpuReadings("cpu")
    cpu()
    assert not cpu.available and cpu.metrics("kernels") == {}
    readings = GpuReadings("cpu")
    readings.clock_mhz, readings.power_w = [1980.0, 1590.0, 1605.0], [120.0, 690.0, 692.0]
    assert readings.metrics("graph") == {"sm_clock_mhz_graph": 1605.0, "power_w_graph": 690.0}
    from qbench.metrics.common import TELEMETRY

    declared = {m.name: m.unit for m in TELEMETRY}
    assert declared["sm_clock_mhz"] == units.MHZ and declared["power_w"] == units.WATTS
    assert units.direction(units.MHZ) == units.direction(units.WATTS) == 0  # informative: no verdict


def test_time_ranks_in_blocks_times_each_step_behind_an_untimed_one():
    import time

    seen = []

    def step(i):
        seen.append(i)
        time.sleep(0.01)

    result = timing.time_ranks(step, steps=2, warmup=1, device="cpu", block=3, observe=lambda: seen.append("o"))
    assert seen == [-1, 0, 0, 0, 0, "o", 1, 1, 1, 1, "o"]  # per block: one untimed step, then three timed
    assert len(result.samples_ms) == 2
    assert all(9.5 <= ms < 25 for ms in result.samples_ms), result.samples_ms  # per step (~10 ms), not per block


def test_time_ranks_observes_each_timed_step_not_the_warm_up():
    seen = []
    timing.time_ranks(lambda i: seen.append(i), steps=3, warmup=2, device="cpu", observe=lambda: seen.append("o"))
    assert seen == [-2, -1, 0, "o", 1, "o", 2, "o"]
