"""Honest `qbench moe` records: the drift rule, non-finite runs, and the execution modes' refusals."""

import json

import pytest
import torch

from qbench import samples
from qbench.benches.moe import MoEBenchConfig, modes, plan
from qbench.benches.moe.cases import Case
from qbench.benches.moe.rank import record_of
from qbench.layers.moe import MoELayer, MoEOptions

CONFIG = MoEBenchConfig(world_size=1, backend="gloo", device="cpu", dtype="fp32", model_dim=16, hidden_size=24,
                        samples=32, num_steps=40, warmup=1, execs=("eager", "compile"))
CASE = Case(num_local_experts=2, a2a_ffn_overlap_degree=1, replicate_hot=0, routing="randn", gemm="auto",
            locality=None, variant="a2a")
STATS = {"expert_load_max_over_mean": 1.0, "rank_load_max_over_mean": 1.0, "dropped_tokens": 0.0,
         "computed_rows": 64.0, "sent_rows": 64.0}
MAX_ERROR = 1.25e-6  # the reference check's largest relative error


def _steps(first: float, last: float, n: int = 40) -> list[float]:
    """n step times rising linearly from `first` to `last` ms, with a little alternating noise."""
    return [first + (last - first) * i / (n - 1) + (0.01 if i % 2 else -0.01) for i in range(n)]


def _records(samples: dict, exec: str = "eager", device: str = "cpu", finite: bool = True) -> dict[str, dict]:
    """timing (or "rank <r>") -> the record of one measurement with these samples."""
    params = {"exec": exec, "world_size": 1, "variant": "a2a"}
    extra = {"peak_memory_mb": None, "host_ms": 0.5}
    records = record_of(CONFIG, CASE, params, 1, samples, dict(STATS), extra, MAX_ERROR, device, finite)
    return {r["params"].get("timing", "none") if "rank" not in r["params"] else f"rank {r['params']['rank']}": r
            for r in records}


def _record(samples: list[float], finite: bool = True) -> dict:
    (record,) = _records({"step_time": samples}, finite=finite).values()
    return record


def test_drift_compares_the_last_tenth_with_the_first():
    assert samples.drift(_steps(1.0, 1.0)) == pytest.approx(0.0, abs=0.02)
    assert samples.drift(_steps(1.0, 1.5)) == pytest.approx(0.45, abs=0.03)  # tenths' medians: ~1.03 and ~1.49
    assert samples.drift(_steps(1.0, 1.5, n=samples.DRIFT_MIN_SAMPLES - 1)) is None  # too few to tell from noise
    assert samples.drift_error(_steps(1.0, 1.1)) is None  # 9% slower: within the 20% limit
    assert "drifted" in samples.drift_error(_steps(1.0, 1.5))


def test_a_drifting_run_records_an_error_never_ok():
    steady = _record(_steps(2.0, 2.1))
    assert steady["status"] == "ok" and steady["metrics"]["step_ms"] > 0 and steady["metrics"]["host_ms"] == 0.5
    assert steady["metrics"]["check_max_rel_error"] == MAX_ERROR  # the check's value, not parsed from a message
    drifting = _records({"step_time": _steps(2.0, 3.0), "loop_step_time": [1.0, 1.1, 1.0]})
    assert set(drifting) == {"per_step", "loop"}
    for record in drifting.values():  # the whole measurement, loop included, is an error
        assert record["status"] == "error", "a run 45% slower at its end was recorded as ok"
        assert "drifted" in record["error"] and record["samples"]["step_ms"], record["error"]


def test_clock_and_power_samples_get_their_units_and_medians():
    samples = {"step_time": _steps(2.0, 2.0), "sm_clock_mhz_step": [1980.0, 1515.0, 1500.0],
               "power_w_step": [600.0, 690.0, 700.0]}
    record = _records(samples, exec="graph", device="cuda")["per_step"]
    m, u = record["metrics"], record["units"]
    assert (m["sm_clock_mhz"], m["power_w"]) == (1515.0, 690.0)
    assert (u["sm_clock_mhz"], u["power_w"], u["step_ms"]) == ("MHz", "W", "ms")


def test_loop_readings_are_named_for_the_loop_and_left_out_without_readings():
    """The loop's clock and power (the sustained regime of the loop's step) are samples of their own, next to
    the plain pass's, and land in the loop's record; a pass NVML could not read adds no key."""
    from qbench.benches.moe.steps import _telemetry
    from qbench.telemetry import GpuReadings

    read = GpuReadings("cpu")
    read.clock_mhz, read.power_w = [1770.0, 1650.0], [634.0, 640.0]
    assert _telemetry(read, "loop") == {"sm_clock_mhz_loop": [1770.0, 1650.0], "power_w_loop": [634.0, 640.0]}
    assert _telemetry(GpuReadings("cpu"), "loop") == {}
    samples = {"step_time": _steps(2.0, 2.0), "loop_step_time": [1.9, 2.0, 2.1], **_telemetry(read, "loop")}
    records = _records(samples, device="cuda")
    loop = records["loop"]
    assert (loop["units"]["sm_clock_mhz"], loop["units"]["power_w"]) == ("MHz", "W")
    assert loop["metrics"]["sm_clock_mhz"] == 1710.0 and loop["metrics"]["step_ms"] == 2.0
    assert "sm_clock_mhz" not in records["per_step"]["metrics"]  # the plain pass was not read


