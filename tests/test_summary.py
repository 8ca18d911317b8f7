"""qbench summary: cells from hand-made records, pivots, repeats combined, printing, the command line."""

import itertools
import json
import os
import subprocess
import sys

import pytest

from qbench import report, store, units
from qbench.analysis import summary, summary_output
from qbench.errors import QbenchUsageError
from qbench.samples import percentile
from tests.helpers import write_run

SAMPLES = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]  # median 1.3, p20 1.12, p80 1.48 (linear interpolation)


def _record(params, time=None, speedup=None, samples=None, bench="toy", **kw):
    """A record with a time (ms, with samples unless told otherwise) and a stored speed-up (x, no samples)."""
    metrics, unit = {}, {}
    if time is not None:
        metrics["time"], unit["time"] = time, units.MS
    if speedup is not None:
        metrics["speedup"], unit["speedup"] = speedup, units.SPEEDUP
    return store.make_record(bench, params, metrics, units=unit, samples={"time": samples} if samples else {}, **kw)


def _summary(tmp_path, *record_lists, **options):
    runs = [write_run(tmp_path / f"run{i}", recs) for i, recs in enumerate(record_lists)]
    return summary.summarize([str(r) for r in runs], summary.SummaryOptions(**options))


def _cells(result, metric, column=""):
    return {values: cells.get((metric, column)) for values, cells in result.rows}


@pytest.mark.parametrize(
    "value, digits, text",
    [(1.398, 4, "1.398"), (1.3984, 4, "1.398"), (1.39996, 4, "1.39996"), (1.4, 4, "1.400"), (1.398, 3, "1.398"),
     (0.96643, 4, "0.9664"), (1272.3, 4, "1272"), (1269.6, 4, "1269.6"), (71311360.0, 4, "71311360"), (0.0, 4, "0"),
     (-3.4731, 4, "-3.473"), (1.23456e-6, 4, "1.235e-06"), (8192, 4, "8192"), (None, 4, "-")],
)
def test_significant_digits_never_round_onto_a_zero(value, digits, text):
    assert report.format_sig(value, digits) == text


def test_a_target_is_met_or_missed_by_the_printed_value():
    """Targets of fewer significant digits than printed: the printed value falls on the same side."""
    for target in (1.4, 1.35, 3.3, 1250.0, 0.95, 15.0, 0.25):
        for rel in (1e-2, 3e-3, 1e-3, 4e-4, 1e-4, 3e-5, 1e-5, 1e-6, 1e-9, 0.0):
            for value in (target * (1 - rel), target * (1 + rel)):
                printed = float(report.format_sig(value, 4))
                assert (printed >= target) == (value >= target), (target, value, printed)
                assert (printed <= target) == (value <= target), (target, value, printed)


def test_cells_from_samples_or_stored_alone():
    rec = _record({"m": 1}, time=1.3, speedup=1.398, samples=SAMPLES)
    cell = summary.record_cell(rec, "time")
    assert (cell.value, cell.samples, cell.off_samples) == (1.3, 7, False)
    assert cell.p20 == pytest.approx(percentile(SAMPLES, 20)) == pytest.approx(1.12)
    assert cell.p80 == pytest.approx(1.48)
    stored = summary.record_cell(rec, "speedup")
    assert (stored.value, stored.samples, stored.p20) == (1.398, 0, None)
    total = summary.record_cell(_record({"m": 1}, time=1.25, samples=SAMPLES), "time")  # a sum of medians, say
    assert total.value == 1.25 and total.off_samples
    assert summary.record_cell(rec, "nosuch") is None
    assert summary_output.cell_text(cell, 4) == "1.300 [1.120, 1.480]"
    assert summary_output.cell_text(stored, 4) == "1.398" + summary_output.STORED_ONLY
    assert summary_output.cell_text(total, 4).startswith("1.250" + summary_output.OFF_SAMPLES)


def _sweep(factor=1.0):
    """switchback-shaped records of a bench qbench does not declare (their metrics `time` and `speedup` carry
    the units they store): (dim_in, dim_out) x batch_size, speed-ups stored, times sampled."""
    out = []
    for (din, dout), batch in itertools.product([(1024, 4096), (4096, 1024)], [8192, 32768]):
        speedup = factor * din / dout * batch / 8192
        samples = [x * factor * batch / 1000 for x in SAMPLES]
        out.append(_record({"batch_size": batch, "dim_in": din, "dim_out": dout, "dtype": "fp16"},
                           time=percentile(samples, 50), speedup=speedup, samples=samples, bench="sweep"))
    return out


