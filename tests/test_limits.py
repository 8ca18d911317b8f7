"""The binding limit where users look: `qbench summary --limits` (per cell, the limit of that metric's prediction
for its record) and the bench tables (per row). Every expectation is computed from the model
(qbench.explain.predictions on the calibration of the run's GPU), never written down."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from qbench import store
from qbench.analysis import summary, summary_output
from qbench.analysis.summary_limits import MIXED
from qbench.explain import limits, predictions, rates
from qbench.telemetry import POWER_CAPPED
from tests.helpers import run_qbench, write_run

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SWITCHBACK = RESULTS / "switchback-h200-modes-c4c2232" / "run1"
FRAGMENTED = [RESULTS / "fragmented-h200-clocks-797e89f" / f"run{i}" for i in (1, 2, 3)]
MOE = RESULTS / "moe-h200-ws1" / "threads-797e89f" / "run1"
BLOCK = RESULTS / "switchback-h200-model" / "vit-h-all" / "run1"
CAPPED = RESULTS / "tidy-ab-h200-ea182f0" / "switchback" / "new1"  # every record's clock held by the power cap
TRAIN_CHECK = RESULTS / "switchback-h200-model" / "train-check"


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    monkeypatch.chdir(ROOT)  # the calibrations are found under results/, as the commands find them


def _loaded(run: Path) -> tuple[dict, list[dict], object]:
    env, records = store.load_run(run)
    return env, records, rates.for_run(env)[0]


def _expected(record: dict, metric: str, calibration) -> str:
    """The limit the model names for one metric of a record, 'power' where the power cap held a compute-bound
    one's clock down."""
    found = predictions(record, calibration).get(metric)
    if found is None:
        return ""
    capped = int(record["metrics"].get("throttle_reasons") or 0) & POWER_CAPPED
    return "power" if capped and found.limit == "compute" else found.limit


def _record_at(records: list[dict], params: dict) -> dict:
    """The one record whose params hold these values."""
    (found,) = [r for r in records if all(r["params"].get(k) == v for k, v in params.items())]
    return found


def _cells_by_record(result, records: list[dict]):
    """(record, metric, cell) of every cell of a summary of one run without a pivot."""
    for values, cells in result.rows:
        record = _record_at(records, {**result.fixed, **dict(zip(result.row_params, values))})
        for (metric, _), cell in cells.items():
            if cell is not None:
                yield record, metric, cell


# ---- qbench.explain.limits: the limit of a metric, the power rule --------------------------------------------


def test_the_limit_of_each_metric_is_that_of_its_prediction_and_power_where_the_clock_was_capped():
    for run in (SWITCHBACK, CAPPED):
        env, records, calibration = _loaded(run)
        limit_of, found = limits.limiter(env), limits.for_run(env)
        for record in records[:60]:
            expected = {m: _expected(record, m, calibration) for m in predictions(record, calibration)}
            assert found.per_metric(record) == expected
            assert all(limit_of(record, m) == want for m, want in expected.items())
            assert limit_of(record, "no_such_metric") == ""
    _, records, calibration = _loaded(CAPPED)
    capped = [limits.metric_limits(r, calibration) for r in records]
    assert any("power" in found.values() and "memory" in found.values() for found in capped)  # per metric
    assert not any("compute" in found.values() for found in capped)  # every compute-bound one is 'power'


def test_a_run_without_a_calibration_has_no_limits_and_says_why():
    _, records, _ = _loaded(SWITCHBACK)
    cpu, other = limits.for_run({"gpu_name": None}), limits.for_run({"gpu_name": "NVIDIA A40"})
    assert (cpu.missing, other.missing) == ("no calibration for a CPU run", "no calibration for NVIDIA A40")
    assert cpu.of(records[0]) == "" and cpu.per_metric(records[0]) == {} and other.of(records[0]) == ""


# ---- qbench summary --limits ------------------------------------------------------------------------------------


