"""Hostile command lines: every numeric option at 0, negative, NaN, inf, huge and non-numeric; the
cross-option combinations that mean nothing; requests too large for this machine.

Each refused command exits 2 with one line on stderr that names the option or the value, says no
"internal error", prints no traceback, and writes nothing (no run directory, no runs/ folder). All refusals
happen before any work, in process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.cli import main
from tests.helpers import timed_record, write_run

ROOT = Path(__file__).resolve().parent.parent
SEED_BNB = ROOT / "tests" / "fixtures" / "seed_bnb_info.jsonl"
BAD = {"zero": "0", "negative": "-1", "NaN": "nan", "inf": "inf", "huge float": "1e400",
       "huge int": "99999999999999999999999", "word": "abc", "empty": "", "fraction": "0.5"}

SB = ["switchback", "--dims", "64", "--batch-sizes", "16", "--variants", "global", "--repeat", "1", "--device", "cpu"]
FR = ["fragmented", "--sizes", "64", "--batch-sizes", "1", "--fragments", "2", "--modes", "train", "--baselines",
      "none", "--steps", "1", "--warmup", "0", "--device", "cpu"]
MOE = ["moe", "--device", "cpu", "--num-steps", "1", "--warmup", "0", "--samples", "16", "--model-dim", "16",
       "--hidden-size", "16"]
LSTM = ["model", "lstm", "--config", "deepflow"]
SEARCH = ["model", "search", "--config", "deepflow", "--devices", "8"]
SEARCH_HW = ["model", "search-hw", "--config", "deepflow", "--no-must-fit"]
GEMM = ["model", "gemm", "--m", "64", "--k", "64", "--n", "64"]

# (command line, option, the names of BAD values the option accepts: those start work and are left out; a
# huge int is a valid time, factor, row count or GEMM size, which only costs arithmetic)
NUMERIC = [
    (SB, "--wm", ("huge int", "fraction")), (SB, "--repeat", ()), (SB, "--batch-sizes", ()), (SB, "--dims", ()),
    (FR, "--sizes", ()), (FR, "--batch-sizes", ()), (FR, "--fragments", ()), (FR, "--steps", ()),
    (FR, "--warmup", ("zero",)),
    (MOE, "--world-size", ()), (MOE, "--batch-size", ()), (MOE, "--num-tokens", ()), (MOE, "--samples", ()),
    (MOE, "--model-dim", ()), (MOE, "--hidden-size", ()), (MOE, "--num-local-experts", ()), (MOE, "--top-k", ()),
    (MOE, "--capacity-factor", ("zero", "negative", "fraction", "huge int")), (MOE, "--a2a-ffn-overlap-degree", ()),
    (MOE, "--replicate-hot", ("zero",)), (MOE, "--block-size", ()), (MOE, "--locality", ("zero", "fraction")),
    (MOE, "--num-steps", ()), (MOE, "--warmup", ("zero",)), (MOE, "--timeout", ("huge int", "fraction")),
    (LSTM, "--time-budget", ("fraction", "huge int")), (LSTM + ["--hours", "1"], "--tokens", ("huge int",)),
    (LSTM + ["--tokens", "1e9"], "--hours", ("fraction", "huge int")),
    (SEARCH[:-2], "--devices", ()), (SEARCH, "--top", ("huge int",)),
    (SEARCH_HW, "--starts", ()), (SEARCH_HW, "--iterations", ()), (SEARCH_HW, "--bounds", ()),
    (GEMM[:-2], "--n", ("huge int",)), (["model", "gemm", "--k", "64", "--n", "64"], "--m", ("huge int",)),
    (["summary", "{run}"], "--digits", ()),
    (["compare", "{run}", "{run}"], "--threshold", ("zero", "fraction", "huge int")),
    (["compare", "{run}", "{run}"], "--group", ()), (["trace", "{csv}"], "--top", ("huge int",)),
]
NUMERIC_CASES = [pytest.param(args, option, value, id=f"{args[0]}-{option}={name}")
                 for args, option, ok in NUMERIC for name, value in BAD.items() if name not in ok]

# Accepted once, refused now: (command line, a fragment of the one-line reason)
COMBINATIONS = [
    (MOE + ["--world-size", "2", "--num-local-experts", "2", "--replicate-hot", "10"], "--replicate-hot 10 exceeds"),
    (MOE + ["--world-size", "2", "--num-local-experts", "4", "--replicate-hot", "0,10"], "--replicate-hot 10 exceeds"),
    (MOE + ["--world-size", "1", "--replicate-hot", "1"], "at world size 1"),
    (MOE + ["--world-size", "1000"], "--world-size 1000 needs 1000 processes"),
    (MOE + ["--world-size", "2147483647"], "processes"),
    (MOE + ["--samples", "2147483647"], "needs at least"),
    (MOE + ["--hidden-size", "2147483647"], "needs at least"),
    (FR[:-2] + ["--baselines", "none,linear"], "'none' means no baseline"),
    (FR[:-2] + ["--baselines", "linear,none"], "'none' means no baseline"),
    (["fragmented", "--sizes", "1073741824", *FR[3:]], "needs at least"),
    (["fragmented", "--sizes", "65536", *FR[3:]], "needs at least"),
    (FR + ["--steps", "100000000"], "100000000 is not in the range"),
    (["switchback", "--dims", "64", "--batch-sizes", "2147483647", *SB[5:]], "needs at least"),
    (SEARCH_HW + ["--starts", "100000000"], "descent steps"),
    (SEARCH_HW + ["--starts", "1000", "--iterations", "1000"], "descent steps"),
    (["model", "floors", "switchback", "batch_size=1", "dim_in=4", "dim_out=4", "foo=1"], "unknown parameter 'foo'"),
    (["model", "floors", "switchback", "batch_size=1", "batch_size=2", "dim_in=4", "dim_out=4"], "given twice"),
    (LSTM + ["--set", "model_param.batch_size=[1"], "is not valid YAML"),
    (LSTM + ["--set", "model_param.batch_size=[1, 2]"], "is a YAML list"),
    (LSTM + ["--set", "model_param.batch_size={a: 1}"], "is a YAML dict"),
    (LSTM + ["--set", "model_param.batch_size=&a [1, *a]"], "alias *a of a list"),
    (LSTM + ["--set", "model_param.batch_size=1", "--set", "model_param.batch_size=2"], "given twice"),
    (LSTM + ["--sweep", "model_param.batch_size=1,[2"], "is not valid YAML"),
    (LSTM + ["--set", "power_breakdown.core=2"], "is a fraction of TDP"),
    (LSTM + ["--set", "power_breakdown.IB=0.9"], "sum to"),
    (LSTM + ["--set", "power_breakdown.L2=-0.1"], "must be >= 0"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("inputs")
    run = write_run(d / "run", [timed_record({"m": 1}, [1.0, 1.1, 1.2])])
    csv = d / "k.csv"
    csv.write_text("step,stream,start_us,dur_us,kind,name\n0,7,0,1,kernel,k\n", encoding="utf-8")
    return {"run": str(run), "csv": str(csv)}


def refused(capsys, tmp_path, monkeypatch, args: list[str], *fragments: str) -> str:
    """Run args in an empty folder; assert exit 2, one line naming each fragment, nothing written."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    if args[0] in ("switchback", "fragmented", "moe") or args[:2] == ["model", "lstm"]:
        args = [*args, "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(args)
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "internal error" not in err and "Traceback" not in err, err
    assert exc.value.code == 2, err
    assert len(lines) == 1, err
    assert all(f in lines[0] for f in fragments), (fragments, lines[0])
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    return lines[0]


@pytest.mark.parametrize("args, option, value", NUMERIC_CASES)
def test_a_bad_number_is_refused_naming_the_option_or_value(args, option, value, inputs, capsys, tmp_path,
                                                            monkeypatch):
    line = refused(capsys, tmp_path, monkeypatch, [a.format(**inputs) for a in args] + [option, value])
    assert option in line or (value and value in line) or "SECTION" in line, line


@pytest.mark.parametrize("args, fragment", COMBINATIONS)
def test_a_meaningless_or_runaway_request_is_refused(args, fragment, capsys, tmp_path, monkeypatch):
    refused(capsys, tmp_path, monkeypatch, list(args), fragment)


def test_enough_hostile_options():
    assert len(NUMERIC_CASES) + len(COMBINATIONS) >= 300, len(NUMERIC_CASES) + len(COMBINATIONS)


LONG = "n" * 300  # one name longer than any file system takes (255 bytes)
PATHS = [  # (command line; {long} is a path whose last name is LONG), each refused naming the path
    (SB + ["--out", "{long}"], "run directory"), (FR + ["--out", "{long}"], "run directory"),
    (MOE + ["--out", "{long}"], "run directory"), (LSTM + ["--out", "{long}"], "run directory"),
    (["import", str(SEED_BNB), "--out", "{long}"], "run directory"), (["import", "{long}"], "results file"),
    (["plot", "{run}", "--out", "{long}.png"], "figure"), (["summary", "{long}"], "run"),
    (["compare", "{run}", "{long}"], "run"), (["model", "lstm", "--config", "{long}"], "config file"),
    (GEMM + ["--calibrated", "{long}"], "hardware file"), (["model", "--against", "{long}", "--gpu", "h200"], "run"),
    (["model", "calibrate", "--device", "cpu", "--file", "{long}.yaml"], "calibration file"),
    (SB + ["--out", "{long}", "--resume"], "--resume"),
]


@pytest.mark.parametrize("args, what", PATHS, ids=[f"{a[0]}-{w}" for a, w in PATHS])
def test_a_name_the_file_system_cannot_take_is_one_line(args, what, inputs, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([a.format(long=tmp_path / LONG, **inputs) for a in args])
    _, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err, err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert what in err and "nnnnnnnn" in err, err
    assert list(tmp_path.iterdir()) == []
