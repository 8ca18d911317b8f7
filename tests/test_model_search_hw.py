"""Power-split search (`qbench model search-hw`), strategy x topology search, time budgets, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from qbench import store
from qbench.benches.model import config as config_files
from qbench.cli import main
from qbench.model import objective, search, search_hw, transformer

FIXTURES = Path(__file__).parent / "fixtures"
SEED_CONFIG = str(FIXTURES / "deepflow_seed_config.yaml")
SEED_TIME = 302.88817584  # the seed report's "Time:" line
TOL = 1e-9  # fractions of TDP: far below any digit DeepFlow prints (0.1 of a unit)


def run_cli(capsys, *args):
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cfg():
    return config_files.load(SEED_CONFIG)


@pytest.fixture(scope="module")
def seed_outcome(cfg):
    setup = search_hw.HwSearch(starts=3, seed=7, iterations=40)
    return search_hw.search(objective.objective(cfg, None), cfg["power_breakdown"], setup)


def _valid(split: dict, keys, total, lo, hi) -> list[str]:
    """Reasons a split is invalid (empty when valid)."""
    bad = [f"{k}={split[k]} outside [{lo}, {hi}]" for k in keys if not lo - TOL <= split[k] <= hi + TOL]
    if abs(sum(split[k] for k in keys) - total) > TOL:
        bad.append(f"sum {sum(split[k] for k in keys)} != {total}")
    return bad


def test_seed_search_is_no_worse_than_the_seed_and_monotone(seed_outcome):
    o = seed_outcome
    assert o.initial_point.time_s == pytest.approx(SEED_TIME, abs=5e-9)  # start 0 is the seed itself
    first = [s for s in o.path if s.start == 0]
    assert first[0].time_s == o.initial_point.time_s and first[0].move == "start"
    assert o.best_point.time_s <= SEED_TIME
    assert o.best_point.time_s < 0.5 * SEED_TIME  # the seed gives 43% of TDP to on-chip memories it barely uses
    for start in {s.start for s in o.path}:
        best = [s.best_s for s in o.path if s.start == start]
        rises = [(i, a, b) for i, (a, b) in enumerate(zip(best, best[1:])) if b > a]
        assert not rises, f"start {start}: best-so-far rises at (iteration, before, after) {rises[:3]}"


def test_fractions_stay_valid_on_every_step(seed_outcome, cfg):
    keys = ("core", "DRAM", "L2", "shared_mem")
    total = sum(cfg["power_breakdown"][k] for k in keys)
    bad = [(s.start, s.iteration, _valid(s.split, keys, total, 0.01, 0.9)) for s in seed_outcome.path]
    bad = [b for b in bad if b[2]]
    assert not bad, f"first invalid steps: {bad[:3]}"
    shares = [seed_outcome.best[k] / total for k in keys]  # the shares of the searched budget sum to one
    assert sum(shares) == pytest.approx(1, abs=TOL)
    assert seed_outcome.best["IB"] == cfg["power_breakdown"]["IB"]  # not searched: untouched


def test_search_is_deterministic_for_a_fixed_seed(cfg):
    setup = search_hw.HwSearch(starts=3, seed=11, iterations=8)
    runs = [search_hw.search(objective.objective(cfg, None), cfg["power_breakdown"], setup) for _ in range(2)]
    a, b = ([(s.start, s.iteration, s.split, s.time_s) for s in o.path] for o in runs)
    assert a == b
    other = search_hw.search(objective.objective(cfg, None), cfg["power_breakdown"],
                             search_hw.HwSearch(starts=3, seed=12, iterations=8))
    assert [s.split for s in other.path if s.start == 1][0] != [s.split for s in runs[0].path if s.start == 1][0]


@pytest.mark.parametrize("n,lo,hi,total", [(4, 0.01, 0.9, 0.890112), (5, 0.0, 1.0, 1.0), (3, 0.1, 0.5, 1.0),
                                           (2, 0.05, 0.95, 0.3)])
def test_projection_lands_in_the_feasible_set(n, lo, hi, total):
    rng = random.Random(n)
    for _ in range(50):
        x = [rng.uniform(-1, 2) for _ in range(n)]
        y = search_hw.project(x, total, lo, hi)
        keys = [str(i) for i in range(n)]
        assert not _valid(dict(zip(keys, y)), keys, total, lo, hi), (x, y)
        assert search_hw.project(y, total, lo, hi) == pytest.approx(y, abs=1e-9)  # a projection is idempotent


def test_projection_and_search_refuse_impossible_bounds(cfg):
    with pytest.raises(ValueError, match="cannot sum"):
        search_hw.project([0.5, 0.5], 1.0, 0.6, 0.9)
    with pytest.raises(ValueError, match="outside the bounds"):
        search_hw.search(objective.objective(cfg, None), cfg["power_breakdown"], search_hw.HwSearch(hi=0.2))
    with pytest.raises(ValueError, match="--keys"):
        search_hw.search(objective.objective(cfg, None), cfg["power_breakdown"], search_hw.HwSearch(keys=("core",)))


def test_transformer_workload_search_improves_its_start(cfg):
    shape = transformer.from_params({"batch": 8, "seq": 512, "layers": 4, "hidden": 768, "heads": 12,
                                     "vocab": 1000})
    setup = search_hw.HwSearch(starts=2, seed=3, iterations=15)
    o = search_hw.search(objective.objective(cfg, shape), cfg["power_breakdown"], setup)
    assert o.best_point.time_s <= o.initial_point.time_s
    assert o.best_point.time_s == min(s.time_s for s in o.path)


def test_time_budget_from_tokens_and_hours():
    # the DeepFlow harness's budget: 100 x 768,648,884 tokens, batch 32, sequences of 20, one day
    got = objective.time_budget(None, 100 * 768_648_884, 24, 32, 20)
    assert got == pytest.approx(86400 / 120_101_389)  # ceil, where the harness floors: one step apart
    assert objective.time_budget(0.5, None, None, 32, 20) == 0.5
    assert objective.time_budget(None, None, None, 32, 20) is None
    with pytest.raises(ValueError, match="go together"):
        objective.time_budget(None, 1e9, None, 32, 20)


def test_ring_and_mesh_links(cfg):
    trial = {**cfg, "power_breakdown": dict(cfg["power_breakdown"])}
    pw, e = 0.2 * 300, 10e-12 * 8
    assert objective.network_ib(trial, "ring", 4, 1, 1) == pytest.approx(pw / (2 * e))
    assert objective.network_ib(trial, "mesh", 4, 1, 1) == pytest.approx(pw / (4 * e))  # DeepFlow: dp*h1 links
    assert objective.network_ib(trial, "mesh", 2, 2, 1) == pytest.approx(pw / (2 * 2 * 2 * e))
    assert objective.network_ib(trial, "ring", 1, 1, 1) == 0


def test_strategy_search_over_topologies(cfg):
    ranked, rejected = search.search(cfg, 4, ("ring", "mesh"))
    assert {c.topology for c in ranked} == {"ring", "mesh"}
    assert [c.time_s for c in ranked] == sorted(c.time_s for c in ranked)
    mesh_only, _ = search.search(cfg, 4)
    assert len(ranked) == 2 * len(mesh_only)
    by = {(json.dumps(c.settings, sort_keys=True), c.topology): c.time_s for c in ranked}
    dp4 = json.dumps({"dp": 4}, sort_keys=True)
    assert by[(dp4, "ring")] < by[(dp4, "mesh")]  # 2 links per device against DeepFlow's 4 for dp=4


def test_cli_search_hw_writes_records_plot_and_table(capsys, tmp_path):
    out = tmp_path / "hw"
    code, stdout, err = run_cli(capsys, "model", "search-hw", "--config", SEED_CONFIG, "--starts", "2",
                                "--iterations", "6", "--time-budget", "120", "--out", str(out),
                                "--deepflow", "exact", "--no-must-fit")  # the seed fits at no split
    assert code == 0, err
    assert "Power-split search" in stdout and "302.888" in stdout
    _, records = store.load_run(out)
    assert (out / "search-path.png").stat().st_size > 1000
    assert {r["params"]["start"] for r in records} == {0, 1}
    first = records[0]
    assert first["metrics"]["time_s"] == pytest.approx(SEED_TIME, abs=5e-9)
    assert first["metrics"]["meets_budget"] == 0 and first["units"]["f_core"] == "of TDP"


def test_cli_search_with_topologies_budget_and_transformer(capsys):
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "4", "--topologies",
                             "ring,mesh", "--time-budget", "100", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["budget_s"] == 100 and {r["topology"] for r in data["ranked"]} == {"ring", "mesh"}
    assert all(r["meets_budget"] == (r["time_s"] <= 100) for r in data["ranked"])
    code, out, err = run_cli(capsys, "model", "search", "--config", SEED_CONFIG, "--devices", "8", "--workload",
                             "transformer", "--shape", "layers=4", "--shape", "batch=16", "--topologies", "ring")
    assert code == 0, err
    assert "dp=" in out and "tp=" in out and "pp=" in out


@pytest.mark.parametrize("args,needle", [
    (("search-hw", "--bounds", "0.5:0.2"), "--bounds"),
    (("search-hw", "--keys", "core,GPU"), "unknown GPU"),
    (("search-hw", "--tokens", "1e9"), "go together"),
    (("search-hw", "--workload", "transformer", "--shape", "depth=3"), "depth"),
    (("search-hw", "--shape", "layers=3"), "--workload transformer"),
    (("search", "--devices", "2", "--topologies", "torus"), "unknown torus"),
    (("search-hw", "--workload", "transformer", "--shape", "heads=7"), "heads"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, args, needle):
    code, out, err = run_cli(capsys, "model", args[0], "--config", SEED_CONFIG, *args[1:])
    assert code == 2
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_help_ends_with_examples(capsys):
    for sub in ("search", "search-hw"):
        code, out, _ = run_cli(capsys, "model", sub, "--help")
        assert code == 0 and "Examples:" in out and "search-hw --config" in out


# ---- memory must fit ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_vocab():
    """The seed with a 100,000-word vocabulary: 67.6 GiB per device, which fits once DRAM has ~0.65 of TDP."""
    raw = config_files.read_yaml(SEED_CONFIG)
    raw["model_param"]["vocab_size"] = 100_000
    from qbench.model.deepflow import config as deepflow_config

    return deepflow_config.normalize(raw)


def test_fit_floor_is_where_capacity_meets_the_memory_needed(small_vocab):
    goal = objective.objective(small_vocab, None)
    split = small_vocab["power_breakdown"]
    floor = objective.fit_floor(goal, split)
    p = goal(split)
    assert not p.fits and floor == pytest.approx(split["DRAM"] * p.memory_gb / p.capacity_gb, rel=1e-12)
    assert goal({**split, "DRAM": floor}).fits and not goal({**split, "DRAM": floor * (1 - 1e-9)}).fits


def test_projection_with_a_floor_per_fraction():
    rng = random.Random(5)
    lows = [0.01, 0.6, 0.01, 0.01]
    for _ in range(50):
        y = search_hw.project([rng.uniform(-1, 2) for _ in range(4)], 0.890112, lows, 0.9)
        assert sum(y) == pytest.approx(0.890112, abs=TOL) and all(lo - TOL <= v <= 0.9 + TOL for v, lo in zip(y, lows))


def test_must_fit_keeps_every_step_in_memory(small_vocab):
    goal = objective.objective(small_vocab, None)
    floor = objective.fit_floor(goal, small_vocab["power_breakdown"])
    setup = search_hw.HwSearch(starts=2, seed=1, iterations=6, floors={"DRAM": floor})
    o = search_hw.search(goal, small_vocab["power_breakdown"], setup)
    assert not o.initial_point.fits  # the config's own split does not fit ...
    assert all(s.point.fits and s.split["DRAM"] >= floor for s in o.path)  # ... no searched split misses
    assert [s.split["DRAM"] for s in o.path if s.start == 0][0] == pytest.approx(floor, abs=TOL)  # start 0 moved
    free = search_hw.search(goal, small_vocab["power_breakdown"], search_hw.HwSearch(starts=2, seed=1, iterations=6))
    assert not free.best_point.fits  # unconstrained, the fastest split gives DRAM's power to the cores


def test_cli_search_hw_must_fit_by_default(capsys, tmp_path):
    args = ("model", "search-hw", "--config", SEED_CONFIG, "--set", "model_param.vocab_size=100000",
            "--starts", "2", "--iterations", "4")
    code, out, err = run_cli(capsys, *args, "--out", str(tmp_path / "fit"))
    assert code == 0, err
    _, records = store.load_run(tmp_path / "fit")
    assert all(r["metrics"]["fits"] == 1 and r["params"]["must_fit"] and r["params"]["deepflow"] == "corrected"
               for r in records)
    assert "memory must fit: DRAM >=" in " ".join(out.split())
    code, out, err = run_cli(capsys, *args, "--no-must-fit", "--out", str(tmp_path / "free"))
    _, records = store.load_run(tmp_path / "free")
    assert code == 0 and any(r["metrics"]["fits"] == 0 for r in records if r["params"]["start"] == 1), err


@pytest.mark.parametrize("extra, needle", [((), "no split fits: the model needs 251.9 GiB per device"),
                                           (("--keys", "core,L2"), "DRAM is not searched")])
def test_cli_search_hw_says_when_nothing_fits(capsys, extra, needle):
    code, _, err = run_cli(capsys, "model", "search-hw", "--config", SEED_CONFIG, *extra)
    assert code == 2 and needle in err and "--no-must-fit" in err and len(err.strip().splitlines()) == 1, err
