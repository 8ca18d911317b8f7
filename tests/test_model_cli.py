"""`qbench model` end to end: DeepFlow's report on stdout, records, sweeps, search, floors, --against,
calibration on the CPU, and one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qbench import store
from qbench.cli import main
from tests.helpers import write_run
from tests.test_model_roofline import moe_record, switchback_record

FIXTURES = Path(__file__).parent / "fixtures"
SEED_CONFIG = str(FIXTURES / "deepflow_seed_config.yaml")
SEED_REPORT = FIXTURES / "deepflow_seed_summary.txt"
HARNESS_BUDGET = 86400 / ((100 * 768_648_884) // (32 * 20))  # one day over the harness's steps (batch 32)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_lstm_debug_prints_the_seed_report_then_a_summary(capsys, tmp_path):
    # the seed's last line is its harness's budget (reference 7.3), given here as the time budget
    code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, "--debug", "--out", str(tmp_path / "r"),
                             "--time-budget", repr(HARNESS_BUDGET))
    assert code == 0, err
    want = SEED_REPORT.read_text().splitlines()
    got = out.splitlines()[: len(want)]
    bad = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"first mismatches (line, got, want): {bad[:3]}"
    assert "Time per step" in out and "does NOT fit" in out
    _, records = store.load_run(tmp_path / "r")
    (rec,) = records
    assert rec["bench"] == "model" and rec["params"]["workload"] == "lstm"
    assert f"{rec['metrics']['time_s']:.8f}" == "302.88817584"
    assert rec["metrics"]["softmax_b_s"] == pytest.approx(143.5923132573369, rel=1e-15)
    assert rec["units"]["time_s"] == "s" and rec["metrics"]["fits"] == 0


def test_lstm_set_and_sweep(capsys, tmp_path):
    code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG,
                             "--set", "scheduling_param.topology=mesh", "--set", "model_param.batch_size=64",
                             "--sweep", "scheduling_param.dp=1,2,4",
                             "--out", str(tmp_path / "s"))
    assert code == 0, err
    _, records = store.load_run(tmp_path / "s")
    assert [r["params"]["dp"] for r in records] == [1, 2, 4]
    assert all(r["params"]["batch_size"] == 64 for r in records)
    times = [r["metrics"]["time_s"] for r in records]
    assert times[0] != times[1] != times[2]
    assert "Time:" not in out  # a sweep prints the table, not three DeepFlow reports


@pytest.mark.parametrize("args, needle", [
    (["--sweep", "scheduling_param.dp=1,2"], "scheduling_param.topology: 'ring'"),
    (["--set", "model_param.layer_size=0"], "model_param.layer_size must be a positive integer"),
    (["--set", "model_param.batch"], "write SECTION.KEY=VALUE"),
    (["--set", "foo.bar=1"], "unknown key 'foo.bar'"),
])
def test_lstm_bad_input_is_one_line_exit_2(capsys, tmp_path, args, needle):
    code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, *args, "--out", str(tmp_path / "x"))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "model", "lstm", "--config", str(tmp_path / "none.yaml"))
    assert code == 2 and "does not exist" in err


def test_search_ranks_strategies_and_marks_memory(capsys):
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "4", "--json")
    assert code == 0, err
    data = json.loads(out)
    times = [c["time_s"] for c in data["ranked"]]
    assert times == sorted(times) and len(times) > 5
    assert any(c["settings"]["dp"] == 4 for c in data["ranked"])
    assert any(not c["fits"] for c in data["ranked"])  # 38 B parameters in 27 GiB devices: nothing fits
    assert all(r["reason"] for r in data["rejected"])
    code, out, _ = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "2")
    assert code == 0 and "strategies" in out


def test_gemm_and_floors_commands(capsys):
    code, out, err = run_cli(capsys, "model", "gemm", "--m", "8192", "--k", "4096", "--n", "4096", "--dtype",
                             "int8", "--gpu", "h200", "--json")
    assert code == 0, err
    f = json.loads(out)["gemm"]
    assert f["flops"] == 2 * 8192 * 4096 * 4096 and f["bytes_moved"] == 8192 * 4096 * 3 + 4096 * 4096
    assert f["bound"] == "compute" and round(f["ridge"]) == 412
    code, out, err = run_cli(capsys, "model", "floors", "moe", "world_size=4", "dtype=float16", "model_dim=1024",
                             "hidden_size=4096", "samples=8192", "num_local_experts=8", "top_k=2")
    assert code == 0 and "step_ms" in out, err
    code, _, err = run_cli(capsys, "model", "floors", "switchback", "batch_size=1024")
    assert code == 2 and "missing parameter dim_in" in err


def test_against_stored_runs(capsys, tmp_path):
    import random

    rng = random.Random(3)
    sb = write_run(tmp_path / "sb", switchback_record(4096, 1024, 4096, "bf16", 1.5)[0])
    code, out, err = run_cli(capsys, "model", "--against", str(sb), "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["metric"] for r in rows} >= {"fwd_ms", "quantize_x_ms", "kernels_ms"}
    assert all(r["fraction"] == pytest.approx(1 / 1.5) for r in rows)
    moe = write_run(tmp_path / "moe", [moe_record(rng, 2.0)])
    code, out, err = run_cli(capsys, "model", "--against", str(moe), "--gpu", "h200")
    assert code == 0 and "step_ms" in out and "50%" in out, err
    code, _, err = run_cli(capsys, "model", "--against", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err


def test_against_with_the_committed_calibration(capsys, tmp_path):
    cal = Path(__file__).parents[1] / "results" / "model-calibration-h200.yaml"
    if not cal.exists():
        pytest.skip("no committed calibration file")
    sb = write_run(tmp_path / "sb", switchback_record(4096, 1024, 4096, "bf16", 3.0)[0])
    code, out, err = run_cli(capsys, "model", "--against", str(sb), "--calibrated", str(cal), "--json")
    assert code == 0, err
    (row,) = [r for r in json.loads(out) if r["metric"] == "fwd_ms" and "variant=16bit" in r["case"]]
    # measured ceilings are below the datasheet: the same time reads closer to its (higher) floor
    assert row["fraction"] > 1 / 3


def test_calibrate_takes_the_l2_and_sm_count_the_driver_reports():
    from types import SimpleNamespace

    from qbench.benches.model.calibrate import device_hardware, reported_figures
    from qbench.model import hardware

    props = SimpleNamespace(L2_cache_size=62914560, multi_processor_count=114)  # a board unlike its preset
    dev = device_hardware("cuda", "NVIDIA H100 80GB HBM3", reported_figures(props))
    preset = hardware.preset("h100")
    assert (dev.l2_mb, dev.sm_count) == (60.0, 114) and (preset.l2_mb, preset.sm_count) == (50.0, 132)
    assert dev.peak_tflops == preset.peak_tflops and dev.nvlink_gbps == preset.nvlink_gbps
    with pytest.raises(ValueError, match="no preset describes"):
        device_hardware("cuda", "NVIDIA Made Up", reported_figures(props))


def test_group_help_and_examples(capsys):
    code, out, _ = run_cli(capsys, "model")
    assert code == 0 and "Examples:" in out and "--against" in out
    for sub in ("lstm", "quirks", "search", "search-hw", "gemm", "floors", "calibrate"):
        code, out, _ = run_cli(capsys, "model", sub, "--help")
        assert code == 0 and "Examples:" in out, sub


# ---- shipped config, modes, budgets, memory basis, usage errors ---------------------------------


def test_the_seed_config_ships_and_is_usable_by_name(capsys, tmp_path, monkeypatch):
    from qbench.benches.model import config as config_files

    monkeypatch.chdir(tmp_path)  # no deepflow.yaml here: the name resolves to the shipped file
    want = SEED_REPORT.read_text().splitlines()
    for name in ("deepflow", "deepflow.yaml"):
        code, out, err = run_cli(capsys, "model", "lstm", "--config", name, "--debug", "--out", name,
                                 "--time-budget", repr(HARNESS_BUDGET))
        assert code == 0 and out.splitlines()[: len(want)] == want, (name, err)
    assert config_files.load("deepflow") == config_files.load(SEED_CONFIG)
    code, _, err = run_cli(capsys, "model", "lstm", "--config", "nosuch")
    assert code == 2 and "usable by name: deepflow" in err and len(err.strip().splitlines()) == 1


def test_pyproject_ships_the_configs_as_package_data():
    import fnmatch

    import tomllib

    root = Path(__file__).parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = sorted((root / "qbench" / "model" / "configs").glob("*.yaml"))
    assert shipped and all(any(fnmatch.fnmatch(f"configs/{p.name}", pat) for pat in data["qbench.model"])
                           for p in shipped)


def test_lstm_time_per_step_comes_from_the_budget_and_the_config(capsys, tmp_path):
    import math

    code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, "--out", str(tmp_path / "a"))
    assert code == 0 and "time_per_step" not in out, err
    for batch in (512, 64):
        run = tmp_path / f"b{batch}"
        code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, "--tokens", "7.7e10",
                                 "--hours", "24", "--set", f"model_param.batch_size={batch}", "--out", str(run))
        budget = 24 * 3600 / math.ceil(7.7e10 / (batch * 20))  # steps of batch x seq_len 20 tokens
        assert code == 0 and f"time_per_step: {budget:.8f}" in out.splitlines(), err
        (rec,) = store.load_run(run)[1]
        assert rec["metrics"]["budget_s"] == budget and rec["metrics"]["meets_budget"] == 0


def test_lstm_corrected_mode_is_recorded_and_exact_is_the_default(capsys, tmp_path):
    from qbench.benches.model.config import load
    from qbench.model import deepflow
    from qbench.model.deepflow import machine, quirks

    cfg = load(SEED_CONFIG)
    want = deepflow.evaluate(cfg, machine.derive(cfg), fixes=quirks.ALL).time
    for mode, time in (("corrected", want), (None, 302.88817584140634)):
        args = ["--deepflow", mode] if mode else []
        code, out, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, *args,
                                 "--out", str(tmp_path / str(mode)))
        (rec,) = store.load_run(tmp_path / str(mode))[1]
        assert code == 0 and rec["params"]["deepflow"] == (mode or "exact") and rec["metrics"]["time_s"] == time, err
        assert f"DeepFlow {mode or 'exact'}" in out


def test_lstm_memory_fields_share_one_basis(capsys, tmp_path):
    code, _, err = run_cli(capsys, "model", "lstm", "--config", SEED_CONFIG, "--out", str(tmp_path / "k"),
                           "--set", "scheduling_param.topology=mesh", "--set", "scheduling_param.kp_hidden_type=1",
                           "--set", "scheduling_param.kp_hidden_dim1=4")
    assert code == 0, err
    m = store.load_run(tmp_path / "k")[1][0]["metrics"]
    assert m["overflow_rate"] == m["memory_total_gb"] / m["memory_capacity_gb"]  # per data shard
    assert m["overflow_rate_model_shard"] == m["memory_model_shard_gb"] / m["memory_capacity_gb"]  # per device
    assert m["overflow_rate_model_shard"] < m["overflow_rate"]  # the hidden weights are split over 4 devices


@pytest.mark.parametrize("args, needle", [
    (("search", "--config", SEED_CONFIG), "missing option '--devices'"),
    (("search-hw",), "missing option '--config'"),
    (("gemm", "--m", "8", "--k", "8"), "missing option '--n'"),
    (("floors",), "missing argument"),
    (("search", "--config", SEED_CONFIG, "--devices", "1e12"), "give 1 to 4096"),
    (("search", "--config", SEED_CONFIG, "--devices", "4097"), "give 1 to 4096"),
    (("search", "--config", SEED_CONFIG, "--devices", "0"), "give 1 to 4096"),
    (("search", "--config", SEED_CONFIG, "--devices", "2.5"), "not a whole number"),
    (("lstm", "--config", SEED_CONFIG, "--deepflow", "fixed"), "'--deepflow'"),
])
def test_missing_and_out_of_range_options_are_one_line_exit_2(capsys, args, needle):
    code, out, err = run_cli(capsys, "model", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_search_runs_corrected_says_so_and_warns_when_exact_ranks_another_first(capsys):
    from qbench.benches.model.config import load
    from qbench.model import search
    from qbench.model.deepflow import quirks

    cfg = load(SEED_CONFIG)
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "4", "--json")
    data = json.loads(out)
    corrected, _ = search.search(cfg, 4, ("mesh",), quirks.ALL)
    exact, _ = search.search(cfg, 4, ("mesh",))
    assert code == 0 and data["deepflow"] == "corrected" and "DeepFlow corrected" in err
    assert [c["time_s"] for c in data["ranked"]] == [c.time_s for c in corrected]
    assert data["other_mode"]["best"]["settings"] == exact[0].settings
    assert exact[0].settings != corrected[0].settings and not data["other_mode"]["same_top"]
    err = " ".join(err.split())  # rich wraps the notice
    assert f"under DeepFlow exact the fastest would be {search.describe(exact[0].settings)}" in err
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "4", "--json",
                             "--deepflow", "exact")
    assert [c["time_s"] for c in json.loads(out)["ranked"]] == [c.time_s for c in exact]
    assert "under DeepFlow corrected the fastest would be" in " ".join(err.split())


def test_search_on_one_device_labels_no_topology(capsys):
    from qbench.benches.model.config import load
    from qbench.model import deepflow
    from qbench.model.deepflow import machine, quirks

    cfg = load(SEED_CONFIG)
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "1",
                             "--topologies", "ring,mesh", "--json")
    (only,) = json.loads(out)["ranked"]
    assert code == 0 and only["topology"] == "none" and only["settings"] == {"dp": 1}
    assert only["time_s"] == deepflow.evaluate(cfg, machine.derive(cfg), fixes=quirks.ALL).time
    code, out, _ = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "1")
    assert "1 device (no network: topology none)" in " ".join(out.split())