def test_each_cell_shows_the_limit_of_its_own_metric_for_its_record():
    """Per metric, not the record's main metric: fp8_all's quantizers and its products differ."""
    _, records, calibration = _loaded(SWITCHBACK)
    options = summary.SummaryOptions(("kernels_ms", "fwd_ms", "quantize_x_ms", "kernels_speedup"),
                                     ("variant=fp8_all/", "timing=per_kernel"), limits=True)
    result = summary.summarize([str(SWITCHBACK)], options)
    seen = set()
    for record, metric, cell in _cells_by_record(result, records):
        assert cell.limit == _expected(record, metric, calibration), (record["case"], metric)
        text = summary_output.cell_text(cell, 4)
        assert text == " ".join(filter(None, (summary_output.cell_text(replace(cell, limit=""), 4), cell.limit)))
        seen.add((metric, cell.limit))
    assert {("quantize_x_ms", "memory"), ("fwd_ms", "compute")} <= seen  # per metric: both in fp8_all's kernel records
    assert {limit for metric, limit in seen if metric == "kernels_speedup"} == {""}  # one the model does not predict
    assert any(line.startswith("limit after a value") for line in summary_output.legend(result))


def test_limits_on_a_power_capped_run_name_power():
    _, records, calibration = _loaded(CAPPED)
    result = summary.summarize([str(CAPPED)], summary.SummaryOptions(("kernels_ms", "quantize_x_ms"),
                                                                     ("timing=per_kernel",), limits=True))
    shown = [(cell.limit, _expected(record, metric, calibration)) for record, metric, cell in
             _cells_by_record(result, records)]
    assert all(got == want for got, want in shown) and ("power", "power") in shown


def test_the_default_output_is_that_with_limits_less_the_limits(capsys):
    """Without --limits a cell, the legend and the JSON are as they were: the --limits output with every limit
    and the lines about them taken out."""
    run = str(FRAGMENTED[0])
    args = ["summary", run, "--metric", "fwd_bwd_ms", "--metric", "tflops", "--by", "variant", "--markdown"]
    _, plain, _ = run_qbench(capsys, args)
    _, limited, _ = run_qbench(capsys, [*args, "--limits"])
    names = ("compute", "memory", "launch", "host", "link", "power")
    stripped = "\n".join(line for line in limited.splitlines() if not line.startswith("limit after a value"))
    for name in names:
        stripped = stripped.replace(f" {name} |", " |")
    assert stripped + "\n" == plain and limited != plain
    _, default_json, _ = run_qbench(capsys, ["summary", run, "--metric", "fwd_bwd_ms", "--json"])
    assert '"limit"' not in default_json and "limits_missing" not in default_json


def test_json_carries_each_cells_limit(capsys):
    _, records, calibration = _loaded(FRAGMENTED[0])
    code, out, err = run_qbench(capsys, ["summary", FRAGMENTED[0], "--metric", "step_ms", "--metric", "tflops",
                                         "--limits", "--json"])
    assert code == 0, err
    payload = json.loads(out)
    assert payload["limits_missing"] == {}
    for row in payload["rows"]:
        record = _record_at(records, {**payload["fixed"], **row["params"]})
        measured = row["metric"] in record["metrics"]  # a prediction of a metric the record lacks shows nowhere
        assert row["limit"] == ((_expected(record, row["metric"], calibration) if measured else "") or None), row
    assert {row["limit"] for row in payload["rows"] if row["metric"] == "step_ms" and row["value"]} - {None}


def _check_across(runs: list[str], options: summary.SummaryOptions, calibration) -> set[str]:
    """Every cell of the summary of these runs shows the limit each run's record (with the metric) names, MIXED
    where they differ; the limits shown."""
    result = summary.summarize(runs, options)
    per_run = [store.load_run(run)[1] for run in runs]
    for values, cells in result.rows:
        params = {**result.fixed, **dict(zip(result.row_params, values))}
        for (metric, _), cell in cells.items():
            measured = [r for recs in per_run if metric in (r := _record_at(recs, params))["metrics"]]
            found = {_expected(r, metric, calibration) for r in measured} or {""}
            assert cell.limit == (MIXED if len(found) > 1 else found.pop()), (params, metric)
    shown = {cell.limit for _, cells in result.rows for cell in cells.values()}
    assert (MIXED in shown) == any(line.startswith(f"{MIXED}:") for line in summary_output.legend(result))
    return shown


