"""Small builders shared by tests: hand-made run directories with known values."""

from __future__ import annotations

from pathlib import Path

from qbench import store, units


def write_run(path: Path, records: list[dict], gpu: str | None = "NVIDIA H200", **env) -> Path:
    """A run directory holding exactly these records (built with qbench.store)."""
    base = {"gpu_name": gpu, "torch": "2.11.0", "triton": "3.6.0", "driver": "580", "cuda": "13.0"}
    base.update(env)
    with store.RunWriter(path, base) as writer:
        for rec in records:
            writer.write(rec)
    return path


def timed_record(case_params: dict, time_samples: list[float], tflops: float | None = None, **kw) -> dict:
    """A record with a time metric (median of its samples) and optionally a throughput."""
    ordered = sorted(time_samples)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else sum(ordered[len(ordered) // 2 - 1 :][:2]) / 2
    metrics = {"time": median}
    unit_map = {"time": units.MS}
    if tflops is not None:
        metrics["tflops"] = tflops
        unit_map["tflops"] = units.TFLOPS
    return store.make_record(
        kw.pop("bench", "toy"), case_params, metrics, units=unit_map, samples={"time": time_samples}, **kw
    )
