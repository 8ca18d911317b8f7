"""Hardware presets, roofline floors, floors of qbench's workloads, and --against on stored runs."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from qbench import store
from qbench.benches.model import against
from qbench.benches.model.config import load_hardware
from qbench.errors import QbenchUsageError
from qbench.migration.switchback import tidy
from qbench.model import floors, hardware
from qbench.model.roofline import analyze, collective_ms, floor_ms, ridge_point, roofline_fraction

H200, H100 = hardware.preset("h200"), hardware.preset("h100")


def test_no_torch_on_import():
    code = ("import sys, qbench.model.roofline, qbench.model.hardware, qbench.model.floors, qbench.model.deepflow;"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name, want", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA H100 SXM5 80GB", "h100"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA H100 PCIe", None),
                                        ("NVIDIA H200 NVL", None), ("NVIDIA GeForce RTX 4090", None)])
def test_preset_for_gpu(name, want):
    got = hardware.preset_for_gpu(name)
    assert got == (hardware.PRESETS[want] if want else None)


def test_ridge_points_match_the_hardware_reference():
    # peak / HBM bandwidth: H100 295 (bf16), 591 (int8); H200 206 / 412
    assert round(ridge_point(H100, "bf16")) == 295 and round(ridge_point(H100, "int8")) == 591
    assert round(ridge_point(H200, "bfloat16")) == 206 and round(ridge_point(H200, "int8")) == 412


def test_floor_is_max_of_compute_and_memory_plus_launch():
    # compute-bound 8192^3 bf16 GEMM on H200: 2 n^3 / 989e12 s
    n = 8192
    f = analyze(2 * n**3, 3 * n * n * 2, H200, "bf16")
    assert f.bound == "compute"
    assert f.floor_ms == pytest.approx(2 * n**3 / 989e12 * 1e3 + H200.launch_us * 1e-3, rel=1e-12)
    # a 1 GB copy is memory-bound: 1e9 / 4.8e12 s
    g = analyze(0, 1e9, H200, "fp16", launches=0)
    assert g.bound == "memory" and g.floor_ms == pytest.approx(1e9 / 4.8e12 * 1e3, rel=1e-12)
    assert analyze(10, 10, H200, "fp16").bound == "latency"
    assert floor_ms(2 * n**3, 0, H200, "int8", launches=0) == pytest.approx(2 * n**3 / 1979e12 * 1e3)
    assert roofline_fraction(1.0, 4.0) == 0.25
    with pytest.raises(ValueError, match="positive"):
        roofline_fraction(1.0, 0)
    with pytest.raises(ValueError, match="unknown dtype"):
        floor_ms(1, 1, H200, "int4")
    with pytest.raises(ValueError, match="no fp8 peak"):
        floor_ms(1, 1, hardware.preset("a100-80gb"), "fp8")


def test_collective_factors():
    # all-to-all moves (n-1)/n of S, all-reduce 2(n-1)/n, plus 5 us; nothing for one rank
    s = 1e9
    assert collective_ms(s, 4, H200) == pytest.approx(0.75 * s / 450e9 * 1e3 + 5e-3)
    assert collective_ms(s, 4, H200, kind="all_reduce") == pytest.approx(1.5 * s / 450e9 * 1e3 + 5e-3)
    assert collective_ms(s, 1, H200) == 0.0


def test_custom_and_calibrated_hardware(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text("base: h200\nname: my H200\nhbm_tbps: 4.2\npeak_tflops: {bfloat16: 700}\n")
    dev = load_hardware(path)
    assert dev.name == "my H200" and dev.peak("bf16") == 700e12 and dev.peak("int8") == 1979e12
    assert dev.hbm_tbps == 4.2 and dev.source == "custom"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npeak_tflops: {bf16: 1}\n")
    with pytest.raises(ValueError, match="missing key 'hbm_gb'"):
        load_hardware(bad)
    cal = hardware.calibrated(H200, {"bf16": 738.0}, 4.26, launch_us=9.0)
    assert cal.source == "calibrated" and cal.peak("bf16") == 738e12 and cal.launch_us == 9.0
    assert cal.peak("fp16") == 989e12  # not measured: the datasheet value stays


# ---- synthetic records with the team's names ----------------------------------------------------

def ideal_ms(flops, moved, hw, dtype, launches=1):
    """The fastest possible time of a kernel, written out independently of qbench.model."""
    return max(flops / (hw.peak_tflops[dtype] * 1e12), moved / (hw.hbm_tbps * 1e12)) * 1e3 + launches * 2e-3


def switchback_record(M, K, N, dtype, slack):
    e = 2
    m = {
        "standard_fwd": ideal_ms(2 * M * K * N, (M * K + K * N + M * N) * e, H200, dtype),
        "standard_gw": ideal_ms(2 * M * K * N, (M * N + M * K + N * K) * e, H200, dtype),
        "standard_gx": ideal_ms(2 * M * K * N, (M * N + N * K + M * K) * e, H200, dtype),
        # int8 GEMM reads int8 operands and the row / column scales (fp16), writes 16-bit output
        "global_fwd": ideal_ms(2 * M * K * N, M * K + N * K + M * N * e + (M + N) * 2, H200, "int8"),
        "rowwise_bwd": ideal_ms(2 * M * K * N, M * N + N * K + M * K * e + (M + N) * 2, H200, "int8"),
        "x_quantize_rowwise": ideal_ms(0, M * K * e + M * K + M * 2, H200, dtype),
        "w_quantize_global": ideal_ms(0, N * K * e + N * K + 2, H200, dtype),
        "cast_g": ideal_ms(0, M * N * e + M * N, H200, dtype),
        # peers: fp8 _scaled_mm writes bf16 with rowwise scales; cuBLAS int8 writes int32
        "fp8_fwd": ideal_ms(2 * M * K * N, M * K + N * K + M * N * 2 + (M + N) * 2, H200, "fp8"),
        "int8_cublas_bwd": ideal_ms(2 * M * K * N, M * N + N * K + M * K * 4, H200, "int8"),
    }
    m["time_standard"] = m["standard_fwd"] + m["standard_gw"] + m["standard_gx"]
    metrics = {k: v * slack for k, v in m.items()}
    params = {"batch_size": M, "dim_in": K, "dim_out": N, "wm": 4, "switch": False, "dtype": dtype}
    return [store.make_record("switchback", p, values, device="cuda") for p, values, _ in tidy(params, metrics)], m


def placed(rows) -> set[tuple[str, str]]:
    """(variant, metric) of each row of tidy switchback records."""
    return {(re.search(r"variant=(\w+)", r.case).group(1), r.metric) for r in rows}


def test_switchback_counts_match_the_ideal_exactly():
    """With measured = the ideal time, every fraction is 1: the flop and byte counts are the minimal ones."""
    records, _ = switchback_record(8192, 1024, 4096, "bf16", 1.0)
    rows = against.rows_for(records, H200)
    # standard_fwd, global_fwd, x_quantize_rowwise, time_standard in the seed's names
    assert placed(rows) >= {("16bit", "fwd_ms"), ("switchback", "fwd_ms"), ("switchback", "quantize_x_ms"),
                            ("16bit", "kernels_ms")}
    off = [(r.metric, r.fraction) for r in rows if abs(r.fraction - 1) > 1e-9]
    assert not off, f"fractions off 1: {off[:3]}"


def moe_record(rng, slack):
    n, d, h, T, k = rng.choice([2, 4, 8]), rng.choice([512, 1024, 1536]), rng.choice([2048, 4096]), \
        rng.choice([1024, 4096, 8192]), rng.choice([1, 2])
    experts, e = rng.choice([1, 2, 8]), 2
    tokens = T * k
    gate = ideal_ms(2 * T * d * experts * n, (T * d + d * experts * n + T * experts * n) * e, H200, "fp16")
    ffn = 2 * ideal_ms(2 * tokens * d * h, (tokens * (d + h) + experts * d * h) * e, H200, "fp16")
    a2a = 2 * ((n - 1) / n * tokens * d * e / 450e9 * 1e3 + 5e-3)
    fwd, bwd = gate + ffn + a2a, 2 * (gate + ffn) + a2a
    params = {"world_size": n, "dtype": "float16", "model_dim": d, "hidden_size": h, "samples": T,
              "num_local_experts": experts, "top_k": k, "a2a_ffn_overlap_degree": 1, "routing": "uniform",
              "capacity_factor": 0.0}
    metrics = {"forward_ms": fwd * slack, "backward_ms": bwd * slack, "step_ms": (fwd + bwd) * slack,
               "tflops": 1.0}
    return store.make_record("moe", params, metrics, device="cuda")


def write_run(path, records):
    with store.RunWriter(path, {"gpu_name": "NVIDIA H200"}) as w:
        for r in records:
            w.write(r)
    return path


def test_against_switchback_and_moe_runs_fraction_never_above_one(tmp_path):
    rng = random.Random(7)
    sb = [rec for _ in range(12) for rec in switchback_record(
        rng.choice([1024, 3000, 32768]), rng.choice([1024, 1408, 8096]), rng.choice([4096, 5632, 1664]),
        rng.choice(["fp16", "bf16"]), rng.uniform(1.0, 4.0))[0]]
    moe = [moe_record(rng, rng.uniform(1.0, 4.0)) for _ in range(12)]
    for name, records in (("switchback", sb), ("moe", moe)):
        run = write_run(tmp_path / name, records)
        hw, rows = against.against(run)  # the GPU comes from the run's env
        assert hw is H200 and rows
        above = [(r.case, r.metric, r.fraction) for r in rows if r.fraction > 1 + 1e-9]
        assert not above, f"{name}: fractions above 1: {above[:3]}"
        assert min(r.fraction for r in rows) > 0.2  # a floor that is a real bound, not ~0


def test_wrong_counts_are_caught():
    """A measurement faster than the floor reads above 1 (a wrong count or a cached run)."""
    records, ideal = switchback_record(4096, 4096, 4096, "bf16", 1.0)
    (rec,) = [r for r in records if r["params"]["variant"] == "16bit"]
    rec["metrics"]["fwd_ms"] = ideal["standard_fwd"] / 2
    row = next(r for r in against.rows_for([rec], H200) if r.metric == "fwd_ms")
    assert row.fraction == pytest.approx(2.0)


def test_fragmented_floors_are_lower_bounds():
    params = {"in_features": 2048, "out_features": 2048, "batch_size": 16, "variant": "dense", "task": "train",
              "fragments": 0, "dtype": "fp32"}
    f = floors.fragmented(params, {"parameters": 2048 * 2048 + 2048}, H200)
    e = 4
    assert f["forward_ms"].flops == 2 * 16 * 2048 * 2048
    assert f["forward_ms"].bytes_moved == (2048 * 2048 + 16 * 4096) * e
    assert f["optimizer_ms"].bytes_moved == 7 * 2048 * 2048 * e  # Adam: 4 reads + 3 writes per parameter
    hard = floors.fragmented({**params, "variant": "fragmented", "task": "eval", "fragments": 8},
                             {"selected_fragments": 3}, H200)
    soft = floors.fragmented({**params, "variant": "fragmented", "task": "train", "fragments": 8}, {}, H200)
    assert hard["forward_ms"].bytes_moved < soft["forward_ms"].bytes_moved


def test_against_errors(tmp_path):
    run = write_run(tmp_path / "other", [store.make_record("compare", {"a": 1}, {"x": 1.0})])
    with pytest.raises(QbenchUsageError, match="no record the model knows"):
        against.against(run, gpu="h200")
    bare = tmp_path / "bare"
    with store.RunWriter(bare, {"gpu_name": "Some GPU"}) as w:
        for rec in switchback_record(1024, 1024, 1024, "fp16", 1.0)[0]:
            w.write(rec)
    with pytest.raises(QbenchUsageError, match="no hardware preset"):
        against.against(bare)
    with pytest.raises(QbenchUsageError, match="unknown GPU"):
        against.against(bare, gpu="v100")


def test_moe_floor_uses_routing_statistics_when_present():
    """computed_rows (all ranks) / n x rank imbalance = the busiest rank's rows; sent_rows sets the
    all-to-all bytes. Measured = that rank's ideal time reads exactly 1."""
    n, d, h, T, k, experts, e = 4, 1024, 4096, 2048, 2, 2, 2
    computed, imb, sent = 4 * 2048 * 2 * 0.9, 1.5, 3000.0
    rows = computed / n * imb
    gate = ideal_ms(2 * T * d * experts * n, (T * d + d * experts * n + T * experts * n) * e, H200, "bf16")
    ffn = 2 * ideal_ms(2 * rows * d * h, (rows * (d + h) + experts * d * h) * e, H200, "bf16")
    a2a = 2 * ((n - 1) / n * sent * d * e / 450e9 * 1e3 + 5e-3)
    params = {"world_size": n, "dtype": "bfloat16", "model_dim": d, "hidden_size": h, "samples": T,
              "num_local_experts": experts, "top_k": k, "a2a_ffn_overlap_degree": 1}
    metrics = {"forward_ms": gate + ffn + a2a, "computed_rows": computed, "rank_load_max_over_mean": imb,
               "sent_rows": sent}
    (row,) = against.rows_for([store.make_record("moe", params, metrics)], H200)
    assert row.fraction == pytest.approx(1.0, rel=1e-9)
    # overlapped all-to-all and FFN: the floor is the larger of the two, so the same time reads lower
    (over,) = against.rows_for([store.make_record("moe", {**params, "a2a_ffn_overlap_degree": 2}, metrics)], H200)
    assert over.floor_ms == pytest.approx(max(gate + ffn, a2a), rel=1e-9)


