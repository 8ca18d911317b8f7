"""`qbench model lstm`: configs from a DeepFlow file (+ overrides, + one sweep), records and the summary.

A sweep `scheduling_param.dp=1,2,4` evaluates the model once per value; every point is validated
before anything runs, so a bad value is a usage error naming the key, not a half-written run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench import store, units
from qbench.benches.model.config import read_yaml
from qbench.model import deepflow, objective
from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow import machine as deepflow_machine
from qbench.model.deepflow import quirks
from qbench.model.deepflow.config import ConfigError, shown

METRIC_UNITS = {
    "time_s": units.S, "cf_s": units.S, "cb_s": units.S, "r_s": units.S, "w_s": units.S,
    "softmax_f_s": units.S, "softmax_b_s": units.S, "embedding_f_s": units.S, "embedding_b_s": units.S,
    "projection_f_s": units.S, "projection_b_s": units.S, "apply_softmax_s": units.S,
    "memory_total_gb": units.GB, "memory_embedding_gb": units.GB, "memory_hidden_gb": units.GB,
    "memory_softmax_gb": units.GB, "memory_projection_gb": units.GB, "memory_weight_gb": units.GB,
    "memory_activation_gb": units.GB, "memory_pointwise_gb": units.GB, "memory_model_shard_gb": units.GB,
    "memory_capacity_gb": units.GB, "overflow_rate": units.RATIO, "overflow_rate_model_shard": units.RATIO,
    "fits": units.FLAG, "parameters": units.COUNT, "budget_s": units.S, "meets_budget": units.FLAG,
}
# memory_*_gb and overflow_rate are per data shard (DeepFlow's first breakdown, what `qbench import` reads);
# memory_model_shard_gb, overflow_rate_model_shard and fits are per device (data shard per model shard).
MEMORY_BASIS = ("memory and overflow_rate per data shard; per device (data shard per model shard): "
                "memory_model_shard_gb, overflow_rate_model_shard, fits")
PARAM_KEYS = ("batch_size", "vocab_size", "num_layers", "layer_size", "projection", "seq_len", "precision",
              "dp", "lp", "hlp", "kp_hidden_type", "kp_hidden_dim1", "kp_hidden_dim2", "kp_softmax_type",
              "kp_softmax_dim1", "kp_softmax_dim2")


@dataclass(frozen=True)
class LstmRun:
    config: str  # path of the DeepFlow YAML file
    overrides: tuple[tuple[str, Any], ...] = ()  # (section.key, value)
    sweep_key: str | None = None
    sweep_values: tuple[Any, ...] = ()
    debug: bool = False
    deepflow: str = "exact"  # exact or corrected (qbench.model.deepflow.quirks)
    budget: tuple = (None, None, None)  # (--time-budget s, --tokens, --hours): time_per_step when given


@dataclass(frozen=True)
class Evaluation:
    result: deepflow.Result
    budget_s: float | None  # seconds allowed per step, from the run's budget and this config (None: none)


def configs(run: LstmRun) -> list[dict]:
    """Normalized configs, one per sweep point (one when there is no sweep)."""
    raw = deepflow_config.with_overrides(read_yaml(run.config), dict(run.overrides))
    where = f"{run.config}{' with --set' if run.overrides else ''}"  # what an error names as the input
    if not run.sweep_key:
        try:
            return [deepflow_config.normalize(raw)]
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    out = []
    for value in run.sweep_values:
        try:
            out.append(deepflow_config.normalize(deepflow_config.with_overrides(raw, {run.sweep_key: value})))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc} (at {run.sweep_key}={shown(value)})") from None
    return out


def evaluate(cfg: dict, debug: bool = False, mode: str = "exact") -> deepflow.Result:
    return deepflow.evaluate(cfg, deepflow_machine.derive(cfg), debug=debug, fixes=quirks.fixes_for(mode))


def evaluate_all(run: LstmRun) -> list[Evaluation]:
    """One evaluation per sweep point, all configs validated first; the budget per step follows each
    point's batch_size and seq_len (steps = ceil(tokens / (batch x seq_len)))."""
    out = []
    for cfg in configs(run):
        mp = cfg["model_param"]
        budget = objective.time_budget(*run.budget, mp["batch_size"], mp["seq_len"])
        out.append(Evaluation(evaluate(cfg, run.debug, run.deepflow), budget))
    return out


