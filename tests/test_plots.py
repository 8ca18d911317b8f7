"""qbench plot: a non-empty figure for each bench from small run directories built here with
qbench.store (fresh random values), from imported seed files, and for several runs side by side;
the helpers that aggregate records for the panels are checked against hand computations."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from qbench import plots, store, units
from qbench.cli import main
from qbench.errors import QbenchUsageError
from qbench.migration import moe as moe_migration
from qbench.migration.switchback import tidy
from qbench.plots import base as plots_base
from qbench.plots.switchback import by_dim, focus_batch, of_variant

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write(path: Path, records: list[dict], gpu: str = "NVIDIA H200") -> Path:
    with store.RunWriter(path, {"gpu_name": gpu, "torch": "2.11.0"}) as writer:
        for rec in records:
            writer.write(rec)
    return path


def switchback_records(rng: random.Random) -> list[dict]:
    """Odd sizes, both projections, two M, two dtypes; totals are sums of the drawn components; each shape's
    values in the bench's wide keys, recorded tidy as the bench records them (one record per variant)."""
    records = []
    for dim, batch, switch, dtype in [
        (d, b, s, t) for d in (96, 1000) for b in (24, 32768) for s in (False, True) for t in ("fp16", "bf16")
    ]:
        params = {
            "batch_size": batch,
            "dim_in": dim * 4 if switch else dim,
            "dim_out": dim if switch else dim * 4,
            "wm": 4,
            "switch": switch,
            "dtype": dtype,
        }
        parts = {
            k: rng.uniform(0.01, 1.0)
            for k in (
                "standard_fwd",
                "standard_gw",
                "standard_gx",
                "global_fwd",
                "global_bwd",
                "x_quantize_rowwise",
                "g_quantize_rowwise",
            )
        }
        metrics = dict(parts, time_standard=parts["standard_fwd"] + parts["standard_gw"] + parts["standard_gx"])
        metrics["time_global"] = metrics["time_standard"] * rng.uniform(0.6, 1.3)
        metrics["speedup_global"] = metrics["time_standard"] / metrics["time_global"]
        metrics["pct_saved_global"] = 100 * (1 - metrics["time_global"] / metrics["time_standard"])
        metrics["speedup_fp8"] = rng.uniform(0.8, 1.6)
        records += [store.make_record("switchback", p, m, device="cuda") for p, m, _ in tidy(params, metrics)]
    return records


def moe_records(rng: random.Random) -> list[dict]:
    records = []
    for experts in (3, 8, 24):
        params = {
            "world_size": 2,
            "dtype": "float32",
            "model_dim": 96,
            "hidden_size": 200,
            "samples": 77,
            "num_local_experts": experts,
            "top_k": 2,
            "a2a_ffn_overlap_degree": 1,
        }
        steps = [rng.uniform(1, 2) for _ in range(11)]
        metrics = {
            "step_time": sorted(steps)[5],
            "forward_time": rng.uniform(0.3, 0.6),
            "backward_time": 0.4,
            "tflops": rng.uniform(1, 5),
            "blocks_rank0": 40,
            "remote_blocks_rank0": 9,
            "blocks_rank1": 31,
            "remote_blocks_rank1": 4,
        }
        measured = {**params, "variant": "blocks", "exec": "eager"}  # tidy, as `qbench moe` records a measurement
        records += [store.make_record("moe", p, m, samples=s)
                    for p, m, s in moe_migration.tidy(measured, metrics, {"step_time": steps})]
    return records


def moe_phase_records(rng: random.Random) -> list[dict]:
    """As `qbench moe` writes them: phase times and load imbalance instead of per-rank block counts."""
    records = []
    for record in moe_records(rng):
        if "rank" in record["params"]:
            continue
        metrics = dict(record["metrics"])
        phases = ("gate", "plan", "dispatch", "experts", "combine", "backward_exchange", "backward_experts")
        metrics.update({f"{p}_ms": rng.uniform(0.01, 0.2) for p in phases})
        metrics.update(expert_load_max_over_mean=rng.uniform(1, 3), rank_load_max_over_mean=rng.uniform(1, 2))
        records.append(store.make_record("moe", {**record["params"], "variant": "a2a"}, metrics))
    return records


