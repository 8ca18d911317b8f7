"""DeepFlow's quirks: each fix changes exactly the term the reference names, by the amount its equations
give (derived here from the machine and the shapes), exact mode stays DeepFlow, and `qbench model
quirks` prints what two evaluations of the model give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qbench.benches.model import config as config_files
from qbench.cli import main
from qbench.model import deepflow
from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow import effects, machine, parallel, quirks
from qbench.model.deepflow import quirks as q
from qbench.model.deepflow.machine import MEM_LATENCY, Trace
from tests.test_model_lstm import SMALL

SEED_CONFIG = Path(__file__).parent / "fixtures" / "deepflow_seed_config.yaml"
B, V, L, D, P, S, G, PREC = 512, 800000, 2, 19968, 2048, 20, 4, 4  # the seed's model_param (reference 1.2)
A = L + (L / 1) * (S - 1)  # wavefront: Cf and Cb each count a = 40 times in Time (reference 7.2, hlp = 1)


@pytest.fixture(scope="module")
def cfg():
    return config_files.load(SEED_CONFIG)


def run(cfg, *fixes):
    return deepflow.evaluate(cfg, machine.derive(cfg), fixes=frozenset(fixes))


def on(cfg, **settings):
    return effects.on_strategy(cfg, settings)


def memory_bound(m, flop, mem) -> bool:
    return flop / mem < m.th / m.mem_bw


def test_modes_exact_fixes_nothing_corrected_fixes_every_quirk(cfg):
    assert quirks.fixes_for("exact") == frozenset()
    assert quirks.fixes_for("corrected") == {x.key for x in quirks.QUIRKS} and len(quirks.QUIRKS) == 11
    with pytest.raises(ValueError, match="exact or corrected"):
        quirks.fixes_for("fixed")
    assert f"{run(cfg).time:.8f}" == "302.88817584"  # no fixes: DeepFlow to the digit


def test_cb_accumulation_bytes_gain_the_precision_factor(cfg):
    m, n = machine.derive(cfg), 2 * D * G * D  # elements of the LSTM weight gradient
    exact, fixed = run(cfg), run(cfg, q.CB_ACCUM_PREC)
    # Cb's pointwise pass is memory-bound either way, so its time moves by the added bytes / bandwidth
    assert memory_bound(m, B * D * 3.25 + n, PREC * B * D * 8.5 + 3 * n * PREC)
    extra = 3 * n * (PREC - 1) / m.mem_bw
    assert fixed.components.Cb - exact.components.Cb == pytest.approx(extra, rel=1e-9)
    assert fixed.time - exact.time == pytest.approx(A * extra, rel=1e-9)


def test_cb_pointwise_counts_every_gate(cfg):
    m, n = machine.derive(cfg), 2 * D * G * D
    exact, fixed = run(cfg), run(cfg, q.CB_POINTWISE_GATES)
    assert memory_bound(m, B * D * G * 3.25 + n, PREC * B * D * G * 8.5 + 3 * n)
    extra = PREC * B * D * (G - 1) * 8.5 / m.mem_bw
    assert fixed.components.Cb - exact.components.Cb == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("split", [{"kp_softmax_type": 1, "kp_softmax_dim1": 4},
                                   {"kp_softmax_type": 2, "kp_softmax_dim1": 2, "kp_softmax_dim2": 2}])
def test_split_softmax_uses_the_hidden_width(cfg, split):
    """Fixed, a split softmax times exactly what DeepFlow would with a projection as wide as D."""
    raw = config_files.read_yaml(SEED_CONFIG)
    raw["model_param"]["projection"] = D
    wide = on(deepflow_config.normalize(raw), **split)
    exact, fixed, as_wide = run(on(cfg, **split)), run(on(cfg, **split), q.SOFTMAX_SPLIT_INNER), run(wide)
    assert fixed.components.softmax_f == as_wide.components.softmax_f
    assert fixed.components.softmax_b == as_wide.components.softmax_b
    assert exact.components.softmax_f < fixed.components.softmax_f  # P = 2048 < D = 19968: an underestimate


def test_column_row_backward_counts_its_gather_once(cfg):
    trial = on(cfg, kp_hidden_type=1, kp_hidden_dim1=4)
    m = machine.derive(trial)
    assert m.IB == pytest.approx(0.2 * 300 / (4 * 10e-12 * 8), rel=1e-15)  # mesh: dp x h1 = 4 links
    gather = ((PREC * B * G * D) / 4 / m.IB + 1.6e-6) * 1 * 3  # all-gather of b x G*D over 4: 3 steps
    exact, fixed = run(trial), run(trial, q.KP1_GATHER_TWICE)
    assert exact.components.Cb - fixed.components.Cb == pytest.approx(gather, rel=1e-9)


def test_row_column_backward_exchanges_its_own_rows(cfg):
    trial = on(cfg, kp_hidden_type=2, kp_hidden_dim1=2, kp_hidden_dim2=2)
    m = machine.derive(trial)
    exact, fixed = run(trial), run(trial, q.CB_KP2_ROWS)
    saved = (B - B / 2) * (G * D / 2) * 3 / m.IB  # b rows -> b / h1 rows
    assert exact.components.Cb - fixed.components.Cb == pytest.approx(saved, rel=1e-9)
    assert exact.components.Cf == fixed.components.Cf


def test_row_column_projection_backward_uses_the_backward_block(cfg):
    trial = on(cfg, kp_projection_type=2, kp_projection_dim1=2, kp_projection_dim2=2)
    m = machine.derive(trial)
    exact, fixed = run(trial), run(trial, q.PROJECTION_B_KP2)
    assert exact.components.projection_b == exact.components.projection_f  # the forward block, twice
    g, r = parallel.b_kp2(m, Trace(), B * S, D, P, 2, 2, "projection_b")
    assert fixed.components.projection_b == g + r != exact.components.projection_b
    assert fixed.time == exact.time  # the projection is not part of Time


def test_small_collective_takes_seconds_not_bytes(tmp_path):
    """A model so small that the LSTM all-reduce is 64 B: DeepFlow adds 64 'seconds' to R."""
    path = tmp_path / "tiny.yaml"
    path.write_text(SMALL.replace("layer_size: 24", "layer_size: 2").replace("projection: 12", "projection: 2"))
    raw = config_files.read_yaml(path)
    raw["scheduling_param"]["dp"] = 2
    tiny = deepflow_config.normalize(raw)
    m = machine.derive(tiny)
    nbytes = 2 * (2 * 2) * (4 * 2)  # prec x 2D x G*D = 64 B < 128 B
    exact, fixed = run(tiny), run(tiny, q.SMALL_COLLECTIVE)
    assert exact.components.R > nbytes
    assert exact.components.R - fixed.components.R == pytest.approx(nbytes - (nbytes / m.IB + 1e-6), rel=1e-12)


def test_data_parallel_all_reduces_the_softmax_weights(cfg):
    trial = on(cfg, dp=4)
    m = machine.derive(trial)
    n = D * V  # K_s x V softmax weights
    ring = ((PREC * n) / 4 / m.IB + 1.6e-6) * 2 * 3  # all-reduce: factor 2, 3 steps
    assert memory_bound(m, n / 4, 3 * PREC * n / 4)
    prep = ((3 * PREC * n / 4) / m.mem_bw + MEM_LATENCY + 3.7e-05) * 3  # local reductions, memory-bound
    exact, fixed = run(trial), run(trial, q.DP_SOFTMAX_ALLREDUCE)
    assert exact.components.allreduce_softmax == 0
    assert fixed.components.allreduce_softmax == pytest.approx(ring + prep, rel=1e-12)
    assert fixed.time - exact.time == pytest.approx(ring + prep, rel=1e-9)


def test_weight_updates_cover_only_the_devices_shard(cfg):
    trial = on(cfg, kp_softmax_type=1, kp_softmax_dim1=4)
    m = machine.derive(trial)
    n = D / 4 * V  # one device's K_s / 4 x V softmax weights

    def apply(n):  # Adam-style update (7 passes) + clipping (3 passes), both memory-bound
        return (7 * n * PREC / m.mem_bw + MEM_LATENCY) + (3 * n * PREC / m.mem_bw + MEM_LATENCY)

    exact, fixed = run(trial), run(trial, q.OPTIMIZER_UNSHARDED)
    assert exact.components.apply_softmax == pytest.approx(apply(D * V), rel=1e-12)
    assert fixed.components.apply_softmax == pytest.approx(apply(n), rel=1e-12)
    assert fixed.components.apply_hidden == exact.components.apply_hidden  # the hidden layer is not split


def test_memory_without_the_projection(cfg):
    exact, fixed = run(cfg), run(cfg, q.MEMORY_PROJECTION)
    mem = fixed.memory_shard
    assert mem.softmax == (B * S * V + (D + 1) * V + 2 * B * S * V + B * S) * PREC  # D x V, not P x V
    assert mem.projection == 0 and mem.total == mem.hidden + mem.softmax + mem.embedding
    assert exact.parameters - fixed.parameters == D * P
    assert fixed.time == exact.time


def test_model_shard_categories_are_computed_per_shard(cfg):
    trial = on(cfg, kp_hidden_type=1, kp_hidden_dim1=4)
    exact, fixed = run(trial), run(trial, q.MODEL_SHARD_CATEGORIES)
    assert exact.memory_model_shard.weight == exact.memory_shard.weight  # DeepFlow repeats the shard's
    weights = (2 * D / 4 + 1) * (G * D) * L + (P + 1) * V + (D + 1) * P + V * D  # hidden split over h1 = 4
    assert fixed.memory_model_shard.weight == weights * PREC
    assert fixed.memory_model_shard.total == exact.memory_model_shard.total


def test_corrected_on_the_seed_is_the_sum_of_the_two_cb_fixes(cfg):
    """On one device only Cb's pointwise pass changes time: gates and bytes together, 40 times."""
    m, n = machine.derive(cfg), 2 * D * G * D
    extra = (PREC * B * D * (G - 1) * 8.5 + 3 * n * (PREC - 1)) / m.mem_bw
    assert run(cfg, *quirks.ALL).time - run(cfg).time == pytest.approx(A * extra, rel=1e-9)


