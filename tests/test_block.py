"""`qbench switchback --model` and `--train-check` (the spellings `qbench block` and `qbench train-check`
had before those commands, kept as hidden aliases) end to end on the CPU at tiny sizes (records, metrics,
table, figure), a diverged training run recorded as an error, and one-line usage errors."""

from __future__ import annotations

import json
import math

import pytest

from qbench import store
from qbench.benches.block.sweep import REL_ERROR
from qbench.benches.train_check import config as train
from qbench.benches.train_check import loop as train_loop
from tests.test_switchback_cli import qbench

STEP_METRICS = {"step_ms", "tokens_per_s", "linear_ms", "linear_share", "host_ms", "tflops", "relerr_output",
                "relerr_loss", "relerr_grads"}


def test_model_bench_tiny_preset(tmp_path):
    out = tmp_path / "run"
    res = qbench("--model", "tiny", "--batch-sizes", "2", "--layers", "2", "--repeat", "2", "--variants",
                 "switchback,fp8_all,torchao", "--out", str(out), "--plot", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Transformer block stack" in res.stdout and "say nothing about GPU performance" in res.stderr
    _, records = store.load_run(out)
    assert [(r["params"]["variant"], r["params"]["exec"]) for r in records] == [
        ("16bit", "eager"), ("switchback", "eager"), ("fp8_all", "eager"), ("torchao", "eager")]
    for rec in records[:3]:
        p, m = rec["params"], rec["metrics"]
        assert rec["bench"] == "block" and rec["status"] == "ok", rec["error"]
        assert p | {"preset": "tiny", "batch_size": 2, "tokens": 9, "layers": 2, "width": 32, "dtype": "bf16"} == p
        assert STEP_METRICS <= set(m) and len(rec["samples"]["step_ms"]) == 2
        assert math.isclose(m["tokens_per_s"], 2 * 9 / (m["step_ms"] / 1e3), rel_tol=1e-9)
        assert math.isclose(m["linear_share"], m["linear_ms"] / m["step_ms"], rel_tol=1e-9)
        assert all(m[k] <= REL_ERROR[p["variant"]] for k in ("relerr_output", "relerr_loss", "relerr_grads"))
        assert rec["units"]["step_speedup" if p["variant"] != "16bit" else "step_ms"] in ("x", "ms")
    assert "step_speedup" not in records[0]["metrics"] and records[0]["metrics"]["relerr_output"] == 0
    sb = records[1]["metrics"]
    assert math.isclose(sb["step_speedup"], records[0]["metrics"]["step_ms"] / sb["step_ms"], rel_tol=1e-9)
    assert sb["relerr_output"] > 0  # int8 really ran
    assert records[3]["status"] == "skipped" and "torchao" in records[3]["error"]
    assert (out / "block.png").stat().st_size > 1000


@pytest.mark.gpu
def test_gpu_model_bench_passes_its_checks_in_every_mode(tmp_path):
    """On a GPU the block stack of every variant is checked against the eager 16-bit stack in every mode
    (eager, compiled, graphed) before it is timed: every record of a small run is ok."""
    out = tmp_path / "run"
    res = qbench("--model", "tiny", "--batch-sizes", "2", "--layers", "2", "--repeat", "2", "--variants",
                 "16bit,switchback,fp8,fp8_all", "--device", "cuda", "--out", str(out), cwd=tmp_path)
    _, records = store.load_run(out)
    assert {r["params"]["exec"] for r in records} == {"eager", "compile", "graph"}
    assert [(r["params"]["variant"], r["params"]["exec"], r["error"]) for r in records if r["status"] != "ok"] == []
    assert res.returncode == 0, res.stderr[-2000:]


def test_train_check_tiny(tmp_path):
    out = tmp_path / "train"
    res = qbench("--train-check", "--steps", "20", "--layers", "1", "--variants", "switchback,fp8",
                 "--out", str(out), "--plot", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)
    assert [r["params"]["variant"] for r in records] == ["16bit", "switchback", "fp8"]
    floor = records[0]["metrics"]["entropy_floor"]
    for rec in records:
        m = rec["metrics"]
        assert rec["status"] == "ok" and rec["bench"] == "train_check" and rec["params"]["exec"] == "eager"
        assert len(rec["samples"]["loss_curve"]) == 2 and m["curve_every"] == 10
        assert floor < m["final_loss"] < m["initial_loss"] < m["uniform_loss"] + 0.5  # it learns, from ~ln V
        assert math.isclose(m["gap_to_floor"], m["final_loss"] - floor, rel_tol=1e-12)
        assert math.isclose(m["gap_to_reference"], m["final_loss"] - records[0]["metrics"]["final_loss"], abs_tol=1e-12)
        assert abs(m["gap_to_reference"]) < 0.05  # same weights, same batches: the variants track 16-bit closely
    assert (out / "train_check.png").exists()


def test_diverged_run_is_an_error_record():
    config = train.resolve(train.TrainConfig(variants=("16bit",), steps=12, lr=float("inf"), layers=1, device="cpu"))
    (rec,) = list(train_loop.run(config))
    assert rec["status"] == "error" and rec["error"].startswith("diverged: non-finite loss at step")
    assert all(math.isfinite(v) for v in rec["samples"]["loss_curve"])  # JSON-safe, what came before


@pytest.mark.parametrize("args,message", [
    (["--model", "vit-x"], "unknown vit-x"),
    (["--model", "vit-h", "--dims", "64"], "--dims/--pairs size the layer bench"),
    (["--layers", "2"], "--layers sizes a block stack"),
    (["--model", "tiny", "--variants", "global"], "unknown global"),
    (["--train-check", "--exec", "compile"], "--train-check trains eagerly"),
    (["--train-check", "--model", "vit-h"], "unknown vit-h"),
    (["--train-check", "--batch-sizes", "4,8"], "trains one size"),
    (["--model", "tiny", "--format", "seed"], "--format seed"),
    (["--model", "tiny", "--exec", "graph"], "needs a CUDA device"),
    (["--train-check", "--trace", "traces"], "--trace profiles the layer bench's module steps"),
])
def test_block_usage_errors_are_one_line_exit_2(tmp_path, args, message):
    res = qbench(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
