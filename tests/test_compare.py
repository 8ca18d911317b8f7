import csv
import io
import itertools
import json
import subprocess
import sys

import pytest

from qbench import report
from qbench.analysis import compare, compare_gate, compare_output, join, run_groups
from qbench.errors import QbenchUsageError
from tests.helpers import timed_record, write_run

FAST = [10.0, 10.2, 9.9, 10.1, 10.05]
SLOW = [12.0, 12.3, 11.9, 12.1, 12.05]  # fully separated from FAST, +20% median


def exact_two_sided_u_p(a, b):
    """Independent exact Mann-Whitney p-value by enumerating every split of the pooled ranks."""
    pooled = sorted(a + b)
    rank = {v: i + 1 for i, v in enumerate(pooled)}  # no ties in these inputs
    n = len(a)
    u_obs = sum(rank[v] for v in a) - n * (n + 1) / 2
    mean_u = n * len(b) / 2
    us = [sum(c) - n * (n + 1) / 2 for c in itertools.combinations(range(1, len(pooled) + 1), n)]
    extreme = sum(1 for u in us if abs(u - mean_u) >= abs(u_obs - mean_u) - 1e-12)
    return extreme / len(us)


def _runs(tmp_path, ref_records, cand_records, **cand_env):
    a = write_run(tmp_path / "a", ref_records)
    b = write_run(tmp_path / "b", cand_records, **cand_env)
    return [compare.load_any(a), compare.load_any(b)]


def _row(result, metric, case=None):
    return next(r for r in result.rows if r.metric == metric and (case is None or case in r.case))


def test_known_ratio_and_significance(tmp_path):
    runs = _runs(tmp_path, [timed_record({"m": 1}, FAST, tflops=100.0)], [timed_record({"m": 1}, SLOW, tflops=80.0)])
    result = compare.compare_runs(runs, compare.CompareOptions())
    time_row = _row(result, "time")
    assert time_row.ratio == pytest.approx(12.05 / 10.05)
    assert time_row.change_pct == pytest.approx(100 * (12.05 - 10.05) / 10.05)
    assert time_row.p_value == pytest.approx(exact_two_sided_u_p(FAST, SLOW))
    assert time_row.p_value == pytest.approx(2 / 252)
    assert time_row.marker == "+" and time_row.note == "few samples"
    assert _row(result, "tflops").marker == "+"  # throughput fell: worse, by the unit's direction


def test_faster_is_better_and_noise_is_not_significant(tmp_path):
    overlap = [9.0, 13.0, 10.0, 12.5, 8.0]  # median 10.0 vs 12.05: beyond 5%, but the samples overlap
    runs = _runs(
        tmp_path,
        [timed_record({"m": 1}, SLOW), timed_record({"m": 2}, SLOW)],
        [timed_record({"m": 1}, FAST), timed_record({"m": 2}, overlap)],
    )
    result = compare.compare_runs(runs, compare.CompareOptions())
    assert _row(result, "time", "m=1").marker == "-"
    noisy = _row(result, "time", "m=2")
    assert noisy.p_value == pytest.approx(exact_two_sided_u_p(SLOW, overlap)) and noisy.p_value > 0.05
    assert noisy.marker == "~"


def test_within_threshold_is_same_and_geomean(tmp_path):
    ref = [timed_record({"m": 1}, [10.0] * 3), timed_record({"m": 2}, [10.0] * 3)]
    cand = [timed_record({"m": 1}, [20.0] * 3), timed_record({"m": 2}, [5.0] * 3)]
    result = compare.compare_runs(_runs(tmp_path, ref, cand), compare.CompareOptions(threshold_pct=5))
    assert result.geomeans[(str(tmp_path / "b"), "time")] == pytest.approx(1.0)
    same = compare.compare_runs(_runs(tmp_path / "2", ref, ref), compare.CompareOptions())
    assert {r.marker for r in same.rows} == {"="}