def test_pivot_rows_by_shape_columns_by_batch(tmp_path):
    result = _summary(tmp_path, _sweep(), metrics=("speedup",), by="batch_size")
    assert result.row_params == ["dim_in", "dim_out"] and result.fixed == {"dtype": "fp16"}
    assert result.columns == [8192, 32768]
    assert _cells(result, "speedup", "32768")[(4096, 1024)].value == pytest.approx(16.0)
    headers, rows = summary_output.text_rows(result, 4)
    assert headers == ["dim_in", "dim_out", "batch_size=8192", "batch_size=32768"]
    assert rows[0] == ["1024", "4096", "0.2500" + summary_output.STORED_ONLY, "1.000" + summary_output.STORED_ONLY]
    text = summary_output.markdown(result, 4)
    assert text.splitlines()[0] == "| dim_in | dim_out | batch_size=8192 | batch_size=32768 |"
    assert "fixed: dtype=fp16" in text and "ratios of medians" in text and "stored median alone" in text


def test_default_metrics_are_the_sampled_ones_and_k_filters(tmp_path):
    result = _summary(tmp_path, _sweep(), patterns=("dim_in=4096/",))
    assert result.metrics == ["time"] and result.row_params == ["batch_size"]
    assert result.fixed == {"dim_in": 4096, "dim_out": 1024, "dtype": "fp16"}
    assert [values for values, _ in result.rows] == [(8192,), (32768,)]


def test_every_k_must_match(tmp_path):
    """-k given twice keeps the cases both match (the second does not replace the first), on the command line
    too; -k order does not matter, and two that no case matches together are the usage error."""
    run = write_run(tmp_path / "run", _sweep())
    both = _summary(tmp_path / "a", _sweep(), patterns=("dim_in=4096/", "batch_size=8192/"))
    assert both.rows == _summary(tmp_path / "b", _sweep(), patterns=("batch_size=8192/", "dim_in=4096/")).rows
    assert len(both.rows) == 1 and both.fixed["dim_in"] == 4096 and both.fixed["batch_size"] == 8192
    out = _cli(run, "--json", "-k", "dim_in=4096/", "-k", "batch_size=8192/").stdout
    assert [row["params"] for row in json.loads(out)["rows"]] == [{}]  # one case: every parameter fixed
    assert "every -k matches" in " ".join(_cli(run, "--help").stdout.split())
    with pytest.raises(QbenchUsageError, match="no ok record of these runs matches -k 'dim_in=4096/' -k 'zzz'"):
        _summary(tmp_path / "c", _sweep(), patterns=("dim_in=4096/", "zzz"))


def test_repeats_combined_median_of_run_medians(tmp_path):
    runs = [_sweep(1.0), _sweep(1.1), _sweep(0.95)]
    runs[2] = runs[2][:3]  # the third run lacks (4096, 1024) at 32768
    result = _summary(tmp_path, *runs, metrics=("speedup", "time"), across_runs="median")
    assert "run" not in result.row_params
    cell = _cells(result, "speedup")[(8192, 1024, 4096)]
    assert cell.runs == pytest.approx((0.25, 0.275, 0.2375)) and cell.value == pytest.approx(0.25)
    assert cell.spread_pct == pytest.approx(100 * (0.275 - 0.2375) / 0.25)
    partial = _cells(result, "speedup")[(32768, 4096, 1024)]
    assert partial.runs[2] is None and partial.value == pytest.approx((16.0 + 17.6) / 2)
    text = summary_output.markdown(result, 4)
    assert "(runs: 0.2500, 0.2750, 0.2375; spread 15%)" in text and "median over 3 runs" in text


def test_several_runs_side_by_side_and_pivoted_by_run(tmp_path):
    result = _summary(tmp_path, _sweep(1.0), _sweep(2.0), metrics=("time",), by="run")
    assert len(result.columns) == 2 and result.row_params == ["batch_size", "dim_in", "dim_out"]
    first, second = (str(tmp_path / f"run{i}") for i in (0, 1))
    row = dict(result.rows)[(8192, 1024, 4096)]
    assert row[("time", first.lower())].value * 2 == pytest.approx(row[("time", second.lower())].value)
    flat = _summary(tmp_path / "flat", _sweep(1.0), _sweep(2.0), metrics=("time",))
    assert flat.row_params[0] == "run" and len(flat.rows) == 8


