"""qbench explain: predictions from calibrated rates only, the limit named, the error summarised."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from qbench import store
from qbench.explain import Cell, cells, predictions, rates, summary
from qbench.model import predict
from qbench.model.predict import Rates
from tests.helpers import run_qbench, write_run

ROOT = Path(__file__).resolve().parent.parent
H200_RUN = ROOT / "results" / "switchback-h200-modes-c4c2232" / "run1"
H200_CALIBRATION = ROOT / "results" / "model-calibration-h200.yaml"


def make_rates(**kw) -> Rates:
    base = dict(name="test", matmul_tflops={"fp16": 500.0, "bf16": 500.0, "int8": 800.0, "fp8": 1000.0},
                stream_gbps={"copy": 4000.0}, stream_latency_ms={}, launch_ms=0.005, clock_mhz=None,
                l2_bytes=60 * 2**20, sm_count=132, link_gbps=400.0,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "int8": 1979.0, "fp8": 1979.0}, peak_hbm_gbps=4800.0)
    return Rates(**{**base, **kw})


class Guarded(dict):
    """Metrics whose predicted names may not be read: a prediction that reads its own measurement fails."""

    def __init__(self, data: Mapping, forbidden: set[str]):
        super().__init__(data)
        self.forbidden = forbidden

    def _check(self, key):
        if key in self.forbidden:
            raise AssertionError(f"the prediction read the measured {key}")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._check(key)
        return super().__contains__(key)


def moe_record(world_size=4, exec_="graph", **metrics):
    params = {"world_size": world_size, "dtype": "fp16", "model_dim": 1024, "hidden_size": 4096, "samples": 8192,
              "top_k": 2, "num_local_experts": 8, "capacity_factor": 0.0, "a2a_ffn_overlap_degree": 1,
              "variant": "a2a", "exec": exec_, "timing": "per_step"}
    values = {"step_ms": 2.0, "forward_ms": 0.8, "backward_ms": 1.2, "gate_ms": 0.02, "dispatch_ms": 0.1,
              "experts_ms": 0.4, "combine_ms": 0.1, "computed_rows": 16384, "sent_rows": 16384, **metrics}
    return store.make_record("moe", params, values, units={k: "ms" for k in values if k.endswith("_ms")})


def fragmented_record(exec_="eager"):
    params = {"in_features": 8192, "out_features": 8192, "batch_size": 16, "variant": "fragmented", "task": "train",
              "fragments": 8, "dtype": "bf16", "exec": exec_}
    values = {"forward_ms": 0.05, "backward_ms": 0.4, "optimizer_ms": 1.0, "step_ms": 1.7, "host_step_ms": 1.2,
              "parameters": 71311360}
    return store.make_record("fragmented", params, values, units={k: "ms" for k in values if k.endswith("_ms")})


def block_record(exec_="graph"):
    params = {"preset": "vit-h", "batch_size": 8, "tokens": 257, "layers": 2, "width": 1280, "mlp": 5120,
              "heads": 16, "variant": "switchback", "exec": exec_, "dtype": "bf16"}
    values = {"step_ms": 3.0, "linear_ms": 2.0, "host_ms": 1.0}
    return store.make_record("block", params, values, units={k: "ms" for k in values})


def switchback_records():
    _, records = store.load_run(H200_RUN)
    return [r for r in records if r["status"] == "ok"]


def test_a_prediction_never_reads_the_measured_value_it_is_compared_with():
    r = make_rates()
    records = switchback_records()[::7] + [moe_record(), moe_record(1, "eager", host_ms=5.0), fragmented_record(),
                                           block_record(), block_record("eager")]
    checked = 0
    for rec in records:
        first = predictions(rec, r)
        assert first, f"no prediction for {rec['case']}"
        guarded = {**rec, "metrics": Guarded(rec["metrics"], set(first))}
        again = predictions(guarded, r)  # an AssertionError here names the metric read
        scaled = {**rec, "metrics": {k: (v * 1000 if k in first else v) for k, v in rec["metrics"].items()}}
        assert again == first == predictions(scaled, r), rec["case"]
        checked += len(first)
    assert checked > 100


def test_a_product_runs_at_its_calibrated_rate_over_whole_waves():
    r = make_rates()
    m, k, n = 128 * 12, 4096, 256 * 11  # 132 tiles: one full wave
    p = predict.matmul(m, k, n, "fp16", r, None, in_bytes=2, out_bytes=2, cublas="fp16")
    assert p.limit == "compute"
    assert math.isclose(p.ms, 2 * m * k * n / 500e12 * 1e3, rel_tol=1e-12)
    wider = predict.matmul(m, k, n + 256, "fp16", r, None, in_bytes=2, out_bytes=2, cublas="fp16")  # 144 tiles
    assert math.isclose(wider.ms, 2 * m * k * (n + 256) / (500e12 * 144 / 264) * 1e3, rel_tol=1e-12)
    calibrated_own = make_rates(matmul_tflops={"int8": 800.0, "switchback_int8": 1300.0})
    own = predict.matmul(m, k, n, "switchback_int8", calibrated_own, None, in_bytes=1, out_bytes=2, cublas="int8")
    fallback = predict.matmul(m, k, n, "switchback_int8", r, None, in_bytes=1, out_bytes=2, cublas="int8")
    assert math.isclose(fallback.ms / own.ms, 1300 / 800, rel_tol=1e-12)
    assert "no switchback_int8 calibrated" in fallback.reason and "no " not in own.reason


def test_a_lower_clock_caps_compute_at_the_clock_scaled_peak_only_against_a_recorded_calibration_clock():
    """fp16 calibrated at 500 T/s at 1980 MHz (peak 989): at 1485 MHz the peak is 742 T/s, still above the
    calibrated rate, so nothing changes; at 495 MHz it is 247 T/s, and the product takes 500 / 247 as long."""
    args = (128 * 12, 4096, 256 * 11, "fp16")
    kw = dict(in_bytes=2, out_bytes=2, cublas="fp16")
    unknown = predict.matmul(*args, make_rates(), 990.0, **kw)
    at_full = predict.matmul(*args, make_rates(clock_mhz=1980.0), 1980.0, **kw)
    at_three_quarters = predict.matmul(*args, make_rates(clock_mhz=1980.0), 1485.0, **kw)
    at_quarter = predict.matmul(*args, make_rates(clock_mhz=1980.0), 495.0, **kw)
    assert unknown.ms == at_full.ms and "clock not scaled" in unknown.reason
    assert at_three_quarters.ms == at_full.ms
    assert math.isclose(at_quarter.ms, at_full.ms * 500 / (989 * 495 / 1980), rel_tol=1e-12)


def test_a_large_operand_is_read_once_per_wave_and_one_that_fits_in_l2_once():
    m, k, n = 128 * 24, 8192, 256 * 22  # 528 tiles: 4 waves of 12 x 11 tiles
    small_l2 = predict.matmul_bytes(m, k, n, 2, 2, l2_bytes=1e6, sm_count=132)
    assert small_l2 == 4 * 12 * 128 * k * 2 + 4 * 11 * 256 * k * 2 + m * n * 2
    big_l2 = predict.matmul_bytes(m, k, n, 2, 2, l2_bytes=1e12, sm_count=132)
    assert big_l2 == (m + n) * k * 2 + m * n * 2


def test_an_eager_step_waits_on_the_host_only_when_issuing_takes_longer():
    gpu = predict.Prediction(1.0, "compute", "x")
    assert predict.with_host(gpu, 0.5) is gpu
    host = predict.with_host(gpu, 2.0)
    assert (host.ms, host.limit) == (2.0, "host")
    r = make_rates()
    eager = predictions(moe_record(1, "eager", host_ms=500.0), r)["step_ms"]
    graph = predictions(moe_record(1, "graph", host_ms=500.0), r)["step_ms"]
    assert eager.limit == "host" and eager.ms == 500.0 and graph.limit != "host"


def test_a_measurement_faster_than_the_hardware_bound_is_flagged():
    rec = [r for r in switchback_records() if r["params"]["variant"] == "16bit"
           and r["params"]["timing"] == "per_kernel"][0]
    fast = {**rec, "metrics": {**rec["metrics"], "fwd_ms": 1e-6}}
    found = {c.metric: c for c in cells([rec, fast], make_rates())}
    flagged = [c for c in cells([fast], make_rates()) if c.below_bound]
    assert [c.metric for c in flagged] == ["fwd_ms"] and not found["gw_ms"].below_bound


def test_a_calibration_file_gives_rates_per_kind_a_stream_fit_and_its_clock(tmp_path):
    path = tmp_path / "cal.yaml"
    # a calibration of cuBLAS alone (as the earlier files were), plus qbench's own kernels written here
    path.write_text((ROOT / "tests" / "fixtures" / "calibration_h200_cublas_only.yaml").read_text() + """\