def test_status_markers_and_missing_cases(tmp_path):
    ref = [
        timed_record({"m": 1}, FAST),
        timed_record({"m": 2}, FAST, status="error", error="mismatch"),
        timed_record({"m": 3}, FAST),
    ]
    cand = [
        timed_record({"m": 1}, FAST, status="error", error="mismatch 0.3"),
        timed_record({"m": 2}, FAST),
        timed_record({"m": 4}, FAST),
    ]
    result = compare.compare_runs(_runs(tmp_path, ref, cand), compare.CompareOptions())
    markers = {(r.case, r.marker) for r in result.rows}
    assert ("m=1", "!") in markers and ("m=2", "*") in markers
    assert ("m=3", "n/a") in markers and ("m=4", "n/a") in markers


def test_join_on_common_params_when_one_run_knows_fewer(tmp_path):
    ref = [timed_record({"m": 1}, FAST)]
    cand = [timed_record({"m": 1, "routing": "randn"}, SLOW)]
    result = compare.compare_runs(_runs(tmp_path, ref, cand), compare.CompareOptions())
    assert _row(result, "time").marker == "+"


def test_no_case_in_common_is_a_usage_error(tmp_path):
    runs = _runs(tmp_path, [timed_record({"m": 1}, FAST)], [timed_record({"m": 2}, FAST)])
    with pytest.raises(QbenchUsageError, match=r"no case in common$"):
        compare.compare_runs(runs, compare.CompareOptions())
    other = _runs(tmp_path / "other", [timed_record({"m": 1}, FAST)],
                  [timed_record({"m": 1}, FAST, bench="other")])
    with pytest.raises(QbenchUsageError, match=r"no case in common \(benches other against toy\)"):
        compare.compare_runs(other, compare.CompareOptions())


def test_different_gpu_warns_and_is_not_comparable_without_cross_env(tmp_path):
    runs = _runs(tmp_path, [timed_record({"m": 1}, FAST)], [timed_record({"m": 1}, SLOW)], gpu="NVIDIA A100")
    result = compare.compare_runs(runs, compare.CompareOptions())
    assert any("gpu_name" in w for w in result.env_warnings)
    assert _row(result, "time").marker == "x" and _row(result, "time").ratio == pytest.approx(12.05 / 10.05)
    crossed = compare.compare_runs(runs, compare.CompareOptions(cross_env=True))
    assert _row(crossed, "time").marker == "+" and "cross-env" in _row(crossed, "time").note


def test_fail_on_gate():
    assert compare_gate.parse_fail_on(["time_global:5%", "step_time:10"]) == [("time_global", 5.0), ("step_time", 10.0)]
    for bad in ("time_global", ":5", "t:abc"):
        with pytest.raises(QbenchUsageError):
            compare_gate.parse_fail_on([bad])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "qbench", "compare", *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def slower_runs(tmp_path):
    a = write_run(tmp_path / "a", [timed_record({"m": 1}, FAST), timed_record({"m": 2}, FAST)])
    b = write_run(tmp_path / "b", [timed_record({"m": 1}, SLOW), timed_record({"m": 2}, FAST)])
    return a, b


def test_cli_exit_codes_of_fail_on(slower_runs):
    a, b = slower_runs
    assert _cli(a, b).returncode == 0  # no gate: report only
    failing = _cli(a, b, "--fail-on", "time:10")
    assert failing.returncode == 1 and "regression" in failing.stderr
    assert _cli(a, b, "--fail-on", "time:25").returncode == 0  # +19.9% is within a 25% allowance
    assert _cli(b, a, "--fail-on", "time:10").returncode == 0  # faster is never a regression


def test_cli_usage_errors_exit_2_with_one_line(tmp_path, slower_runs):
    a, _ = slower_runs
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.jsonl").write_text('{"bench": 1}\n{not json\n{"x": 2}\n')
    for args in ([a, tmp_path / "missing"], [a, tmp_path / "bad"], [a], [a, a, "--threshold", "lots"]):
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_machine_readable_outputs_are_valid(slower_runs):
    a, b = slower_runs
    payload = json.loads(_cli(a, b, "--json").stdout)
    assert {r["marker"] for r in payload["rows"]} == {"+", "="}
    rows = list(csv.DictReader(io.StringIO(_cli(a, b, "--csv").stdout)))
    assert len(rows) == 2 and {"ratio", "p_value", "marker"} <= set(rows[0])
    markdown = _cli(a, b, "--markdown").stdout.splitlines()
    widths = {line.count("|") for line in markdown if line.startswith("|")}
    assert len(widths) == 1 and len(markdown) >= 4  # header, rule, two rows (+ geometric mean)


