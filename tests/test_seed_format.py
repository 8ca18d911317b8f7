"""`qbench switchback --format seed` writes the original benchmark's info.jsonl: exactly its keys, in
its order, of its types; the writer is the inverse of the `qbench import` reader, both ways."""

from __future__ import annotations

import json

from qbench import store
from qbench.analysis.join import join_params
from qbench.importers.bnb import SEED_KEYS, format_bnb_jsonl, read_bnb_jsonl, seed_line
from tests.test_switchback_cli import qbench

SEED_TYPES = {"repeat": int, "batch_size": int, "dim_out": int, "dim_in": int, "switch": bool}


def _seed_json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]


def test_original_lines_survive_import_and_export_byte_for_byte(fixtures_dir):
    text = (fixtures_dir / "seed_bnb_info.jsonl").read_text()
    _, records = read_bnb_jsonl(text)
    lines, left_out = format_bnb_jsonl(records)
    assert left_out == 0 and lines == _seed_json_lines(text)  # 142 lines, wm 4 / 4.3637 / 4.9231 included


def test_cpu_run_in_seed_format_reads_back_through_import(tmp_path):
    out = tmp_path / "run"
    res = qbench("--dims", "32", "--batch-sizes", "16", "--repeat", "2", "--variants", "global,rowwise",
                 "--format", "seed", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "seed format: 2 lines" in res.stderr
    _, records = store.load_run(out)
    text = (out / "info.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == 2
    for row, rec in zip(rows, records):
        assert tuple(row) == SEED_KEYS
        assert all(type(row[k]) is t for k, t in SEED_TYPES.items()) and type(row["wm"]) is int
        assert all(type(row[k]) is float and row[k] == rec["metrics"][k] for k in SEED_KEYS[6:])
        assert row["repeat"] == rec["metrics"]["repeat"] == 2
    _, imported = read_bnb_jsonl(text)
    for back, rec in zip(imported, records):
        # fp16: the seed format has no dtype, the reader assumes fp16; nor a backward thread (PyTorch's default)
        assert join_params(back["params"]) == join_params(rec["params"])
        assert {k: back["metrics"][k] for k in SEED_KEYS if k in back["metrics"]} == {
            k: rec["metrics"][k] for k in SEED_KEYS if k in rec["metrics"]}
        assert seed_line(back) == seed_line(rec)


def test_records_without_every_seed_key_are_left_out():
    full = {"bench": "switchback", "status": "ok", "params": {"batch_size": 8, "dim_in": 4, "dim_out": 16,
                                                               "wm": 4.0, "switch": False}}
    full["metrics"] = {k: 0.5 for k in SEED_KEYS[6:]} | {"repeat": 3}
    partial = {**full, "metrics": {k: v for k, v in full["metrics"].items() if k != "rowwise_fwd"}}
    failed = {**full, "status": "error"}
    lines, left_out = format_bnb_jsonl([full, partial, failed])
    assert left_out == 2 and len(lines) == 1 and json.loads(lines[0])["wm"] == 4
