"""How `qbench moe` records are shown: the rich table, and the seeds' log lines (--seed-format),
which `qbench import` reads back."""

from __future__ import annotations

from typing import Any


def table(records: list[dict[str, Any]]):
    """The rich table of a run: layer records (phase times, TFLOP/s, load), or kernel records."""
    from qbench.report import records_table
    from qbench.store import varying_params

    if records and records[0]["bench"] != "moe":
        from qbench.benches.moe.grouped import table as kernel_table

        return kernel_table(records)
    params = ["world_size", "num_local_experts", "a2a_ffn_overlap_degree", "replicate_hot", "routing", "gemm", "exec"]
    metrics = ["step_time", "loop_step_time", "forward_time", "backward_time", "dispatch_time", "experts_time",
               "combine_time", "host_ms", "tflops", "experts_tflops", "roofline_fraction", "expert_load_max_over_mean",
               "dropped_tokens"]
    if any(r["params"].get("system") == "blocks" for r in records):
        params += ["system", "transport", "locality"]
        metrics[4:7] = ["plan_time", "ag_time", "ga_time", "dispatch_time", "combine_time"]
        metrics.remove("experts_tflops")
        metrics.append("remote_fraction")
    elif any(r["params"].get("locality") is not None for r in records):
        params.append("locality")
    if any(r["params"].get("system") == "tutel" for r in records) and "system" not in params:
        params.append("system")
    params += varying_params(records, ["backward_thread"])  # its column only when it varies
    if any("sm_clock_mhz_loop" in r["metrics"] for r in records):  # where NVML read it: a GPU at its power cap
        metrics.insert(metrics.index("loop_step_time") + 1, "sm_clock_mhz_loop")  # lowers the loop's clock
    return records_table(records, params, metrics, title="qbench moe (ms: median over steps of the max over ranks)",
                         headers={"a2a_ffn_overlap_degree": "overlap", "num_local_experts": "experts/rank",
                                  "expert_load_max_over_mean": "load max/mean", "replicate_hot": "hot",
                                  "experts_tflops": "FFN tflops", "backward_thread": "bwd thread",
                                  "loop_step_time": "loop step", "sm_clock_mhz_loop": "loop clock"})


def seed_lines(record: dict) -> list[str]:
    """The seeds' log lines for one record: [Benchmark] header, STEP-i lines, [Summary]. The dtype is
    spelled as the seeds print their torch dtype (float16), whatever alias the record uses."""
    from qbench.units import torch_dtype

    p, s = record["params"], record.get("samples", {})
    device = "cuda:0" if record.get("device") == "cuda" else "cpu"
    dtype = str(torch_dtype(p["dtype"])).removeprefix("torch.")
    lines = [f"[Benchmark] world_size = {p['world_size']}, dtype = {dtype}, model_dim = {p['model_dim']}, "
             f"hidden_size = {p['hidden_size']}, samples = {p['samples']}, num_local_experts = "
             f"{p['num_local_experts']}, topK = {p['top_k']}, a2a_ffn_overlap_degree = "
             f"{p['a2a_ffn_overlap_degree']}, device = `{device}`"]
    steps = s.get("step_time", [])
    fwd = s.get("forward_time", [0.0] * len(steps))
    bwd = s.get("backward_time", [0.0] * len(steps))
    flops = p["samples"] * p["model_dim"] * p["hidden_size"] * 4 * p["top_k"] * (1 if p.get("eval") else 3)
    for i, (t, f, b) in enumerate(zip(steps, fwd, bwd)):
        lines.extend(block_lines(record, i))
        lines.append(f"STEP-{i}: step_time = {t:.6f} ms, foward_time = {f:.6f}, backward_time = {b:.6f}, "
                     f"perf = {flops / (t * 1e-3) / 1e12:.2f} tflops.")
    if steps:
        mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
        lines.append(f"[Summary] Average synchronized step_time = {mean(steps)} ms, "
                     f"forward = {mean(fwd)}, backward = {mean(bwd)}.")
    return lines


def block_lines(record: dict, step: int) -> list[str]:
    """System blocks: the seed's per-rank diagnostics printed before STEP-<step>: `block_info TOTAL
    REMOTE`, then `AG|GA, <remote fraction>, <ms>, 0` (forward AG, GA, then backward AG, GA), each
    line ending in `rank R` (the seed's lines carry no rank; the importer reads the suffix when present)."""
    m, s = record.get("metrics", {}), record.get("samples", {})
    ranks = sorted(int(k.removeprefix("blocks_rank")) for k in m if k.startswith("blocks_rank"))
    lines = [f"block_info {int(m[f'blocks_rank{r}'])} {int(m[f'remote_blocks_rank{r}'])} rank {r}" for r in ranks]
    for phase, label in (("ag", "AG"), ("ga", "GA"), ("backward_ag", "AG"), ("backward_ga", "GA")):
        for r in ranks:
            values = s.get(f"{phase}_time_rank{r}", [])
            if step < len(values):
                lines.append(f"{label}, {m[f'remote_fraction_rank{r}']:.6f}, {values[step]:.6f}, 0 rank {r}")
    return lines