def test_rich_table_renders_all_rows(slower_runs):
    runs = [compare.load_any(p) for p in slower_runs]
    result = compare.compare_runs(runs, compare.CompareOptions(only_changed=True))
    assert [r.case for r in result.rows] == ["m=1"]
    console = report.Console(file=io.StringIO(), width=200, no_color=True)
    for table in compare_output.comparison_tables(result):
        console.print(table)
    text = console.file.getvalue()
    assert "toy" in text and "geometric mean" in text and "1 worse (+)" in text
    assert "every case: m=1" in text  # the one case's parameters, once beneath the table
    every = compare.compare_runs(runs, compare.CompareOptions())
    console = report.Console(file=io.StringIO(), width=200, no_color=True)
    for table in compare_output.comparison_tables(every):
        console.print(table)
    text = console.file.getvalue()
    assert "m=1" in text and "m=2" in text and "every case" not in text  # m differs: each row names it


def _case_row(bench, case):
    return compare.Row(bench, case, "time", "ms", "b", 1.0, 1.0)


def test_case_labels_show_what_differs_and_list_what_every_case_shares():
    rows = [_case_row("sb", f"batch_size={m}/dim_in=1024/dtype=fp16") for m in (8192, 32768, 8192)]
    labels, shared = report.case_labels(rows)
    assert labels[("sb", "batch_size=8192/dim_in=1024/dtype=fp16")] == "batch_size=8192"
    assert labels[("sb", "batch_size=32768/dim_in=1024/dtype=fp16")] == "batch_size=32768"
    assert shared == "dim_in=1024, dtype=fp16"
    labels, shared = report.case_labels([_case_row("sb", "m=1/path=a/b"), _case_row("moe", "m=1/path=a/c")])
    assert labels == {("sb", "m=1/path=a/b"): "sb path=a/b", ("moe", "m=1/path=a/c"): "moe path=a/c"}  # two benches
    assert shared == "m=1"  # a value with '/' in it stays whole
    labels, shared = report.case_labels([_case_row("toy", "not-a-case-id"), _case_row("toy", "m=1")])
    assert labels[("toy", "not-a-case-id")] == "not-a-case-id" and labels[("toy", "m=1")] == "m=1" and shared == ""
    assert report.case_labels([_case_row("toy", "m=1")]) == ({("toy", "m=1"): "toy"}, "m=1")


