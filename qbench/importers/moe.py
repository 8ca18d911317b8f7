"""Reader for MoE step logs (a Tutel-helloworld-style benchmark; the MixMoE variant adds diagnostics).

A log holds one or more benchmark blocks, each:
  [model print]   DistributedDataParallel(... FMoELinear(num_expert=14, ...) ...)   (MixMoE only)
  [Benchmark] world_size = 4, dtype = float16, model_dim = 1024, ..., topK = 2, ...
  STEP-k: step_time = 27.46 ms, foward_time = 25.06, backward_time = 2.30, perf = 30.03 tflops.
  [Summary] Average synchronized step_time = 22.85 ms, forward = 20.66, backward = 2.13.
Only rank 0 prints STEP lines, so "max over ranks" is not available for step times. Times are ms.

Each block becomes the tidy "moe" records of one measurement (qbench/migration/moe.py tidy; variant blocks
where the log has MixMoE's block diagnostics, else a2a; exec eager, timing per_step): the header params;
step/forward/backward time as the median of the STEP lines after WARMUP_STEPS (those lines are the samples);
TFLOP/s by the seed's formula; the seed's own summary and the number of trailing steps it averages (found by
recomputing it); the printed expert count; and, for MixMoE, per-rank diagnostics (see _diagnostics), the
per-rank ones as records with param `rank`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from typing import Any

from qbench import store
from qbench.errors import QbenchUsageError

WARMUP_STEPS = 10  # qbench's MoE rule: at least 10 warm-up steps before the measured ones
SUMMARY_TOLERANCE_MS = 1e-5  # STEP values are printed to 1e-6 ms, so a recomputed mean is this close

HEADER = re.compile(r"\[Benchmark\](.*)")
STEP = re.compile(
    r"STEP-(\d+): step_time = ([\d.]+) ms, (?:foward|forward)_time = ([\d.]+), backward_time = ([\d.]+)"
    r"(?:, perf = ([\d.]+) tflops)?"
)
SUMMARY = re.compile(r"\[Summary\].*?step_time = ([\d.]*\d) ms, forward = ([\d.]*\d), backward = ([\d.]*\d)")
INT_KEYS = ("world_size", "model_dim", "hidden_size", "samples", "num_local_experts", "top_k", "a2a_ffn_overlap_degree")


def read_moe_log(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The "moe" records of each benchmark block; a STEP line that does not parse and a block whose header
    lacks a size are skipped and named in env["skipped"]."""
    lines, skipped = _parsable(text.splitlines())
    records = []
    for number, block in enumerate(_blocks(lines), start=1):
        try:
            records.extend(_block_records(block))
        except (ValueError, ArithmeticError) as exc:  # a value that does not parse, a zero time or count
            skipped.append(f"benchmark block {number}: {str(exc)[:120]}")
    if not records:
        found = f" ({skipped[0]})" if skipped else ""
        raise QbenchUsageError(f"no '[Benchmark] world_size = ...' block with STEP lines found{found}")
    layer = re.search(r"\(_moe_layer\): (\w+)", text)
    env = {
        "gpu_name": None,  # the log names devices (cuda:0 ...) but not the GPU model
        "gpu_count": records[0]["params"].get("world_size"),
        "moe_layer": layer.group(1) if layer else None,
        "timing": "rank 0's step times only (no max over ranks); summary = mean of the last steps",
        "skipped": skipped,
    }
    return env, records


def _parsable(lines: list[str]) -> tuple[list[str], list[str]]:
    """The lines without the STEP lines that do not parse (cut short, a number such as 1.2.3), and those
    lines named as skipped."""
    kept, skipped = [], []
    for number, line in enumerate(lines, start=1):
        match = STEP.search(line) if "STEP-" in line else None
        if "STEP-" in line and (match is None or not _numbers(match.groups()[1:])):
            skipped.append(f"line {number}: a STEP line that does not parse")
            continue
        kept.append(line)
    return kept, skipped


def _numbers(texts) -> bool:
    try:
        return all(math.isfinite(float(t)) for t in texts if t)
    except ValueError:
        return False


def _blocks(lines: list[str]) -> list[list[str]]:
    """Lines of each benchmark block: everything up to and including its [Summary] line (the model
    print comes before the header). A trailing block without a summary (a crash) is kept."""
    blocks, current = [], []
    for line in lines:
        current.append(line)
        if line.startswith("[Summary]"):
            blocks.append(current)
            current = []
    blocks.append(current)
    return [b for b in blocks if any(HEADER.match(x) for x in b) and any(STEP.search(x) for x in b)]