def test_parameters_tied_to_the_pivot_label_its_columns(tmp_path):
    recs = [_record({"experts": e, "system": s, "transport": t, "block_size": b}, time=float(e), samples=[float(e)] * 3)
            for e in (8, 16) for s, t, b in (("a2a", "a2a", None), ("blocks", "symm", 64))]
    result = _summary(tmp_path, recs, by="system")
    assert result.row_params == ["experts"] and len(result.rows) == 2
    headers, _ = summary_output.text_rows(result, 4)
    assert headers[1:] == ["system=a2a (transport=a2a, block_size=-)", "system=blocks (transport=symm, block_size=64)"]


def test_every_metrics_columns_keep_their_metric_in_the_header_when_a_pivot_ties_parameters(tmp_path):
    recs = [_record({"experts": e, "system": s, "transport": t}, time=float(e), speedup=2.0, samples=[float(e)] * 3)
            for e in (8, 16) for s, t in (("a2a", "a2a"), ("blocks", "symm"))]
    result = _summary(tmp_path, recs, by="system", metrics=("time", "speedup"))
    headers, _ = summary_output.text_rows(result, 4)
    assert headers[1:] == ["time (ms) system=a2a (transport=a2a)", "time (ms) system=blocks (transport=symm)",
                           "speedup (x) system=a2a (transport=a2a)", "speedup (x) system=blocks (transport=symm)"]


def test_old_and_new_spellings_join_across_runs(tmp_path):
    old = [_record({"m": 1, "dtype": "float16"}, time=2.0, samples=[2.0] * 3)]  # before `exec`, old dtype name
    new = [_record({"m": 1, "dtype": "fp16", "exec": "eager"}, time=4.0, samples=[4.0] * 3),
           _record({"m": 1, "dtype": "fp16", "exec": "graph"}, time=1.0, samples=[1.0] * 3)]
    result = _summary(tmp_path, old, new, across_runs="median")
    assert result.row_params == ["exec"] and result.fixed == {"m": 1, "dtype": "fp16"}
    cells = _cells(result, "time")
    assert cells[("eager",)].runs == (2.0, 4.0) and cells[("graph",)].runs == (None, 1.0)


def test_failed_records_are_left_out_and_named(tmp_path):
    recs = [_record({"m": 1}, time=1.0, samples=[1.0] * 3),
            _record({"m": 2}, time=None, status="error", error="mismatch 0.3")]
    result = _summary(tmp_path, recs)
    assert [v for v, _ in result.rows] == [()] and result.left_out == ["toy/m=2: error mismatch 0.3"]
    assert any("left out, not ok: 1 records" in line for line in summary_output.legend(result))


def _layers(scale):
    """A toy fragmented-style run: two layers (fragments tied to layer) at two batch sizes, two modes."""
    return [_record({"layer": layer, "fragments": frags, "batch": b, "exec": ex},
                    time=scale * base * b * (2.0 if ex == "eager" else 1.0), samples=[1.0] * 3)
            for layer, frags, base in (("linear", 0, 1.0), ("fragmented", 8, 1.5))
            for b in (1, 16) for ex in ("eager", "graph")]


def test_ratio_to_divides_each_record_by_its_reference_in_the_same_run(tmp_path):
    """--ratio-to layer=linear: every fragmented record over the linear record of the same batch and mode
    (fragments, tied to layer, left out of the match); with --across-runs the median of each run's ratio."""
    slow = _layers(1.0)
    slow[5]["metrics"]["time"] *= 2  # fragmented, batch 1, graph: twice as slow in this run only
    result = _summary(tmp_path, _layers(1.0), slow, _layers(3.0), metrics=("time",), ratio_to="layer=linear",
                      across_runs="median")
    assert result.fixed == {"layer": "fragmented", "fragments": 8} and result.units == {"time": units.RATIO}
    cells = _cells(result, "time")
    assert result.row_params == ["exec", "batch"]
    assert set(cells) == {(ex, b) for b in (1, 16) for ex in ("eager", "graph")}
    assert cells[("eager", 16)].runs == pytest.approx((1.5, 1.5, 1.5))
    assert cells[("graph", 1)].runs == pytest.approx((1.5, 3.0, 1.5)) and cells[("graph", 1)].value == 1.5
    assert any("over that of its layer=linear counterpart" in line for line in summary_output.legend(result))