def _one_line_exit_2(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_unknown_metric_in_fail_on_or_metric_is_a_usage_error(slower_runs):
    a, b = slower_runs
    _one_line_exit_2(_cli(a, b, "--fail-on", "tiem:5"), "--fail-on tiem", "no record")
    _one_line_exit_2(_cli(a, b, "--metric", "tflops"), "--metric tflops", "no record")
    assert _cli(a, b, "--metric", "time").returncode == 0


def test_a_gate_that_can_judge_no_case_is_a_usage_error(tmp_path):
    a = write_run(tmp_path / "a", [timed_record({"m": 1}, FAST, tflops=10.0)])
    b = write_run(tmp_path / "b", [timed_record({"m": 1}, SLOW)])  # no tflops on this side
    _one_line_exit_2(_cli(a, b, "--fail-on", "tflops:5"), "--fail-on tflops", "no case")
    c = write_run(tmp_path / "c", [timed_record({"m": 1}, SLOW)], gpu="NVIDIA A100")  # every row 'x'
    _one_line_exit_2(_cli(a, c, "--fail-on", "time:5"), "different hardware")
    assert _cli(a, c, "--fail-on", "time:5", "--cross-env").returncode == 1


def test_a_candidate_missing_reference_cases_fails_the_gate_unless_allowed(tmp_path):
    a = write_run(tmp_path / "a", [timed_record({"m": m}, FAST) for m in (1, 2, 3)])
    b = write_run(tmp_path / "b", [timed_record({"m": 1}, FAST)])
    failing = _cli(a, b, "--fail-on", "time:5")
    assert failing.returncode == 1 and "2 reference cases missing" in failing.stderr, failing.stderr
    assert _cli(a, b, "--fail-on", "time:5", "--allow-missing").returncode == 0
    assert _cli(a, b).returncode == 0  # no gate: a report only
    assert _cli(b, a, "--fail-on", "time:5").returncode == 0  # cases new in the candidate are fine


def test_a_bench_the_candidate_lacks_entirely_is_missing(tmp_path):
    ref = [timed_record({"m": 1}, FAST), timed_record({"m": 1}, FAST, bench="other")]
    runs = _runs(tmp_path, ref, [timed_record({"m": 1}, FAST)])
    result = compare.compare_runs(runs, compare.CompareOptions())
    assert [(r.bench, r.note) for r in compare_gate.missing_cases(result)] == [("other", "missing in candidate")]
    assert compare_gate.gate_failures(result, [("time", 5.0)], allow_missing=False)
    assert not compare_gate.gate_failures(result, [("time", 5.0)], allow_missing=True)


def test_an_empty_run_is_named_empty(tmp_path, slower_runs):
    a, _ = slower_runs
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "results.jsonl").write_text("")
    (empty / "env.json").write_text("{}")
    _one_line_exit_2(_cli(a, empty), "empty run")
    (empty / "results.jsonl").unlink()  # stopped before its first record
    _one_line_exit_2(_cli(empty, a), "empty run")


def test_a_run_made_before_exec_joins_as_eager(tmp_path):
    old = [timed_record({"m": 1, "dtype": "float16"}, FAST)]  # no exec param, dtype spelt the old moe way
    new = [timed_record({"m": 1, "dtype": "fp16", "exec": e}, SLOW) for e in ("eager", "compile")]
    result = compare.compare_runs(_runs(tmp_path, old, new), compare.CompareOptions())
    joined = _row(result, "time")
    assert "exec" not in joined.case and joined.ratio == pytest.approx(12.05 / 10.05)
    missing = [r for r in result.rows if r.marker == "n/a"]
    assert [r.note for r in missing] == [compare.MISSING_IN_REFERENCE] and "exec=compile" in missing[0].case
    assert not [w for w in result.env_warnings if "dtype" in w]  # float16 and fp16 are one dtype


def test_param_normalization():
    assert join.join_params({"m": 1}) == {"m": 1, "exec": "eager", "backward_thread": "device"}
    assert join.join_params({"dtype": "bfloat16", "exec": "graph"}) == {"dtype": "bf16", "exec": "graph",
                                                                        "backward_thread": "device"}
    assert join.join_params({"dtype": "e9m9"})["dtype"] == "e9m9"  # unknown names join as they are spelt


def _exec_records(times: dict[str, list[float]], **params) -> list[dict]:
    return [timed_record({"m": 1, **params, "exec": e}, t) for e, t in times.items()]


def test_across_exec_puts_each_mode_beside_eager(tmp_path):
    graph = [5.0, 5.1, 4.9, 5.05, 5.02]
    run = compare.load_any(write_run(tmp_path / "r", _exec_records({"graph": graph, "eager": FAST, "compile": SLOW})))
    split = run_groups.across_param([run], "exec")
    assert [r.label for r in split] == ["exec=eager", "exec=graph", "exec=compile"]  # reference first
    result = compare.compare_runs(split, compare.CompareOptions())
    assert {r.case for r in result.rows} == {"m=1"}  # joined on the remaining params
    assert _row(result, "time").candidate in ("exec=graph", "exec=compile")
    ratios = {r.candidate: r.ratio for r in result.rows}
    assert ratios == pytest.approx({"exec=graph": 5.02 / 10.05, "exec=compile": 12.05 / 10.05})
    other_ref = run_groups.across_param([run], "exec=compile")
    assert other_ref[0].label == "exec=compile"


