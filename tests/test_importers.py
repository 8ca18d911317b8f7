"""Importers: every seed format reads into records with the shared names, counts and values that the
file itself says (re-read here with independent parsing), and unknown input is a one-line error.

Fixtures (tests/fixtures/seed_*): copies of the seeds. seed_moe_mixmoe_trimmed.log keeps every
header, model print, STEP and summary line of the MixMoE log, and the per-rank diagnostics of steps
10-12 of each block only (the full log is 930 kB).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from qbench import importers, store, units
from qbench.cli import main
from qbench.errors import QbenchUsageError

FIXTURES = Path(__file__).parent / "fixtures"
BNB = FIXTURES / "seed_bnb_info.jsonl"
MIXMOE = FIXTURES / "seed_moe_mixmoe_trimmed.log"
BASELINE = FIXTURES / "seed_moe_baseline.log"
FRAGMENTED = FIXTURES / "seed_fragmented_report.txt"
DEEPFLOW = FIXTURES / "seed_deepflow.txt"
TRITONBENCH = FIXTURES / "tritonbench_output.json"  # written from tritonbench's key format (importers/tritonbench.py)
NVBENCH = FIXTURES / "nvbench_output.json"  # written from nvbench's JSON schema, file version 1.0.0
SWITCHBACK_PARAMS = {"batch_size", "dim_in", "dim_out", "wm", "switch", "dtype"}
TIDY_FIELDS = {"variant", "exec", "timing"}
STEP_LINE = re.compile(r"STEP-(\d+): step_time = ([\d.]+) ms, foward_time = ([\d.]+), backward_time = ([\d.]+), perf")


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def assert_units_complete(records: list[dict]) -> None:
    """Every metric of every record declares a unit (compare reads better/worse from it)."""
    missing = [(r["case"], m) for r in records for m in r["metrics"] if m not in r["units"]]
    assert not missing, f"metrics without a unit, first: {missing[:5]}"


def seed_json_lines() -> list[dict]:
    return [json.loads(x) for x in BNB.read_text().splitlines() if x.startswith("{")]


# ---- bitsandbytes info.jsonl ------------------------------------------------------------------


def bnb_shapes(records: list[dict]) -> list[dict[str, dict]]:
    """Per imported line, in file order: variant -> its tidy record (the seed's kernel sums: eager, per_kernel)."""
    from qbench.migration.switchback import shapes

    out = []
    for group in shapes(records):
        assert all((r["params"]["exec"], r["params"]["timing"]) == ("eager", "per_kernel") for r in group)
        out.append({r["params"]["variant"]: r for r in group})
    return out


def test_bnb_every_line_becomes_a_shapes_records_with_seed_keys():
    """Each line becomes the tidy records of its shape, one per variant it times; the seed's keys come back
    from them exactly (migration.switchback.wide), and each time is also where the tidy form puts it."""
    from qbench.migration.switchback import wide

    env, records = importers.read_file(BNB)
    rows = seed_json_lines()
    shapes = bnb_shapes(records)
    assert len(shapes) == len(rows) == 142 and len(records) == 3 * 142
    assert env["source"] == "bnb-jsonl" and env["gpu_name"] == "NVIDIA A100"
    assert any("info.jsonl" in line for line in env["header"])
    mismatched = []
    for row, shape in zip(rows, shapes):
        assert set(shape) == {"16bit", "switchback", "switchback_rowwise"}
        for rec in shape.values():
            assert rec["bench"] == "switchback" and set(rec["params"]) == SWITCHBACK_PARAMS | TIDY_FIELDS
            assert rec["params"]["dtype"] == "fp16"
        seed = wide(list(shape.values()))
        keys = [k for k in row if k not in ("repeat", *SWITCHBACK_PARAMS)]
        mismatched += [(row["batch_size"], k) for k in keys if seed[k] != row[k]]
        assert shape["switchback"]["metrics"]["kernels_ms"] == row["time_global"]
        assert shape["16bit"]["metrics"]["fwd_ms"] == row["standard_fwd"]
        assert shape["switchback_rowwise"]["metrics"]["quantize_w_t_ms"] == row["w_quantize_colwise_transpose"]
    assert not mismatched, f"seed values not kept exactly, first: {mismatched[:5]}"
    assert_units_complete(records)


def test_bnb_derived_metrics_follow_their_definitions():
    _, records = importers.read_file(BNB)
    row = seed_json_lines()[57]  # an arbitrary line: every line goes through the same code
    shape = bnb_shapes(records)[57]
    sb, row_wise, standard = (shape[v]["metrics"] for v in ("switchback", "switchback_rowwise", "16bit"))
    m, k, n = row["batch_size"], row["dim_in"], row["dim_out"]
    assert close(sb["kernels_speedup"], row["time_standard"] / row["time_global"])
    saved = 100 * (row["time_standard"] - row["time_rowwise"]) / row["time_standard"]
    assert close(row_wise["kernels_pct_saved"], saved)
    assert close(standard["gw_tflops"], 2 * m * k * n / row["standard_gw"] / 1e9)
    assert close(sb["fwd_tops"], 2 * m * k * n / row["global_fwd"] / 1e9)
    # columnwise quantize of W (N x K): fp16 in, int8 out, one fp16 scale per column
    assert close(row_wise["quantize_w_t_gbps"], (3 * n * k + 2 * k) / row["w_quantize_colwise_transpose"] / 1e6)
    units_of = shape["switchback"]["units"]
    assert units_of["kernels_speedup"] == units.SPEEDUP and units_of["fwd_tops"] == units.TOPS


def test_bnb_totals_in_the_seed_are_the_documented_sums():
    """The seed's totals equal the sums the reference documents, so the imported keys mean what qbench's do."""
    _, records = importers.read_file(BNB)
    parts = ("quantize_x_ms", "quantize_g_ms", "quantize_w_ms", "quantize_w_t_ms", "gw_ms", "fwd_ms", "bwd_ms")
    sums = [shape["switchback"]["metrics"] for shape in bnb_shapes(records)]
    off = [i for i, m in enumerate(sums) if not close(sum(m[p] for p in parts), m["kernels_ms"], 1e-12)]
    assert not off, f"time_global is not the documented sum for lines {off[:3]}"


# ---- MoE step logs ----------------------------------------------------------------------------


def step_blocks(path: Path) -> list[list[tuple[float, float, float]]]:
    """(step, forward, backward) of every STEP line, per benchmark block, read independently."""
    blocks: list[list[tuple[float, float, float]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("[Benchmark]"):
            blocks.append([])
        elif m := STEP_LINE.match(line):
            blocks[-1].append(tuple(float(v) for v in m.groups()[1:]))
    return blocks


def moe_measurements(records: list[dict]) -> list[tuple[dict, dict[int, dict]]]:
    """(the block's per_step record, rank -> its per-rank record) of each imported log block, in order."""
    out: list[tuple[dict, dict[int, dict]]] = []
    for rec in records:
        assert rec["params"]["exec"] == "eager" and rec["params"]["timing"] == "per_step"
        if "rank" in rec["params"]:
            out[-1][1][rec["params"]["rank"]] = rec
        else:
            out.append((rec, {}))
    return out


def test_mixmoe_log_has_four_blocks_of_100_steps():
    env, records = importers.read_file(MIXMOE)
    assert_units_complete(records)
    records = [rec for rec, _ in moe_measurements(records)]
    blocks = step_blocks(MIXMOE)
    assert env["source"] == "moe-log" and env["gpu_name"] is None and env["moe_layer"] == "MixMOETransformerMLP"
    assert [r["params"]["num_local_experts"] for r in records] == [8, 16, 32, 64]
    assert [len(b) for b in blocks] == [100] * 4
    for rec, steps in zip(records, blocks):
        assert rec["bench"] == "moe" and rec["params"]["top_k"] == 2 and rec["params"]["dtype"] == "float16"
        assert rec["metrics"]["steps_logged"] == 100
        assert rec["params"]["variant"] == "blocks"  # MixMoE's block dispatch
        kept = steps[rec["metrics"]["warmup_steps"] :]
        assert rec["samples"]["step_ms"] == [s[0] for s in kept]
        assert rec["samples"]["backward_ms"] == [s[2] for s in kept]
        assert rec["metrics"]["step_ms"] == statistics.median(s[0] for s in kept)
        assert rec["metrics"]["forward_ms"] == statistics.median(s[1] for s in kept)


@pytest.mark.parametrize(("path", "window"), [(MIXMOE, 10), (BASELINE, 60)])
def test_summary_averages_recomputed_from_step_lines(path, window):
    """The seed's [Summary] is the mean of its last `window` STEP lines (10 for MixMoE, 60 for the baseline)."""
    _, records = importers.read_file(path)
    records = [rec for rec, _ in moe_measurements(records)]
    summaries = [re.findall(r"[\d.]*\d", x)[:3] for x in path.read_text().splitlines() if x.startswith("[Summary]")]
    for rec, steps, printed in zip(records, step_blocks(path), summaries):
        assert rec["metrics"]["summary_steps"] == window
        for i, name in enumerate(("summary_step_ms", "summary_forward_ms", "summary_backward_ms")):
            assert rec["metrics"][name] == float(printed[i])
            recomputed = sum(s[i] for s in steps[-window:]) / window
            assert abs(recomputed - float(printed[i])) < 1e-5, (rec["case"], name, recomputed, printed[i])


def test_moe_tflops_uses_the_seed_formula():
    """perf = samples * model_dim * hidden * 4 * top_k * 3 / step_time: the printed perf of each STEP matches it."""
    _, records = importers.read_file(BASELINE)
    rec = records[0]
    p = rec["params"]
    flop = p["samples"] * p["model_dim"] * p["hidden_size"] * 4 * p["top_k"] * 3
    assert close(rec["metrics"]["tflops"], flop / rec["metrics"]["step_ms"] / 1e9)
    perf = [
        (float(a), float(b)) for a, b in re.findall(r"step_time = ([\d.]+) ms.*perf = ([\d.]+)", BASELINE.read_text())
    ]
    off = [(t, printed) for t, printed in perf if abs(flop / t / 1e9 - printed) > 0.006]  # perf printed to 0.01
    assert not off, f"the seed formula does not reproduce the printed perf: {off[:3]}"


def test_mixmoe_experts_and_per_rank_diagnostics():
    _, records = importers.read_file(MIXMOE)
    text = MIXMOE.read_text()
    measured = moe_measurements(records)
    for rec, ranks in measured:
        e = rec["params"]["num_local_experts"]
        assert rec["metrics"]["total_experts"] == e * rec["params"]["world_size"]  # the gate's out_features
        assert rec["metrics"]["replicated_expert_slots"] == rec["metrics"]["experts_per_rank"] - e
        assert f"num_expert={rec['metrics']['experts_per_rank']}," in text
        assert sorted(ranks) == [0, 1, 2, 3]  # one record per rank, param rank
        fractions = [ranks[r]["metrics"]["remote_fraction"] for r in range(4)]
        for r in range(4):
            total, remote = ranks[r]["metrics"]["block_count"], ranks[r]["metrics"]["remote_block_count"]
            assert f"block_info {total} {remote}" in text and f"AG, {remote / total:.6f}," in text
            assert ranks[r]["units"]["ag_ms"] == units.MS
        assert close(rec["metrics"]["remote_fraction"], sum(ranks[r]["metrics"]["remote_block_count"] for r in range(4))
                     / sum(ranks[r]["metrics"]["block_count"] for r in range(4)))  # fmt: skip
        assert 0 < min(fractions) <= max(fractions) < 1
    first = measured[0][1][0]["metrics"]  # rank 0 of the 8-expert block prints "0 wait time" then 228 blocks
    assert (first["block_count"], first["remote_block_count"]) == (228, 16)


def test_baseline_log_is_one_record_without_diagnostics():
    env, records = importers.read_file(BASELINE)
    assert len(records) == 1 and env["moe_layer"] is None and records[0]["params"]["variant"] == "a2a"
    assert not [m for m in records[0]["metrics"] if "rank" in m or m.startswith("experts") or "block" in m]


# ---- FragmentedLinear report ------------------------------------------------------------------


def test_fragmented_report_one_record_per_configuration():
    _, records = importers.read_file(FRAGMENTED)
    shapes = re.findall(r"input_size=(\d+), output_size=(\d+), batch_size=(\d+)", FRAGMENTED.read_text())
    assert len(shapes) == 9
    assert (
        len(records) == 9 * 3 * 4 - 9 * 3
    )  # 9 shapes x (dense, train, eval) x 4 fragment counts - shared dense rows
    combos = {(r["params"]["variant"], r["params"]["task"], r["params"]["fragments"]) for r in records}
    assert combos == {("dense", "train", 0)} | {
        ("fragmented", m, n) for m in ("train", "eval") for n in (2, 8, 32, 128)
    }
    assert len({r["case"] for r in records}) == len(records)
    assert all(r["params"]["dtype"] == "fp32" for r in records)
    assert_units_complete(records)


def test_fragmented_parameter_counts_match_the_layer_formula():
    """in + in*out + in*c + c*out with c = in/32 (the reference's count), and nn.Linear's in*out + out."""
    _, records = importers.read_file(FRAGMENTED)
    wrong = []
    for rec in records:
        i, o = rec["params"]["in_features"], rec["params"]["out_features"]
        c = i // 32
        expected = i * o + o if rec["params"]["variant"] == "dense" else i + i * o + i * c + c * o
        if rec["metrics"]["parameters"] != expected:
            wrong.append((rec["case"], rec["metrics"]["parameters"], expected))
    assert not wrong, f"first mismatches: {wrong[:3]}"


def test_fragmented_spot_values():
    _, records = importers.read_file(FRAGMENTED)
    by_case = {r["case"]: r["metrics"] for r in records}
    gather = by_case[
        "batch_size=16/dtype=fp32/fragments=2/in_features=8192/out_features=8192/task=eval/variant=fragmented"
    ]
    assert (gather["forward_ms"], gather["backward_optimizer_ms"], gather["peak_memory_mb"]) == (9.19, 18.0, 3668.8)
    linear = by_case["batch_size=1/dtype=fp32/fragments=0/in_features=2048/out_features=2048/task=train/variant=dense"]
    assert (linear["forward_ms"], linear["backward_optimizer_ms"], linear["peak_memory_mb"]) == (0.12, 1.0, 96.3)


# ---- DeepFlow summary -------------------------------------------------------------------------


def test_deepflow_summary():
    env, records = importers.read_file(DEEPFLOW)
    (rec,) = records
    metrics = rec["metrics"]
    text = DEEPFLOW.read_text()
    assert rec["bench"] == "model" and rec["params"]["workload"] == "lstm"
    assert f"Time: {metrics['time_s']:.8f}" in text and rec["units"]["time_s"] == units.S
    printed = ("Cf", "Cb", "R", "softmax_f", "softmax_b", "embedding_f", "embedding_b", "projection_f")
    # named as `qbench model lstm` names them (Cf -> cf_s), values exactly as printed
    missing = [
        c for c in printed if rec["units"][f"{c.lower()}_s"] != units.S or repr(metrics[f"{c.lower()}_s"]) not in text
    ]
    assert not missing, missing
    by_layer = sum(metrics[f"memory_{k}_gb"] for k in ("embedding", "hidden", "softmax", "projection"))
    by_kind = sum(metrics[f"memory_{k}_gb"] for k in ("weight", "activation", "pointwise"))
    assert (
        abs(by_layer - metrics["memory_total_gb"]) < 0.2 and abs(by_kind - metrics["memory_total_gb"]) < 0.2
    )  # 0.1 GB print rounding x parts
    assert (
        env["hardware"]["memory_size_gb"] == metrics["memory_capacity_gb"] == 26.8
        and env["hardware"]["throughput_tflops"] == 6.5
    )
    assert round(metrics["memory_total_gb"] / env["hardware"]["memory_size_gb"], 1) == metrics["overflow_rate"]
    assert metrics["parameters"] == 38_370_000_000


# ---- detection, errors, the command -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fmt"), [(BNB, "bnb-jsonl"), (MIXMOE, "moe-log"), (BASELINE, "moe-log"),
                      (FRAGMENTED, "fragmented-report"), (DEEPFLOW, "deepflow"), (TRITONBENCH, "tritonbench"),
                      (NVBENCH, "nvbench")],
)  # fmt: skip
def test_formats_are_detected(path, fmt):
    assert importers.detect_format(path.read_text()) == fmt


def test_every_registered_format_has_a_detected_fixture():
    detected = {importers.detect_format(p.read_text())
                for p in (BNB, MIXMOE, BASELINE, FRAGMENTED, DEEPFLOW, TRITONBENCH, NVBENCH)}
    assert detected == set(importers.FORMATS) == set(importers.READERS)


def test_unknown_or_wrong_format_is_a_clear_error(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text('hello\n{"a": 1}\n')
    with pytest.raises(QbenchUsageError, match="unknown format"):
        importers.load_any(junk)
    with pytest.raises(QbenchUsageError, match="not a valid deepflow file"):
        importers.read_file(BNB, "deepflow")


def test_load_any_reads_files_and_run_directories(tmp_path):
    env, records = importers.load_any(FRAGMENTED)
    path, written = importers.import_to_run(FRAGMENTED, out=tmp_path / "run")
    run_env, run_records = importers.load_any(path)
    assert run_records == written == records
    assert run_env["source"] == env["source"] == "fragmented-report"


def test_import_command_writes_a_run(tmp_path, capsys):
    out = tmp_path / "bnb"
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(BNB), "--out", str(out), "--json"])
    assert exit_info.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    env, records = store.load_run(out)
    assert len(printed) == len(records) == 3 * 142 and env["gpu_name"] == "NVIDIA A100"  # 3 variants a line