def test_across_runs_a_cell_shows_the_limit_every_runs_record_agrees_on_else_mixed(tmp_path):
    """Three runs of one command; then a run beside a copy of it with every clock held by the power cap, where
    the compute-bound cells of the copy become 'power' and the combined cells 'mixed'."""
    calibration = _loaded(FRAGMENTED[0])[2]
    options = summary.SummaryOptions(("forward_ms", "fwd_bwd_ms"), across_runs="median", limits=True)
    assert _check_across(list(map(str, FRAGMENTED)), options, calibration) - {"", MIXED}
    _, records, calibration = _loaded(SWITCHBACK)
    capped = [{**r, "metrics": {**r["metrics"], "throttle_reasons": POWER_CAPPED}} for r in records]
    runs = [str(SWITCHBACK), str(write_run(tmp_path / "capped", capped))]
    options = summary.SummaryOptions(("kernels_ms", "cast_x_ms"), ("variant=16bit/", "timing=per_kernel"),
                                     across_runs="median", limits=True)
    assert {MIXED, "memory"} <= _check_across(runs, options, calibration)  # compute is mixed, memory agreed


def test_a_ratio_cell_shows_the_limit_of_the_record_divided():
    _, records, calibration = _loaded(FRAGMENTED[0])
    options = summary.SummaryOptions(("fwd_bwd_ms",), ratio_to="variant=dense", limits=True)
    result = summary.summarize([str(FRAGMENTED[0])], options)
    for record, metric, cell in _cells_by_record(result, [r for r in records if r["params"]["variant"] != "dense"]):
        assert cell.limit == _expected(record, metric, calibration)
    assert any(c.limit for _, cells in result.rows for c in cells.values())


def test_a_cpu_run_shows_no_limits_and_the_legend_says_why(tmp_path, capsys):
    out = tmp_path / "cpu"
    code, table, err = run_qbench(capsys, ["fragmented", "--device", "cpu", "--sizes", "64", "--batch-sizes", "1",
                                           "--fragments", "2", "--tasks", "train", "--steps", "1", "--warmup",
                                           "0", "--out", out])
    assert code == 0, err
    last = table[table.rindex("\u2503 limit"):]  # the (last) table of the limit column, just before the status
    limit_cells = [line.split("\u2502")[-3].strip() for line in last.splitlines() if line.startswith("\u2502")]
    assert limit_cells and set(limit_cells) == {"-"}
    assert "limit: none, no calibration for a CPU run" in table  # and why it holds no limit
    code, text, err = run_qbench(capsys, ["summary", out, "--metric", "fwd_bwd_ms", "--limits", "--markdown"])
    assert code == 0, err
    cells = [line for line in text.splitlines() if line.startswith("| ") and "variant" not in line]
    assert cells and not any(name in line for line in cells for name in (" compute ", " memory ", " host "))
    assert "limits: none shown, no calibration for a CPU run" in text
    code, mixed, err = run_qbench(capsys, ["summary", out, FRAGMENTED[0], "--metric", "fwd_bwd_ms", "--limits"])
    assert code == 0, err
    assert f"limits: none for {out}: no calibration for a CPU run" in mixed


def test_records_the_model_does_not_predict_show_no_limit_and_the_legend_says_so(capsys):
    code, text, err = run_qbench(capsys, ["summary", TRAIN_CHECK, "--metric", "final_loss", "--limits"])
    assert code == 0, err
    assert "limits: none shown, the model predicts none of these cells" in text


def test_limits_and_spreads_are_refused_together(capsys):
    code, _, err = run_qbench(capsys, ["summary", *FRAGMENTED[:2], "--across-runs", "median", "--spreads",
                                       "--limits"])
    assert code == 2 and "--spreads and --limits" in err


# ---- the bench tables ---------------------------------------------------------------------------------------------


def _column(table, header: str) -> list[str]:
    (index,) = [i for i, c in enumerate(table.columns) if c.header == header]
    return [row[index].plain for row in table.rows]


def _fits(table) -> None:
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=120, no_color=True)
    console.print(table)
    text = console.file.getvalue()
    assert max(map(len, text.splitlines())) <= 120 and "\u2026" not in text