def test_ratio_to_usage_errors(tmp_path):
    for spec, fragment in (("layer", "must be PARAM=REF"), ("layer=conv", "no record of .* has layer=conv"),
                           ("nosuch=1", "has nosuch=1")):
        with pytest.raises(QbenchUsageError, match=fragment):
            _summary(tmp_path / spec.replace("=", "_"), _layers(1.0), metrics=("time",), ratio_to=spec)
    dense_only = [rec for rec in _layers(1.0) if rec["params"]["layer"] == "linear"]
    with pytest.raises(QbenchUsageError, match="every record of .* has layer=linear; nothing to divide by it"):
        _summary(tmp_path / "dense", dense_only, metrics=("time",), ratio_to="layer=linear")


def test_ratio_to_says_how_many_records_it_left_out_and_why(tmp_path):
    """A record without a counterpart in its run, or not ok, gives no ratio: the summary says how many and why
    (one line on stderr), and says nothing where every record gave one."""
    whole = _summary(tmp_path / "whole", _layers(1.0), metrics=("time",), ratio_to="layer=linear")
    assert whole.ratio_left_out == "" and len(whole.rows) == 4
    records = _layers(1.0)
    del records[3]  # linear, batch 16, graph: its fragmented twin has nothing to divide by
    records[4]["status"], records[4]["error"] = "error", "mismatch"  # fragmented, batch 1, graph (after the del)
    result = _summary(tmp_path / "cut", records, metrics=("time",), ratio_to="layer=linear")
    assert [values for values, _ in result.rows] == [(1,), (16,)] and result.fixed["exec"] == "eager"
    assert result.ratio_left_out == ("--ratio-to layer=linear: 1 record has a status other than ok; 1 record has "
                                     "no layer=linear counterpart in their run (left out)")
    done = _cli(write_run(tmp_path / "cli", records), "--metric", "time", "--ratio-to", "layer=linear")
    assert done.returncode == 0 and " ".join(done.stderr.split()) == result.ratio_left_out  # (wrapped at 80)
    whole_run = write_run(tmp_path / "cli2", _layers(1.0))
    assert _cli(whole_run, "--metric", "time", "--ratio-to", "layer=linear").stderr == ""


def test_ratio_to_with_no_counterpart_at_all_names_the_values_that_keep_the_layers_apart(tmp_path):
    """fragments varies within the fragmented layer, so it is not tied to `layer` and no record matches a
    linear one: a usage error with the layers the run has and the parameter whose values no side shares."""
    records = [_record({"layer": layer, "fragments": f, "batch": b}, time=1.0, samples=[1.0] * 3)
               for layer, frags in (("linear", (0,)), ("fragmented", (2, 8, 32))) for f in frags for b in (1, 16)]
    message = ("--ratio-to layer=linear: no record gives a ratio (6 records have no layer=linear counterpart in "
               "their run); the runs have layer=linear, fragmented; they differ in fragments (layer=linear: 0; the "
               "others: 2, 8, 32)")
    with pytest.raises(QbenchUsageError) as error:
        _summary(tmp_path, records, metrics=("time",), ratio_to="layer=linear")
    assert str(error.value) == message
    done = _cli(tmp_path / "run0", "--ratio-to", "layer=linear")
    assert done.returncode == 2 and done.stderr.strip().endswith(message)