def test_the_table_shows_the_clock_only_where_a_record_has_it():
    from rich.console import Console

    from qbench.benches.moe.output import table

    def rendered(samples):
        console = Console(record=True, width=400)
        console.print(table(list(_records(samples, device="cuda").values())))
        return console.export_text()

    assert "clock" not in rendered({"step_time": _steps(2.0, 2.0), "loop_step_time": [1.0, 1.1, 1.2]})
    with_clock = rendered({"step_time": _steps(2.0, 2.0), "loop_step_time": [1.0, 1.1, 1.2],
                           "sm_clock_mhz_loop": [1635.0, 1620.0, 1672.0]})
    assert "clock" in with_clock and "1,635" in with_clock  # the median of the loop's readings
    assert "timing" in with_clock and "per_step" in with_clock and "loop" in with_clock


def test_a_diverged_run_records_an_error():
    record = _record(_steps(2.0, 2.0), finite=False)
    assert record["status"] == "error" and "not finite" in record["error"] and not record["metrics"]


def _layer(cf: float, world_size: int, hot: int = 0) -> MoELayer:
    opts = MoEOptions(16, 24, 2, 2, capacity_factor=cf, replicate_hot=hot)
    return MoELayer(opts, rank=0, world_size=world_size, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("mode, cf, world_size, hot, model, words", [
    ("graph", 0.0, 2, 0, "layer", "dropless routing: the host must learn"),
    ("graph", -0.5, 1, 0, "layer", "capped capacity"),
    ("compile", 1.0, 1, 1, "layer", "replication"),
    ("compile", 1.0, 2, 0, "layer", "world-size-1"),
    ("graph", 1.0, 1, 0, "attn-moe", "DistributedDataParallel"),
    ("graph", 1.0, 2, 0, "layer", None),  # fixed capacity: static at any world size
    ("graph", 0.0, 1, 0, "layer", None),  # world size 1: dropless keeps all k * T rows, static
    ("compile", 0.5, 1, 0, "layer", None),
    ("eager", 0.0, 2, 3, "attn-moe", None),
])
def test_modes_say_why_they_cannot_run(mode, cf, world_size, hot, model, words):
    config = MoEBenchConfig(world_size=world_size, backend="gloo", device="cpu", model=model, capacity_factor=cf)
    reason = modes.refusal(mode, config, _layer(cf, world_size, hot), world_size)
    if words is None:
        assert reason is None, reason
    else:
        assert reason is not None and words in reason and "\n" not in reason, reason


def test_the_plan_has_one_item_per_case_and_mode():
    items = plan(MoEBenchConfig(world_size=1, backend="gloo", device="cpu", num_local_experts=(2, 4),
                                execs=("eager", "compile", "graph")))
    assert [(i["num_local_experts"], i["exec"]) for i in items] == [
        (L, m) for L in (2, 4) for m in ("eager", "compile", "graph")]


@pytest.mark.parametrize("dtype, refused", [(torch.float16, True), (torch.float32, True), (torch.bfloat16, False)])
def test_graph_refuses_torch_grouped_mm_where_it_reads_offsets_on_the_host(dtype, refused):
    opts = MoEOptions(16, 24, 2, 2, capacity_factor=1.0, gemm="torch")
    layer = MoELayer(opts, rank=0, world_size=1, dtype=dtype, device="cpu")
    config = MoEBenchConfig(world_size=1, backend="gloo", device="cpu", capacity_factor=1.0)
    reason = modes.refusal("graph", config, layer, 1)
    assert (reason is not None and "torch._grouped_mm" in reason) == refused, reason
    assert modes.refusal("eager", config, layer, 1) is None


def test_default_modes_are_every_mode_the_device_runs(monkeypatch):
    from qbench import dist
    from qbench.benches.moe.config import EXECS, resolve

    assert resolve(MoEBenchConfig(world_size=1, backend="gloo", device="cpu")).execs == ("eager",)
    monkeypatch.setattr(dist, "visible_gpus", lambda: 1)
    assert resolve(MoEBenchConfig(world_size=1, backend="auto", device="cuda")).execs == EXECS
    assert resolve(MoEBenchConfig(world_size=1, backend="gloo", device="cpu", execs=("graph",))).execs == ("graph",)


def test_the_plan_runs_each_backward_thread_where_autograd_runs_a_backward():
    config = MoEBenchConfig(world_size=1, backend="gloo", device="cpu", execs=("eager", "compile", "graph"),
                            backward_threads=("device", "calling"))
    assert [(i["exec"], i["backward_thread"]) for i in plan(config)] == [
        ("eager", "device"), ("eager", "calling"), ("compile", "device"), ("compile", "calling"), ("graph", "device")]
    forward_only = MoEBenchConfig(world_size=1, backend="gloo", device="cpu", eval=True, backward_threads=("calling",
                                                                                                         "device"))
    assert [i["backward_thread"] for i in plan(forward_only)] == ["calling"]


@pytest.mark.usefixtures("torch_path")
def test_a_cpu_run_records_each_backward_thread_and_restores_the_engine(tmp_path, capsys):
    import json

    from qbench.cli import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["moe", "--device", "cpu", "--world-size", "1", "--model-dim", "16", "--hidden-size", "24", "--samples",
              "32", "--num-local-experts", "2", "--num-steps", "3", "--warmup", "1", "--backward-thread",
              "device,calling", "--out", str(out)])
    printed = capsys.readouterr().out
    assert exc.value.code == 0, printed
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["params"]["backward_thread"], r["params"]["timing"], r["status"]) for r in records] == [
        (thread, timing, "ok") for thread in ("device", "calling") for timing in ("per_step", "loop")]
    for r in records[1::2]:  # the step in a loop too: its samples (3 blocks at least), median and throughput
        assert len(r["samples"]["step_ms"]) == 3 and r["units"]["step_ms"] == "ms"
        assert r["metrics"]["step_ms"] > 0 and r["metrics"]["tflops"] > 0
    assert "bwd" in printed  # the column, shown because the records differ in it
    assert torch.autograd.is_multithreading_enabled()  # the default is back once the run is over


