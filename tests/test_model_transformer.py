"""The dense transformer workload: GEMM flop count against Megatron's formula, parameters, splits,
memory and the time model's response to the machine."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from qbench.benches.model import config as config_files
from qbench.model import transformer
from qbench.model.deepflow import machine as deepflow_machine
from qbench.model.transformer import Transformer

SEED_CONFIG = Path(__file__).parent / "fixtures" / "deepflow_seed_config.yaml"
REL = 1e-12  # flop counts near 1e16 summed in a different order: a few ulps apart, no more

# (B, s, l, h, a, V): GPT-3 XL, odd and non-power-of-two shapes, a single sequence, Megatron's 1T row
SHAPES = [(512, 2048, 24, 2048, 16, 51200), (3, 77, 5, 96, 3, 1013), (1, 1, 1, 8, 1, 3),
          (7, 129, 3, 120, 5, 50257), (2048, 2048, 128, 25600, 160, 51200)]


@pytest.fixture(scope="module")
def machine():
    return deepflow_machine.derive(config_files.load(SEED_CONFIG))


@pytest.mark.parametrize("B,s,l,h,a,V", SHAPES)
@pytest.mark.parametrize("recompute", [True, False])
def test_gemm_flops_equal_megatron(B, s, l, h, a, V, recompute):
    x = Transformer(B, s, l, h, a, V, recompute=recompute)
    got, want = transformer.gemm_flops(x), transformer.megatron_flops(x)
    assert got == pytest.approx(want, rel=REL), f"B={B} s={s} l={l} h={h} V={V}: {got:.17g} vs {want:.17g}"
    if recompute:  # the published expression itself, written out once more
        assert got == pytest.approx(96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)), rel=REL)


def test_seventy_two_variant_holds_for_the_layers_only():
    # without recomputation: 72 B s l h^2 (1 + s/(6h)) for the layers; the logits add 6 B s h V, so
    # 72 (1 + s/(6h) + V/(16 l h)) undercounts them by a quarter
    x = Transformer(4, 256, 6, 512, 8, 5000, recompute=False)
    B, s, l, h, V = x.batch, x.seq, x.layers, x.hidden, x.vocab
    layers = 72 * B * s * l * h**2 * (1 + s / (6 * h))
    assert transformer.gemm_flops(x) == pytest.approx(layers + 6 * B * s * h * V, rel=REL)
    assert transformer.gemm_flops(x) > 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def test_flops_are_shared_exactly_by_the_devices():
    x = Transformer(8, 96, 4, 192, 6, 600)
    for dp, tp in [(2, 1), (1, 3), (4, 2), (8, 6)]:
        y = replace(x, dp=dp, tp=tp)
        per_device = sum(2 * A * B * C * n for _, A, B, C, n in transformer.layer_gemms(y))
        whole = sum(2 * A * B * C * n for _, A, B, C, n in transformer.layer_gemms(x))
        assert per_device * dp * tp == pytest.approx(whole, rel=REL), (dp, tp)


def test_parameter_count_matches_megatron_and_gpt3_xl():
    for B, s, l, h, a, V in SHAPES:
        x = Transformer(B, s, l, h, a, V)
        megatron = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))  # Narayanan et al. 2021
        assert transformer.parameter_count(x) == pytest.approx(megatron + 2 * h, rel=REL)  # + final norm
    assert transformer.parameter_count(transformer.from_params({})) / 1e9 == pytest.approx(1.3, abs=0.05)


def test_ffn_width_other_than_4h_counts_its_gemms():
    x = Transformer(2, 64, 3, 96, 4, 300, ffn=250, recompute=False)
    T, h, f = 2 * 64, 96, 250
    layer = 2 * T * h * 3 * h + 2 * 2 * 64 * 64 * h * 2 + 2 * T * h * h + 2 * 2 * T * h * f
    assert transformer.gemm_flops(x) == pytest.approx(3 * (3 * layer + 2 * T * h * 300), rel=REL)


@pytest.mark.parametrize("change,needle", [({"heads": 7}, "heads"), ({"tp": 3}, "tp"), ({"pp": 5}, "pp"),
                                           ({"dp": 3}, "dp"), ({"layers": 0}, "layers"), ({"hidden": 2.5}, "hidden")])
def test_bad_shapes_name_the_field(change, needle):
    with pytest.raises(ValueError, match=needle):
        transformer.validate(replace(Transformer(8, 64, 4, 96, 4, 400), **change))
    with pytest.raises(ValueError, match="unknown key"):
        transformer.from_params({"depth": 3})


def test_time_falls_with_compute_and_memory_grows_with_batch(machine):
    rng = random.Random(5)
    for _ in range(3):
        h = rng.choice([64, 96, 160])
        x = Transformer(rng.randint(1, 6), rng.choice([33, 64, 100]), rng.randint(1, 4), h, 4, rng.randint(50, 900))
        r = transformer.evaluate(x, machine)
        faster = transformer.evaluate(x, replace(machine, th=machine.th * 4))
        assert faster.time < r.time and r.time == pytest.approx(sum(r.parts.values()))
        bigger = transformer.evaluate(replace(x, batch=x.batch * 2), machine)
        assert bigger.memory > r.memory and bigger.time > r.time


def test_tensor_and_pipeline_splits_cost_communication(machine):
    x = Transformer(8, 128, 4, 256, 8, 1000)
    linked = replace(machine, IB=machine.mem_bw / 10)
    one = transformer.evaluate(x, linked)
    tp = transformer.evaluate(replace(x, tp=4), linked)
    pp = transformer.evaluate(replace(x, pp=2), linked)
    assert tp.parts["layers"] < one.parts["layers"]  # a quarter of the GEMM work each, plus all-reduces
    assert pp.parts["pipeline transfer"] > 0 and one.parts["pipeline transfer"] == 0
    assert tp.memory < one.memory and pp.memory < one.memory
    assert not transformer.evaluate(replace(x, recompute=False), machine).memory < one.memory
