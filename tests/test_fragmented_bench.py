"""`qbench fragmented` end to end on the CPU: records, the correctness gate, the seed layout, errors."""

import json
import re

import pytest

from qbench.benches import fragmented as bench
from qbench.cli import main
from qbench.dtypes import tolerance
from qbench.store import load_run

PARAMS = {"in_features", "out_features", "batch_size", "variant", "task", "fragments", "dtype", "exec",
          "backward_thread"}


def run_cli(args, capsys):
    """The command on the CPU (these tests pin what a CPU run records), unless args name a --device."""
    device = [] if "--device" in args else ["--device", "cpu"]
    with pytest.raises(SystemExit) as exc:
        main(["fragmented", *args, *device])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def seed_numbers(text):
    """[(section, fragments, forward, backward, peak, parameters)] in the order of a seed-style report."""
    rows, section, frag = [], None, 0
    for line in text.splitlines():
        if line.startswith(("Linear Layer:", "FragmentedLinear")):
            section, frag = line.rstrip(":"), 0
        elif m := re.match(r"Fragments: (\d+)", line):
            frag = int(m.group(1))
        elif m := re.match(r"  Forward time: ([\d.]+)ms", line):
            current = [section, frag, float(m.group(1))]
        elif m := re.match(r"  (?:Backward time|Peak memory): ([\d.]+)", line):
            current.append(float(m.group(1)))
        elif m := re.match(r"  Parameters: (\d+)", line):
            rows.append(tuple(current + [int(m.group(1))]))
    return rows


def test_cpu_run_writes_complete_records(tmp_path, capsys):
    out = tmp_path / "run"
    # one batch size: single rows and odd shapes are the layer's own tests (tests/test_fragmented_layer.py)
    code, stdout, err = run_cli(["--sizes", "96", "--batch-sizes", "5", "--fragments", "3,4",
                                 "--dtype", "fp32,bf16", "--steps", "2", "--warmup", "1", "--out", str(out)], capsys)
    assert code == 0, err
    assert "CPU" in err
    _, records = load_run(out)
    # per dtype: 3 tasks x (dense, lowrank + 2 N x (fragmented, blockdiag))
    assert len(records) == 2 * 3 * 6
    for rec in records:
        assert rec["status"] == "ok", rec["error"]
        assert set(rec["params"]) == PARAMS
        assert set(rec["metrics"]) <= set(rec["units"]) and rec["params"]["variant"] in bench.VARIANTS
        assert not [k for k in rec["metrics"] if k.startswith(("sm_clock_mhz_", "power_w_"))]  # no GPU, no readings
        assert rec["metrics"]["forward_ms"] > 0 and len(rec["samples"]["forward_ms"]) == 2
        if rec["params"]["task"] == "inference":
            assert "backward_ms" not in rec["metrics"]
        else:
            m = rec["metrics"]
            assert m["backward_optimizer_ms"] >= m["backward_ms"] and m["optimizer_state_mb"] > 0
            assert m["step_ms"] >= m["backward_optimizer_ms"] and m["fwd_bwd_ms"] > 0
            assert m["host_step_ms"] > 0 and m["host_fwd_bwd_ms"] > 0
        assert rec["params"]["exec"] == "eager"  # the CPU default
    frag = [r for r in records if r["params"]["variant"] == "fragmented"]
    assert all(r["metrics"]["rel_error_train"] <= tolerance(r["params"]["dtype"]).layer for r in frag)
    counts = {r["params"]["variant"]: r["metrics"]["parameters"] for r in records if r["params"]["fragments"] in (0, 3)}
    assert counts == {"dense": 96 * 96, "lowrank": 2 * 96 * 3, "blockdiag": 96 * 96 // 3,
                      "fragmented": 96 + 96 * 96 + 2 * 96 * 3}


def test_seed_format_reproduces_the_seed_layout(fixtures_dir):
    """Records carrying the seed's own numbers print back as the seed's text, line for line."""
    text = (fixtures_dir / "fragmented_seed_excerpt.txt").read_text()
    records = []
    for size_text, block in zip(re.findall(r"input_size=(\d+)", text), text.split("Benchmarking with")[1:]):
        size, batch = int(size_text), int(re.search(r"batch_size=(\d+)", block).group(1))
        for section, frag, fwd, bwd, peak, count in seed_numbers(block):
            variant = "dense" if section.startswith("Linear") else "fragmented"
            task = "eval" if "Inference" in section else "train"
            params = {"in_features": size, "out_features": size, "batch_size": batch, "variant": variant,
                      "task": task, "fragments": frag, "dtype": "fp32"}
            metrics = {"forward_ms": fwd, "backward_optimizer_ms": bwd, "peak_memory_mb": peak, "parameters": count}
            records.append({"bench": "fragmented", "status": "ok", "params": params, "metrics": metrics})
    assert len(records) == 3 * 9
    header, body = bench.format_seed(records).split("\n", 1)
    assert header == "#qbench fragmented, dtype=fp32"
    assert body == text