def fragmented_records(rng: random.Random) -> list[dict]:
    records = []
    for size, batch in ((96, 1), (1000, 7)):
        for variant, task, fragments in (
            ("dense", "train", 0),
            ("fragmented", "train", 3),
            ("fragmented", "eval", 3),
            ("blockdiag", "train", 4),
            ("lowrank", "train", 0),
        ):
            params = {
                "in_features": size,
                "out_features": size,
                "batch_size": batch,
                "variant": variant,
                "task": task,
                "fragments": fragments,
                "dtype": "fp32",
            }
            metrics = {
                "forward_ms": rng.uniform(0.05, 2),
                "backward_ms": rng.uniform(0.05, 2),
                "peak_memory_mb": rng.uniform(1, 100),
            }
            unit_of = {"forward_ms": units.MS, "backward_ms": units.MS, "peak_memory_mb": units.MB}
            records.append(store.make_record("fragmented", params, metrics, units=unit_of))
    return records


def model_records(rng: random.Random) -> list[dict]:
    parts = {k: rng.uniform(0.001, 10) for k in ("cf_s", "cb_s", "softmax_f_s", "softmax_b_s")}
    memory = {k: rng.uniform(1, 40) for k in ("memory_embedding_gb", "memory_hidden_gb", "memory_weight_gb")}
    metrics = {
        "time_s": sum(parts.values()) * 3,
        **parts,
        **memory,
        "memory_capacity_gb": 80.0,
        "memory_total_gb": memory["memory_embedding_gb"] + memory["memory_hidden_gb"],
    }
    unit_of = {k: units.GB if k.endswith("_gb") else units.S for k in metrics}
    return [store.make_record("model", {"workload": "lstm"}, metrics, units=unit_of)]


BUILDERS = {
    "switchback": switchback_records,
    "moe": moe_records,
    "moe-phases": moe_phase_records,
    "fragmented": fragmented_records,
    "model": model_records,
}


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{path}: {len(data)} bytes"


@pytest.mark.parametrize("bench", sorted(BUILDERS))
def test_plot_each_bench_from_a_stored_run(tmp_path, bench, monkeypatch):
    records = BUILDERS[bench](random.Random())
    run = write(tmp_path / bench, records)
    monkeypatch.chdir(tmp_path)
    out = plots.plot_run([run])
    assert out == Path("runs") / "plots" / f"{bench}-{records[0]['bench']}.png"  # beside the runs, not in one
    assert_png(out)
    assert sorted(p.name for p in run.iterdir()) == ["env.json", "results.csv", "results.jsonl"]


@pytest.mark.parametrize(
    "name", ["seed_bnb_info.jsonl", "seed_moe_mixmoe_trimmed.log", "seed_fragmented_report.txt", "seed_deepflow.txt"]
)
def test_plot_imported_seed_files(tmp_path, name):
    assert_png(plots.plot_run([FIXTURES / name], tmp_path / "seed.png"))