def test_moe_floor_of_the_bench_is_the_model_floor(monkeypatch, tmp_path):
    """The moe bench's floor_ms is the model's step floor (one floor for one step), forward only in
    eval, and counts only remote rows for --variant blocks."""
    import torch

    from qbench.benches import moe as moe_bench
    from qbench.benches.model import config
    from qbench.model import floors

    params = {"world_size": 4, "dtype": "float16", "model_dim": 1024, "hidden_size": 4096, "samples": 8192,
              "num_local_experts": 8, "top_k": 2, "a2a_ffn_overlap_degree": 1, "capacity_factor": 0.0}
    stats = {"computed_rows": 65536.0, "rank_load_max_over_mean": 1.01, "sent_rows": 16384.0}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config, "CALIBRATIONS", tmp_path)  # no committed calibration: the datasheet preset
    got = moe_bench.floor_ms(params, stats, "cuda")
    assert got == floors.moe(params, stats, H200)["step_ms"].floor_ms
    forward = floors.moe(params, stats, H200)["forward_ms"].floor_ms
    assert moe_bench.floor_ms({**params, "eval": True}, stats, "cuda") == forward < got
    local = moe_bench.floor_ms({**params, "variant": "blocks"}, {**stats, "remote_rows": 0.0}, "cuda")
    remote = moe_bench.floor_ms({**params, "variant": "blocks"}, {**stats, "remote_rows": 12288.0}, "cuda")
    assert local < remote and abs(remote - got) < 0.05 * got  # 3/4 of 16384 rows remote ~ the all-to-all
    assert moe_bench.floor_ms(params, stats, "cpu") is None