def test_across_pools_runs_and_reads_old_runs_as_eager(tmp_path):
    old = compare.load_any(write_run(tmp_path / "old", [timed_record({"m": 1, "dtype": "float16"}, FAST)]))
    new = compare.load_any(write_run(tmp_path / "new", _exec_records({"compile": SLOW}, dtype="fp16")))
    result = compare.compare_runs(run_groups.across_param([old, new], "exec"), compare.CompareOptions())
    assert [(r.candidate, r.marker) for r in result.rows] == [("exec=compile", "+")]
    with pytest.raises(QbenchUsageError, match="every record has dtype=fp16"):  # float16 is fp16
        run_groups.across_param([old, new], "dtype=float16")


def test_across_usage_errors(tmp_path):
    one = compare.load_any(write_run(tmp_path / "one", [timed_record({"m": 1}, FAST)]))
    two = compare.load_any(write_run(tmp_path / "two", _exec_records({"eager": FAST, "graph": SLOW})))
    a100 = compare.load_any(write_run(tmp_path / "a100", _exec_records({"graph": SLOW}), gpu="NVIDIA A100"))
    for runs, spec, fragment in [
        ([one], "exec", "every record has exec=eager"),
        ([two], "nosuch", "no record of these runs has a parameter 'nosuch'"),
        ([two], "exec=compile", "no record has exec=compile"),
        ([one, a100], "exec", "different GPUs"),
    ]:
        with pytest.raises(QbenchUsageError, match=fragment):
            run_groups.across_param(runs, spec)
    assert len(run_groups.across_param([one, a100], "exec", cross_env=True)) == 2


def test_cli_across_names_the_reference(tmp_path):
    run = write_run(tmp_path / "r", _exec_records({"eager": FAST, "compile": SLOW}))
    result = _cli(run, "--across", "exec")
    assert result.returncode == 0, result.stderr
    assert "exec=compile vs exec=eager" in result.stdout and "1 worse (+)" in result.stdout
    payload = json.loads(_cli(run, "--across", "exec", "--json").stdout)
    assert payload["reference"] == "exec=eager" and [r["case"] for r in payload["rows"]] == ["m=1"]
    _one_line_exit_2(_cli(run, "--across", "dtype"), "--across dtype")


def test_across_a_parameter_others_go_with(tmp_path):
    """moe's transport and block_size go with system: they label the groups instead of splitting the join."""
    recs = [timed_record({"experts": e, "system": s, "transport": t, "block_size": b}, times)
            for e in (8, 16) for s, t, b, times in (("a2a", "a2a", None, SLOW), ("blocks", "symm", 64, FAST))]
    run = compare.load_any(write_run(tmp_path / "r", recs))
    split = run_groups.across_param([run], "system=a2a")
    assert [r.label for r in split] == ["system=a2a (block_size=None, transport=a2a)",
                                        "system=blocks (block_size=64, transport=symm)"]
    result = compare.compare_runs(split, compare.CompareOptions())
    assert sorted(r.case for r in result.rows) == ["experts=16", "experts=8"]
    assert {r.marker for r in result.rows} == {"-"}
    single = [timed_record({"m": m, "exec": e}, FAST) for m, e in ((1, "eager"), (2, "graph"))]
    one_each = run_groups.across_param([compare.load_any(write_run(tmp_path / "s", single))], "exec")
    with pytest.raises(QbenchUsageError, match="no case in common"):  # m=1 is never joined with m=2
        compare.compare_runs(one_each, compare.CompareOptions())