def test_several_runs_side_by_side_and_vector_formats(tmp_path):
    rng = random.Random()
    runs = [write(tmp_path / "a", moe_records(rng)), write(tmp_path / "b", moe_records(rng), gpu="NVIDIA H100")]
    assert_png(plots.plot_run(runs + [FIXTURES / "seed_moe_baseline.log"], tmp_path / "side.png"))
    svg = plots.plot_run(runs, tmp_path / "side.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    assert plots.plot_run(runs, tmp_path / "side.pdf").read_bytes().startswith(b"%PDF")


def test_mixed_benches_in_one_figure(tmp_path):
    rng = random.Random()
    runs = [write(tmp_path / "sb", switchback_records(rng)), write(tmp_path / "fr", fragmented_records(rng))]
    assert_png(plots.plot_run(runs, tmp_path / "mixed.png"))


def test_by_dim_averages_up_and_down_projections():
    records = switchback_records(random.Random())
    fp16 = of_variant([r for r in records if r["params"]["dtype"] == "fp16"], "switchback")
    dims, values = by_dim(fp16, "kernels_ms", 32768)
    assert dims == [96, 1000] and len(fp16) == 8
    for dim, got in zip(dims, values):
        pair = [
            r["metrics"]["kernels_ms"]
            for r in fp16
            if r["params"]["batch_size"] == 32768 and min(r["params"]["dim_in"], r["params"]["dim_out"]) == dim
        ]
        assert len(pair) == 2 and abs(got - sum(pair) / 2) < 1e-12
    assert focus_batch(fp16) == 32768 and focus_batch([r for r in fp16 if r["params"]["batch_size"] == 24]) == 24


def test_one_dtype_keeps_a_single_dtype():
    records = switchback_records(random.Random())
    kept, dtype = plots_base.one_dtype(records)
    assert dtype == "fp16" and {r["params"]["dtype"] for r in kept} == {"fp16"} and len(kept) == len(records) // 2


def test_registry_has_panels_for_every_bench():
    registry = plots.registry()
    assert set(registry) == set(plots.BENCHES)
    assert all(panels and all(callable(p) for p in panels) for panels in registry.values())


def test_bad_input(tmp_path, capsys):
    run = write(tmp_path / "m", model_records(random.Random()))
    with pytest.raises(QbenchUsageError, match="unknown figure format"):
        plots.plot_run([run], tmp_path / "figure.jpg")
    empty = write(tmp_path / "failed", [store.make_record("moe", {"world_size": 2}, status="error", error="boom")])
    with pytest.raises(QbenchUsageError, match="no successful records"):
        plots.plot_run([empty])
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(run), "--out", str(tmp_path / "x.bmp")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_plot_command_writes_the_file(tmp_path):
    run = write(tmp_path / "f", fragmented_records(random.Random()))
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(run), "--out", str(tmp_path / "out" / "f.png")])
    assert exit_info.value.code == 0
    assert_png(tmp_path / "out" / "f.png")


def test_moe_figure_tells_apart_records_that_differ_in_mode_or_backward_thread():
    from qbench.plots import moe as moe_plot

    params = {"world_size": 1, "num_local_experts": 8}
    records = [store.make_record("moe", dict(params, exec=e, backward_thread=t), {"step_ms": ms, "tflops": 1 / ms})
               for e, t, ms in (("eager", "device", 3.0), ("eager", "calling", 2.7), ("graph", "device", 1.8))]
    assert moe_plot.labels(records) == ["exec=eager\nbwd=device", "exec=eager\nbwd=calling", "exec=graph\nbwd=device"]
    series = moe_plot._series(records)  # one line per mode and thread, never one line through all three
    assert sorted(series) == ["exec=eager, bwd=calling", "exec=eager, bwd=device", "exec=graph, bwd=device"]
    assert all(len(points) == 1 for points in series.values())


def test_fragmented_figure_draws_each_exec_and_thread_as_its_own_line():
    from qbench.plots import fragmented as fragmented_plot

    base = {"in_features": 64, "out_features": 64, "variant": "fragmented", "task": "train", "fragments": 2}
    records = [store.make_record("fragmented", dict(base, batch_size=b, exec=e, backward_thread="device"),
                                 {"forward_ms": 1.0}) for b in (1, 8) for e in ("eager", "compile")]
    lines = fragmented_plot.series(records)
    assert sorted(lines) == [("fragmented", "train", 2, "compile"), ("fragmented", "train", 2, "eager")]
    assert all(len(recs) == 2 for recs in lines.values())  # one point per batch size on each line
    one_mode = fragmented_plot.series([r for r in records if r["params"]["exec"] == "eager"])
    assert list(one_mode) == [("fragmented", "train", 2, "")]  # nothing to tell apart: no suffix