def _header(lines: list[str]) -> dict[str, Any]:
    line = next(HEADER.match(x).group(1) for x in lines if HEADER.match(x))
    raw = dict(re.findall(r"(\w+) = ([^,]+)", line))
    raw["top_k"] = raw.pop("topK", raw.get("top_k"))
    params: dict[str, Any] = {}
    for key in INT_KEYS:
        if raw.get(key) is None:
            raise QbenchUsageError(f"the [Benchmark] header lacks {key}")
        text = raw[key].strip()
        if not text.isdigit() or int(text) <= 0:
            raise QbenchUsageError(f"the [Benchmark] header's {key} = {text[:20]!r} is not a positive integer")
        params[key] = int(text)
    params["dtype"] = raw.get("dtype", "").strip()
    return params


def _steps(lines: list[str]) -> tuple[list[tuple[float, ...]], list[list[str]]]:
    """(step, forward, backward, perf) per STEP line, and the diagnostic lines printed before each."""
    steps, chunks, chunk = [], [], []
    for line in lines:
        match = STEP.search(line)
        if match is None:
            chunk.append(line)
            continue
        steps.append(tuple(float(v) if v else float("nan") for v in match.groups()[1:]))
        chunks.append(chunk)
        chunk = []
    return steps, chunks


def summary_window(steps: list[tuple[float, ...]], summary: tuple[float, float, float]) -> int | None:
    """How many trailing steps the seed's summary averages: the n whose mean of step, forward and
    backward time matches all three summary values (largest such n), or None."""
    found = None
    for n in range(1, len(steps) + 1):
        tail = steps[-n:]
        if all(abs(sum(s[i] for s in tail) / n - summary[i]) <= SUMMARY_TOLERANCE_MS for i in range(3)):
            found = n
    return found


def _block_records(lines: list[str]) -> list[dict[str, Any]]:
    from qbench.migration.moe import tidy

    params = _header(lines)
    steps, chunks = _steps(lines)
    kept = slice(WARMUP_STEPS, None) if len(steps) > WARMUP_STEPS else slice(min(1, len(steps) - 1), None)
    columns = {
        name: [s[i] for s in steps[kept]] for i, name in enumerate(("step_time", "forward_time", "backward_time"))
    }
    metrics = {name: statistics.median(values) for name, values in columns.items()}
    flop = params["samples"] * params["model_dim"] * params["hidden_size"] * 4 * params["top_k"] * 3
    metrics["tflops"] = flop / (metrics["step_time"] * 1e-3) / 1e12
    metrics.update(steps_logged=len(steps), warmup_steps=len(steps) - len(steps[kept]))
    _summary(lines, steps, metrics)
    _experts(lines, params, metrics)
    _diagnostics(chunks[kept], metrics)
    blocks = any(name.startswith("blocks_rank") for name in metrics)
    measured = {**params, "variant": "blocks" if blocks else "a2a", "exec": "eager"}
    return [store.make_record("moe", p, values, samples=kept_samples, device="cuda")
            for p, values, kept_samples in tidy(measured, metrics, columns)]


def _summary(lines, steps, metrics: dict[str, Any]) -> None:
    match = next((SUMMARY.search(x) for x in lines if SUMMARY.search(x)), None)
    if match is None:
        return
    values = tuple(float(v) for v in match.groups())
    for name, value in zip(("summary_step_time", "summary_forward_time", "summary_backward_time"), values):
        metrics[name] = value
    window = summary_window(steps, values)
    if window is not None:
        metrics["summary_steps"] = window


def _experts(lines, params, metrics: dict[str, Any]) -> None:
    """Experts held per rank (the printed FMoELinear num_expert) and the gate's total expert count."""
    text = "\n".join(lines)
    per_rank = re.search(r"FMoELinear\(num_expert=(\d+)", text)
    gate = re.search(r"\(gate\): Linear\(in_features=\d+, out_features=(\d+)", text)
    if per_rank:
        metrics["experts_per_rank"] = int(per_rank.group(1))
        metrics["replicated_expert_slots"] = int(per_rank.group(1)) - params["num_local_experts"]
    if gate:
        metrics["total_experts"] = int(gate.group(1))


def _max_per_step(chunks: list[list[str]], pattern: str) -> float | None:
    """Median over steps of the max over ranks of an unlabelled per-rank value (ms)."""
    regex = re.compile(pattern)
    per_step = []
    for chunk in chunks:
        values = [float(m.group(1)) for line in chunk if (m := regex.search(line))]
        if values:
            per_step.append(max(values))
    return statistics.median(per_step) if per_step else None