@pytest.mark.parametrize(
    "args", [["import", "{missing}"], ["import", "{junk}"], ["import", "{bnb}", "--format", "deepflow"]]
)
def test_import_command_bad_input_is_one_line_exit_2(tmp_path, capsys, args):
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing to see\n")
    names = {"missing": tmp_path / "missing.txt", "junk": junk, "bnb": BNB}
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(**names) for a in args] + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err


# ---- compare: a seed file against a stored GPU run --------------------------------------------


def gpu_switchback_run(path: Path, rows: list[dict], seed: int = 0) -> Path:
    """A small stored switchback run on another GPU, at three of the seed's shapes, with fresh
    random times (qbench.store, tidy as the bench writes them)."""
    import random

    from qbench.migration.switchback import tidy

    rng = random.Random(seed)
    records = []
    for row in rows:
        params = {k: row[k] for k in ("batch_size", "dim_in", "dim_out", "wm", "switch")} | {"dtype": "fp16"}
        samples = {k: [row[k] * rng.uniform(0.3, 0.6) for _ in range(12)] for k in ("time_standard", "time_global")}
        metrics = {k: statistics.median(v) for k, v in samples.items()}
        records += [store.make_record("switchback", p, m, samples=kept, device="cuda")
                    for p, m, kept in tidy(params, metrics, samples)]
    env = {"gpu_name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "driver": "580", "cuda": "13.0"}
    with store.RunWriter(path, env) as writer:
        for rec in records:
            writer.write(rec)
    return path


@pytest.mark.parametrize("cross_env", [False, True])
def test_compare_seed_file_with_a_gpu_run(tmp_path, capsys, cross_env):
    """The seed file's kernel sums of SwitchBack against a tidy GPU run's, paired by their params."""
    rows = [seed_json_lines()[i] for i in (3, 40, 101)]
    run = gpu_switchback_run(tmp_path / "h200", rows)
    _, candidates = store.load_run(run)
    args = ["compare", str(BNB), str(run), "--metric", "kernels_ms", "-k", "variant=switchback/", "--json"]
    with pytest.raises(SystemExit) as exit_info:
        main(args + (["--cross-env"] if cross_env else []))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0
    assert "gpu_name 'NVIDIA A100' -> 'NVIDIA H200'" in " ".join(captured.err.split())
    compared = [r for r in json.loads(captured.out)["rows"] if r["metric"] == "kernels_ms"]
    assert len(compared) == len(rows)
    expected = {r["case"]: r["metrics"]["kernels_ms"] for r in candidates if r["params"]["variant"] == "switchback"}
    for row in compared:
        assert close(row["ratio"], expected[row["case"]] / row["reference_value"]), row
        assert (row["marker"] == "x") != cross_env  # not comparable unless --cross-env
        assert "different hardware" in row["note"]
