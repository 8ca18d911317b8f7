"""How `qbench moe` records are shown: the rich table, and the seeds' log lines (--seed-format),
which `qbench import` reads back."""

from __future__ import annotations

from typing import Any


def table(records: list[dict[str, Any]], limits=None):
    """The rich table of a run: layer records (one row per measurement and timing: phase times, TFLOP/s,
    load, with `limits` (the run's qbench.explain.limits.RunLimits) the limit binding the step; blocks' per-rank
    records are left to --format seed and the plots), or kernel records."""
    from qbench.report import records_table
    from qbench.store import varying_params

    if records and records[0]["bench"] != "moe":
        from qbench.benches.moe.grouped import table as kernel_table

        return kernel_table(records)
    records = [r for r in records if "rank" not in r["params"]]
    params = ["world_size", "num_local_experts", "a2a_ffn_overlap_degree", "replicate_hot", "routing", "gemm", "exec",
              "timing"]
    metrics = ["step_ms", "forward_ms", "backward_ms", "dispatch_ms", "experts_ms", "combine_ms", "host_ms", "tflops",
               "experts_tflops", "roofline_fraction", "expert_load_max_over_mean", "dropped_tokens"]
    if any(r["params"].get("variant") == "blocks" for r in records):
        params += ["variant", "transport", "locality"]
        metrics[3:6] = ["plan_ms", "ag_ms", "ga_ms", "dispatch_ms", "combine_ms"]
        metrics.remove("experts_tflops")
        metrics.append("remote_fraction")
    elif any(r["params"].get("locality") is not None for r in records):
        params.append("locality")
    if any(r["params"].get("variant") == "tutel" for r in records) and "variant" not in params:
        params.append("variant")
    params += varying_params(records, ["backward_thread"])  # its column only when it varies
    # where NVML read it: a GPU at its power cap lowers its clock, in the loop most
    metrics.insert(metrics.index("step_ms") + 1, "sm_clock_mhz")
    return records_table(records, params, metrics, title="qbench moe (ms: median over steps of the max over ranks)",
                         headers={"a2a_ffn_overlap_degree": "overlap", "num_local_experts": "experts/rank",
                                  "expert_load_max_over_mean": "load max/mean", "replicate_hot": "hot",
                                  "experts_tflops": "FFN tflops", "backward_thread": "bwd thread",
                                  "sm_clock_mhz": "clock"}, limits=limits)


def measurements(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records grouped by the measurement they came from (cases.resume_id), in order."""
    from qbench.benches.moe.cases import resume_id

    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(resume_id(record["params"]), []).append(record)
    return list(groups.values())


def seed_lines(records: list[dict]) -> list[str]:
    """The seeds' log lines for one measurement's records: [Benchmark] header, STEP-i lines, [Summary]. The
    dtype is spelled as the seeds print their torch dtype (float16), whatever alias the record uses."""
    from qbench.dtypes import torch_dtype

    record = next(r for r in records if r["params"].get("timing", "per_step") == "per_step" and "rank" not in
                  r["params"])
    p, s = record["params"], record.get("samples", {})
    device = "cuda:0" if record.get("device") == "cuda" else "cpu"
    dtype = str(torch_dtype(p["dtype"])).removeprefix("torch.")
    lines = [f"[Benchmark] world_size = {p['world_size']}, dtype = {dtype}, model_dim = {p['model_dim']}, "
             f"hidden_size = {p['hidden_size']}, samples = {p['samples']}, num_local_experts = "
             f"{p['num_local_experts']}, topK = {p['top_k']}, a2a_ffn_overlap_degree = "
             f"{p['a2a_ffn_overlap_degree']}, device = `{device}`"]
    steps = s.get("step_ms", [])
    fwd = s.get("forward_ms", [0.0] * len(steps))
    bwd = s.get("backward_ms", [0.0] * len(steps))
    flops = p["samples"] * p["model_dim"] * p["hidden_size"] * 4 * p["top_k"] * (1 if p.get("eval") else 3)
    ranks = sorted((r for r in records if "rank" in r["params"]), key=lambda r: r["params"]["rank"])
    for i, (t, f, b) in enumerate(zip(steps, fwd, bwd)):
        lines.extend(block_lines(ranks, i))
        lines.append(f"STEP-{i}: step_time = {t:.6f} ms, foward_time = {f:.6f}, backward_time = {b:.6f}, "
                     f"perf = {flops / (t * 1e-3) / 1e12:.2f} tflops.")
    if steps:
        mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
        lines.append(f"[Summary] Average synchronized step_time = {mean(steps)} ms, "
                     f"forward = {mean(fwd)}, backward = {mean(bwd)}.")
    return lines


def block_lines(ranks: list[dict], step: int) -> list[str]:
    """Variant blocks: the seed's per-rank diagnostics printed before STEP-<step>, from the per-rank
    records (param `rank`, in rank order): `block_info TOTAL REMOTE`, then `AG|GA, <remote fraction>, <ms>, 0`
    (forward AG, GA, then backward AG, GA), each line ending in `rank R` (the seed's lines carry no rank;
    the importer reads the suffix when present)."""
    lines = [f"block_info {int(r['metrics']['block_count'])} {int(r['metrics']['remote_block_count'])} "
             f"rank {r['params']['rank']}" for r in ranks]
    for phase, label in (("ag", "AG"), ("ga", "GA"), ("backward_ag", "AG"), ("backward_ga", "GA")):
        for r in ranks:
            values = r.get("samples", {}).get(f"{phase}_ms", [])
            if step < len(values):
                lines.append(f"{label}, {r['metrics']['remote_fraction']:.6f}, {values[step]:.6f}, 0 "
                             f"rank {r['params']['rank']}")
    return lines