def test_targets_are_judged_on_the_printed_values(tmp_path):
    """--target counts the cells that meet it, judged on each cell as printed: 1.30004 prints as 1.30004
    (never rounded onto 1.300) and misses '<= 1.3'; 1.3 meets it."""
    from qbench.analysis import targets

    recs = [_record({"m": m}, time=t, samples=[t] * 3) for m, t in ((1, 1.2), (2, 1.3), (3, 1.30004), (4, 2.0))]
    result = _summary(tmp_path, recs, metrics=("time",))
    cells = summary_output.metric_cells(result)
    (got,) = targets.check([targets.parse("time:..1.3")], cells, 4)
    assert (got["cells"], got["met"]) == (4, 2) and got["missed"] == [("m=3", "1.30004"), ("m=4", "2.000")]
    assert targets.lines([got])[0].startswith("target time <= 1.3: 2 of 4 cells met; missed: m=3: 1.30004")
    (band,) = targets.check([targets.parse("time:1.25..1.5")], cells, 4)
    assert band["met"] == 2 and band["target"] == "time in [1.25, 1.5]"
    assert targets.parse("time:1.15..") == targets.Target("time", 1.15, None)
    for spec, fragment in (("time", "must be METRIC:LO..HI"), ("time:1.3", "must be"), ("time:..", "must be"),
                           ("time:a..b", "must be numbers"), ("time:2..1", "lower one first"),
                           ("time:..inf", "finite")):
        with pytest.raises(QbenchUsageError, match=fragment):
            targets.parse(spec)
    with pytest.raises(QbenchUsageError, match="add --metric speedup"):
        targets.check([targets.parse("speedup:1..")], cells, 4)


def test_usage_errors(tmp_path):
    run = [_sweep()]
    for options, fragment in [
        ({"metrics": ("nosuch",)}, "--metric nosuch"), ({"by": "nosuch"}, "--by nosuch"),
        ({"patterns": ("(",)}, "not a valid regular expression"), ({"patterns": ("zzz",)}, "no ok record"),
        ({"across_runs": "median"}, "at least two runs"), ({"across_runs": "mean"}, "--across-runs mean"),
    ]:
        with pytest.raises(QbenchUsageError, match=fragment):
            _summary(tmp_path / str(len(fragment)), *run, **options)
    with pytest.raises(QbenchUsageError, match="keep no samples or times"):
        _summary(tmp_path / "nosamples", [_record({"m": 1}, speedup=1.2)])
    times = _summary(tmp_path / "times", [_record({"m": 1}, time=1.5, speedup=1.2)])  # samples lost, say
    assert times.metrics == ["time"] and summary_output.cell_text(_cells(times, "time")[()], 4) == "1.500\u2020"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "qbench", "summary", *map(str, args)], capture_output=True, text=True)


def test_cli_outputs_and_exit_codes(tmp_path):
    run = write_run(tmp_path / "run", _sweep())
    table = _cli(run, "--metric", "speedup", "--by", "batch_size")
    assert table.returncode == 0 and "batch_size=32768" in table.stdout and "[" not in table.stderr
    assert "median [p20, p80]" in _cli(run).stdout  # legend text survives rich markup
    payload = json.loads(_cli(run, "--json", "--metric", "time").stdout)
    assert len(payload["rows"]) == 4 and payload["rows"][0]["samples"] == 7
    lines = [line for line in _cli(run, "--markdown", "--by", "dim_in").stdout.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in lines}) == 1 and len(lines) == 2 + 2  # dim_out is tied to dim_in
    judged = json.loads(_cli(run, "--json", "--metric", "time", "--target", "time:..1e9").stdout)["targets"]
    assert judged[0]["cells"] == judged[0]["met"] == 4
    for args in ([run, "--metric", "nosuch"], [tmp_path / "missing"], [run, "--digits", "0"], [run, "--by", "x"],
                 [run, "--target", "time"], [run, "--metric", "time", "--target", "speedup:1.."],
                 [run, "--ratio-to", "layer"]):
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_runs_of_several_benches_get_a_table_each(tmp_path):
    """Without --metric, runs of different benches print one table per bench, each titled by its bench and runs
    and with only its own parameters; --metric (or --json) keeps one table, --across-runs over them refuses."""
    sb = write_run(tmp_path / "sb", _sweep())
    toy_records = [_record({"experts": e}, time=t, samples=SAMPLES) for e, t in ((8, 1.3), (16, 2.0))]
    toy = write_run(tmp_path / "toy", toy_records)
    out = _cli(sb, toy, "--markdown")
    assert out.returncode == 0, out.stderr
    tables = out.stdout.split("**toy: ")
    assert len(tables) == 2 and tables[0].startswith(f"**sweep: {sb}**")
    header = [line for line in tables[0].splitlines() if line.startswith("|")][0]
    assert "dim_in" in header and "experts" not in header and "bench" not in header
    assert [line for line in tables[1].splitlines() if line.startswith("|")][0].startswith("| experts |")
    one = _cli(sb, toy, "--markdown", "--metric", "time")
    assert one.stdout.count("**") == 0 and "| bench |" in one.stdout  # one table, a bench column
    assert len(json.loads(_cli(sb, toy, "--json").stdout)["rows"]) > 4  # JSON stays one unpivoted list
    only_toy = _cli(sb, toy, "--markdown", "-k", "experts=")
    assert only_toy.returncode == 0 and "**toy: " in only_toy.stdout and "sweep" not in only_toy.stdout
    assert only_toy.stderr.startswith("sweep: nothing to show (no ok record")
    assert _cli(sb, toy, "-k", "nosuch").returncode == 2
    for metric in ([], ["--metric", "time"]):
        refused = _cli(sb, toy, "--across-runs", "median", *metric)
        assert refused.returncode == 2 and "several benches (sweep, toy)" in refused.stderr