UNLABELLED = {
    "moe_forward_ms": r"^forward:\s+([\d.]+)",
    "first_gemm_fwd_ms": r"fisrt gemm forward duration: ([\d.]+)",
    "first_gemm_bwd_ms": r"fisrt gemm backward duration: ([\d.]+)",
    "weight_grad_ms": r"weight grad: ([\d.]+)",
    "second_gemm_bwd_ms": r"second_gemm: ([\d.]+)",
    "linear1_bwd_ms": r"Linear 1 Backward:\s+([\d.]+)",
    "linear2_bwd_ms": r"Linear 2 Backward:\s+([\d.]+)",
}


def _diagnostics(chunks: list[list[str]], metrics: dict[str, Any]) -> None:
    """MixMoE's per-rank lines: `block_info TOTAL REMOTE` (64-token blocks), `AG|GA, remote
    fraction, ms, 0` (fused gather+GEMM / GEMM+scatter; first per step = forward, second = backward),
    `cuda:R process time: ms` (host planning). Absent in other logs: nothing is added."""
    for name, pattern in UNLABELLED.items():
        value = _max_per_step(chunks, pattern)
        if value is not None:
            metrics[name] = value
    ranks = _rank_blocks(chunks)
    if not ranks:
        return
    for rank, (total, remote) in sorted(ranks.items()):
        metrics[f"blocks_rank{rank}"], metrics[f"remote_blocks_rank{rank}"] = total, remote
        metrics[f"remote_fraction_rank{rank}"] = remote / total
    totals = [t for t, _ in ranks.values()]
    metrics["remote_fraction"] = sum(r for _, r in ranks.values()) / sum(totals)
    metrics["block_imbalance"] = max(totals) / (sum(totals) / len(totals))  # busiest rank / mean
    _transfer_times(chunks, ranks, metrics)
    _planning_times(chunks, metrics)


RANKED_BLOCKS = re.compile(r"block_info (\d+) (\d+) rank (\d+)")
RANK_SUFFIX = re.compile(r" rank (\d+)\s*$")


def _rank_blocks(chunks: list[list[str]]) -> dict[int, tuple[int, int]]:
    """rank -> (total blocks, remote blocks). block_info lines carry no rank; a rank prints
    `R wait time: x` and then its total on the next line, so the most common pairing decides
    (ranks' lines sometimes interleave). qbench's own lines end in `rank R`, which decides directly."""
    named = {int(m.group(3)): (int(m.group(1)), int(m.group(2)))
             for chunk in chunks for line in chunk if (m := RANKED_BLOCKS.match(line))}
    if named:
        return named
    pairs, owners = Counter(), Counter()
    for chunk in chunks:
        for i, line in enumerate(chunk):
            if m := re.match(r"block_info (\d+) (\d+)", line):
                pairs[(int(m.group(1)), int(m.group(2)))] += 1
            if (m := re.match(r"(\d+) wait time:", line)) and i + 1 < len(chunk) and chunk[i + 1].strip().isdigit():
                owners[(int(m.group(1)), int(chunk[i + 1]))] += 1
    remote_of = {total: remote for (total, remote), _ in pairs.most_common()[::-1]}
    ranks: dict[int, tuple[int, int]] = {}
    for (rank, total), _ in owners.most_common():
        if rank not in ranks and total in remote_of:
            ranks[rank] = (total, remote_of[total])
    return ranks


def _transfer_times(chunks, ranks, metrics: dict[str, Any]) -> None:
    """AG/GA ms per rank (median over steps), matched to ranks by their remote fraction."""
    fraction_rank = {round(remote / total, 6): rank for rank, (total, remote) in ranks.items()}
    times: dict[str, list[float]] = {}
    for chunk in chunks:
        seen: Counter = Counter()
        for line in chunk:
            m = re.match(r"(AG|GA), ([\d.]+), ([\d.]+), ", line)
            named = RANK_SUFFIX.search(line)
            rank = int(named.group(1)) if m and named else fraction_rank.get(round(float(m.group(2)), 6)) if m else None
            if rank is None:
                continue
            kind = m.group(1).lower()
            phase = "fwd" if seen[(kind, rank)] == 0 else "bwd"
            seen[(kind, rank)] += 1
            times.setdefault(f"{kind}_{phase}_ms_rank{rank}", []).append(float(m.group(3)))
    for name, values in sorted(times.items()):
        metrics[name] = statistics.median(values)


def _planning_times(chunks, metrics: dict[str, Any]) -> None:
    per_rank: dict[int, list[float]] = {}
    for chunk in chunks:
        for line in chunk:
            if m := re.match(r"cuda:(\d+) process time:\s*([\d.]+)", line):
                per_rank.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    for rank, values in sorted(per_rank.items()):
        metrics[f"plan_ms_rank{rank}"] = statistics.median(values)