@pytest.mark.usefixtures("torch_path")
def test_resume_runs_the_configurations_a_cut_run_lacks(tmp_path, capsys, monkeypatch):
    import contextlib

    from qbench import report
    from qbench.cli import main

    bars: list[list] = []  # per command: [total, the label of each advance]

    @contextlib.contextmanager
    def progress(total, description):
        bars.append([total])
        yield lambda label="": bars[-1].append(label)

    monkeypatch.setattr(report, "progress", progress)

    out = tmp_path / "run"
    args = ["moe", "--device", "cpu", "--world-size", "1", "--model-dim", "16", "--hidden-size", "24",
            "--samples", "32", "--num-local-experts", "2,4", "--num-steps", "3", "--warmup", "1", "--out", str(out)]

    def qbench(*extra) -> str:
        with pytest.raises(SystemExit) as exc:
            main(args + list(extra))
        err = capsys.readouterr().err
        assert exc.value.code == 0, err
        return err

    qbench()
    assert bars[-1][0] == 2 and len(bars[-1]) == 3  # progress counts the 2 measurements, not their 4 records
    first = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert [(json.loads(line)["params"]["num_local_experts"], json.loads(line)["params"]["timing"])
            for line in first] == [(2, "per_step"), (2, "loop"), (4, "per_step"), (4, "loop")]
    (out / "results.jsonl").write_text("".join(first[:2]))  # the run stopped after its first measurement
    err = qbench("--resume")
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert lines[:2] == first[:2] and len(lines) == 4  # the kept records as they were, the missing ones measured
    assert [json.loads(line)["params"]["num_local_experts"] for line in lines] == [2, 2, 4, 4]
    assert "2 records added; 4 records in" in err
    assert bars[-1][0] == 1 and len(bars[-1]) == 2  # one measurement left, one advance


@pytest.mark.gpu
def test_graph_mode_reuses_no_gradient_accumulator_of_an_earlier_capture(tmp_path, capfd):
    """graph mode captures twice (the timed step, then the phase breakdown) with eager warm-up steps before
    each: the first capture's kept output must be gone by then, or the warm-up steps reuse its parameters'
    gradient accumulators across streams (torch warns: "The AccumulateGrad node's stream does not match")."""
    import warnings

    from qbench.cli import main

    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as exc:
            main(["moe", "--world-size", "1", "--capacity-factor", "1.0", "--exec", "graph", "--model-dim", "256",
                  "--hidden-size", "512", "--samples", "1024", "--num-local-experts", "4", "--num-steps", "4",
                  "--warmup", "1", "--out", str(out)])
    printed = capfd.readouterr()
    assert exc.value.code == 0, printed.err[-2000:]
    record = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert record["status"] == "ok" and "forward_ms" in record["metrics"], record
    assert not [w for w in seen if "AccumulateGrad" in str(w.message)]
    assert "AccumulateGrad" not in printed.err
