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
from tests.helpers import env_without_interpreter

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
    return env_without_interpreter(COLUMNS="200")  # the CLI on a CPU runs the torch references


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
    torchao = [(r["params"]["exec"], r["params"]["timing"], r["metrics"]["step_speedup"]) for r in records
               if r["params"].get("variant") == "torchao"]
    assert {mode for mode, timing, _ in torchao if timing == "per_step"} == {"eager", "compile", "graph"}
    assert all(value > 0 for *_, value in torchao), torchao
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
    torchao layer itself cannot run, so the run has the other modules' steps and no torchao record."""
    out = tmp_path / "run"
    res = qbench("--dims", "64", "--batch-sizes", "64", "--repeat", "2", "--variants", "torchao", "--out", str(out),
                 cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, records = store.load_run(out)
    steps = [r for r in records if r["params"]["timing"] == "per_step"]
    assert {r["params"]["variant"] for r in steps} >= {"16bit", "switchback"}
    assert all(r["metrics"]["step_ms"] > 0 for r in steps)
    assert not [r for r in records if r["params"]["variant"] == "torchao"]


def by_shape(records: list[dict]) -> list[dict[tuple, dict]]:
    """Per measured shape, in run order: (variant, exec, timing) -> its record."""
    from qbench.migration.switchback import shapes, where

    return [{where(r): r for r in group} for group in shapes(records)]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU run of two shapes (the up- and down-projection of 48), every variant the CPU runs."""
    tmp = tmp_path_factory.mktemp("sb")
    res = qbench("--dims", "48", "--batch-sizes", "40", "--repeat", "3", "--out", str(tmp / "run"), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return res, *store.load_run(tmp / "run")


def test_cpu_run_records_are_tidy_and_declared(cpu_run):
    """Every record holds one variant, exec and timing of one shape as params, and only metrics its family
    declares, with their declared units; no metric name spells a variant, exec or timing."""
    from qbench.metrics import TIMINGS
    from qbench.metrics.registry import hidden_dimension, metric
    from qbench.metrics.switchback import VARIANTS
    from qbench.modes import EXECS

    res, _, records = cpu_run
    assert "say nothing about GPU performance" in res.stderr and "SwitchBack vs 16-bit" in res.stdout
    shape = {"batch_size", "dim_in", "dim_out", "wm", "switch", "dtype", "backward_thread"}
    for rec in records:
        p = rec["params"]
        assert rec["status"] == "ok" and rec["device"] == "cpu" and set(p) == shape | {"variant", "exec", "timing"}
        assert p["variant"] in VARIANTS and p["exec"] in EXECS and p["timing"] in TIMINGS, p
        assert rec["metrics"] and rec["units"] == {m: metric("switchback", m).unit for m in rec["metrics"]}
        assert not [m for m in rec["metrics"] if hidden_dimension("switchback", m)]
        assert not [k for k in rec["metrics"] if k in ("sm_clock_mhz", "power_w")]  # no GPU, no readings
    shapes = by_shape(records)
    assert [(s[LAST]["params"]["dim_in"], s[LAST]["params"]["dim_out"], s[LAST]["params"]["switch"])
            for s in shapes] == [(48, 192, False), (192, 48, True)]
    kernels = {w[0] for s in shapes for w in s if w[1:] == ("eager", "per_kernel")}
    assert kernels == {"16bit", "switchback", "switchback_rowwise"}  # the variants whose kernels a CPU runs
    assert all(list(s)[-1] == LAST for s in shapes)  # written last: --resume knows a shape a crash cut


LAST = ("16bit", "eager", "per_kernel")


def test_cpu_run_keeps_the_seed_keys_and_totals(cpu_run):
    """The kernel sums and speed-ups follow their definitions, and each shape's records give back the seed's
    keys (migration.switchback.wide) with its totals the sums of its components."""
    from qbench.migration.switchback import wide

    _, _, records = cpu_run
    for shape in by_shape(records):
        seed = wide(list(shape.values()))
        assert all(k in seed and seed[k] > 0 for k in SEED_KEYS), [k for k in SEED_KEYS if k not in seed]
        for total, keys in TOTALS.items():
            if total in seed:
                assert math.isclose(seed[total], sum(seed[k] for k in keys), rel_tol=1e-12), total
        standard, sb = shape[LAST], shape[("switchback", "eager", "per_kernel")]
        row = shape[("switchback_rowwise", "eager", "per_kernel")]
        base = standard["metrics"]["kernels_ms"]
        assert math.isclose(sb["metrics"]["kernels_speedup"], base / sb["metrics"]["kernels_ms"], rel_tol=1e-12)
        assert math.isclose(row["metrics"]["kernels_pct_saved"], 100 * (1 - row["metrics"]["kernels_ms"] / base),
                            rel_tol=1e-9)
        assert 1e-4 < sb["metrics"]["relerr_fwd"] < 0.05 and 1e-4 < row["metrics"]["relerr_bwd"] < 0.05
        assert sb["units"]["kernels_speedup"] == "x" and sb["units"]["fwd_tops"] == "TOP/s"
        assert len(sb["samples"]["kernels_ms"]) == 3


def test_cpu_run_times_the_modules_in_each_mode_as_steps_and_as_a_loop(cpu_run):
    """Per exec: the eager-steps' host time with its samples, the kernel chains, the speed-ups over nn.Linear
    and the ratios to the kernel sums, per step (timed alone) and in a loop, each from its own records."""
    _, _, records = cpu_run
    for shape in by_shape(records):
        kernels = shape[("switchback", "eager", "per_kernel")]["metrics"]["kernels_speedup"]
        modes = [mode for mode in ("eager", "compile", "graph") if ("switchback", mode, "per_step") in shape]
        assert "eager" in modes
        for mode in modes:
            for timing in ("per_step", "loop"):
                sb, linear = shape[("switchback", mode, timing)], shape[("16bit", mode, timing)]
                m = sb["metrics"]
                assert math.isclose(m["step_speedup"], linear["metrics"]["step_ms"] / m["step_ms"], rel_tol=1e-12)
                assert math.isclose(m["chain_speedup"], linear["metrics"]["chain_ms"] / m["chain_ms"], rel_tol=1e-12)
                assert math.isclose(m["step_over_chain"], m["step_speedup"] / m["chain_speedup"], rel_tol=1e-12)
                assert len(sb["samples"]["step_ms"]) > 0 and sb["units"]["step_over_chain"] == "x"
            loop = shape[("switchback", mode, "loop")]["metrics"]
            assert math.isclose(loop["step_over_kernels"], loop["step_speedup"] / kernels, rel_tol=1e-12)
            step = shape[("switchback", mode, "per_step")]
            assert math.isclose(step["metrics"]["host_ms"], statistics.median(step["samples"]["host_ms"]))


def test_pairs_json_and_bf16(tmp_path):
    res = qbench("--pairs", "40x72", "--batch-sizes", "24", "--dtype", "bf16", "--variants", "global",
                 "--repeat", "2", "--json", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)
    shape = {"batch_size": 24, "dim_in": 40, "dim_out": 72, "wm": 1.8, "switch": False, "dtype": "bf16",
             "backward_thread": "device"}
    assert all({k: v for k, v in r["params"].items() if k not in ("variant", "exec", "timing")} == shape
               for r in records)
    kernels = {r["params"]["variant"] for r in records if "kernels_ms" in r["metrics"]}
    assert kernels == {"16bit", "switchback"}  # --variants global: no rowwise total


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
    shapes = by_shape(records)
    assert [s[LAST]["params"]["backward_thread"] for s in shapes] == ["device", "calling"]
    assert "bwd thread" in res.stdout
    for shape in shapes:  # the eager steps' calls, each timed alone, and their sums (host_calls.py)
        for variant, calls in (("switchback", 6), ("16bit", 4)):
            rec = shape[(variant, "eager", "per_step")]
            m = rec["metrics"]
            assert rec["status"] == "ok" and m["step_ms"] > 0
            parts = [v for k, v in m.items() if k.startswith("host_") and k not in ("host_ms", "host_calls_ms")]
            assert len(parts) == calls and all(v > 0 for v in parts), m
            assert m["host_calls_ms"] == pytest.approx(sum(parts)) and rec["units"]["host_calls_ms"] == "ms"


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
    components, and a shape's qbench records carry every one of its keys (params, or metrics that
    migration.switchback.wide names the seed's way)."""
    from qbench.migration.switchback import wide

    seed = [json.loads(line) for line in (fixtures_dir / "switchback_seed_lines.jsonl").read_text().splitlines()]
    for line in seed:
        for total in ("time_standard", "time_rowwise", "time_global"):
            assert math.isclose(line[total], sum(line[k] for k in TOTALS[total]), rel_tol=1e-9), total
    res = qbench("--dims", "32", "--batch-sizes", "16", "--variants", "global,rowwise", "--repeat", "1",
                 "--json", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    shape = list(by_shape(json.loads(res.stdout))[0].values())
    missing = set(seed[0]) - set(shape[0]["params"]) - set(wide(shape))
    assert not missing, missing


def test_fp8_quantizers_are_put_next_to_their_int8_twins():
    """<fp8 quantizer>_over_int8 = its time over the int8 quantizer of the same shape and layout (a
    ratio: lower is better), recorded as quantize_<t>_over_int8 of the fp8 variants; a quantizer timed without
    its twin gets none."""
    from qbench.benches.switchback import peers
    from qbench.metrics.registry import metric
    from qbench.migration.switchback import tidy

    medians = {"fp8_quantize_x": 0.22, "x_quantize_rowwise": 0.2, "fp8_quantize_g": 0.5, "fp8_quantize_w_t": 0.1,
               "w_quantize_colwise_transpose": 0.125}
    ratios = peers.twin_ratios(medians)
    assert ratios == pytest.approx({"fp8_quantize_x_over_int8": 1.1, "fp8_quantize_w_t_over_int8": 0.8})
    (params, tidy_metrics, _), = tidy({}, ratios)  # alone, the ratios go to the first fp8 variant that uses them
    assert params["variant"] == "fp8" and (params["exec"], params["timing"]) == ("eager", "per_kernel")
    assert tidy_metrics == pytest.approx({"quantize_x_over_int8": 1.1, "quantize_w_t_over_int8": 0.8})
    assert {metric("switchback", name).unit for name in tidy_metrics} == {"ratio"}


def _record(variant, exec_, timing, metrics, status="ok", error=None, **shape):
    params = {"batch_size": 64, "dim_in": 32, "dim_out": 128, "backward_thread": "device", **shape}
    if variant:
        params.update(variant=variant, exec=exec_, timing=timing)
    return {"params": params, "metrics": metrics, "status": status, "error": error}


def test_table_is_one_row_per_shape_with_a_column_per_variant_and_exec():
    """The pivot: a shape's records make one row; the kernel sums' speed-ups per variant, SwitchBack's step per
    exec, each in the column of its record (never another variant's or exec's value)."""
    from qbench.benches.switchback.table import table

    rows = [_record("16bit", "eager", "per_kernel", {"kernels_ms": 2.0}),
            _record("switchback", "eager", "per_kernel", {"kernels_speedup": 1.25}),
            _record("fp8", "eager", "per_kernel", {"kernels_speedup": 1.5}),
            _record("switchback", "graph", "per_step", {"step_speedup": 1.125}),
            _record("switchback", "graph", "loop", {"step_speedup": 9.0}),
            _record("fp8", "graph", "per_step", {"step_speedup": 7.0}),
            _record("16bit", "eager", "per_kernel", {"kernels_ms": 4.0}, dim_in=64),
            _record(None, None, None, {}, "error", "relative error [1e-1] > bound", dim_in=96)]
    fitted = table(rows)
    headers = [c.text for c in fitted.columns]
    assert headers == ["in", "16bit\nms", "sb\nkern", "fp8\nkern", "sb\ngraph", "status"]
    cells = [[cell.plain for cell in row] for row in fitted.rows]
    assert cells == [["32", "2.000", "1.25", "1.50", "1.12", "ok"], ["64", "4.000", "-", "-", "-", "ok"],
                     ["96", "-", "-", "-", "-", "error [1]"]]
    assert "[1] relative error [1e-1] > bound" in fitted.notes and "fixed: M=64, out=128, bwd thread=device" \
        in fitted.notes


def test_table_fits_120_columns_with_every_variant_and_exec():
    """A GPU run's table (six kernel variants, three execs, a reason) prints as one table 120 characters wide."""
    from rich.console import Console

    from qbench.benches.switchback.table import table

    rows = []
    for m in (8192, 131072):
        rows.append(_record("16bit", "eager", "per_kernel", {"kernels_ms": 80.212}, batch_size=m, dim_in=16384))
        rows += [_record(v, "eager", "per_kernel", {"kernels_speedup": 1.234}, batch_size=m, dim_in=16384)
                 for v in ("switchback", "switchback_rowwise", "fp8", "fp8_all", "fp8_cublas", "int8_cublas")]
        rows += [_record("switchback", e, "per_step", {"step_speedup": 0.987}, batch_size=m, dim_in=16384)
                 for e in ("eager", "compile", "graph")]
    rows.append(_record(None, None, None, {}, "skipped", "needs 90 GB", batch_size=131072, dim_in=32384))
    console = Console(width=120, record=True)
    console.print(table(rows))
    lines = console.export_text().splitlines()
    assert sum(line.startswith("┏") for line in lines) == 1 and max(map(len, lines)) <= 120


def test_resume_runs_only_the_shapes_a_cut_run_lacks_and_keeps_the_others(tmp_path):
    """--resume of a tidy run: a shape whose records are all there is kept as it was; a shape with a record
    that failed, and one whose last records a crash cut (a partial line, the rest never written), run again."""
    out = tmp_path / "run"
    args = ("--pairs", "48x96", "--batch-sizes", "40,56,72", "--variants", "global", "--repeat", "2", "--out", str(out))
    assert qbench(*args, cwd=tmp_path).returncode == 0
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    shapes = [[line for line in lines if f'"batch_size": {m},' in line] for m in (40, 56, 72)]
    assert [len(s) for s in shapes] == [len(shapes[0])] * 3 and len(shapes[0]) > 2
    assert sum(map(len, shapes)) == len(lines)
    failed = json.loads(shapes[1][1])
    failed["status"], failed["error"] = "error", "RuntimeError: lost"
    cut = shapes[2][:2] + [shapes[2][2][:40]]  # a crash: two records of the last shape, then half a line
    (out / "results.jsonl").write_text("".join([*shapes[0], shapes[1][0], json.dumps(failed) + "\n", *shapes[1][2:],
                                                *cut]))
    res = qbench("--resume", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    after = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert after[:len(shapes[0])] == shapes[0]  # kept as it was, not measured again
    records = store.read_records(out)
    assert sorted(r["params"]["batch_size"] for r in records) == sorted([40, 56, 72] * len(shapes[0]))
    assert all(r["status"] == "ok" for r in records)  # the error ran again and replaced its record
    assert f"{2 * len(shapes[0])} records added" in res.stderr
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
    assert {r["status"] for r in records} == {"ok"} and len({r["params"]["batch_size"] for r in records}) == 1
    names = sorted(p.name for p in (out / "traces").iterdir())
    assert names == [f"{layer}-64x64x128-fp16-device-rank0.{ext}" for layer in ("linear", "switchback")
                     for ext in ("csv", "json.gz")]
    trace = json.loads(gzip.open(out / "traces" / names[3]).read())
    ranges = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert sorted(set(ranges)) == ["backward", "forward", "step 0", "step 1", "step 2"]
    assert ranges.count("forward") == ranges.count("backward") == 3
    assert (out / "traces" / names[2]).read_text().splitlines()[0] == ",".join(COLUMNS)