def test_group_compares_repeated_runs_by_their_median_with_pooled_samples(tmp_path):
    """--group N: N consecutive runs per side, each metric the median over a side's runs (as summary
    --across-runs median prints it), the U test on every run's samples pooled."""
    old = [[10.0, 10.1, 9.9], [10.4, 10.5, 10.3], [9.6, 9.7, 9.5]]
    new = [[9.0, 9.1, 8.9], [9.3, 9.4, 9.2], [8.6, 8.7, 8.5]]
    paths = [write_run(tmp_path / f"old{i}", [timed_record({"m": 1}, s), timed_record({"m": 2}, s)])
             for i, s in enumerate(old, 1)]
    # new2 lacks case m=2: that case is left out of the new side and shows as missing there
    paths += [write_run(tmp_path / f"new{i}", [timed_record({"m": 1}, s)] + ([timed_record({"m": 2}, s)] if i != 2
                                                                          else [])) for i, s in enumerate(new, 1)]
    runs = run_groups.group_runs([compare.load_any(p) for p in paths], 3)
    assert [r.label for r in runs] == [f"{tmp_path}/old{{1,2,3}}", f"{tmp_path}/new{{1,2,3}}"]
    result = compare.compare_runs(runs, compare.CompareOptions())
    row = _row(result, "time", "m=1")
    assert (row.reference_value, row.candidate_value) == (10.0, 9.0)  # medians of 10.0, 10.4, 9.6 and 9.0, 9.3, 8.6
    pooled_old, pooled_new = [x for s in old for x in s], [x for s in new for x in s]
    assert row.p_value == pytest.approx(compare.mann_whitney_p(pooled_old, pooled_new))
    assert row.marker == "-"
    assert any(r.marker == "n/a" and "m=2" in r.case for r in result.rows)


def test_group_marks_a_change_only_where_the_sides_runs_do_not_overlap(tmp_path):
    """Each run is tight (the pooled U test finds the new side faster, p < 0.05) but one new run is as slow as
    an old one: the change is '~' ("the sides' runs overlap"), not '-'. With that run moved past every old
    run the same change is '-'."""
    old = [[10.0, 10.01, 9.99] * 4, [10.5, 10.51, 10.49] * 4, [10.2, 10.21, 10.19] * 4]

    def verdict(new, name):
        paths = [write_run(tmp_path / f"{name}-old{i}", [timed_record({"m": 1}, s)]) for i, s in enumerate(old, 1)]
        paths += [write_run(tmp_path / f"{name}-new{i}", [timed_record({"m": 1}, s)]) for i, s in enumerate(new, 1)]
        runs = run_groups.group_runs([compare.load_any(p) for p in paths], 3)
        return _row(compare.compare_runs(runs, compare.CompareOptions()), "time")

    row = verdict([[9.0, 9.01, 8.99] * 4, [9.1, 9.11, 9.09] * 4, [10.3, 10.31, 10.29] * 4], "overlap")
    assert row.change_pct < -5 and row.p_value < 0.05
    assert (row.marker, row.note) == ("~", "the sides' runs overlap")
    row = verdict([[9.0, 9.01, 8.99] * 4, [9.1, 9.11, 9.09] * 4, [9.3, 9.31, 9.29] * 4], "apart")
    assert row.marker == "-" and row.note == ""


def test_group_usage_errors_exit_2_with_one_line(slower_runs):
    a, b = slower_runs
    for args in ([a, b, a, "--group", "2"], [a, b, "--group", "2"], [a, b, a, b, "--group", "2", "--across", "m"],
                 [a, b, "--group", "0"]):
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert _cli(a, a, b, b, "--group", "2").returncode == 0


def test_compare_cells_never_round_onto_the_threshold():
    """A +4.98% change within a 5% threshold prints as 1.0498 and +4.98%, not 1.050 and +5.0%."""
    row = compare.Row("toy", "m=1", "time", "ms", "b", reference_value=10.0, candidate_value=10.498)
    compare._verdict(row, -1, compare.CompareOptions())
    cells = compare_output._compare_cells(row, "m=1")
    assert cells[3:7] == ["10.00", "10.498", "1.0498", "+4.98%"] and row.marker == "="
    assert report.format_change(-13.08) == "-13.1%" and report.format_change(None) == "-"


