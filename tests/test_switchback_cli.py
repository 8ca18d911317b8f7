"""End-to-end `qbench switchback` on the CPU: records with the seed's keys and totals, the table,
the CPU notice, and one-line usage errors."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest

from qbench import store
from qbench.benches import switchback as bench
from qbench.benches.switchback.components import TOTALS

SEED_KEYS = ("standard_fwd", "standard_gw", "standard_gx", "rowwise_fwd", "rowwise_bwd", "global_fwd",
             "global_bwd", "x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise",
             "w_quantize_colwise_transpose", "w_quantize_global", "w_quantize_global_transpose", "cast_x",
             "cast_g", "cast_w", "time_standard", "time_rowwise", "time_global")


def qbench(*args, cwd):
    """The command on the CPU (these tests pin what a CPU run prints and records), unless args name a --device."""
    device = () if "--device" in args else ("--device", "cpu")
    return subprocess.run([sys.executable, "-m", "qbench", "switchback", *args, *device], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=_env())


def _env():
    import os

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the CLI on a CPU runs the torch references
    env["COLUMNS"] = "200"
    return env


@pytest.mark.gpu
def test_gpu_run_passes_its_checks_in_every_mode(tmp_path):
    """On a GPU every component, peer and module (eager, compiled, graphed) is checked before it is timed:
    every record of a small run is ok."""
    out = tmp_path / "run"
    res = qbench("--dims", "48", "--batch-sizes", "40", "--repeat", "3", "--device", "cuda", "--out", str(out),
                 cwd=tmp_path)
    _, records = store.load_run(out)
    assert records and [(r["case"], r["error"]) for r in records if r["status"] != "ok"] == []
    assert res.returncode == 0, res.stderr


@pytest.mark.gpu
def test_gpu_graph_mode_right_after_eager_captures(tmp_path):
    """--exec eager,graph: the eager steps (and their gradient accumulators, made on the default stream) are
    gone before the graph mode captures, so its captures neither fail nor reuse them across streams."""
    out = tmp_path / "run"
    res = qbench("--dims", "48", "--batch-sizes", "40", "--repeat", "3", "--variants", "global,module", "--exec",
                 "eager,graph", "--device", "cuda", "--out", str(out), cwd=tmp_path)
    _, records = store.load_run(out)
    assert records and [(r["case"], r["error"]) for r in records if r["status"] != "ok"] == []
    assert res.returncode == 0 and "AccumulateGrad" not in res.stderr, res.stderr[-2000:]


@pytest.mark.gpu
def test_gpu_torchao_peer_is_checked_and_timed_in_every_mode(tmp_path):
    """--variants ...,torchao with torchao importable: its Float8Linear runs beside the modules, checked
    against nn.Linear (eager) and against its own eager step (compile, graph) before it is timed."""
    pytest.importorskip("torchao.float8")
    out = tmp_path / "run"
    res = qbench("--dims", "64", "--batch-sizes", "64", "--repeat", "3", "--variants", "global,module,torchao",
                 "--device", "cuda", "--out", str(out), cwd=tmp_path)
    _, records = store.load_run(out)
    assert records and [(r["case"], r["error"]) for r in records if r["status"] != "ok"] == []
    for mode in ("", "_compile", "_graph"):
        assert all(r["metrics"][f"speedup_module_torchao{mode}"] > 0 for r in records), mode
    assert res.returncode == 0, res.stderr[-2000:]


def test_torchao_layer_only_where_it_can_run():
    """The torchao peer joins the modules only where torchao's Float8Linear can run (an fp8 GPU with
    torchao importable); elsewhere the layers are the others, and a run goes on without it."""
    from dataclasses import replace

    from qbench.benches.switchback import components as comp
    from qbench.benches.switchback import modules
    from qbench.benches.switchback.sweep import Shape, SwitchbackConfig
    from qbench.layers.transformer import unavailable

    config = SwitchbackConfig(pairs=((24, 40),), batch_sizes=(16,), device="cpu")
    ops = comp.Operands.make(Shape(16, 24, 40, 4, False), config)
    assert unavailable("torchao", "cpu") is not None
    assert modules.torchao_takes(ops) is False  # M = 16, in = 24: torch._scaled_mm takes multiples of 16 only
    shape = Shape(32, 48, 64, 4, False)
    assert modules.torchao_takes(comp.Operands.make(shape, replace(config, pairs=((48, 64),), batch_sizes=(32,))))
    assert set(modules._layers(ops, ("module", "torchao"))) == {"switchback", "linear"}
    metrics, _, failure = modules.measure(ops, ("eager",), ("module", "torchao"), repeat=2, budget_ms=None)
    assert failure is None and "module_switchback_ms" in metrics and "module_torchao_ms" not in metrics


def test_torchao_alone_brings_the_modules_it_is_timed_beside(tmp_path):
    """--variants torchao runs the module steps (torchao's speed-ups are over nn.Linear's); on the CPU the
    torchao layer itself cannot run, so the record has the other modules and no torchao metric."""
    out = tmp_path / "run"
    res = qbench("--dims", "64", "--batch-sizes", "64", "--repeat", "2", "--variants", "torchao", "--out", str(out),
                 cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(out)
    assert records and all("module_switchback_ms" in r["metrics"] for r in records)
    assert not any(k.startswith(("module_torchao", "speedup_module_torchao")) for r in records for k in r["metrics"])


def test_cpu_run_writes_seed_compatible_records(tmp_path):
    out = tmp_path / "run"
    res = qbench("--dims", "48", "--batch-sizes", "40", "--repeat", "3", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "say nothing about GPU performance" in res.stderr
    assert "SwitchBack int8 vs 16-bit" in res.stdout
    env, records = store.load_run(out)
    assert [(r["params"]["dim_in"], r["params"]["dim_out"], r["params"]["switch"]) for r in records] == [
        (48, 192, False), (192, 48, True)]
    for rec in records:
        assert rec["status"] == "ok", rec["error"]
        assert set(rec["params"]) == {"batch_size", "dim_in", "dim_out", "wm", "switch", "dtype", "backward_thread"}
        m = rec["metrics"]
        assert all(k in m and m[k] > 0 for k in SEED_KEYS), [k for k in SEED_KEYS if k not in m]
        for total, keys in TOTALS.items():
            if total in m:
                assert math.isclose(m[total], sum(m[k] for k in keys), rel_tol=1e-12), total
        assert math.isclose(m["speedup_global"], m["time_standard"] / m["time_global"], rel_tol=1e-12)
        assert math.isclose(m["pct_saved_rowwise"], 100 * (1 - m["time_rowwise"] / m["time_standard"]),
                            rel_tol=1e-9)
        assert 1e-4 < m["relerr_global_fwd"] < 0.05 and 1e-4 < m["relerr_rowwise_bwd"] < 0.05
        assert rec["units"]["speedup_global"] == "x" and rec["units"]["global_fwd_tops"] == "TOP/s"
        assert len(rec["samples"]["time_global"]) == 3 and rec["device"] == "cpu"
        assert m["module_switchback_ms"] > 0 and m["module_linear_ms"] > 0
        assert not [k for k in m if k.startswith(("sm_clock_mhz_", "power_w_"))]  # no GPU, no readings
        modes = [mode for mode in ("eager", "compile", "graph") if f"host_switchback_{mode}_ms" in m]
        assert "eager" in modes
        for mode in modes:  # the kernel chains timed with each mode's module steps; host samples kept
            samples = rec["samples"][f"host_switchback_{mode}_ms"]
            assert samples and math.isclose(m[f"host_switchback_{mode}_ms"], statistics.median(samples))
            assert m[f"chain_standard_{mode}_ms"] > 0 and m[f"chain_global_{mode}_ms"] > 0
            assert math.isclose(m[f"speedup_chain_{mode}"],
                                m[f"chain_standard_{mode}_ms"] / m[f"chain_global_{mode}_ms"], rel_tol=1e-12)
            module = m["speedup_module" + ("" if mode == "eager" else f"_{mode}")]
            assert math.isclose(m[f"module_chain_ratio_{mode}"], module / m[f"speedup_chain_{mode}"], rel_tol=1e-12)
            assert rec["units"][f"module_chain_ratio_{mode}"] == "x"
            # the same steps and chains timed as a loop runs them, with their own speed-ups and ratios
            loop = m[f"loop_linear_{mode}_ms"] / m[f"loop_switchback_{mode}_ms"]
            assert len(rec["samples"][f"loop_switchback_{mode}_ms"]) > 0 and m[f"loop_chain_global_{mode}_ms"] > 0
            assert math.isclose(m[f"speedup_loop_{mode}"], loop, rel_tol=1e-12)
            assert math.isclose(m[f"loop_kernel_ratio_{mode}"], loop / m["speedup_global"], rel_tol=1e-12)
            chain = m[f"loop_chain_standard_{mode}_ms"] / m[f"loop_chain_global_{mode}_ms"]
            assert math.isclose(m[f"loop_chain_ratio_{mode}"], loop / chain, rel_tol=1e-12)
            assert rec["units"][f"loop_kernel_ratio_{mode}"] == rec["units"][f"speedup_loop_{mode}"] == "x"


def test_pairs_json_and_bf16(tmp_path):
    res = qbench("--pairs", "40x72", "--batch-sizes", "24", "--dtype", "bf16", "--variants", "global",
                 "--repeat", "2", "--json", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (rec,) = json.loads(res.stdout)
    assert rec["params"] == {"batch_size": 24, "dim_in": 40, "dim_out": 72, "wm": 1.8, "switch": False,
                             "dtype": "bf16", "backward_thread": "device"}
    assert "time_global" in rec["metrics"] and "time_rowwise" not in rec["metrics"]


@pytest.mark.parametrize("args,message", [
    (["--dims", "10,x"], "is not an integer"),
    (["--pairs", "10by20"], "IN x OUT pair"),
    (["--dims", "8", "--pairs", "8x16"], "not both"),
    (["--variants", "global,int4"], "unknown int4"),
    (["--dtype", "fp32"], "fp32"),
    (["--backward-thread", "main"], "unknown main"),
    (["--backward-thread", "device,calling", "--format", "seed"], "give one --backward-thread"),
    (["--model", "vit-h", "--backward-thread", "calling"], "applies to the layer bench"),
    (["--variants", "global", "--trace", "traces"], "--trace profiles the module steps: add module"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    res = qbench(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_module_steps_run_once_per_backward_thread(tmp_path):
    res = qbench("--pairs", "40x72", "--batch-sizes", "24", "--variants", "global,module", "--repeat", "2",
                 "--backward-thread", "device,calling", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(tmp_path / "r")
    assert [r["params"]["backward_thread"] for r in records] == ["device", "calling"]
    assert all(r["status"] == "ok" and r["metrics"]["module_switchback_ms"] > 0 for r in records)
    assert "bwd thread" in res.stdout
    for r in records:  # the eager steps' calls, each timed alone, and their sums (host_calls.py)
        m = r["metrics"]
        for layer in ("switchback", "linear"):
            parts = [v for k, v in m.items() if k.startswith(f"host_call_{layer}_")]
            assert len(parts) == (6 if layer == "switchback" else 4) and all(v > 0 for v in parts), m
            assert m[f"host_calls_{layer}_ms"] == pytest.approx(sum(parts))
            assert r["units"][f"host_calls_{layer}_ms"] == "ms"


def test_help_ends_with_examples(tmp_path):
    res = qbench("--help", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.rstrip().splitlines()[-1].strip().startswith("qbench switchback")


def test_plan_covers_up_and_down_projections_of_the_seed_pairs():
    config = bench.SwitchbackConfig(batch_sizes=(8192,), device="cuda")
    shapes = bench.plan(config)
    assert len(shapes) == 18
    assert {(s.dim_in, s.dim_out) for s in shapes} >= {(1024, 4096), (4096, 1024), (8096, 32384), (32384, 8096)}
    assert {s.wm for s in shapes} == {4, 4.3637, 4.9231}  # as the seed records them


def test_seed_keys_and_totals_agree_with_the_original(fixtures_dir, tmp_path):
    """Three lines of the original info.jsonl: our totals' definitions reproduce its totals from its
    components, and a qbench record carries every one of its keys (params or metrics)."""
    seed = [json.loads(line) for line in (fixtures_dir / "switchback_seed_lines.jsonl").read_text().splitlines()]
    for line in seed:
        for total in ("time_standard", "time_rowwise", "time_global"):
            assert math.isclose(line[total], sum(line[k] for k in TOTALS[total]), rel_tol=1e-9), total
    res = qbench("--dims", "32", "--batch-sizes", "16", "--variants", "global,rowwise", "--repeat", "1",
                 "--json", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)[0]
    missing = set(seed[0]) - set(rec["params"]) - set(rec["metrics"])
    assert not missing, missing


def test_fp8_quantizers_are_put_next_to_their_int8_twins():
    """<fp8 quantizer>_over_int8 = its time over the int8 quantizer of the same shape and layout (a
    ratio: lower is better); a quantizer timed without its twin gets none."""
    from qbench.benches.switchback import peers
    from qbench.benches.switchback.sweep import units_of

    medians = {"fp8_quantize_x": 0.22, "x_quantize_rowwise": 0.2, "fp8_quantize_g": 0.5, "fp8_quantize_w_t": 0.1,
               "w_quantize_colwise_transpose": 0.125}
    ratios = peers.twin_ratios(medians)
    assert ratios == pytest.approx({"fp8_quantize_x_over_int8": 1.1, "fp8_quantize_w_t_over_int8": 0.8})
    assert set(units_of(ratios).values()) == {"ratio"}


def test_slowest_component_is_a_share_of_time_global_or_nothing():
    from qbench.benches.switchback.table import slowest

    parts = dict.fromkeys(TOTALS["time_global"], 1.0)
    parts["standard_gw"] = 2.0
    assert slowest({**parts, "time_global": sum(parts.values())}) == f"standard_gw {100 * 2 / sum(parts.values()):.0f}%"
    # a --variants run without global: only the shared 16-bit components, no total to take a share of
    assert slowest({"standard_gw": 2.0, "standard_fwd": 1.0}) == "-"


def test_table_shows_a_speedup_column_only_where_a_record_has_it():
    """A CPU run (or a --variants run) times fewer peers: their columns are left out, not printed as dashes."""
    from qbench.benches.switchback.table import table

    params = {"batch_size": 64, "dim_in": 32, "dim_out": 128, "backward_thread": "device"}
    records = [{"params": params, "metrics": {"time_standard": 1.0, "speedup_global": 1.2}, "status": "ok",
                "error": None},
               {"params": params, "metrics": {"speedup_fp8": 1.3}, "status": "ok", "error": None},
               {"params": params, "metrics": {}, "status": "error", "error": "relative error [1e-1] > bound"}]
    headers = [str(c.header) for c in table(records).columns]
    assert "x glob" in headers and "x fp8" in headers
    assert not {"x tao/c", "x mod/g", "x f8mm"} & set(headers)


def test_resume_runs_only_what_a_cut_run_lacks_and_keeps_what_it_has(tmp_path):
    out = tmp_path / "run"
    args = ("--pairs", "48x96", "--batch-sizes", "40,56,72", "--variants", "global", "--repeat", "2", "--out", str(out))
    assert qbench(*args, cwd=tmp_path).returncode == 0
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    failed = json.loads(lines[1])
    failed["status"], failed["error"] = "error", "RuntimeError: lost"
    # a crash: record 1 failed, record 2 was cut mid-line
    (out / "results.jsonl").write_text(lines[0] + json.dumps(failed) + "\n" + lines[2][:40])
    res = qbench("--resume", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    after = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert after[0] == lines[0]  # kept as it was, not measured again
    records = store.read_records(out)
    assert sorted(r["params"]["batch_size"] for r in records) == [40, 56, 72]
    assert all(r["status"] == "ok" for r in records)  # the error ran again and replaced its record
    assert "2 records added; 3 records in" in res.stderr
    again = qbench("--resume", *args, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to run" in again.stderr
    assert (out / "results.jsonl").read_text().splitlines(keepends=True) == after


@pytest.mark.parametrize("extra, words", [
    ((), "--resume needs --out"),
    (("--out", "missing-run"), "is not a run directory"),
    (("--out", "RUN", "--force"), "pass only one of them"),
    (("--model", "vit-h", "--out", "RUN"), "drop --model"),
])
def test_resume_usage_errors_are_one_line(tmp_path, extra, words):
    run = _fragmented_run(tmp_path / "run")
    res = qbench("--resume", *[str(run) if a == "RUN" else a for a in extra], cwd=tmp_path)
    assert res.returncode == 2 and words in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_resume_refuses_a_run_of_another_bench(tmp_path):
    run = _fragmented_run(tmp_path / "run")
    res = qbench("--resume", "--pairs", "48x96", "--batch-sizes", "40", "--out", str(run), cwd=tmp_path)
    assert res.returncode == 2 and "holds a fragmented run, not switchback" in res.stderr, res.stderr


def _fragmented_run(path):
    with store.RunWriter(path, {}, bench="fragmented") as writer:
        writer.write(store.make_record("fragmented", {"in_features": 8}))
    return path


def test_host_calls_are_the_calls_an_eager_switchback_step_makes(monkeypatch):
    """The host-time breakdown times the kernel calls that SwitchBackLinear's eager step makes, no more and no
    fewer: each kernel function the layer calls is counted during one step and during one pass over the
    breakdown's SwitchBack calls (its 16-bit weight gradient is a plain matmul in both)."""
    from types import SimpleNamespace

    import torch

    from kernels import switchback_matmul as sm
    from kernels import switchback_quantize as sq
    from qbench.benches.switchback import host_calls
    from qbench.layers import switchback as layer_module

    names = ("quantize_rowwise", "quantize_global_both", "quantize_rowwise_colsum", "int8_matmul_rowwise_global")
    counts: dict[str, int] = {}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return wrapped

    for name in names:
        for module in (layer_module, sq if hasattr(sq, name) else sm):
            monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    M, K, N = 8, 32, 16
    x, g, w = torch.randn(M, K), torch.randn(M, N), torch.randn(N, K) * K**-0.5
    q = {"x": sq.quantize_rowwise(x), "g": sq.quantize_rowwise(g), "w_global": sq.quantize_global(w),
         "w_global_t": sq.quantize_global_transpose(w)}
    ops = SimpleNamespace(x=x, g=g, w=w, q=q, device="cpu", dtype=torch.float32)
    layer = layer_module.SwitchBackLinear(K, N)
    x = ops.x.clone().requires_grad_(True)
    counts.clear()
    layer(x).backward(ops.g)
    step = dict(counts)
    fns = host_calls.calls(ops)["switchback"]
    counts.clear()
    for fn in fns.values():
        fn()
    assert step == counts == {"quantize_rowwise": 1, "quantize_global_both": 1, "quantize_rowwise_colsum": 1,
                              "int8_matmul_rowwise_global": 2}
    assert len(fns) == sum(step.values()) + 1  # and the 16-bit weight gradient