def test_spreads_per_metric_largest_first(tmp_path):
    """--spreads: per metric (every metric by default, the stored-only speed-up too) the cells with a spread,
    the largest spread and its case, the median spread; largest first."""
    from qbench.analysis import spreads

    runs = [_sweep(1.0), _sweep(1.0), _sweep(1.0)]
    runs[1][3] = _record({"batch_size": 32768, "dim_in": 4096, "dim_out": 1024, "dtype": "fp16"}, time=40.0,
                         speedup=1.2, samples=[40.0] * 3, bench="sweep")  # one cell of run 2 off
    result = _summary(tmp_path, *runs, across_runs="median", every_metric=True)
    assert result.metrics == ["time", "speedup"]
    got = {m.metric: m for m in spreads.spreads(result)}
    time_cell = _cells(result, "time")[(32768, 4096, 1024)]
    assert got["time"].largest_pct == pytest.approx(time_cell.spread_pct) and got["time"].cells == 4
    assert got["time"].largest_at == "batch_size=32768, dim_in=4096, dim_out=1024"
    assert got["time"].median_pct == 0.0
    assert got["speedup"].largest_pct == pytest.approx(100 * (16.0 - 1.2) / 16.0)  # 4096/1024 x 32768/8192
    assert [m.metric for m in spreads.spreads(result)] == sorted(got, key=lambda k: -got[k].largest_pct)
    with pytest.raises(QbenchUsageError, match="add --across-runs median"):
        spreads.spreads(_summary(tmp_path / "one", runs[0]))


def test_spreads_on_the_command_line(tmp_path):
    runs = [write_run(tmp_path / f"run{i}", _sweep(f)) for i, f in enumerate((1.0, 1.1, 0.95))]
    text = _cli(*runs, "--across-runs", "median", "--spreads", "--markdown").stdout
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| metric | unit | cells | largest spread") and len(rows) == 1 + 2
    assert "spread = (max - min) / median" in text
    payload = json.loads(_cli(*runs, "--across-runs", "median", "--spreads", "--json", "--metric", "time").stdout)
    (only,) = payload["spreads"]
    assert only["metric"] == "time" and only["largest_pct"] == pytest.approx(100 * (1.1 - 0.95) / 1.0)
    for args in ([*runs, "--spreads"], [*runs, "--across-runs", "median", "--spreads", "--target", "time:..1"]):
        result = _cli(*args)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_metric_patterns_select_every_matching_metric_in_record_order(tmp_path):
    """--metric with shell-style wildcards ('time*', 's?eedup', '[st]*'): each pattern stands for the metrics it
    matches, in record order, a name named twice once; a pattern matching nothing is a usage error."""
    run = [_sweep()]
    assert _summary(tmp_path / "a", *run, metrics=("sp*",)).metrics == ["speedup"]
    assert _summary(tmp_path / "b", *run, metrics=("[st]*",)).metrics == ["time", "speedup"]
    assert _summary(tmp_path / "c", *run, metrics=("speedup", "*e*")).metrics == ["speedup", "time"]
    with pytest.raises(QbenchUsageError, match=r"--metric x\*: no metric of these records matches"):
        _summary(tmp_path / "d", *run, metrics=("x*",))
    with pytest.raises(QbenchUsageError, match="--metric tim: no selected record"):  # plain names stay exact
        _summary(tmp_path / "e", *run, metrics=("tim",))


