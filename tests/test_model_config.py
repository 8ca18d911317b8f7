"""DeepFlow config parsing: YAML 1.2 floats, unit strings, and bad configs named by their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.benches.model import config as config_files
from qbench.model.deepflow import config as dc
from qbench.model.deepflow.config import ConfigError

SEED = Path(__file__).parent / "fixtures" / "deepflow_seed_config.yaml"


def raw():
    return config_files.read_yaml(SEED)


def test_yaml_12_floats_and_unit_strings():
    cfg = dc.normalize(raw())
    assert cfg["arch_param"]["kernel_launch_overhead"] == 3.7e-05  # '37e-6' is a float, not a string
    assert cfg["tech_param"]["core_energy_per_flop"] == 1.19e-11
    assert cfg["tech_param"]["HBM_stack_bw"] == 225 * 2**30
    assert cfg["tech_param"]["HBM_stack_capacity"] == 4 * 2**30
    assert cfg["scheduling_param"]["topology"] == "ring"


@pytest.mark.parametrize("text, want", [("32 KB", 32 * 2**10), ("3 Mb/s", 3 * 2**20 * 8), ("1 TB", 2**40),
                                        ("ring", "ring")])
def test_unit_strings(text, want):
    assert dc.parse_unit_string(text, "x") == want


@pytest.mark.parametrize("text, needle", [("4 XB", "unknown prefix"), ("4 Gq", r"bytes \(B\) or bits \(b\)"),
                                          ("4 5 GB", "one number and one unit")])
def test_bad_unit_strings(text, needle):
    with pytest.raises(ConfigError, match=needle):
        dc.parse_unit_string(text, "tech_param.HBM_stack_bw")


def _error(mutate) -> str:
    data = raw()
    mutate(data)
    with pytest.raises(ConfigError) as info:
        dc.normalize(data)
    return str(info.value)


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["model_param"].pop("batch_size"), "missing key model_param.batch_size"),
    (lambda d: d.pop("tech_param"), "missing section 'tech_param'"),
    (lambda d: d["arch_param"].update(flops=3), "unknown key arch_param.flops"),
    (lambda d: d["model_param"].update(layer_size=0), "model_param.layer_size must be a positive integer"),
    (lambda d: d["model_param"].update(batch_size=-4), "model_param.batch_size must be a positive integer"),
    (lambda d: d["model_param"].update(seq_len=2.5), "model_param.seq_len must be a positive integer"),
    (lambda d: d["tech_param"].update(HBM_stack_bw="0 GB/s"), "tech_param.HBM_stack_bw must be > 0"),
    (lambda d: d["power_breakdown"].update(core=0), "power_breakdown.core must be > 0"),
    (lambda d: d["arch_param"].update(precision="four"), "arch_param.precision must be a number"),
    (lambda d: d["scheduling_param"].update(topology="torus"), "scheduling_param.topology: unknown topology"),
    (lambda d: d["scheduling_param"].update(dp=2), "scheduling_param.topology: 'ring' has no interconnect"),
    (lambda d: d["scheduling_param"].update(hlp=3), "scheduling_param.hlp = 3 must divide"),
    (lambda d: d["scheduling_param"].update(auto=True), "scheduling_param.auto"),
])
def test_bad_configs_name_the_key(mutate, needle):
    assert needle in _error(mutate)


def _kp(**values):
    def mutate(d):
        d["scheduling_param"].update(topology="mesh", **values)
    return mutate


@pytest.mark.parametrize("values, needle", [
    (dict(kp_hidden_type=3), "kp_hidden_type = 3: use -1"),
    (dict(kp_hidden_dim1=4), "kp_hidden_dim1/_dim2 = 4/1 need scheduling_param.kp_hidden_type 1 or 2"),
    (dict(kp_hidden_type=1, kp_hidden_dim1=1), "kp_hidden_dim1 must be > 1"),
    (dict(kp_hidden_type=1, kp_hidden_dim1=6), "kp_hidden_dim1 = 6 must be 2 or a multiple of 4"),
    (dict(kp_hidden_type=1, kp_hidden_dim1=2, kp_hidden_dim2=2), "type 1) uses only"),
    (dict(kp_hidden_type=2, kp_hidden_dim1=1, kp_hidden_dim2=3), "kp_hidden_dim2 = 3 must"),
    (dict(kp_hidden_type=2, kp_hidden_dim1=3), "kp_hidden_dim1 = 3 must divide the rows 512"),
    (dict(kp_softmax_type=1, kp_softmax_dim1=5), "kp_softmax_dim1 = 5 must divide the inner dimension 19968"),
    (dict(kp_projection_type=2, kp_projection_dim2=3), "kp_projection_dim2 = 3 must divide the columns 2048"),
])
def test_kernel_parallel_settings_the_model_cannot_express(values, needle):
    assert needle in _error(_kp(**values))


def test_valid_kernel_parallel_settings_pass():
    data = raw()
    _kp(kp_hidden_type=2, kp_hidden_dim1=2, kp_hidden_dim2=4, kp_softmax_type=1, kp_softmax_dim1=4)(data)
    cfg = dc.normalize(data)
    assert cfg["scheduling_param"]["kp_hidden_dim2"] == 4


def test_overrides_and_scalars():
    data = dc.with_overrides(raw(), {"model_param.batch_size": dc.parse_scalar("64"),
                                     "arch_param.kernel_launch_overhead": dc.parse_scalar("1e-6")})
    cfg = dc.normalize(data)
    assert cfg["model_param"]["batch_size"] == 64 and cfg["arch_param"]["kernel_launch_overhead"] == 1e-6
    with pytest.raises(ConfigError, match="unknown key 'model_param.batch'"):
        dc.with_overrides(raw(), {"model_param.batch": 1})


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config_files.read_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_param: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_files.read_yaml(bad)