def test_k_narrows_the_geometric_means_and_counts_to_its_rows(slower_runs):
    runs = [compare.load_any(p) for p in slower_runs]
    everything = compare.compare_runs(runs, compare.CompareOptions())
    one_case = compare.compare_runs(runs, compare.CompareOptions(patterns=("m=2 ",)))
    candidate = runs[1].label
    assert everything.counts[candidate] == {"+": 1, "=": 1}
    assert one_case.counts[candidate] == {"=": 1}  # the slower case m=1 is not among -k's rows
    assert one_case.geomeans[(candidate, "time")] == pytest.approx(1.0)
    assert everything.geomeans[(candidate, "time")] > 1.05
    assert len(one_case.unfiltered) == len(everything.unfiltered)  # gates still see every row


def test_every_k_must_match(tmp_path):
    """-k given twice keeps the rows both match, in the counts too; before, the last -k alone was applied."""
    a = write_run(tmp_path / "a", [timed_record({"m": m}, FAST, tflops=1.0) for m in (1, 2)])
    b = write_run(tmp_path / "b", [timed_record({"m": m}, SLOW, tflops=1.0) for m in (1, 2)])
    rows = json.loads(_cli(a, b, "--json", "-k", "m=2", "-k", " time$").stdout)["rows"]
    assert [(r["case"], r["metric"]) for r in rows] == [("m=2", "time")]
    assert {(r["case"], r["metric"]) for r in json.loads(_cli(a, b, "--json", "-k", "m=2").stdout)["rows"]} == {
        ("m=2", "time"), ("m=2", "tflops")}
    assert "every -k matches" in " ".join(_cli("--help").stdout.split())
    bad = _cli(a, b, "-k", "m=2", "-k", "(")
    assert bad.returncode == 2 and "-k '(' is not a valid regular expression" in bad.stderr


def test_across_merges_the_repeats_of_several_runs_as_group_does(tmp_path):
    """Each run holds both sides (an A/B inside every run): each side is the median over the runs, and a change
    counts only where the two sides' runs do not overlap; before, the last run's records alone were compared."""
    def run(name, eager, graph):
        return compare.load_any(write_run(tmp_path / name, _exec_records({"eager": eager, "graph": graph})))

    shifted = [v + 1.5 for v in FAST]  # 11.55: between FAST and SLOW
    apart = [run("a", SLOW, FAST), run("b", SLOW, FAST), run("c", SLOW, FAST)]
    result = compare.compare_runs(run_groups.across_param(apart, "exec"), compare.CompareOptions())
    assert (_row(result, "time").marker, _row(result, "time").ratio) == ("-", pytest.approx(10.05 / 12.05))
    overlapping = [run("d", SLOW, FAST), run("e", FAST, shifted), run("f", SLOW, FAST)]
    row = _row(compare.compare_runs(run_groups.across_param(overlapping, "exec"), compare.CompareOptions()), "time")
    assert row.marker == "~" and row.reference_value == pytest.approx(12.05)  # eager: median of 12.05, 10.05, 12.05
    assert row.candidate_value == pytest.approx(10.05)  # graph: median of 10.05, 11.55, 10.05


def test_metric_patterns_on_the_command_line(tmp_path):
    """compare --metric takes shell-style patterns too: 't*' compares time and tflops, 'x*' is a usage error."""
    recs = [timed_record({"n": 1}, [1.0, 1.1, 1.2], tflops=100.0)]
    a, b = write_run(tmp_path / "a", recs), write_run(tmp_path / "b", recs)
    cli = [sys.executable, "-m", "qbench", "compare", str(a), str(b), "--json"]
    done = subprocess.run(cli + ["--metric", "t*"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {row["metric"] for row in json.loads(done.stdout)["rows"]} == {"time", "tflops"}
    done = subprocess.run(cli + ["--metric", "time*"], capture_output=True, text=True)
    assert {row["metric"] for row in json.loads(done.stdout)["rows"]} == {"time"}
    bad = subprocess.run(cli + ["--metric", "x*"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--metric x*: no metric of these records matches" in bad.stderr