def test_column_groups_fit_the_width_beside_the_key_columns():
    widths = [6, 7, 24, 24, 24, 40, 3, 90]  # two key columns, then six value columns (the last too wide)
    groups = report.column_groups(widths, [0, 1], 80)
    assert [i for g in groups for i in g] == [2, 3, 4, 5, 6, 7] and all(groups)
    fixed = 1 + (6 + 3) + (7 + 3)
    for group in groups:  # each table fits, or holds one column that could not share
        assert fixed + sum(widths[i] + 3 for i in group) <= 80 or len(group) == 1
    assert groups == [[2, 3], [4], [5, 6], [7]]
    assert report.column_groups(widths, [0, 1], 1000) == [[2, 3, 4, 5, 6, 7]]
    assert report.column_widths(["t (ms)", "a_long_metric_name (x)"], [["1.3 [1.12, 1.48]", "2"]]) == [16, 22]
    wide = report.column_widths(["t"], [["4.328 (runs: 4.31001, 4.339, 4.328; spread 0.66%)"]])
    assert wide == [report.CELL_WRAP]  # a long cell wraps at its spaces instead of widening the table


def test_a_table_too_wide_for_the_console_prints_as_several_that_fit(tmp_path):
    """Many metrics on a narrow console: tables that each repeat the case columns and fit the width, every
    header and cell whole (nothing cut to '…'), the legend once, under the last; a wide console keeps one."""
    metrics = {f"metric_number_{i}": 1.0 + i / 7 for i in range(8)}
    records = [store.make_record("toy", {"dim_in": d}, {m: v * d for m, v in metrics.items()},
                                 units={m: units.MS for m in metrics}, samples={m: SAMPLES for m in metrics})
               for d in (1024, 4096)]
    run = write_run(tmp_path / "run", records)
    env = {"COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", "qbench", "summary", str(run)], capture_output=True, text=True,
                          env={**os.environ, **env})
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and max(map(len, lines)) <= 100 and "\u2026" not in done.stdout
    assert sum(line.startswith("\u250f") for line in lines) > 1  # several tables (their top borders)
    assert all(f"metric_number_{i}" in done.stdout for i in range(8))
    assert done.stdout.count("median [p20, p80]") == 1 and done.stdout.rstrip().endswith(lines[-1].strip())
    assert sum("dim_in" in line for line in lines) == sum(line.startswith("\u250f") for line in lines)
    wide = subprocess.run([sys.executable, "-m", "qbench", "summary", str(run)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "1000"})
    assert sum(line.startswith("\u250f") for line in wide.stdout.splitlines()) == 1


def test_fit_widths_cut_the_widest_columns_first_and_never_below_their_least():
    natural, least = [10, 50, 8], [10, 12, 8]
    assert report.fit_widths(natural, least, 200) == natural  # everything on one line where it fits
    fitted = report.fit_widths(natural, least, 60)
    assert fitted == [10, 32, 8] and sum(w + 3 for w in fitted) + 1 == 60  # only the wide column gives way
    assert report.fit_widths(natural, least, 40) == [10, 12, 8]  # the least widths exactly
    assert report.fit_widths(natural, least, 39) is None  # not even the least widths fit


def test_history_keeps_a_case_only_where_every_k_matches(tmp_path):
    """qbench history (and the HTML report built on it) read -k as summary and compare do."""
    from qbench.analysis import history

    runs = [summary.load_any(write_run(tmp_path / f"rev{i}", _sweep(1.0 + i / 10), git_commit=f"{i + 1:x}" * 40,
                                       time_utc=f"2026-11-2{i}T00:00:00+00:00")) for i in range(2)]
    both = history.build(runs, ["time"], ("dim_in=4096/", "batch_size=8192/"))
    (series,) = both.series
    assert (series.params["dim_in"], series.params["batch_size"]) == ("4096", "8192")  # join keys
    assert len(history.build(runs, ["time"], ("dim_in=4096/",)).series) == 2
    with pytest.raises(QbenchUsageError, match="-k 'dim_in=4096/' -k 'zzz'"):
        history.build(runs, ["time"], ("dim_in=4096/", "zzz"))
