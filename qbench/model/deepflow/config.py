"""DeepFlow's YAML configuration: parsing, unit strings, validation, overrides and sweeps.

The file has five sections (model_param, arch_param, tech_param, power_breakdown, scheduling_param),
each with exactly the keys below. Scalars resolve as YAML 1.2 (`37e-6` is a float, not a string);
strings like `225 GB/s` are parsed the DeepFlow way: the number times a binary prefix from the
first two characters of the unit (K/M/G/T -> 2^10..2^40; second char B -> x1, b -> x8).
Every error names the offending key (`scheduling_param.kp_hidden_dim1`).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from typing import Any

SECTIONS: dict[str, tuple[str, ...]] = {
    "model_param": ("batch_size", "vocab_size", "num_layers", "layer_size", "projection", "seq_len",
                    "num_gates", "num_non_linear", "num_add"),
    "arch_param": ("kernel_launch_overhead", "precision"),
    "tech_param": ("DRAM_energy_per_bit_trans", "L2_energy_per_bit", "shared_mem_energy_per_bit",
                   "core_energy_per_flop", "internode_energy_per_bit", "HBM_stack_capacity", "HBM_stack_bw",
                   "L2_bank_capacity", "L2_bank_bw", "shared_mem_bank_capacity", "shared_mem_bank_bw",
                   "line_latency"),
    "power_breakdown": ("TDP", "core", "DRAM", "L2", "shared_mem", "IB"),
    "scheduling_param": ("auto", "topology", "dp", "lp", "hlp", "kp_hidden_dim1", "kp_hidden_dim2",
                         "kp_softmax_dim1", "kp_softmax_dim2", "kp_embedding_dim1", "kp_embedding_dim2",
                         "kp_projection_dim1", "kp_projection_dim2", "kp_hidden_type", "kp_softmax_type",
                         "kp_embedding_type", "kp_projection_type"),
}
TOPOLOGIES = ("mesh", "tree", "ring")  # only mesh has a network model; ring/tree are single-device
KP_LAYERS = ("hidden", "softmax", "embedding", "projection")
_POSITIVE_INTS = {"model_param": SECTIONS["model_param"][:7], "arch_param": ("precision",),
                  "scheduling_param": ("dp", "lp", "hlp") + tuple(f"kp_{n}_dim{i}" for n in KP_LAYERS
                                                                  for i in (1, 2))}
MAX_COUNT = 2**53  # counts above this are not exact in floating point (and overflow the model's arithmetic)
_PREFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_FLOAT_RE = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


class ConfigError(ValueError):
    """A config problem; the message names the key (section.key) and what to change."""


def parse_yaml(text: str, where: str) -> dict:
    """The raw mapping of a DeepFlow config's text (ConfigError naming `where` when it is malformed, too
    large, repeats a key or uses aliases of collections: qbench.safe_yaml)."""
    from qbench.safe_yaml import YamlRefused, load

    try:
        data = load(text)
    except YamlRefused as exc:
        raise ConfigError(f"{where} {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected the sections {', '.join(SECTIONS)}")
    return data


def shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut short (a hostile file's value may be huge)."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    return short.repr(value)


def parse_unit_string(value: str, where: str) -> Any:
    """'225 GB/s' -> 225 * 2^30; 'ring' stays 'ring' (DeepFlow's rule, quirks included)."""
    tokens = value.split()
    numbers = [t for t in tokens if t.isdigit()]
    others = [t for t in tokens if not t.isdigit()]
    if not numbers or not others:
        return value
    if len(numbers) != 1 or len(others) != 1:
        raise ConfigError(f"{where}: {shown(value)} must be one number and one unit, like '4 GB'")
    unit = others[0]
    if unit[0] not in _PREFIX:
        raise ConfigError(f"{where}: unknown prefix in {shown(value)}; use K, M, G or T (as in '32 KB')")
    if len(unit) < 2 or unit[1] not in "Bb":
        raise ConfigError(f"{where}: unit {shown(unit)} must be bytes (B) or bits (b), as in '225 GB/s'")
    return int(numbers[0]) * _PREFIX[unit[0]] * (1 if unit[1] == "B" else 8)


def normalize(raw: Mapping) -> dict[str, dict[str, Any]]:
    """Check the sections and keys, parse unit strings and validate values; returns a new mapping."""
    missing = [s for s in SECTIONS if s not in raw]
    if missing:
        raise ConfigError(f"missing section {shown(missing[0])} (a DeepFlow config has {', '.join(SECTIONS)})")
    extra = [s for s in raw if s not in SECTIONS]
    if extra:
        raise ConfigError(f"unknown section {shown(extra[0])}; expected {', '.join(SECTIONS)}")
    out: dict[str, dict[str, Any]] = {}
    for section, keys in SECTIONS.items():
        body = raw[section] or {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"{section}: expected a mapping of keys")
        for key in keys:
            if key not in body:
                raise ConfigError(f"missing key {section}.{key}")
        for key in body:
            if key not in keys:
                raise ConfigError(f"unknown key {section}.{str(key)[:60]}; {section} has {', '.join(keys)}")
        out[section] = {k: _value(body[k], f"{section}.{k}") for k in keys}
    _validate(out)
    return out


def _value(value: Any, where: str) -> Any:
    if isinstance(value, str):
        value = parse_unit_string(value, where)
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        value = float(value)
    return value


def _number(cfg: dict, section: str, key: str) -> float:
    value = cfg[section][key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{section}.{key} must be a number, not {shown(value)}")
    return value


def _validate(cfg: dict) -> None:
    for section, keys in SECTIONS.items():
        for key in keys:
            if section == "scheduling_param" and key in ("auto", "topology"):
                continue
            value = _number(cfg, section, key)
            if key in _POSITIVE_INTS.get(section, ()) and (int(value) != value or not 0 < value <= MAX_COUNT):
                raise ConfigError(f"{section}.{key} must be a positive integer up to 2**53, not {shown(value)}")
            zero_ok = key in ("kernel_launch_overhead", "line_latency")  # a fixed cost may be 0
            if section in ("tech_param", "arch_param") and (value < 0 if zero_ok else value <= 0):
                raise ConfigError(f"{section}.{key} must be > 0, not {shown(value)}")
            if section == "power_breakdown" and value < 0:
                raise ConfigError(f"{section}.{key} must be >= 0, not {shown(value)}")
    for key in ("TDP", "core", "DRAM"):
        if cfg["power_breakdown"][key] <= 0:
            raise ConfigError(f"power_breakdown.{key} must be > 0 (it sets the device's rates)")
    _validate_power(cfg["power_breakdown"])
    _validate_scheduling(cfg)


POWER_FRACTIONS = ("core", "DRAM", "L2", "shared_mem", "IB")  # shares of TDP
# DeepFlow's own seed config gives 1.090112 of TDP in all (0.89 on chip + 0.2 to IB), so a sum up to 1.1 is
# a DeepFlow config as published; more claims power the device does not have (a typo such as 2.0 for 0.2)
MAX_POWER_SUM = 1.1


def _validate_power(power: dict) -> None:
    for key in POWER_FRACTIONS:
        if not 0 <= power[key] <= 1:
            raise ConfigError(f"power_breakdown.{key} = {shown(power[key])} is a fraction of TDP; give 0 to 1")
    total = sum(power[key] for key in POWER_FRACTIONS)
    if total > MAX_POWER_SUM:
        raise ConfigError(f"power_breakdown fractions {', '.join(POWER_FRACTIONS)} sum to {total:.4g} of TDP; "
                          f"they share one TDP, so their sum must be at most {MAX_POWER_SUM} (DeepFlow's seed: 1.09)")


def _validate_scheduling(cfg: dict) -> None:
    sched = cfg["scheduling_param"]
    if sched["auto"] not in (False, None):
        raise ConfigError("scheduling_param.auto: only False is supported (DeepFlow's automatic modes "
                          "do not run); use `qbench model search` to rank strategies")
    if sched["topology"] not in TOPOLOGIES:
        raise ConfigError(f"scheduling_param.topology: unknown topology {shown(sched['topology'])}; "
                          f"choose from {', '.join(TOPOLOGIES)}")
    if cfg["model_param"]["num_layers"] % sched["hlp"]:
        raise ConfigError(f"scheduling_param.hlp = {sched['hlp']} must divide model_param.num_layers "
                          f"= {cfg['model_param']['num_layers']}")
    for layer in KP_LAYERS:
        _validate_kp(cfg, layer)
    parallel = sched["dp"] > 1 or sched["lp"] > 1 or any(sched[f"kp_{n}_type"] != -1 for n in KP_LAYERS)
    if parallel and sched["topology"] != "mesh":
        raise ConfigError(f"scheduling_param.topology: {shown(sched['topology'])} has no interconnect model, so "
                          "dp, lp or kernel parallelism > 1 cannot be timed; use topology: mesh")


def _validate_kp(cfg: dict, layer: str) -> None:
    """Kernel-parallel settings the model can express (DeepFlow's own preconditions)."""
    sched, model = cfg["scheduling_param"], cfg["model_param"]
    kind, d1, d2 = (sched[f"kp_{layer}_type"], sched[f"kp_{layer}_dim1"], sched[f"kp_{layer}_dim2"])
    key = f"scheduling_param.kp_{layer}"
    if kind not in (-1, 1, 2):
        raise ConfigError(f"{key}_type = {shown(kind)}: use -1 (none), 1 (column-row) or 2 (row-column)")
    if kind == -1 and (d1 > 1 or d2 > 1):
        raise ConfigError(f"{key}_dim1/_dim2 = {d1}/{d2} need {key}_type 1 or 2 (type -1 means no split)")
    if kind == 1 and d2 > 1:
        raise ConfigError(f"{key}_dim2 = {d2}: a column-row split (type 1) uses only {key}_dim1")
    if kind == -1 or layer == "embedding":
        return
    b = math.ceil(model["batch_size"] / sched["dp"])
    D, G, P, S = model["layer_size"], model["num_gates"], model["projection"], model["seq_len"]
    # (rows, inner, columns) of the split GEMM and the extra rule DeepFlow imposes on the degrees
    shape = {"hidden": (b, 2 * D, G * D), "softmax": (b * S, D, None), "projection": (b * S, D, P)}[layer]
    rows, inner, cols = shape
    if kind == 1:
        _need(d1 > 1, f"{key}_dim1 must be > 1 for a column-row split")
        _need(inner % d1 == 0, f"{key}_dim1 = {d1} must divide the inner dimension {inner}")
        if layer == "hidden":
            _need(d1 % 4 == 0 or d1 == 2, f"{key}_dim1 = {d1} must be 2 or a multiple of 4")
        return
    _need(d1 > 1 or d2 > 1, f"{key}_dim1 or _dim2 must be > 1 for a row-column split")
    _need(rows % d1 == 0, f"{key}_dim1 = {d1} must divide the rows {rows}")
    if layer == "softmax":
        _need(inner % d2 == 0, f"{key}_dim2 = {d2} must divide model_param.layer_size {inner}")
    else:
        _need(cols % d2 == 0, f"{key}_dim2 = {d2} must divide the columns {cols}")
    if layer == "hidden":
        _need(d2 % G == 0 or d2 in (1, 2), f"{key}_dim2 = {d2} must be 1, 2 or a multiple of num_gates {G}")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def with_overrides(raw: Mapping, overrides: Mapping[str, Any]) -> dict:
    """A copy of `raw` with `section.key` values replaced (before normalization)."""
    out = copy.deepcopy(dict(raw))
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or key not in SECTIONS[section]:
            raise ConfigError(f"--set/--sweep: unknown key {shown(dotted)}; write section.key, "
                              f"e.g. model_param.batch_size")
        out.setdefault(section, {})
        out[section] = dict(out[section] or {})
        out[section][key] = value
    return out


def parse_scalar(text: str, option: str = "--set") -> Any:
    """A command-line value: int, float, bool or string (YAML 1.2 rules, as in the file); a ConfigError
    naming the option and the value when it is not one YAML scalar."""
    from qbench.safe_yaml import YamlRefused, load

    try:
        value = load(text)
    except YamlRefused as exc:
        raise ConfigError(f"{option} value {shown(text)} {exc}") from None
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{option} value {shown(text)} is a YAML {type(value).__name__}; give one number, "
                          "word or true/false")
    return value
