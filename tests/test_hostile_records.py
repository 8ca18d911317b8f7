"""Hostile run directories: every field of a record replaced by each wrong type, lines that are not records.

Each generated line sits in a run beside one good record. `qbench summary` and `qbench compare` read the
good record and leave the bad line out, named once on stderr as FILE:LINE; with --strict the bad line is a
one-line usage error (exit 2); a run holding only the bad line is a usage error. Never "internal error",
never a traceback. All in process: each case is a few hundredths of a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qbench import store
from tests.helpers import run_qbench as qbench

GOOD = store.make_record("toy", {"m": 1, "dtype": "fp16"}, {"time": 1.0, "tflops": 2.0},
                         units={"time": "ms", "tflops": "TFLOP/s"}, samples={"time": [1.0, 1.1, 0.9]})

WRONG = {  # a value of each JSON type (and the non-finite numbers Python's json accepts)
    "null": None, "true": True, "zero": 0, "float": 1.5, "NaN": float("nan"), "inf": float("inf"),
    "huge int": 10**400, "text": "x", "empty text": "", "empty list": [], "list": [1, "a"], "object": {"a": {"b": 1}},
    "empty object": {},
}
ALLOWED = {  # field -> names of WRONG values that are valid there (all others must be refused)
    "bench": ("text",), "case": ("null", "text", "empty text"), "params": ("object", "empty object"),
    "metrics": ("empty object",), "units": ("empty object",), "samples": ("empty object",), "status": (),
    "error": ("null", "text", "empty text"), "device": ("null", "text", "empty text"),
    "source_hash": ("null", "text", "empty text"), "schema_version": ("zero",),
}
FIELD_CASES = [(field, name) for field in ALLOWED for name in WRONG if name not in ALLOWED[field]]
INNER = {  # field -> key whose value each wrong value replaces, and the names valid there
    "params": ("m", ("null", "true", "zero", "float", "text", "empty text")),
    "metrics": ("time", ("null", "zero", "float")),
    "units": ("time", ("text", "empty text")),
    "samples": ("time", ("empty list",)),
}
INNER_CASES = [(field, name) for field, (_, ok) in INNER.items() for name in WRONG if name not in ok]
LINES = {  # whole lines that are not records
    "not JSON": "not json at all", "a JSON list": "[1, 2]", "a JSON number": "3", "a JSON text": '"x"',
    "JSON null": "null", "truncated": json.dumps(GOOD)[:40] + "\n" + json.dumps(GOOD)[40:],
    "deep nesting": "[" * 100_000, "an int of 5000 digits": "1" * 5000, "no bench": json.dumps({"params": {},
    "metrics": {}}), "no params": json.dumps({"bench": "toy", "metrics": {}}), "no metrics": json.dumps(
        {"bench": "toy", "params": {}}), "a bench path": json.dumps({**GOOD, "bench": "../../etc"}),
    "a newer schema": json.dumps({**GOOD, "schema_version": 99}), "sample text": json.dumps(
        {**GOOD, "samples": {"time": [1.0, "x"]}}), "bad status": json.dumps({**GOOD, "status": "fine"}),
    "metric NaN literal": json.dumps(GOOD).replace('"time": 1.0', '"time": NaN', 1),
    "metric Infinity literal": json.dumps(GOOD).replace('"time": 1.0', '"time": -Infinity', 1),
}


def _with(field: str, name: str, inner: bool = False) -> str:
    record = json.loads(json.dumps(GOOD))
    if inner:
        record[field] = {**record[field], INNER[field][0]: WRONG[name]}
    else:
        record[field] = WRONG[name]
    return json.dumps(record)  # NaN and Infinity as the literals Python's json writes (and reads)


def _run(tmp_path: Path, bad_line: str, good: bool = True) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / store.ENV_FILE).write_text(json.dumps({"gpu_name": "NVIDIA H200"}), encoding="utf-8")
    good_line = json.dumps(GOOD) + "\n" if good else ""
    (run / store.RECORDS_FILE).write_text(good_line + bad_line + "\n", encoding="utf-8")
    return run



HOSTILE = ([pytest.param(_with(f, n), id=f"{f}={n}") for f, n in FIELD_CASES]
           + [pytest.param(_with(f, n, inner=True), id=f"{f}.{INNER[f][0]}={n}") for f, n in INNER_CASES]
           + [pytest.param(line, id=name) for name, line in LINES.items()])


@pytest.mark.parametrize("bad_line", HOSTILE)
def test_a_bad_line_is_left_out_and_named_once(bad_line, tmp_path, capsys):
    run = _run(tmp_path, bad_line)
    before = sorted(p.name for p in run.iterdir())
    for args in (["summary", run, "--metric", "time"], ["compare", run, run]):
        code, out, err = qbench(capsys, args)
        warned = [line for line in err.splitlines() if "left out" in line]
        assert code == 0, err
        assert len(warned) == 1 and f"{run / store.RECORDS_FILE}:2:" in warned[0], err
        assert "m" in out  # the good record is still read
    assert sorted(p.name for p in run.iterdir()) == before  # reading writes nothing


@pytest.mark.parametrize("bad_line", HOSTILE)
def test_strict_refuses_a_bad_line_in_one_line(bad_line, tmp_path, capsys):
    run = _run(tmp_path, bad_line)
    code, _, err = qbench(capsys, ["summary", run, "--metric", "time", "--strict"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{run / store.RECORDS_FILE}:2:" in err and "--strict" in err


@pytest.mark.parametrize("bad_line", HOSTILE)
def test_a_run_of_only_bad_lines_is_a_usage_error(bad_line, tmp_path, capsys):
    run = _run(tmp_path, bad_line, good=False)
    for args in (["compare", run, run], ["model", "--against", run, "--gpu", "h200"]):
        code, _, err = qbench(capsys, args)
        errors = [line for line in err.splitlines() if "error:" in line]
        assert code == 2 and len(errors) == 1 and f"{run} is an empty run" in errors[0], err


def test_enough_hostile_records():
    assert len(HOSTILE) >= 150, len(HOSTILE)


def test_the_schema_names_the_field_and_the_line(tmp_path, capsys):
    run = _run(tmp_path, _with("metrics", "text", inner=True))
    code, _, err = qbench(capsys, ["summary", run, "--metric", "time", "--strict"])
    assert "results.jsonl:2: the record metrics.time is text, not a finite number or null" in err


def test_a_good_run_beside_a_bad_one_is_still_read(tmp_path, capsys):
    bad = _run(tmp_path, _with("params", "list"), good=False)
    good = tmp_path / "good"
    good.mkdir()
    (good / store.ENV_FILE).write_text("{}", encoding="utf-8")
    (good / store.RECORDS_FILE).write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    code, _, err = qbench(capsys, ["summary", good, "--metric", "time"])
    assert code == 0, err
    code, _, err = qbench(capsys, ["compare", good, bad])
    assert code == 2 and "is an empty run" in err


def test_a_warning_is_one_line_on_stderr_of_a_real_process(tmp_path):
    import subprocess
    import sys

    run = _run(tmp_path, "[1, 2]")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "qbench", "summary", str(run), "--metric", "time"], cwd=root,
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(root), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"qbench: warning: {run / store.RECORDS_FILE}: 1 line left out, not valid "
                                        f"records: {run / store.RECORDS_FILE}:2: the record is a list, not a record "
                                        "object"]


@pytest.mark.parametrize("bench", ["switchback", "fragmented", "moe", "model", "block",
                                   "train_check"])
@pytest.mark.parametrize("params", [{"x": "y"}, {"batch_size": "big", "dim_in": "wide", "dim_out": None,
                                                 "in_features": "a", "out_features": "b", "layer": 1,
                                                 "world_size": "w", "model": 3, "variant": 4, "exec": None}],
                         ids=["foreign params", "words for sizes"])
def test_a_valid_record_with_foreign_params_is_never_a_crash(bench, params, tmp_path, capsys):
    """The schema checks types, not which parameters or metrics a bench has: the figure and the floors name
    the run. Written by hand in today's schema, as another tool might (store.make_record refuses a family's
    undeclared metric), so no migration reads it."""
    record = {"schema_version": store.SCHEMA_VERSION, "bench": bench, "params": params,
              "metrics": {"time": 1.0, "forward_ms": 1.0, "step_time": 1.0},
              "units": {"time": "ms", "forward_ms": "ms", "step_time": "ms"}}
    run = _run(tmp_path, json.dumps(record), good=False)
    code, _, err = qbench(capsys, ["plot", run, "--out", tmp_path / "f.png"])
    assert code in (0, 2), err
    assert code == 0 or (len(err.strip().splitlines()) == 1 and "run" in err and not (tmp_path / "f.png").exists())
    code, _, err = qbench(capsys, ["model", "--against", run, "--gpu", "h200"])
    assert code == 2 and "no record the model knows" in err, err


READERS = {  # every command that reads runs: its arguments for one run (a toy run has no standard figure)
    "summary": ["summary", "{run}", "--metric", "time"], "compare": ["compare", "{run}", "{run}"],
    "history": ["history", "{run}", "{run}", "--metric", "time"], "export": ["export", "{run}", "--format", "bmf"],
    "report": ["report", "{run}", "--html", "{tmp}/r.html", "--metric", "time"],
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_leaves_a_bad_line_out_or_refuses_it_with_strict(reader, tmp_path, capsys):
    run = _run(tmp_path, _with("metrics", "list"))
    args = [a.format(run=run, tmp=tmp_path) for a in READERS[reader]]
    code, _, err = qbench(capsys, args)
    assert code == 0 and f"{run / store.RECORDS_FILE}:2: the record metrics is a list" in err, err
    code, _, err = qbench(capsys, [*args, "--strict"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--strict" in err, err
