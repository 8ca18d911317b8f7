"""No traceback, ever: every bad input found so far, on every subcommand.

Usage errors exit 2 with exactly one line on stderr that names the problem, and leave no run
directory behind. A configuration that fails at run time (out of memory, a kernel that cannot run)
becomes an `error` record while the other configurations are still measured, and the run exits 1.
Distributed failures name the rank that failed first, and a frozen rank ends the run after the
collective timeout. Most cases run in process (qbench.cli.main); two run as real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench import dist, store
from qbench.cli import main
from qbench.metrics import FIELDS
from tests.helpers import env_without_interpreter, timed_record, write_run

ROOT = Path(__file__).resolve().parent.parent
SEED_BNB = ROOT / "tests" / "fixtures" / "seed_bnb_info.jsonl"
DEEPFLOW = ROOT / "qbench" / "model" / "configs" / "deepflow.yaml"
UNWRITABLE = "/proc/qbench-no-such-dir/run"  # /proc takes no new entries, even for root
HW = "name: x\nhbm_gb: 80\nhbm_tbps: 3\nl2_mb: 50\nsm_count: 132\nnvlink_gbps: 450\n"


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


NEEDS_NO_CUDA = pytest.mark.skipif(not _no_cuda(), reason="checks the message for a machine without CUDA")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Bad inputs on disk: configs, hardware files, corrupt runs, a file where a folder should be."""
    d = tmp_path_factory.mktemp("inputs")
    text = DEEPFLOW.read_text(encoding="utf-8")
    (d / "big.yaml").write_text(text.replace("batch_size:", "batch_size: 1e300 #", 1), encoding="utf-8")
    (d / "bin.yaml").write_bytes(bytes(range(128, 256)) * 4)
    (d / "bad.yaml").write_text("a: [1, 2\n  b: : :\n", encoding="utf-8")
    (d / "hw_nan.yaml").write_text(HW + "peak_tflops: {bf16: .nan}\n", encoding="utf-8")
    (d / "hw_list.yaml").write_text(HW + "peak_tflops: [1, 2]\n", encoding="utf-8")
    (d / "hw.json").write_text("{not json", encoding="utf-8")
    (d / "afile").write_text("a file, not a folder\n", encoding="utf-8")
    (d / "fake.json.gz").write_text("not gzip", encoding="utf-8")
    (d / "bad_times.csv").write_text("step,stream,start_us,dur_us,kind,name\nstep 0,7,x,1,kernel,k\n", encoding="utf-8")
    (d / "x[bold]").mkdir()
    run = write_run(d / "run", [timed_record({"m": 1}, [1.0, 1.1, 1.2])])
    for name, env_text, records in (("binrun", None, bytes(range(128, 256))), ("listenv", b"[1, 2]", None)):
        bad = write_run(d / name, [timed_record({"m": 1}, [1.0])])
        if records is not None:
            (bad / store.RECORDS_FILE).write_bytes(records)
        if env_text is not None:
            (bad / store.ENV_FILE).write_bytes(env_text)
    return {"dir": str(d), "run": str(run), **{p.name.replace(".", "_").replace("[", "_").replace("]", ""): str(p)
                                            for p in d.iterdir()}}