def record(evaluation: Evaluation, run: LstmRun) -> dict:
    """One store record of an evaluation (times in seconds, memory in GiB, as DeepFlow prints them)."""
    result, budget = evaluation.result, evaluation.budget_s
    cfg, c, mem, shard = result.cfg, result.components, result.memory_shard, result.memory_model_shard
    params = {"workload": "lstm", "config": Path(run.config).name, "deepflow": run.deepflow}
    for section in ("model_param", "arch_param", "scheduling_param"):
        params.update({k: v for k, v in cfg[section].items() if k in PARAM_KEYS})
    gib = 2**30
    metrics = {
        "time_s": c.time, "cf_s": c.Cf, "cb_s": c.Cb, "r_s": c.R, "w_s": float(c.W),
        "softmax_f_s": c.softmax_f, "softmax_b_s": c.softmax_b, "embedding_f_s": c.embedding_f,
        "embedding_b_s": c.embedding_b, "projection_f_s": c.projection_f, "projection_b_s": c.projection_b,
        "apply_softmax_s": c.apply_softmax,
        "memory_total_gb": mem.total / gib, "memory_embedding_gb": mem.embedding / gib,
        "memory_hidden_gb": mem.hidden / gib, "memory_softmax_gb": mem.softmax / gib,
        "memory_projection_gb": mem.projection / gib, "memory_weight_gb": mem.weight / gib,
        "memory_activation_gb": mem.activation / gib, "memory_pointwise_gb": mem.pointwise / gib,
        "memory_model_shard_gb": shard.total / gib, "memory_capacity_gb": mem.capacity / gib,
        "overflow_rate": mem.overflow, "overflow_rate_model_shard": shard.overflow, "fits": int(shard.fits),
        "parameters": result.parameters,
    }
    if budget is not None:
        metrics.update(budget_s=budget, meets_budget=int(c.time <= budget))
    return store.make_record("model", params, metrics, units=METRIC_UNITS, device="model")


def summary(records: list[dict], shares_by_case: dict | None = None):
    """A rich summary: one record -> shares of the step time and memory against capacity; several ->
    one row per sweep point."""
    from rich.console import Group
    from rich.table import Table

    from qbench import report

    if len(records) != 1:
        keys = [k for k in PARAM_KEYS if len({str(r["params"].get(k)) for r in records}) > 1] or ["dp"]
        return report.records_table(records, keys, ["time_s", "cf_s", "cb_s", "softmax_f_s", "softmax_b_s",
                                                     "memory_model_shard_gb", "overflow_rate_model_shard", "fits"],
                                    title=f"DeepFlow LSTM model ({records[0]['params']['deepflow']})",
                                    notes=[f"records: {MEMORY_BASIS}"])
    m = records[0]["metrics"]
    shares = (shares_by_case or {}).get(records[0]["case"], {})
    times = Table(title=f"Time per step: {m['time_s']:.4f} s (DeepFlow {records[0]['params']['deepflow']})",
                  header_style="bold")
    for col in ("component", "seconds", "share"):
        times.add_column(col, justify="right" if col != "component" else "left")
    for name, value in shares.items():
        times.add_row(name, f"{value:.6g}", f"{100 * value / m['time_s']:.1f}%")
    mem = Table(title="Memory per data shard (GiB)", header_style="bold")
    for col in ("category", "GiB", "of capacity"):
        mem.add_column(col, justify="right" if col != "category" else "left")
    cap = m["memory_capacity_gb"]
    for cat in ("embedding", "hidden", "softmax", "projection", "weight", "activation", "pointwise", "total"):
        value = m[f"memory_{cat}_gb"]
        mem.add_row(cat, f"{value:.1f}", f"{100 * value / cap:.0f}%")
    verdict = "fits" if m["fits"] else f"does NOT fit ({m['overflow_rate_model_shard']:.1f}x the memory)"
    shard = m["memory_model_shard_gb"]
    mem.caption = (f"capacity {cap:.1f} GiB per device; per device (data shard per model shard) {shard:.1f} GiB: "
                   f"{verdict}")
    return Group(times, mem)
