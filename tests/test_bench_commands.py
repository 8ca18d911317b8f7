"""One family, one command, one dialect: `qbench block`, `qbench train-check` and `qbench grouped` write
the records their old spellings wrote (bench names unchanged, so old runs compare with new ones), the old
spellings forward to them, and every bench command spells the shared options alike."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernels._common import interpreting
from qbench import cli, store
from qbench.options import RUN_FIGURE
from tests.test_switchback_cli import _env


def run_qbench(*args, cwd, interpret: bool = False):
    """The command in a fresh process; interpret: Triton kernels through the interpreter (as these tests
    run them), else the CPU's torch references."""
    env = {**_env(), **({"TRITON_INTERPRET": "1"} if interpret else {})}
    return subprocess.run([sys.executable, "-m", "qbench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_new_commands_are_registered():
    assert {"block", "train-check", "grouped"} <= set(cli.COMMANDS)
    for name in ("block", "train-check", "grouped"):
        assert cli.cli.get_command(None, name) is not None


def test_block_runs_the_block_stack_over_a_dtype_list(tmp_path):
    out = tmp_path / "run"
    res = run_qbench("block", "--preset", "tiny", "--batch-sizes", "2", "--layers", "1", "--steps", "2",
                     "--variants", "16bit", "--dtype", "bf16,fp16", "--device", "cpu", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    env, records = store.load_run(out)
    assert [(r["bench"], r["params"]["dtype"], r["params"]["variant"], r["params"]["exec"], r["status"])
            for r in records] == [("block", "bf16", "16bit", "eager", "ok"),
                                  ("block", "fp16", "16bit", "eager", "ok")]
    assert all(len(r["samples"]["step_ms"]) == 2 for r in records)  # --steps: the timed repeats
    assert env["config"]["dtype"] == "bf16,fp16"
    assert env["launch_path"] == "none"  # the CPU without the interpreter runs the kernels' torch references


def test_train_check_trains_the_size_it_is_given(tmp_path):
    out = tmp_path / "run"
    res = run_qbench("train-check", "--preset", "lm-tiny", "--steps", "10", "--layers", "1", "--variants", "16bit",
                     "--device", "cpu", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(out)
    assert [(r["bench"], r["params"]["preset"], r["params"]["steps"], r["status"]) for r in records] == [
        ("train_check", "lm-tiny", 10, "ok")]


@pytest.mark.slow
@pytest.mark.skipif(not interpreting(), reason="tiny shapes for the interpreter; a GPU runs the seed sizes")
@pytest.mark.parametrize("spelling", [("grouped",), ("moe", "--kernels", "grouped")])
def test_grouped_and_its_old_spelling_write_grouped_gemm_records(tmp_path, spelling):
    out = tmp_path / "run"
    res = run_qbench(*spelling, "--dtype", "bf16", "--model-dim", "32", "--hidden-size", "48", "--samples", "20",
                     "--num-local-experts", "2", "--device", "cpu", "--out", str(out), cwd=tmp_path, interpret=True)
    assert res.returncode == 0, res.stderr
    env, records = store.load_run(out)
    assert env["launch_path"] == "interpreter" and "grouped_gemm_fwd" in env["launch_paths"]
    assert list(dict.fromkeys(r["params"]["shape"] for r in records)) == ["a fwd x@w1", "b fwd act@w2",
                                                                          "c dgrad dy@w2^T", "d dgrad dpre@w1^T"]
    # tidy: one record per shape and variant, exec eager, timing per_kernel
    assert [r["params"]["variant"] for r in records[:3]] == ["tma", "pointer", "dense"]
    assert {(r["params"]["exec"], r["params"]["timing"]) for r in records} == {("eager", "per_kernel")}
    assert {(r["bench"], r["params"]["dtype"], r["status"]) for r in records} == {("grouped_gemm", "bf16", "ok")}


@pytest.mark.slow
def test_moe_runs_its_layer_over_a_dtype_list(tmp_path):
    out = tmp_path / "run"
    res = run_qbench("moe", "--world-size", "1", "--dtype", "fp32,bf16", "--model-dim", "16", "--hidden-size", "16",
                     "--samples", "16", "--num-local-experts", "2", "--steps", "2", "--warmup", "1", "--device", "cpu",
                     "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(out)
    assert [(r["bench"], r["params"]["dtype"], r["params"]["timing"], r["status"]) for r in records] == [
        ("moe", dtype, timing, "ok") for dtype in ("fp32", "bf16") for timing in ("per_step", "loop")]


def _parsed(command: str, *args) -> dict:
    """The values click hands a command for these arguments (nothing runs)."""
    cmd = cli.cli.get_command(None, command)
    return cmd.make_context(command, list(args)).params


BENCH_COMMANDS = ("switchback", "block", "train-check", "fragmented", "moe", "grouped")


@pytest.mark.parametrize("command", BENCH_COMMANDS)
def test_every_bench_command_spells_the_shared_options_alike(command):
    """--steps, --dtype (a list), --exec, --out, --plot [FILE] and --format seed mean the same wherever a
    command has them, and --steps, --dtype and --out are everywhere."""
    params = {p.name: p for p in cli.cli.get_command(None, command).params}
    assert {"dtypes", "out"} <= set(params), sorted(params)
    assert _parsed(command, "--out", "runs/x")["out"] == "runs/x"
    assert _parsed(command, "--dtype", "bf16,float16")["dtypes"] == ("bf16", "fp16")
    if "steps" in params:
        assert _parsed(command, "--steps", "3")["steps"] == 3
    if "plot" in params:
        assert _parsed(command, "--plot")["plot"] == RUN_FIGURE
        assert _parsed(command, "--plot", "fig.svg")["plot"] == "fig.svg"
    if "fmt" in params:
        assert _parsed(command, "--format", "seed")["fmt"] == "seed"
        assert _parsed(command, "--seed-format")["seed_format"] is True  # the command reads it as --format seed
    if "execs" in params:
        assert _parsed(command, "--exec", "eager,graph")["execs"] == ("eager", "graph")


@pytest.mark.parametrize("command, alias, name", [
    ("switchback", "--repeat", "steps"), ("block", "--repeat", "steps"), ("moe", "--num-steps", "steps"),
    ("block", "--model", "presets"), ("train-check", "--model", "presets"),
])
def test_earlier_spellings_stay_aliases(command, alias, name):
    value = _parsed(command, alias, "4")[name]
    assert value in (4, ("4",))


def test_old_spellings_are_hidden_from_help():
    for command, flags in (("switchback", ("--model", "--train-check", "--layers")), ("moe", ("--kernels",)),
                           ("moe", ("--seed-format",))):
        params = {o: p for p in cli.cli.get_command(None, command).params for o in p.opts}
        assert all(params[flag].hidden for flag in flags), command