- {op: matmul, kernel: switchback, dtype: int8, n: 8192, time_ms: 0.8, tops: 1374.4, sm_clock_mhz: 1700}
- {op: quantize, kernel: quantize_rowwise, dtype: fp16, n: 1048576, time_ms: 0.0030, gbps: 1048.576}
- {op: quantize, kernel: quantize_rowwise, dtype: fp16, n: 16777216, time_ms: 0.0180, gbps: 2796.2}
""")
    from qbench.model import hardware

    r = rates.from_file(path, hardware.preset("h200"))
    assert r.matmul_tflops["switchback_int8"] == 1374.4 and r.matmul_tflops["int8"] > 800
    assert r.clock_mhz == 1700
    # (3.1457 MB, 3 us), (50.33 MB, 18 us): 1 / slope = 47.19 MB / 15 us (MB / ms = GB/s), fixed 2 us
    rate = (50.3316 - 3.1457) / 0.015
    assert math.isclose(r.stream_gbps["quantize_rowwise"], rate, rel_tol=1e-3)
    assert math.isclose(r.stream_latency_ms["quantize_rowwise"], 0.002, rel_tol=1e-3)
    assert r.peak_tflops["int8"] == 1979.0  # the bound's peaks are the datasheet's


def _cell(error: float, kind="component", exec_="") -> Cell:
    return Cell("switchback", f"c{error}", "fwd_ms", kind, exec_, 1.0, 1.0 + error, "compute", "r", 0.0)


def test_groups_give_the_median_and_p90_error_against_the_targets():
    errs = [0.01 * i for i in range(1, 11)]  # median 5.5%, p90 9.1%
    (g,) = summary.groups([_cell(e) for e in errs])
    assert math.isclose(g.median, 0.055) and math.isclose(g.p90, 0.091) and g.met
    (g,) = summary.groups([_cell(e * 3) for e in errs])
    assert not g.met
    (g,) = summary.groups([_cell(0.5, "step", "eager")])
    assert g.met is None and g.target == ""
    assert [c.error for c in summary.worst([_cell(e) for e in errs], 3)] == pytest.approx([0.10, 0.09, 0.08])


def test_explain_prints_the_error_table_of_a_committed_run(capsys):
    code, out, _ = run_qbench(capsys, ["explain", H200_RUN, "--markdown", "--worst", "3"])
    assert code == 0
    assert out.startswith("| family | kind | exec | cells | median err | p90 err | pred/meas | target | met |")
    assert "| switchback | component |  |" in out and "| switchback | step | graph |" in out
    code, out, _ = run_qbench(capsys, ["explain", H200_RUN, "--json", "-k", "variant=16bit/"])
    data = json.loads(out)
    assert code == 0 and len(data["worst"]) == 10 and data["calibrations"] == ["H200 SXM 141GB (calibrated)"]
    assert {c["case"].split("variant=")[1].split("/")[0] for c in data["cells"]} == {"16bit"}


def test_explain_reads_tidy_moe_records_by_world_size(tmp_path, capsys):
    run = write_run(tmp_path / "moe", [moe_record(4, "graph"), moe_record(4, "eager", host_ms=3.0),
                                       moe_record(1, "graph")])
    code, out, _ = run_qbench(capsys, ["explain", run, "--calibrated", H200_CALIBRATION, "--json"])
    assert code == 0
    where = {(g["kind"], g["exec"]) for g in json.loads(out)["groups"]}
    assert {("phase", "graph ws=4"), ("phase", "graph ws=1"), ("step", "eager ws=4")} <= where


def test_explain_refuses_a_run_it_has_nothing_to_say_about(tmp_path, capsys):
    run = write_run(tmp_path / "toy", [store.make_record("toy", {"n": 1}, {"time": 1.0}, units={"time": "ms"})])
    code, _, err = run_qbench(capsys, ["explain", run])
    assert code == 2 and "no record the model predicts" in err and len(err.strip().splitlines()) == 1
    other = write_run(tmp_path / "a100", [moe_record()], gpu="NVIDIA A100-SXM4-40GB")
    code, _, err = run_qbench(capsys, ["explain", other])
    assert code == 2 and "no calibration" in err


def test_calibrate_measures_qbench_own_kernels_beside_cublas(tmp_path, capsys):
    """On a CPU (Triton interpreter) at toy sizes: the records and the file `qbench explain` and `qbench model`
    read their rates and hardware from."""
    from qbench.benches.model.config import load_hardware
    from qbench.model import hardware

    cal = tmp_path / "cal.yaml"
    args = ["model", "calibrate", "--device", "cpu", "--file", cal, "--out", tmp_path / "run"]
    code, _, err = run_qbench(capsys, args)
    assert code == 0, err
    assert "CPU" in err
    dev = load_hardware(cal)
    assert dev.source == "calibrated" and dev.peak("fp32") > 0 and dev.hbm_tbps > 0
    _, records = store.load_run(tmp_path / "run")
    ok = {(r["params"]["op"], r["params"].get("kernel")) for r in records if r["status"] == "ok"}
    assert {("matmul", "cublas"), ("matmul", "switchback"), ("quantize", "quantize_rowwise"),
            ("quantize", "quantize_weight"), ("quantize", "quantize_weight_t"), ("cast", "cast_int8"),
            ("epilogue", "int8_epilogue"), ("route", "moe_route")} <= ok
    r = rates.from_file(cal, hardware.preset("h200"))
    assert r.matmul_tflops["switchback_int8"] > 0 and r.matmul_tflops["fp32"] > 0
    assert {"copy", "cast_int8", "int8_epilogue", "moe_route", "quantize_rowwise", "quantize_weight",
            "quantize_weight_t"} <= set(r.stream_gbps)
    assert r.stream_latency_ms["moe_route"] >= 0  # two routing shapes: a fixed time and a rate fitted


def test_limit_of_names_the_binding_limit_of_a_record_and_power_where_the_clock_was_capped():
    from qbench.explain.limits import limiter

    env, records = store.load_run(H200_RUN)
    limit_of = limiter(env)
    step = [r for r in records if r["params"]["timing"] == "loop" and r["params"]["exec"] == "graph"
            and r["params"]["batch_size"] == 131072][0]
    assert limit_of(step) == "compute"
    assert limit_of({**step, "metrics": {**step["metrics"], "throttle_reasons": 0x4}}) == "power"
    assert limit_of(store.make_record("toy", {"n": 1}, {"time": 1.0})) == ""
    eager = moe_record(1, "eager", host_ms=500.0)
    assert limit_of(eager) == "host"


def test_a_grouped_product_fills_its_waves_with_every_groups_tiles():
    r = make_rates()
    # one expert: 16 x 4 = 64 tiles, half a wave; eight in one launch: 512 tiles, 4 waves of 132 (97%)
    one = predict.matmul(2048, 4096, 1024, "fp16", r, None, in_bytes=2, out_bytes=2, cublas="fp16")
    eight = predict.matmul(2048, 4096, 1024, "fp16", r, None, in_bytes=2, out_bytes=2, cublas="fp16", groups=8)
    assert math.isclose(one.ms, 2 * 2048 * 4096 * 1024 / (500e12 * 64 / 132) * 1e3, rel_tol=1e-12)
    assert math.isclose(eight.ms, 8 * 2 * 2048 * 4096 * 1024 / (500e12 * 512 / 528) * 1e3, rel_tol=1e-12)
    dispatch = predictions(moe_record(4), r)["dispatch_ms"]
    assert dispatch.limit == "link" and "GB/s" in dispatch.reason


def test_the_moe_plan_phase_is_predicted_only_where_it_launches_work():
    r = make_rates()
    assert "plan_ms" in predictions(moe_record(4), r)
    assert "plan_ms" not in predictions(moe_record(1), r)  # the routing kernel wrote the expert segments
    hot = store.make_record("moe", {**moe_record(1)["params"], "replicate_hot": 2}, moe_record(1)["metrics"])
    assert "plan_ms" in predictions(hot, r)
    # an eager step's plan host time then counts with the forward's untracked host time, still waited on
    eager = predictions(moe_record(1, "eager", host_forward_ms=50.0, host_plan_ms=1.0), r)
    assert "plan_ms" not in eager and eager["forward_ms"].ms >= 50.0
