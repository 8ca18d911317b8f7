"""Hostile files: YAML bombs and malformed configs, seed files that are cut, garbled or of the wrong types,
trace tables with impossible times.

Configs: a billion-laughs file is refused in well under a second by every command that reads one, and so is
a key given twice, a file too large, a fraction of TDP out of range. Importers: each field of a bitsandbytes
line replaced by each wrong type is skipped and named (a file where nothing parses is exit 2, nothing
written); a partly good file imports its good lines and says how many it skipped and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from qbench import store
from qbench.importers.bnb import BNB_PARAM_KEYS, BNB_TIME_KEYS
from tests.helpers import run_qbench as qbench

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DEEPFLOW = ROOT / "qbench" / "model" / "configs" / "deepflow.yaml"
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
SCALAR_BOMB = "x: &x lol\n" + "".join(f"k{i}: *x\n" for i in range(200))  # many aliases, each harmless
CONFIG_READERS = [["model", "lstm", "--config"], ["model", "quirks", "--config"],
                  ["model", "search", "--devices", "8", "--config"], ["model", "search-hw", "--config"],
                  ["model", "gemm", "--m", "8", "--k", "8", "--n", "8", "--calibrated"]]



def refused(capsys, tmp_path, monkeypatch, args: list, *fragments: str) -> str:
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = qbench(capsys, args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert all(f in lines[0] for f in fragments), (fragments, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a refused command wrote something"
    return lines[0]


def _deepflow(replace: tuple[str, str] = ("", "")) -> str:
    return DEEPFLOW.read_text(encoding="utf-8").replace(*replace, 1)


BAD_CONFIGS = {
    "billion laughs": (LAUGHS, "alias *a of a list or mapping"),
    "many aliases": (SCALAR_BOMB, "more than 100 aliases"),
    "too large": ("x: " + "1" * 1_100_000, "characters long"),
    "duplicate key": (_deepflow(("    TDP: 300", "    TDP: 300\n    TDP: 300")), "gives the key 'TDP' twice"),
    "duplicate section": (_deepflow() + "\nmodel_param:\n    batch_size: 1\n", "twice"),
    "deep nesting": ("x: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    "not YAML": ("a: [1, 2\n  b: : :\n", "is not valid YAML"),
    "a list": ("- 1\n- 2\n", ""),
    "power over TDP": (_deepflow(("    core: 0.2592", "    core: 0.9")), "sum to"),
    "power fraction over 1": (_deepflow(("    IB: 0.2", "    IB: 5.8")), "power_breakdown.IB = 5.8"),
    "unknown key": (_deepflow(("    TDP: 300", "    TDP: 300\n    TDQ: 1")), "unknown key power_breakdown.TDQ"),
    "a huge value quoted short": (_deepflow(("    TDP: 300", "    TDP: [" + "1, " * 5000 + "1]")), "..."),
}


@pytest.mark.parametrize("reader", CONFIG_READERS, ids=lambda r: r[1])
@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_a_bad_config_is_refused_at_once(reader, name, capsys, tmp_path, monkeypatch):
    text, fragment = BAD_CONFIGS[name]
    path = tmp_path / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    if reader[-1] == "--calibrated" and fragment.startswith(("sum", "power", "unknown", "...")):
        fragment = ""  # a hardware file is not a DeepFlow config: refused for what it lacks
    start = time.monotonic()
    line = refused(capsys, tmp_path, monkeypatch, [*reader, path], fragment)
    assert "cfg.yaml" in line and len(line) < 400, line
    # refused before any expansion: well under a second alone (a billion-laughs file once ran for over a
    # minute); 3 s leaves room for a 2-core machine busy with other work
    assert time.monotonic() - start < 3.0


def test_a_bomb_through_set_is_refused(capsys, tmp_path, monkeypatch):
    bomb = "&a [x, x, x, x, x, x, x, x, x]"
    refused(capsys, tmp_path, monkeypatch, ["model", "lstm", "--config", "deepflow", "--set",
                                            f"model_param.batch_size={bomb}"], "is a YAML list")


WRONG = {"null": None, "true": True, "text": "x", "number text": "1024", "list": [1], "object": {"a": 1},
         "negative": -4, "zero": 0, "NaN": float("nan"), "inf": float("inf"), "float": 2.5}
VALID = {  # key -> names of WRONG values that key accepts
    **dict.fromkeys(("batch_size", "dim_in", "dim_out"), ()), "wm": ("float",), "switch": ("true", "zero"),
    **dict.fromkeys(BNB_TIME_KEYS, ("zero", "float")), "time_standard": ("float",),
}
BNB_LINE = json.loads(next(line for line in (FIXTURES / "seed_bnb_info.jsonl").read_text().splitlines()
                           if line.startswith("{")))
BNB_CASES = [(key, name) for key in (*BNB_PARAM_KEYS, *BNB_TIME_KEYS) if key in BNB_LINE
             for name in WRONG if name not in VALID[key]]


@pytest.mark.parametrize("key, name", BNB_CASES, ids=[f"{k}={n}" for k, n in BNB_CASES])
def test_a_bitsandbytes_line_of_the_wrong_type_is_skipped_and_named(key, name, capsys, tmp_path, monkeypatch):
    good, bad = dict(BNB_LINE), {**BNB_LINE, key: WRONG[name]}
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps(bad) + "\n", encoding="utf-8")
    refused(capsys, tmp_path, monkeypatch, ["import", only_bad, "--format", "bnb-jsonl"], "line 1", key)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f"{json.dumps(good)}\n{json.dumps(bad)}\n", encoding="utf-8")
    code, _, err = qbench(capsys, ["import", mixed, "--out", tmp_path / "run"])
    err = " ".join(err.split())  # notices wrap at the console's width
    assert code == 0, err
    records = store.load_run(tmp_path / "run")[1]  # the good line's shape: one tidy record per variant
    assert f"{len(records)} records in" in err and "1 skipped: line 2: " in err and key in err, err
    assert {r["params"]["batch_size"] for r in records} == {good["batch_size"]}
    assert {r["params"]["variant"] for r in records} == {"16bit", "switchback", "switchback_rowwise"}


def _bnb_text() -> str:
    return (FIXTURES / "seed_bnb_info.jsonl").read_text(encoding="utf-8")


def _moe_text() -> str:
    return (FIXTURES / "seed_moe_baseline.log").read_text(encoding="utf-8")


SEED_FILES = {  # name -> (bytes, exit code, a fragment of stderr)
    "bnb cut mid-line": (_bnb_text()[: len(_bnb_text()) // 2].encode(), 0, "(cut mid-line?)"),
    "bnb all NaN": (_bnb_text().replace('"time_standard": ', '"time_standard": NaN, "x": ').encode(), 2,
                    "time_standard is nan"),
    "bnb negative dims": (_bnb_text().replace('"dim_in": ', '"dim_in": -').encode(), 2, "dim_in is -"),
    "moe binary": (b"[Benchmark] world_size = 4\nSTEP-1: " + bytes(range(128, 256)), 2, "is not a text file"),
    "moe bad header": (_moe_text().replace("world_size = ", "world_size = x"), 2, "not a positive integer"),
    "moe bad STEP": (_moe_text().replace("step_time = ", "step_time = 1.2.", 1), 0,
                     "a STEP line that does not parse"),
    "fragmented header only": (b"Benchmarking with input_size=64, output_size=64, batch_size=1\nLinear Layer:\n",
                               2, "no 'Benchmarking with input_size"),
    "fragmented negative": ((FIXTURES / "seed_fragmented_report.txt").read_text().replace(
        "Forward time: ", "Forward time: -", 1).encode(), 0, "is not a number >= 0"),
    "deepflow garbled": (b"Hardware Configuration\n#&*!\nTime: 12.5\n", 0, "no the component times line"),
}


@pytest.mark.parametrize("name", list(SEED_FILES))
def test_a_damaged_seed_file_says_what_it_skipped(name, capsys, tmp_path, monkeypatch):
    data, expected, fragment = SEED_FILES[name]
    path = tmp_path / "seed.txt"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    if expected == 2:
        refused(capsys, tmp_path, monkeypatch, ["import", path], fragment)
        return
    code, _, err = qbench(capsys, ["import", path, "--out", tmp_path / "run"])
    err = " ".join(err.split())
    assert code == 0 and fragment in err and "skipped" in err, err


def test_the_same_seed_twice_in_one_run_keeps_one_record_per_case(capsys, tmp_path):
    seed = tmp_path / "seed.jsonl"  # the header and 12 results of the published file (each record is fsync'ed)
    seed.write_text("\n".join(_bnb_text().splitlines()[:20]) + "\n", encoding="utf-8")
    doubled = tmp_path / "twice.jsonl"
    doubled.write_text(seed.read_text() * 2, encoding="utf-8")
    run = tmp_path / "run"
    code, _, err = qbench(capsys, ["import", doubled, "--out", run])
    err = " ".join(err.split())
    n = len(store.load_run(run)[1])
    assert code == 0 and "replacing a record of the same case" in err, err
    code, _, err = qbench(capsys, ["import", seed, "--out", run, "--append"])
    records = store.load_run(run)[1]
    assert code == 0 and len(records) == n == len({r["case"] for r in records}), err


@pytest.mark.parametrize("row", ["0,7,0,-5,kernel,k", "0,7,nan,1,kernel,k", "0,7,0,inf,kernel,k"])
def test_a_trace_table_with_impossible_times_is_refused(row, capsys, tmp_path, monkeypatch):
    path = tmp_path / "k.csv"
    path.write_text(f"step,stream,start_us,dur_us,kind,name\n{row}\n", encoding="utf-8")
    refused(capsys, tmp_path, monkeypatch, ["trace", path], "k.csv:2:", "durations >= 0")


def test_enough_hostile_files():
    assert len(BNB_CASES) + len(BAD_CONFIGS) * len(CONFIG_READERS) + len(SEED_FILES) >= 150