def test_seed_format_from_a_real_run(tmp_path, capsys):
    code, stdout, err = run_cli(["--sizes", "64", "--batch-sizes", "2", "--fragments", "2,8", "--tasks",
                                 "train,eval", "--baselines", "dense", "--steps", "2", "--warmup", "0",
                                 "--out", str(tmp_path / "r"), "--format", "seed"], capsys)
    assert code == 0, err
    assert "Benchmarking with input_size=64, output_size=64, batch_size=2" in stdout
    _, records = load_run(tmp_path / "r")
    printed = seed_numbers(stdout)
    assert [(s, f) for s, f, *_ in printed] == [("Linear Layer", 0), ("FragmentedLinear (Train) Results", 2),
                                               ("FragmentedLinear (Train) Results", 8),
                                               ("FragmentedLinear (Inference) Results", 2),
                                               ("FragmentedLinear (Inference) Results", 8)]
    by_key = {(r["params"]["variant"], r["params"]["task"], r["params"]["fragments"]): r for r in records}
    keys = [("dense", "train", 0), ("fragmented", "train", 2), ("fragmented", "train", 8),
            ("fragmented", "eval", 2), ("fragmented", "eval", 8)]
    for (_, _, fwd, bwd, _, count), rec in zip(printed, [by_key[k] for k in keys]):
        assert fwd == pytest.approx(rec["metrics"]["forward_ms"], abs=0.005)
        assert bwd == pytest.approx(rec["metrics"]["backward_optimizer_ms"], abs=0.005)
        assert count == rec["metrics"]["parameters"]


@pytest.mark.gpu
def test_gpu_run_passes_its_checks_in_every_mode(tmp_path, capsys):
    """On a GPU each compiled and graphed step is checked against eager before it is timed (the check that
    caught the grouped eval path's lost dW under torch 2.11's compile, at this very configuration): every
    record of a small sweep in every mode is ok."""
    out = tmp_path / "run"
    code, _, err = run_cli(["--sizes", "96", "--batch-sizes", "1", "--fragments", "4", "--dtype", "fp32",
                            "--steps", "2", "--warmup", "1", "--device", "cuda", "--out", str(out)], capsys)
    _, records = load_run(out)
    assert {r["params"]["exec"] for r in records} == {"eager", "compile", "graph"}
    assert [(r["case"], r["error"]) for r in records if r["status"] != "ok"] == []
    assert code == 0, err


