"""`qbench switchback`'s wide form and its tidy form.

The bench measures one shape into one dict keyed the bitsandbytes way (`standard_fwd`, `time_global`,
`module_switchback_graph_ms`, ...: the seed's info.jsonl keys, which `--format seed` writes exactly) and
records it tidy: one record per (variant, exec, timing) with the metrics of qbench/metrics/switchback.py.
Runs written before the tidy form (schema 1) hold the wide dict and load through the same table, so an
old run and a new one pair in `qbench compare`.
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.modes import EXECS

Where = tuple[str, str, str, str]  # (variant, exec, timing, metric)

# the seed's totals: variant -> its component keys (benches/switchback/components.py TOTALS)
TOTALS = {
    "16bit": ("standard_fwd", "standard_gx", "standard_gw"),
    "switchback_rowwise": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_colwise_transpose",
                           "w_quantize_rowwise", "standard_gw", "rowwise_fwd", "rowwise_bwd"),
    "switchback": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_global", "w_quantize_global_transpose",
                   "standard_gw", "global_fwd", "global_bwd"),
    "fp8": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "standard_gw", "fp8_fwd",
            "fp8_bwd"),
    "fp8_all": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "fp8_quantize_g_t",
                "fp8_quantize_x_t", "fp8_fwd", "fp8_bwd", "fp8_gw"),
    "fp8_cublas": ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t", "standard_gw",
                   "fp8_cublas_fwd", "fp8_cublas_bwd"),
    "int8_cublas": ("x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise", "w_quantize_colwise_transpose",
                    "standard_gw", "int8_cublas_fwd", "int8_cublas_bwd"),
}
# the seed's name of each variant in its total (time_<name>), speed-up and % saved keys
SEED_NAME = {"16bit": "standard", "switchback": "global", "switchback_rowwise": "rowwise", "fp8": "fp8",
             "fp8_all": "fp8_all", "fp8_cublas": "fp8_cublas", "int8_cublas": "int8_cublas"}
# the module layers' names in the wide keys (benches/switchback/modules.py LAYERS)
LAYER_VARIANT = {"linear": "16bit", "switchback": "switchback", "fp8": "fp8", "fp8_all": "fp8_all",
                 "torchao": "torchao"}
PRODUCTS = ("fwd", "bwd", "gx", "gw")  # the matmul components (a rate in TFLOP/s or TOP/s, a relative error)
FP8_TWINNED = ("fp8_quantize_x", "fp8_quantize_g", "fp8_quantize_w", "fp8_quantize_w_t")  # *_over_int8
CHAIN_VARIANT = {"standard": "16bit", "global": "switchback"}
HOST_CALL_VARIANT = {"linear": "16bit", "switchback": "switchback"}


def component_metric(key: str) -> str:
    """The tidy name of a component key: standard_fwd -> fwd, x_quantize_rowwise -> quantize_x, ..."""
    fixed = {"x_quantize_rowwise": "quantize_x", "g_quantize_rowwise": "quantize_g",
             "w_quantize_rowwise": "quantize_w", "w_quantize_colwise_transpose": "quantize_w_t",
             "w_quantize_global": "quantize_w", "w_quantize_global_transpose": "quantize_w_t"}
    if key in fixed:
        return fixed[key]
    if key.startswith(("fp8_quantize_", "cast_")):
        return key.removeprefix("fp8_")
    return key.rsplit("_", 1)[1]  # standard_gx -> gx, global_fwd -> fwd, fp8_cublas_bwd -> bwd


def _component_keys() -> dict[str, list[str]]:
    """component key -> the variants whose total holds it (cast_* belong to 16bit)."""
    owners: dict[str, list[str]] = {f"cast_{t}": ["16bit"] for t in "xgw"}
    for variant, keys in TOTALS.items():
        for key in keys:
            owners.setdefault(key, []).append(variant)
    return owners


def _per_kernel() -> dict[str, list[Where]]:
    table: dict[str, list[Where]] = {}
    for key, owners in _component_keys().items():
        name = component_metric(key)
        if name in PRODUCTS:
            shapes = {"": f"{name}_ms", "_tflops": f"{name}_tflops", "_tops": f"{name}_tops"}
            shapes.update({"relerr_": f"relerr_{name}"})
        else:
            shapes = {"": f"{name}_ms", "_gbps": f"{name}_gbps"}
            if key in FP8_TWINNED:
                shapes["_over_int8"] = f"{name}_over_int8"
        for affix, tidy_name in shapes.items():
            wide_key = affix + key if affix.endswith("_") else key + affix
            table[wide_key] = [(v, "eager", "per_kernel", tidy_name) for v in owners]
    for variant, seed in SEED_NAME.items():
        table[f"time_{seed}"] = [(variant, "eager", "per_kernel", "kernels_ms")]
        table[f"speedup_{seed}"] = [(variant, "eager", "per_kernel", "kernels_speedup")]
        table[f"pct_saved_{seed}"] = [(variant, "eager", "per_kernel", "kernels_pct_saved")]
    table["roofline_fraction"] = [("switchback", "eager", "per_kernel", "roofline_fraction")]
    every = [(v, "eager", "per_kernel") for v in TOTALS]
    table["repeat"] = [(*w, "repeat") for w in every]
    for what in ("sm_clock_mhz", "power_w", "throttle_reasons"):
        table[f"{what}_kernels"] = [(*w, what) for w in every]
    return table


def _speedup_key(kind: str, layer: str, mode: str) -> str:
    """speedup_module[_<layer>][_<mode>] (eager unsuffixed) and speedup_loop[_<layer>]_<mode>."""
    name = "" if layer == "switchback" else f"_{layer}"
    if kind == "module":
        return f"speedup_module{name}" + ("" if mode == "eager" else f"_{mode}")
    return f"speedup_loop{name}_{mode}"


def _per_step(mode: str) -> dict[str, list[Where]]:
    table: dict[str, list[Where]] = {}
    suffix = "" if mode == "eager" else f"_{mode}"
    for layer, variant in LAYER_VARIANT.items():
        step, loop = (variant, mode, "per_step"), (variant, mode, "loop")
        table[f"module_{layer}{suffix}_ms"] = [(*step, "step_ms")]
        table[f"loop_{layer}_{mode}_ms"] = [(*loop, "step_ms")]
        table[f"host_{layer}_{mode}_ms"] = [(*step, "host_ms")]
        if layer != "linear":
            table[_speedup_key("module", layer, mode)] = [(*step, "step_speedup")]
            table[_speedup_key("loop", layer, mode)] = [(*loop, "step_speedup")]
    for seed, variant in CHAIN_VARIANT.items():
        table[f"chain_{seed}_{mode}_ms"] = [(variant, mode, "per_step", "chain_ms")]
        table[f"loop_chain_{seed}_{mode}_ms"] = [(variant, mode, "loop", "chain_ms")]
    table[f"speedup_chain_{mode}"] = [("switchback", mode, "per_step", "chain_speedup")]
    table[f"speedup_loop_chain_{mode}"] = [("switchback", mode, "loop", "chain_speedup")]
    for kind, timing in (("module", "per_step"), ("loop", "loop")):
        table[f"{kind}_kernel_ratio_{mode}"] = [("switchback", mode, timing, "step_over_kernels")]
        table[f"{kind}_chain_ratio_{mode}"] = [("switchback", mode, timing, "step_over_chain")]
    modules = [(v, mode, t) for v in LAYER_VARIANT.values() for t in ("per_step", "loop")]
    for what in ("sm_clock_mhz", "power_w", "throttle_reasons"):
        table[f"{what}_{mode}"] = [(*w, what) for w in modules]
    return table


def _host_calls() -> dict[str, list[Where]]:
    from qbench.metrics.switchback import HOST_CALLS

    table: dict[str, list[Where]] = {}
    for layer, variant in HOST_CALL_VARIANT.items():
        where = (variant, "eager", "per_step")
        table[f"host_calls_{layer}_ms"] = [(*where, "host_calls_ms")]
        for call in HOST_CALLS:
            table[f"host_call_{layer}_{call}_ms"] = [(*where, f"host_{call}_ms")]
    return table


def _table() -> dict[str, list[Where]]:
    table = {**_per_kernel(), **_host_calls()}
    for mode in EXECS:
        table.update(_per_step(mode))
    return table


WIDE: dict[str, list[Where]] = _table()  # wide key -> where each of its values goes in the tidy form


def tidy(params: Mapping, metrics: Mapping, samples: Mapping | None = None) -> list[tuple[dict, dict, dict]]:
    """The tidy (params, metrics, samples) of one shape's wide metrics, one per (variant, exec, timing), in
    the order the variants and modes first appear. A wide key the table does not know is a KeyError naming
    it (a bench that records a new key declares it here and in qbench/metrics/switchback.py). A group that
    holds only keys shared with a kept one (standard_gw and repeat of an fp8 variant a CPU run never timed)
    is left out: it would be a record of a variant that was not measured."""
    groups: dict[tuple[str, str, str], tuple[dict, dict]] = {}
    for key in metrics:
        if key not in WIDE:
            raise KeyError(f"switchback: no tidy place for the wide key {key!r} (qbench/migration/switchback.py)")
    for place in _measured(metrics):
        values, kept = groups.setdefault(place[:3], ({}, {}))
        key, name = place[3], place[4]
        values[name] = metrics[key]
        if samples and samples.get(key):
            kept[name] = list(samples[key])
    return [({**params, "variant": v, "exec": m, "timing": t}, values, kept)
            for (v, m, t), (values, kept) in groups.items()]


def _measured(metrics: Mapping) -> list[tuple[str, str, str, str, str]]:
    """(variant, exec, timing, wide key, tidy name) of each value, in the order of `metrics`, for the groups
    that hold a key no other group holds, and for a shared key that no such group holds, its first group."""
    places = [(*place[:3], key, place[3]) for key in metrics for place in WIDE[key]]
    owned = {p[:3] for p in places if len(WIDE[p[3]]) == 1}
    covered = {p[3] for p in places if p[:3] in owned}
    first = {}
    for p in places:
        if p[3] not in covered:
            first.setdefault(p[3], p[:3])
    return [p for p in places if p[:3] in owned or first.get(p[3]) == p[:3]]


def where(record: Mapping) -> tuple:
    """(variant, exec, timing) of a tidy record; Nones for the one error or skipped record of a shape."""
    return tuple(record["params"].get(field) for field in ("variant", "exec", "timing"))


def shapes(records: list[Mapping]) -> list[list[Mapping]]:
    """The records of each measured shape (their params but variant, exec and timing alike, as store.measured_id
    groups them; the store reads records through this module, so it is not imported here), in the order the
    shapes first appear: what wide() takes."""
    from qbench.metrics import FIELDS

    groups: dict[tuple, list[Mapping]] = {}
    for record in records:
        shape = tuple(sorted((k, repr(v)) for k, v in record["params"].items() if k not in FIELDS))
        groups.setdefault(shape, []).append(record)
    return list(groups.values())


def wide(records: list[Mapping]) -> dict:
    """The wide dict (seed keys) of one shape's tidy records: the inverse of tidy() on their metrics."""
    at = {where(r): r["metrics"] for r in records}
    out = {}
    for key, places in WIDE.items():
        for variant, mode, timing, name in places:
            value = at.get((variant, mode, timing), {}).get(name)
            if value is not None:
                out[key] = value
                break
    return out


OLD_BENCH = "switchback"


def migrate(record: dict) -> list[dict]:
    """A schema-1 switchback record as its tidy records (an error or skip stays one record)."""
    from qbench.migration import split

    return split(record, tidy(record["params"], record["metrics"], record.get("samples")))