@pytest.mark.parametrize("run, family", [(FRAGMENTED[0], "fragmented"), (MOE, "moe"), (BLOCK, "block")])
def test_a_bench_table_of_a_gpu_run_shows_the_limit_of_each_row(run, family):
    from qbench.contract import family as family_of

    env, records, calibration = _loaded(run)
    rows = [r for r in records if "rank" not in r["params"]]  # the moe table leaves per-rank records out
    table = family_of(family).table(records, limits.for_run(env))
    expected = [limits.limit(r, calibration) or "-" for r in rows]
    assert _column(table, "limit") == expected
    assert set(expected) - {"-"}  # the model names a limit for some row
    assert any(note.startswith("limit: what binds") for note in table.notes)
    _fits(table)


def test_the_switchback_table_names_what_binds_the_16bit_kernels_after_their_time():
    from qbench.benches import switchback
    from qbench.migration.switchback import shapes, where

    for run in (SWITCHBACK, CAPPED):
        env, records, calibration = _loaded(run)
        table = switchback.table(records, limits.for_run(env))
        baselines = [next(r for r in group if where(r) == ("16bit", "eager", "per_kernel"))
                     for group in shapes(records)]
        cells = _column(table, "16bit")
        assert [cell.split()[-1] for cell in cells] == [limits.limit(r, calibration) for r in baselines]
        assert all(len(cell.split()) == 2 for cell in cells)
        _fits(table)
    assert {cell.split()[-1] for cell in cells} == {"power"}  # the capped run: compute at a power-capped clock
    plain = switchback.table(records, limits.for_run({}))
    assert all(len(cell.split()) == 1 for cell in _column(plain, "16bit"))
    assert "limit: none, no calibration for a CPU run" in plain.notes


def test_the_runner_gives_a_bench_table_the_limits_of_the_gpu_its_run_env_names(tmp_path):
    from qbench.benches import fragmented, train_check
    from qbench.runner import limited_table

    env, records, calibration = _loaded(FRAGMENTED[0])
    out = write_run(tmp_path / "gpu", records, **{k: v for k, v in env.items() if k != "gpu_name"})
    table = limited_table(fragmented, str(out))(store.read_records(out))
    assert _column(table, "limit") == [limits.limit(r, calibration) or "-" for r in records]
    assert limited_table(train_check, str(out)) is train_check.table  # a family the model does not predict


# ---- summary --predicted: the model's time beside the measured one --------------------------------------------


def test_predicted_cells_hold_the_models_time_of_their_record_and_print_it_after_the_limit():
    _, records, calibration = _loaded(BLOCK)
    result = summary.summarize([str(BLOCK)], summary.SummaryOptions(metrics=("step_ms",), predicted=True))
    seen = 0
    for record, metric, cell in _cells_by_record(result, records):
        want = predictions(record, calibration).get(metric)
        assert cell.predicted == (None if want is None else want.ms)
        assert cell.limit == _expected(record, metric, calibration)
        if want is not None:
            seen += 1
            text = summary_output.cell_text(cell, 4)
            assert text.endswith(f"{cell.limit}, model {summary_output.report.format_sig(want.ms, 4)}")
    assert seen > 0
    assert any(line.startswith("model X:") for line in summary_output.legend(result))


def test_predicted_across_runs_is_the_median_of_the_runs_predictions_and_json_carries_it(capsys):
    runs = [RESULTS / "switchback-h200-model" / "vit-h-all" / f"run{i}" for i in (1, 2, 3)]
    code, out, err = run_qbench(capsys, ["summary", *map(str, runs), "--across-runs", "median", "--metric", "step_ms",
                                         "-k", "exec=graph", "-k", "variant=16bit/", "--predicted", "--json"])
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    each = []
    for run in runs:
        _, records, calibration = _loaded(run)
        record = _record_at(records, {"exec": "graph", "variant": "16bit"})
        each.append(predictions(record, calibration)["step_ms"].ms)
    assert row["predicted"] == pytest.approx(sorted(each)[1]) and row["limit"] == "compute"


def test_predicted_refuses_a_ratio(capsys):
    code, _, err = run_qbench(capsys, ["summary", str(BLOCK), "--metric", "step_ms", "--ratio-to", "variant=16bit",
                                       "--predicted"])
    assert code == 2 and "--predicted" in err and len(err.strip().splitlines()) == 1
