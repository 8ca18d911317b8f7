"""The original FragmentedLinear benchmark's text report, printed from qbench records.

Per size and batch: "Linear Layer:" (variant dense, task train), "FragmentedLinear (Train) Results:"
(task train) and "FragmentedLinear (Inference) Results:" (task eval: model.eval() with autograd and the
optimizer step, which is what the original called inference). "Backward time" is
zero_grad + backward + Adam step, as the original measured it. Old readers of that report work.
"""

from __future__ import annotations

import math

BENCH = "fragmented"


def _seed_block(metrics: dict) -> list[str]:
    def number(key: str) -> float:
        value = metrics.get(key)
        return math.nan if value is None else value

    peak = metrics.get("peak_memory_mb")
    return [f"  Forward time: {number('forward_ms'):.2f}ms",
            f"  Backward time: {number('backward_optimizer_ms'):.2f}ms",
            f"  Peak memory: {0.0 if peak is None else peak:.1f}MB",  # the seed printed 0.0 without CUDA
            f"  Parameters: {int(metrics.get('parameters') or 0)}"]


def format_seed(records: list[dict]) -> str:
    """The original benchmark's text report: per size and batch the dense Linear (task train), then
    FragmentedLinear in task train ("Train") and task eval ("Inference", as the seed named it).
    Backward time is zero_grad + backward + Adam step, as the seed measured it."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("bench") == BENCH]
    lines: list[str] = []
    for dtype in dict.fromkeys(r["params"]["dtype"] for r in ok):
        lines.append(f"#qbench fragmented, dtype={dtype}")
        groups = dict.fromkeys((r["params"]["in_features"], r["params"]["out_features"],
                                r["params"]["batch_size"]) for r in ok if r["params"]["dtype"] == dtype)
        for size_in, size_out, batch in groups:
            mine = [r for r in ok if r["params"]["dtype"] == dtype and (r["params"]["in_features"],
                    r["params"]["out_features"], r["params"]["batch_size"]) == (size_in, size_out, batch)]
            lines += ["", f"Benchmarking with input_size={size_in}, output_size={size_out}, batch_size={batch}"]
            lines += _seed_group(mine)
    return "\n".join(lines) + "\n"


def _seed_group(records: list[dict]) -> list[str]:
    def pick(variant: str, task: str) -> list[dict]:
        return [r for r in records if r["params"]["variant"] == variant and r["params"]["task"] == task]

    lines = ["", "Detailed Results:"]
    for rec in pick("dense", "train")[:1]:
        lines += ["Linear Layer:", *_seed_block(rec["metrics"])]
    for title, task in (("Train", "train"), ("Inference", "eval")):
        chosen = pick("fragmented", task)
        if chosen:
            lines += ["", f"FragmentedLinear ({title}) Results:"]
        for rec in chosen:
            lines += ["", f"Fragments: {rec['params']['fragments']}", *_seed_block(rec["metrics"])]
    return lines