def test_effects_come_from_two_evaluations(cfg):
    found = effects.effects(cfg)
    assert [e.quirk.key for e in found if e.quirk] == [x.key for x in quirks.QUIRKS]
    for e in found:
        trial = on(cfg, **e.settings)
        value = effects.MEASURES[e.measure][2]
        fixes = {e.quirk.key} if e.quirk else quirks.ALL
        assert (e.exact, e.corrected) == (value(run(trial)), value(run(trial, *fixes))), e
    zero = [e.quirk.key for e in found if e.quirk and e.change == 0]
    assert zero == [q.SMALL_COLLECTIVE]  # no message of the seed is under 128 B


def test_a_strategy_the_config_cannot_express_is_named(cfg):
    raw = config_files.read_yaml(SEED_CONFIG)
    raw["model_param"]["layer_size"] = 19970  # not a multiple of 4: no 4-way split of the softmax inner D
    e = effects.effect(deepflow_config.normalize(raw), next(x for x in quirks.QUIRKS if x.key == q.SOFTMAX_SPLIT_INNER))
    assert e.exact is None and e.change is None and "must divide" in e.reason


def test_quirks_command_prints_the_measured_effects(capsys, cfg):
    try:
        main(["model", "quirks", "--json"])  # the shipped seed config by default
    except SystemExit as exc:
        assert exc.code in (0, None)
    rows = json.loads(capsys.readouterr().out)
    want = effects.effects(cfg)
    assert [r["quirk"] for r in rows] == [e.quirk.key if e.quirk else None for e in want]
    assert [(r["exact"], r["corrected"]) for r in rows] == [(e.exact, e.corrected) for e in want]
    with pytest.raises(SystemExit):
        main(["model", "quirks", "--config", str(SEED_CONFIG)])
    out = capsys.readouterr().out
    assert all(x.key in out for x in quirks.QUIRKS) and "all quirks" in out