def run_cli(capsys, args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_error_line(err: str, fragment: str) -> None:
    """A run-time failure: notices may come first, then exactly one error line; no traceback."""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err, err
    assert len(errors) == 1 and fragment in errors[0] and err.rstrip().endswith(errors[0]), err


def assert_one_line(err: str, fragment: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{err}"
    assert fragment in lines[0], lines[0]


SB = ["switchback", "--dims", "64", "--batch-sizes", "16", "--variants", "global", "--repeat", "1", "--device", "cpu"]
FR = ["fragmented", "--sizes", "64", "--batch-sizes", "1", "--fragments", "2", "--tasks", "train", "--baselines",
      "none", "--steps", "1", "--warmup", "0", "--device", "cpu"]
MOE = ["moe", "--device", "cpu", "--num-steps", "1", "--warmup", "0", "--samples", "16", "--model-dim", "16",
       "--hidden-size", "16"]
CFG = ["model", "lstm", "--config"]
GEMM = ["model", "gemm", "--m", "64", "--k", "64", "--n", "64", "--calibrated"]
SW = ["model", "floors", "switchback", "dim_in=1024", "dim_out=4096"]

# (arguments, a fragment of the one-line message); {name} is a file of the `files` fixture, {out} a
# fresh run directory that must not exist afterwards.
USAGE = [
    (SB + ["--wm", "0.001"], "--wm 0.001 makes the 64 -> 0 layer"),
    (SB + ["--wm", "nan"], "'nan' is not a finite number"),
    (SB + ["--wm", "inf"], "'inf' is not a finite number"),
    (SB + ["--wm", "1e300"], "layer; choose --wm"),
    (SB + ["--batch-sizes", "99999999999999999999"], "is too large"),
    (SB + ["--dims", "0"], "not a positive size"),
    (SB + ["--dims", "64x"], "not an integer"),
    (SB + ["--pairs", "64x64"], "give --dims or --pairs"),
    (["switchback", "--pairs", "64x"], "'64x' is not an IN x OUT pair"),
    (["switchback", "--pairs", "64x0"], "0 is not a positive size"),
    (SB + ["--dtype", "fp32"], "unknown fp32"),
    (SB + ["--variants", "bogus"], "unknown bogus"),
    (SB + ["--exec", "graph"], "--exec graph needs a CUDA device"),
    pytest.param(["switchback", "--device", "cuda"], "no CUDA device", marks=NEEDS_NO_CUDA),
    (SB + ["--out", UNWRITABLE], "cannot create run directory"),
    (SB + ["--out", UNWRITABLE, "--append"], "cannot create run directory"),
    (SB + ["--out", "{afile}/run", "--force"], "a parent is a file"),
    (SB + ["--append", "--force"], "pass only one of them"),
    (FR + ["--plot", "figure.gif"], "unknown figure format"),
    (FR + ["--plot", UNWRITABLE + ".png"], "cannot write figure"),
    (FR + ["--plot", "{afile}/f.png"], "is a file"),
    (FR + ["--fragments", "3"], "not divisible by --fragments 3"),
    (FR + ["--sizes", "16", "--fragments", "2"], "below 32"),
    (FR + ["--steps", "0"], "--steps"),
    (MOE + ["--capacity-factor", "nan"], "'nan' is not a finite number"),
    (MOE + ["--capacity-factor", "inf"], "'inf' is not a finite number"),
    (MOE + ["--timeout", "0"], "--timeout"),
    (MOE + ["--timeout", "nan"], "'nan' is not a finite number"),
    (MOE + ["--top-k", "99"], "--top-k 99 exceeds"),
    (MOE + ["--locality", "2"], "probabilities"),
    (MOE + ["--routing", "bogus"], "unknown routing 'bogus'"),
    (MOE + ["--routing", "trace:{bin_yaml}"], "the trace file is not text"),
    (MOE + ["--plot", "figure.gif"], "unknown figure format"),
    (MOE + ["--trace", UNWRITABLE], "--trace"),
    (MOE + ["--trace", "{afile}/traces"], "is a file; choose a folder"),
    (FR + ["--trace", "{afile}/traces"], "is a file; choose a folder"),
    (FR + ["--trace", UNWRITABLE], "cannot make the directory"),
    (MOE + ["--samples", "99999999999"], "--samples"),
    (MOE + ["--out", UNWRITABLE], "cannot create run directory"),
    (CFG + ["{big_yaml}"], "model_param.batch_size must be a positive integer up to 2**53"),
    (CFG + ["deepflow", "--set", "model_param.batch_size=1e300"], "up to 2**53"),
    (CFG + ["deepflow", "--sweep", "model_param.batch_size=1,1e300"], "at model_param.batch_size"),
    (CFG + ["{bin_yaml}"], "bin.yaml is not a text file"),
    (CFG + ["{bad_yaml}"], "bad.yaml is not valid YAML"),
    (CFG + ["no-such-config"], "does not exist"),
    (CFG + ["/dev/null"], "/dev/null is not a regular file"),
    (CFG + ["deepflow", "--tokens", "1e400", "--hours", "1"], "'1e400' is not a finite number"),
    (CFG + ["deepflow", "--out", UNWRITABLE], "cannot create run directory"),
    (GEMM + ["{bad_yaml}"], "bad.yaml is not valid YAML"),
    (GEMM + ["{bin_yaml}"], "bin.yaml is not a text file"),
    (GEMM + ["{hw_nan_yaml}"], "peak_tflops.bf16 must be a positive number"),
    (GEMM + ["{hw_list_yaml}"], "peak_tflops must map dtypes"),
    (GEMM + ["{hw_json}"], "hw.json is not valid JSON"),
    (SW + ["batch_size=abc"], "batch_size='abc' is not a finite number"),
    (SW + ["batch_size=1e400"], "batch_size=inf is not a finite number"),
    (["model", "floors", "fragmented", "batch_size=1", "in_features=64", "out_features=64", "variant=bogus",
      "dtype=fp32"], "variant='bogus' is not a value"),
    pytest.param(["model", "calibrate", "--device", "cuda"], "no CUDA device", marks=NEEDS_NO_CUDA),
    (["model", "calibrate", "--device", "cpu", "--file", UNWRITABLE + ".yaml"], "cannot write calibration file"),
    (["model", "calibrate", "--device", "cpu", "--file", "{afile}/c.yaml"], "is a file"),
    (["model", "search", "--config", "deepflow", "--devices", "1e12"], "give 1 to 4096"),
    (["model", "search", "--config", "deepflow", "--devices", "nan"], "not a whole number"),
    (["model", "search-hw", "--config", "deepflow", "--starts", "1", "--iterations", "1", "--set",
      "power_breakdown.TDP=1e308"], "out of range"),
    (["model", "quirks", "--config", "{bin_yaml}"], "is not a text file"),
    (["model", "--against", "{binrun}", "--gpu", "h200"], "is not UTF-8 text"),
    (["compare", "{run}", "{binrun}"], "results.jsonl is not UTF-8 text"),
    (["compare", "{run}", "{listenv}"], "env.json is not a JSON object"),
    (["compare", "{run}", "{x_bold}"], "x[bold] is not a qbench run"),  # brackets printed as written
    (["compare", "{run}", "{run}", "--threshold", "abc"], "is not a percentage"),
    (["compare", "{run}", "{run}", "--threshold", "nan"], "must be a finite number >= 0"),
    (["compare", "{run}", "{run}", "--threshold", "-1"], "must be a finite number >= 0"),
    (["compare", "{run}", "{run}", "--fail-on", "time_global:x"], "--fail-on 'time_global:x': 'x' is not a percentage"),
    (["plot", "{run}", "--out", UNWRITABLE + ".png"], "cannot write figure"),
    (["plot", "{run}", "--out", "{afile}/figure.png"], "is a file"),
    (["plot", "{run}", "--out", "figure.gif"], "unknown figure format"),
    (["plot", "{binrun}"], "is not UTF-8 text"),
    (["import", "{bin_yaml}"], "is not a text file"),
    (["trace", "{bin_yaml}"], "is not UTF-8 text"),
    (["trace", "{hw_json}"], "is not a kernel table of a --trace run"),
    (["trace", "{dir}/nosuch.csv"], "cannot read"),
    (["trace", "{bad_times_csv}"], "with numeric times"),
    (["trace", "{fake_json_gz}"], "is not a gzipped Chrome trace"),
    (["trace", "{dir}/nosuch.json.gz"], "cannot read"),
    (["import", str(SEED_BNB), "--out", UNWRITABLE], "cannot create run directory"),
    (["nosuch"], "No such command"),
    (["model", "nosuch"], "No such command"),
]


@pytest.mark.parametrize("args, fragment", USAGE)
def test_usage_error_is_one_line_exit_2_and_leaves_no_run(args, fragment, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default run directories would land under ./runs
    out = tmp_path / "out"
    args = [a.format(out=out, **files) for a in args]
    if args[0] in ("switchback", "fragmented", "moe") and "--out" not in args:
        args += ["--out", str(out)]
    code, _, err = run_cli(capsys, args)
    assert code == 2, err
    assert_one_line(err, fragment)
    assert not out.exists() and not (tmp_path / "runs").exists(), "a refused run left a directory behind"


def test_moe_triton_gemm_without_a_gpu_or_the_interpreter_is_a_usage_error(capsys, tmp_path, monkeypatch):
    import kernels._common

    monkeypatch.setattr(kernels._common, "interpreting", lambda: False)  # as on a CPU outside the tests
    code, _, err = run_cli(capsys, MOE + ["--gemm", "triton,torch", "--out", str(tmp_path / "run")])
    assert code == 2
    assert_one_line(err, "--gemm triton needs a CUDA GPU")


def test_enough_inputs_are_covered():
    assert len(USAGE) + len(RUNTIME) >= 40


@pytest.mark.parametrize("args", [CFG + ["{big_yaml}"], ["plot", "{run}", "--out", UNWRITABLE + ".png"]])
def test_usage_error_in_a_real_process(args, files, tmp_path):
    args = [a.format(**files) for a in args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "qbench", *args], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr, "error:")


def test_sigterm_closes_the_run_as_ctrl_c_does(tmp_path):
    """SIGTERM (`timeout`, a scheduler's time limit) in the middle of a sweep: exit 128 + 15 with one line, the
    records measured so far kept, and the run closed: its CSV written from them, env.json whole."""
    import json

    out = tmp_path / "run"
    env = env_without_interpreter(PYTHONPATH=str(ROOT))  # the torch references: the interpreter would take minutes
    args = ["switchback", "--pairs", "64x256,256x64,96x384,384x96,128x512,512x128", "--batch-sizes", "64,256,1024",
            "--exec", "eager", "--out", str(out)]  # about half a second per configuration on a CPU
    proc = subprocess.Popen([sys.executable, "-m", "qbench", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    records = out / store.RECORDS_FILE
    deadline = time.monotonic() + 120
    while not (records.exists() and records.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert_error_line(err, "terminated (SIGTERM); records measured so far are kept")
    kept = store.read_records(out)
    assert 1 <= len(kept) < 18
    assert (out / store.CSV_FILE).read_text().count("\n") == len(kept) + 1  # header and one row per record
    json.loads((out / store.ENV_FILE).read_text())


# ---- run-time failures: an error record, the sweep goes on, exit 1 ------------------------------------------

def _fail_switchback_m32(monkeypatch, error):
    from qbench.benches.switchback import components

    real = components.time_all

    def flaky(ops, *args, **kwargs):
        if ops.x.shape[0] == 32 and ops.x.shape[1] == 32:
            raise error
        return real(ops, *args, **kwargs)

    monkeypatch.setattr(components, "time_all", flaky)


def _fail_fragmented_batch2(monkeypatch, error):
    from qbench.benches.fragmented import sweep

    real = sweep.measure

    def flaky(case, config):
        if case.batch == 2:
            raise error
        return real(case, config)

    monkeypatch.setattr(sweep, "measure", flaky)


def _errors():
    import torch

    # '[/x]' is markup to rich: the table must print it as written, not fail on it
    return {"oom": torch.OutOfMemoryError("CUDA out of memory [/x]"), "runtime": RuntimeError("no kernel [/x]")}


SB_TWO = ["switchback", "--pairs", "32x32", "--batch-sizes", "16,32", "--variants", "global", "--repeat", "1",
          "--device", "cpu"]
RUNTIME = [
    ("switchback", "oom", SB_TWO, _fail_switchback_m32, 2),
    ("switchback", "runtime", SB_TWO, _fail_switchback_m32, 2),
    ("fragmented", "oom", FR + ["--batch-sizes", "1,2"], _fail_fragmented_batch2, 2),
]


@pytest.mark.parametrize("bench, kind, args, inject, planned", RUNTIME)
def test_a_failing_configuration_is_an_error_record_and_the_sweep_goes_on(bench, kind, args, inject, planned,
                                                                         capsys, tmp_path, monkeypatch):
    error = _errors()[kind]
    inject(monkeypatch, error)
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, args + ["--out", str(out)])
    assert code == 1 and "Traceback" not in err, err
    records = store.read_records(out)
    failed = [r for r in records if r["status"] == "error"]
    measured = {store.measured_id(r, FIELDS) for r in records}  # a configuration may write several tidy records
    assert len(measured) == planned and len(failed) == 1, [(r["case"], r["status"]) for r in records]
    assert type(error).__name__ in failed[0]["error"] and "[/x]" in failed[0]["error"]
    assert all(r["status"] == "ok" for r in records if r is not failed[0])
    assert "1 configuration failed; see the status column" in err


def test_brackets_in_a_notice_print_as_written(capsys, tmp_path):
    out = tmp_path / "r[/z]"
    code, _, err = run_cli(capsys, ["import", str(SEED_BNB), "--out", str(out)])
    assert code == 0, err
    assert f"records in {out}" in err.replace("\n", "")


def test_an_unexpected_error_is_one_line_with_the_traceback_in_a_file(capsys, monkeypatch):
    import qbench.importers

    def broken(*args, **kwargs):
        raise TypeError("deliberate [/bug]")

    monkeypatch.setattr(qbench.importers, "import_file", broken)
    code, _, err = run_cli(capsys, ["import", str(SEED_BNB)])
    assert code == 1
    assert_one_line(err, "internal error: TypeError: deliberate [/bug]")
    saved = Path(err.rsplit("traceback in ", 1)[1].rstrip(")\n"))
    assert "Traceback" in saved.read_text(encoding="utf-8")
    saved.unlink()


# ---- distributed: --timeout reaches the process group, the rank that failed first is named -----------------

def test_moe_timeout_reaches_the_launcher_and_a_rank_failure_is_one_line(capsys, tmp_path, monkeypatch):
    seen = {}

    def launch(fn, args=(), **kwargs):
        seen.update(kwargs)
        raise dist.RankFailure("rank 1 died (killed by SIGKILL) without reporting an error")
        yield  # a generator, like the real launcher

    monkeypatch.setattr(dist, "launch", launch)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, MOE + ["--timeout", "7.5", "--out", str(out)])
    assert code == 1 and seen["timeout_s"] == 7.5
    assert_error_line(err, "rank 1 died (killed by SIGKILL)")
    assert not out.exists(), "a run that measured nothing left its directory"


def die_or_freeze(ctx, how):
    """Rank 1 is killed (no word to the launcher) or freezes while rank 0 waits in a collective."""
    import torch
    import torch.distributed as tdist

    if ctx.rank == 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    tdist.all_reduce(torch.ones(2))
    yield "unreachable"


@pytest.mark.dist
def test_a_killed_rank_is_named_not_the_survivor():
    with pytest.raises(dist.RankFailure) as exc:
        list(dist.launch(die_or_freeze, ("kill",), world_size=2, backend="gloo", device="cpu", timeout_s=60))
    assert str(exc.value).startswith("rank 1 died (killed by SIGKILL) without reporting an error"), exc.value


@pytest.mark.dist
def test_a_frozen_rank_ends_the_run_after_the_timeout_and_is_named():
    start = time.monotonic()
    with pytest.raises(dist.RankFailure) as exc:
        list(dist.launch(die_or_freeze, ("freeze",), world_size=2, backend="gloo", device="cpu", timeout_s=6))
    assert time.monotonic() - start < 45  # not the 600 s default
    assert "still running, maybe frozen: rank 1" in str(exc.value), exc.value


def test_json_of_a_record_is_checked_before_a_file_is_made(tmp_path):
    path = tmp_path / "run"
    with pytest.raises(ValueError), store.RunWriter(path, {"torch": "x"}) as writer:
        writer.write(store.make_record("toy", {"cf": float("nan")}))
    assert not path.exists(), "a record that cannot be stored left an empty run behind"


def test_figure_check_leaves_no_file(tmp_path):
    from qbench.plots import check_figure_path

    target = tmp_path / "sub" / "f.png"
    assert check_figure_path(target) == target and not target.exists()
