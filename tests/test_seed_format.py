"""`qbench switchback --format seed` writes the original benchmark's info.jsonl: exactly its keys, in
its order, of its types; the writer is the inverse of the `qbench import` reader, both ways."""

from __future__ import annotations

import json

from qbench import store
from qbench.analysis.join import join_params
from qbench.importers import bnb
from qbench.importers.bnb import SEED_KEYS, format_bnb_jsonl, read_bnb_jsonl
from qbench.migration.switchback import shapes, wide
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
    seeds = [{**group[0]["params"], **wide(group)} for group in shapes(records)]
    assert len(rows) == len(seeds) == 2
    for row, shape in zip(rows, seeds):
        assert tuple(row) == SEED_KEYS
        assert all(type(row[k]) is t for k, t in SEED_TYPES.items()) and type(row["wm"]) is int
        assert all(type(row[k]) is float and row[k] == shape[k] for k in SEED_KEYS[6:])
        assert row["repeat"] == shape["repeat"] == 2
    _, imported = read_bnb_jsonl(text)
    for back, rec in zip(shapes(imported), shapes(records)):
        # fp16: the seed format has no dtype, the reader assumes fp16; nor a backward thread (PyTorch's default)
        assert join_params(shape_params(back)) == join_params(shape_params(rec))
        assert {k: v for k, v in wide(back).items() if k in SEED_KEYS} == {
            k: v for k, v in wide(rec).items() if k in SEED_KEYS}
        assert bnb.shape_line(back) == bnb.shape_line(rec)


def shape_params(records: list[dict]) -> dict:
    """The params a shape's records share (without the variant, exec and timing that tell them apart)."""
    return {k: v for k, v in records[0]["params"].items() if k not in ("variant", "exec", "timing")}


def _shape(variant_metrics: dict[str, dict], status: str = "ok", **params) -> list[dict]:
    base = {"batch_size": 8, "dim_in": 4, "dim_out": 16, "wm": 4.0, "switch": False, **params}
    return [{"bench": "switchback", "status": status, "metrics": metrics,
             "params": {**base, "variant": variant, "exec": "eager", "timing": "per_kernel"}}
            for variant, metrics in variant_metrics.items()]


def test_records_without_every_seed_key_are_left_out():
    """One line per shape whose records hold every seed key; a shape missing one, or with a record that is not
    ok, is left out and counted."""
    full = {variant: dict.fromkeys(names, 0.5) for variant, names in (
        ("16bit", ("fwd_ms", "gw_ms", "gx_ms", "kernels_ms", "cast_x_ms", "cast_g_ms", "cast_w_ms")),
        ("switchback", ("fwd_ms", "bwd_ms", "quantize_x_ms", "quantize_g_ms", "quantize_w_ms", "quantize_w_t_ms",
                        "kernels_ms")),
        ("switchback_rowwise", ("fwd_ms", "bwd_ms", "quantize_w_ms", "quantize_w_t_ms", "kernels_ms")))}
    full["16bit"]["repeat"] = 3
    partial = {**full, "switchback_rowwise": {k: v for k, v in full["switchback_rowwise"].items() if k != "fwd_ms"}}
    lines, left_out = format_bnb_jsonl([*_shape(full), *_shape(partial, dim_in=8), *_shape(full, "error", dim_in=12)])
    assert left_out == 2 and len(lines) == 1 and json.loads(lines[0])["wm"] == 4
    assert json.loads(lines[0])["rowwise_fwd"] == 0.5 and json.loads(lines[0])["repeat"] == 3


def test_every_committed_switchback_record_comes_back_from_its_tidy_records():
    """wide(tidy(x)) == x for the metrics of every switchback record under results/ (schema 1, read as stored):
    what --format seed writes from a tidy run is what the record held."""
    from pathlib import Path

    from qbench.migration.switchback import tidy

    root = Path(__file__).resolve().parent.parent / "results"
    stored = [json.loads(line) for path in sorted(root.rglob(store.RECORDS_FILE))
              for line in path.read_text().splitlines() if line.strip()]
    wide_records = [r for r in stored if r.get("bench") == "switchback" and r.get("metrics")
                    and r.get("schema_version", 1) == 1]  # today's runs beside them are tidy already
    assert len(wide_records) > 100  # the reference runs are there: the walk checks what it claims
    for record in wide_records:
        parts = [{"params": params, "metrics": metrics} for params, metrics, _ in tidy(record["params"],
                                                                                   record["metrics"])]
        assert wide(parts) == record["metrics"], record["case"]