def test_each_modes_steps_are_gone_before_the_next_mode_prepares(monkeypatch):
    """A mode's steps keep their last output, whose autograd graph holds the gradient accumulators made on
    that mode's stream; a CUDA-graph capture that reuses them from its own stream fails (every GPU record of
    a graphed mode was an error while the steps outlived their mode). On the CPU: when a mode prepares its
    first step, no step of an earlier mode is alive."""
    import weakref

    from qbench.benches.switchback import components as comp
    from qbench.benches.switchback import modules
    from qbench.benches.switchback.sweep import Shape, SwitchbackConfig

    config = SwitchbackConfig(pairs=((24, 40),), batch_sizes=(16,), device="cpu")
    ops = comp.Operands.make(Shape(16, 24, 40, 4, False), config)
    kept: dict[str, list] = {}
    prepare = modules._prepare

    def watching(mode, layer, x, g):
        if mode not in kept:  # this mode's first step: every earlier mode's steps (and their outputs) gone
            alive = [m for m, refs in kept.items() if any(r() is not None for r in refs)]
            assert alive == [], f"steps of {alive} still alive when {mode} prepares"
            kept[mode] = []
        step, results = prepare(mode, layer, x, g)
        kept[mode].append(weakref.ref(step))  # a step keeps its last output in its closure
        return step, results

    monkeypatch.setattr(modules, "_prepare", watching)
    metrics, _, failure = modules.measure(ops, ("eager", "compile"), ("global", "module"), repeat=2, budget_ms=None)
    assert failure is None and metrics["module_switchback_compile_ms"] > 0
    assert len(kept["eager"]) == 2 * len(modules._layers(ops, ("global", "module")))  # the check, then the timed


def test_trace_profiles_each_layers_eager_step_after_its_timing(tmp_path):
    """--trace (inside the run directory): per shape and layer a Chrome trace whose 3 steps hold the forward and
    the backward as ranges, and its kernel table beside it."""
    import gzip

    from qbench.traces import COLUMNS

    out = tmp_path / "run"
    res = qbench("--pairs", "64x128", "--batch-sizes", "64", "--variants", "global,module", "--out", str(out),
                 "--trace", str(out / "traces"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(out)
    assert [r["status"] for r in records] == ["ok"]
    names = sorted(p.name for p in (out / "traces").iterdir())
    assert names == [f"{layer}-64x64x128-fp16-device-rank0.{ext}" for layer in ("linear", "switchback")
                     for ext in ("csv", "json.gz")]
    trace = json.loads(gzip.open(out / "traces" / names[3]).read())
    ranges = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert sorted(set(ranges)) == ["backward", "forward", "step 0", "step 1", "step 2"]
    assert ranges.count("forward") == ranges.count("backward") == 3
    assert (out / "traces" / names[2]).read_text().splitlines()[0] == ",".join(COLUMNS)
