"""qbench history: revisions in git's order (or by time), series per GPU and configuration, the change-point
rule on hand-made runs whose answer is known, --fail-on, and the demo over the committed switchback runs."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from helpers import timed_record, write_run

from qbench.analysis import history, revisions
from qbench.analysis.compare import load_any
from qbench.cli import main

ROOT = Path(__file__).resolve().parent.parent


def samples(center: float, spread: float, n: int = 30, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def make_runs(tmp_path: Path, centers: list[float], spread: float = 0.01, gpu: str = "NVIDIA H200",
              tag: str = "r") -> list[str]:
    """One run per revision, each a fake commit at a later time, one case with `time` samples around center."""
    paths = []
    for i, center in enumerate(centers):
        rec = timed_record({"n": 8}, samples(center, spread, seed=i))
        env = {"git_commit": f"{i:x}" * 40, "time_utc": f"2026-11-2{i}T00:00:00+00:00"}
        paths.append(str(write_run(tmp_path / f"{tag}{i}", [rec], gpu=gpu, **env)))
    return paths


def built(paths: list[str], **kw) -> history.History:
    return history.build([load_any(p) for p in paths], ["time"], **kw)


def test_a_step_beyond_the_noise_is_a_change_and_noise_is_not(tmp_path):
    result = built(make_runs(tmp_path, [1.0, 1.002, 1.30, 1.30, 0.80]))
    (series,) = result.series
    assert [p.marker for p in series.points] == ["", "=", "+", "=", "-"]
    assert series.points[2].step_pct == pytest.approx(29.7, abs=1.0)
    assert series.points[2].p_value < 0.05
    assert result.order == "time"  # fake commits: no git order, the runs' times instead


def test_overlapping_samples_beyond_the_threshold_are_not_called_a_change(tmp_path):
    # 30% spread on each side: a 10% step lies inside the samples' own p20-p80 width, so it is '='
    result = built(make_runs(tmp_path, [1.0, 1.10], spread=0.30))
    assert result.series[0].points[1].marker == "="
    # a 10% step with 1% spread and one sample each: beyond the floor, nothing to test with: '~'
    one = [str(write_run(tmp_path / f"one{i}", [timed_record({"n": 8}, [v])],
                         git_commit=f"{i + 3:x}" * 40, time_utc=f"2026-11-2{i}T00:00:00+00:00"))
           for i, v in enumerate([1.0, 1.10])]
    assert built(one).series[0].points[1].marker == "~"


def test_runs_of_one_commit_merge_and_their_spread_is_the_floor(tmp_path):
    a = make_runs(tmp_path, [1.0], tag="a")
    rec = [timed_record({"n": 8}, samples(c, 0.001, seed=9)) for c in (1.0, 1.2)]
    b = [str(write_run(tmp_path / f"b{i}", [r], git_commit="f" * 40, time_utc="2026-11-25T00:00:00+00:00"))
         for i, r in enumerate(rec)]
    (series,) = built(a + b).series
    point = series.points[1]
    assert point.run_values == pytest.approx((1.0, 1.2), rel=0.01) and point.low < point.high
    assert point.marker == "="  # the +10% median step lies within the two runs' own 20% spread


def test_gpus_never_share_a_series(tmp_path):
    paths = make_runs(tmp_path, [1.0, 1.0], tag="h200") + make_runs(tmp_path, [2.0], gpu="NVIDIA H100", tag="h100")
    result = built(paths)
    assert sorted((s.gpu, len(s.points)) for s in result.series) == [("NVIDIA H100", 1), ("NVIDIA H200", 2)]


def test_git_order_beats_time_order(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for i in range(2):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", str(i)], check=True)
        shas.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    assert revisions.git_positions(shas, repo) == {shas[0]: 0, shas[1]: 1}
    assert revisions.git_positions([*shas, "0" * 40], repo) is None  # an unknown commit: no git order
    # the later commit measured first: git order puts it last all the same
    runs = [load_any(str(write_run(tmp_path / name, [timed_record({"n": 8}, [1.0, 1.1])], git_commit=sha,
                                   time_utc=time)))
            for name, sha, time in (("new", shas[1], "2026-01-01"), ("old", shas[0], "2026-02-01"))]
    order, _, how = revisions.ordered(runs, repo)
    assert how == "git" and [r.commit for r in order] == shas


def test_fail_on_exits_1_only_when_the_latest_revision_regressed(tmp_path, capsys):
    worse = make_runs(tmp_path, [1.0, 1.5], tag="w")
    with pytest.raises(SystemExit) as exc:
        main(["history", *worse, "--metric", "time", "--fail-on", "time:10"])
    assert exc.value.code == 1
    assert "regression beyond --fail-on" in capsys.readouterr().err
    better = make_runs(tmp_path, [1.5, 1.0], tag="b")
    with pytest.raises(SystemExit) as exc:
        main(["history", *better, "--metric", "time", "--fail-on", "time:10"])
    assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        main(["history", *worse, "--fail-on", "no_such_metric:5"])
    assert exc.value.code == 2


def test_table_json_and_figure(tmp_path, capsys):
    paths = make_runs(tmp_path, [1.0, 1.3])
    figure = tmp_path / "history.svg"
    with pytest.raises(SystemExit) as exc:
        main(["history", *paths, "--metric", "time", "--plot", str(figure), "--markdown"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "+30" in out.replace(" ", "") or "+29" in out.replace(" ", "")
    assert figure.read_text().lstrip().startswith("<?xml")
    with pytest.raises(SystemExit):
        main(["history", *paths, "--metric", "time", "--json"])
    import json

    payload = json.loads(capsys.readouterr().out)
    assert [p["marker"] for p in payload["series"][0]["points"]] == ["", "+"]


SWITCHBACK = [f"results/switchback-h200-{name}/run{i}" for name in ("modes", "modes-c4c2232") for i in (1, 2, 3)]


@pytest.mark.skipif(not all((ROOT / p).is_dir() for p in SWITCHBACK), reason="the committed switchback runs are gone")
def test_committed_switchback_runs_of_two_commits():
    """The H200 reference command at two commits whose kernels are the same: 18 series of two points each,
    in git's order, and no step called a change (no median moves by 5%, the threshold)."""
    result = history.build([load_any(ROOT / p) for p in SWITCHBACK], ["kernels_ms"], ["variant=switchback/"])
    assert result.order == "git" and len(result.revisions) == 2 and len(result.series) == 18
    assert all(len(s.points) == 2 for s in result.series)
    assert not [p for s in result.series for p in s.changes()]