def test_gate_records_a_wrong_layer_as_an_error_and_does_not_time_it(tmp_path, capsys, monkeypatch):
    from qbench.layers.fragmented import FragmentedLinear

    original = FragmentedLinear._hard
    monkeypatch.setattr(FragmentedLinear, "_hard", lambda self, x, p: original(self, x, p) * 1.01)
    code, stdout, err = run_cli(["--sizes", "64", "--batch-sizes", "3", "--fragments", "4", "--tasks", "eval",
                                 "--baselines", "none", "--steps", "1", "--out", str(tmp_path / "g"), "--json"], capsys)
    assert code == 1
    (rec,) = json.loads(stdout)
    assert rec["status"] == "error" and "rel_error_eval" in rec["error"]
    assert "forward_ms" not in rec["metrics"] and rec["metrics"]["rel_error_train"] < 1e-4


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "100", "--fragments", "3"], "not divisible"),
    (["--sizes", "16", "--fragments", "2"], "below 32"),
    (["--tasks", "train,fast"], "unknown fast"),
    (["--baselines", "conv"], "unknown conv"),
    (["--sizes", "64,x"], "not an integer"),
    (["--dtype", "fp8"], "unknown fp8"),
    (["--steps", "0"], "--steps"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_help_ends_with_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fragmented", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.rstrip().splitlines()[-1].strip().startswith("qbench fragmented --sizes 4096 --steps 100")
    assert "Examples:" in out


def test_plan_orders_baselines_first_and_respects_choices():
    config = bench.FragmentedConfig(sizes=(64,), batch_sizes=(1,), fragments=(2, 4), tasks=("train",),
                                    baselines=("blockdiag",), device="cpu")
    cases = bench.plan(bench.resolve(config))
    assert [(c.variant, c.fragments) for c in cases] == [("fragmented", 2), ("blockdiag", 2),
                                                       ("fragmented", 4), ("blockdiag", 4)]


def test_plan_sweeps_backward_threads_only_where_a_step_runs_backward():
    config = bench.FragmentedConfig(sizes=(64,), batch_sizes=(1,), fragments=(2,), tasks=("train", "inference"),
                                    baselines=(), device="cpu", execs=("eager", "compile"),
                                    backward_threads=("calling", "device"))
    cases = bench.plan(bench.resolve(config))
    assert [(c.task, c.exec, c.backward_thread) for c in cases] == [
        ("train", "eager", "calling"), ("train", "eager", "device"), ("train", "compile", "calling"),
        ("train", "compile", "device"), ("inference", "eager", "calling"), ("inference", "compile", "calling")]


def test_training_steps_run_with_the_case_backward_thread(tmp_path, capsys, monkeypatch):
    """--backward-thread device,calling: each train case's steps run with autograd's multithreading as its
    backward_thread param says (on the CPU both run on the calling thread, so the engine flag is what differs)."""
    import torch

    from qbench.benches.fragmented import steps

    seen = []
    measure_training = steps.measure_training

    def spy(*args, **kwargs):
        seen.append(torch._C._is_multithreading_enabled())
        return measure_training(*args, **kwargs)

    monkeypatch.setattr(steps, "measure_training", spy)
    out = tmp_path / "run"
    code, stdout, err = run_cli(["--sizes", "64", "--batch-sizes", "2", "--fragments", "2", "--tasks", "train",
                                 "--baselines", "none", "--steps", "2", "--warmup", "1",
                                 "--backward-thread", "device,calling", "--out", str(out)], capsys)
    assert code == 0, err
    _, records = load_run(out)
    assert [r["params"]["backward_thread"] for r in records] == ["device", "calling"]
    assert seen == [True, False]
    assert torch._C._is_multithreading_enabled()  # restored after the sweep
    assert "bwd thread" in stdout


def test_records_carry_the_median_clock_and_power_of_each_timed_loop(tmp_path, capsys, monkeypatch):
    """With readable GPU telemetry (faked here: one fixed reading per call), a train record gets the clock and
    power medians of its timed steps (step) and forward + backward calls (fwd_bwd), an inference record those of
    its forward calls, one reading per timed step, with units MHz and W by name."""
    from qbench.benches.fragmented import steps
    from qbench.telemetry import GpuReadings

    made = []

    class Readable(GpuReadings):
        def __init__(self, device):
            super().__init__(device)
            self.available = True
            made.append(self)

        def __call__(self):  # first, median and last of three calls all differ
            i = len(self.clock_mhz) % 3
            self.clock_mhz.append((1980.0, 1600.0, 1500.0)[i])
            self.power_w.append((700.0, 450.0, 300.0)[i])

    monkeypatch.setattr(steps, "GpuReadings", Readable)
    out = tmp_path / "run"
    code, _, err = run_cli(["--sizes", "64", "--batch-sizes", "2", "--fragments", "2", "--tasks", "train,inference",
                            "--baselines", "none", "--steps", "3", "--warmup", "1", "--out", str(out)], capsys)
    assert code == 0, err
    _, records = load_run(out)
    assert [r["params"]["task"] for r in records] == ["train", "inference"]
    assert [len(r.clock_mhz) for r in made] == [3, 3, 3]  # train steps, fwd_bwd calls, inference calls
    whats = {"train": ("step", "fwd_bwd"), "inference": ("forward",)}
    for rec in records:
        telemetry = {k: v for k, v in rec["metrics"].items() if k.startswith(("sm_clock_mhz_", "power_w_"))}
        what = whats[rec["params"]["task"]]
        assert telemetry == {**{f"sm_clock_mhz_{w}": 1600.0 for w in what}, **{f"power_w_{w}": 450.0 for w in what}}
        assert all(rec["units"][k] == ("MHz" if k.startswith("sm_") else "W") for k in telemetry)


def test_forward_cost_counts_useful_work():
    train = bench.Case(size=8192, batch=16, variant="fragmented", task="train", fragments=2, dtype="fp32")
    hard = bench.Case(size=8192, batch=16, variant="fragmented", task="eval", fragments=128, dtype="bf16")
    linear = bench.Case(size=8192, batch=16, variant="dense", task="train", fragments=0, dtype="fp32")
    flops, moved = bench.forward_cost(train, None)
    assert flops == 2 * 16 * (8192 * 8192 + 2 * 8192 * 256 + 8192)
    assert moved == 4 * (8192 * 8192 + 2 * 8192 * 256 + 8192 + 16 * 2 * 8192)
    # hard selection of 5 distinct fragments reads 5/128 of the expert weights
    assert bench.forward_cost(hard, 5)[1] == 2 * (5 * 8192 * 64 + 2 * 8192 * 256 + 8192 + 16 * 2 * 8192)
    assert bench.forward_cost(linear, None)[0] == 2 * 16 * 8192 * 8192


def test_compile_mode_is_checked_against_eager_and_timed(tmp_path, capsys):
    """--exec compile: one record per configuration and mode, the compiled step checked against the
    eager one before it is timed; --exec graph on the CPU is a one-line usage error."""
    out = tmp_path / "run"
    code, _, err = run_cli(["--sizes", "64", "--batch-sizes", "3", "--fragments", "2", "--tasks", "train",
                            "--baselines", "dense", "--steps", "2", "--warmup", "1", "--exec", "eager,compile",
                            "--out", str(out)], capsys)
    assert code == 0, err
    _, records = load_run(out)
    assert sorted((r["params"]["variant"], r["params"]["exec"]) for r in records) == [
        ("dense", "compile"), ("dense", "eager"), ("fragmented", "compile"), ("fragmented", "eager")]
    assert all(r["status"] == "ok" and r["metrics"]["fwd_bwd_ms"] > 0 for r in records), records
    code, _, err = run_cli(["--sizes", "64", "--exec", "graph", "--out", str(tmp_path / "g")], capsys)
    assert code == 2 and "needs a CUDA device" in err and len(err.strip().splitlines()) == 1


def test_resume_measures_only_the_configurations_a_run_lacks(tmp_path, capsys, monkeypatch):
    from qbench.benches.fragmented import sweep

    out = tmp_path / "run"
    args = ["--sizes", "64", "--batch-sizes", "2", "--fragments", "2", "--modes", "train", "--baselines", "linear",
            "--steps", "1", "--warmup", "0", "--out", str(out)]
    assert run_cli(args, capsys)[0] == 0
    first = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert len(first) == 2
    (out / "results.jsonl").write_text(first[0])  # the run stopped after its first record
    measured = []
    real = sweep.measure
    monkeypatch.setattr(sweep, "measure", lambda case, config: measured.append(case.variant) or real(case, config))
    code, _, err = run_cli(["--resume", *args], capsys)
    assert code == 0, err
    assert measured == [json.loads(first[1])["params"]["variant"]]  # only the missing one ran
    assert (out / "results.jsonl").read_text().splitlines(keepends=True)[0] == first[0]
    assert "1 record added; 2 records in" in err


def test_trace_profiles_each_eager_configuration_after_timing_it(tmp_path, capsys):
    """--trace (here inside the run directory): per eager configuration a Chrome trace whose steps hold the forward
    and the backward as ranges, and a kernel CSV beside it (no GPU work on the CPU: `qbench trace` says so)."""
    import gzip

    from qbench.traces import COLUMNS, read_gpu_table

    out = tmp_path / "run"
    code, _, err = run_cli(["--sizes", "64", "--batch-sizes", "2", "--fragments", "2", "--tasks", "train,inference",
                            "--baselines", "dense", "--steps", "1", "--warmup", "0", "--out", str(out),
                            "--trace", str(out / "traces")], capsys)
    assert code == 0, err
    assert len(load_run(out)[1]) == 4
    stems = sorted(p.name.removesuffix(".csv") for p in (out / "traces").glob("*.csv"))
    assert stems == ["dense-64-b2-n0-inference-fp32-device-rank0", "dense-64-b2-n0-train-fp32-device-rank0",
                     "fragmented-64-b2-n2-inference-fp32-device-rank0", "fragmented-64-b2-n2-train-fp32-device-rank0"]
    trace = json.loads(gzip.open(out / "traces" / f"{stems[3]}.json.gz").read())
    ranges = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert sorted(set(ranges)) == ["backward", "forward", "step 0", "step 1", "step 2"]
    assert ranges.count("backward") == 3
    inference = json.loads(gzip.open(out / "traces" / f"{stems[2]}.json.gz").read())
    assert "backward" not in {e.get("name") for e in inference["traceEvents"]}
    csv_path = out / "traces" / f"{stems[3]}.csv"
    assert csv_path.read_text().splitlines()[0] == ",".join(COLUMNS) and read_gpu_table(csv_path) == []
    with pytest.raises(SystemExit) as exc:
        main(["trace", str(csv_path)])
    assert exc.value.code in (0, None)
    assert "no GPU work in this table" in capsys.readouterr().out