def test_a_gate_that_can_judge_nothing_is_a_usage_error(tmp_path, capsys):
    one = make_runs(tmp_path, [1.0], tag="one")
    with pytest.raises(SystemExit) as exc:
        main(["history", *one, "--fail-on", "time:5"])
    assert exc.value.code == 2 and "at least two commits" in capsys.readouterr().err


def test_the_figure_draws_at_most_max_panels_metrics(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from qbench import store, units
    from qbench.plots import history as history_figure

    names = [f"m{i}_ms" for i in range(history_figure.MAX_PANELS + 3)]
    paths = []
    for i in range(2):
        rec = store.make_record("toy", {"n": 8}, {n: 1.0 + i for n in names}, units=dict.fromkeys(names, units.MS),
                                samples={n: [1.0 + i, 1.1 + i] for n in names})
        paths.append(str(write_run(tmp_path / f"r{i}", [rec], git_commit=f"{i + 1:x}" * 40, time_utc=f"2026-0{i + 1}")))
    fig = history_figure.figure(plt, history.build([load_any(p) for p in paths], names))
    assert len(fig.axes) == history_figure.MAX_PANELS and "name others with --metric" in fig._suptitle.get_text()
    plt.close(fig)


def test_dirty_trees_on_one_commit_are_told_apart_by_their_source_hash(tmp_path):
    def run(name, source, time):
        return load_any(str(write_run(tmp_path / name, [timed_record({"n": 8}, [1.0, 1.1])], git_commit="a" * 40,
                                      git_dirty=True, source_hash=source, time_utc=time)))

    runs = [run("x1", "1" * 64, "2026-01-01"), run("x2", "1" * 64, "2026-01-02"), run("y", "2" * 64, "2026-01-03")]
    order, of_run, _ = revisions.ordered(runs)
    assert [r.label for r in order] == ["aaaaaaa+dirty:1111111", "aaaaaaa+dirty:2222222"]
    assert of_run[runs[0].label] == of_run[runs[1].label] != of_run[runs[2].label]


@pytest.mark.skipif(not all((ROOT / p).is_dir() for p in SWITCHBACK), reason="the committed switchback runs are gone")
def test_the_legend_lists_the_revisions_in_the_columns_order(capsys):
    """Runs given newest first still print oldest first, in the table's columns and in the legend alike."""
    with pytest.raises(SystemExit) as exc:
        main(["history", *reversed(SWITCHBACK), "--metric", "kernels_ms", "-k", "variant=switchback/"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    legend = out[out.index("revisions oldest first"):]
    assert legend.index("switchback-h200-modes/run1") < legend.index("switchback-h200-modes-c4c2232/run1")
