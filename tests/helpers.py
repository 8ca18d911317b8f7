"""Small builders shared by tests: hand-made run directories with known values."""

from __future__ import annotations

import os
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


def assert_close(got, want, tol: float, what: str, first: int = 5) -> None:
    """got within tol of want, relative to the largest |want| (the measure of qbench.dtypes' gemm and
    layer_peak tolerances); on failure: how many entries differ, the largest relative error, and the first
    mismatches with their indices and both values."""
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    err = (got - want).abs()
    scale = want.abs().max().clamp_min(1e-6) if want.numel() else 1.0
    bad = ~(err <= tol * scale)  # NaN counts as a mismatch
    if bad.any():
        idx = [tuple(i) for i in bad.nonzero()[:first].tolist()]
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} mismatches (max rel {float(err.max() / scale):.2e} > {tol}); "
            f"first (index, got, want): {[(i, float(got[i]), float(want[i])) for i in idx]}")


def gemm_tol(dtype) -> float:
    """The gemm tolerance (qbench.dtypes.TOLERANCE) of a torch dtype or dtype name."""
    from qbench.dtypes import tolerance

    return tolerance(dtype).gemm


def run_qbench(capsys, args: list) -> tuple[int, str, str]:
    """qbench's command line in this process: (exit code, stdout, stderr); a crash shown as a bug ("internal
    error") or a traceback fails the calling test, whatever the exit code."""
    import pytest

    from qbench.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err, err
    return exc.value.code, out, err


def env_without_interpreter(**extra: str) -> dict[str, str]:
    """This process's environment without TRITON_INTERPRET, plus `extra`. A process started with it compiles
    Triton kernels instead of interpreting them, and its layers take their torch path on CPU tensors: for tests
    of a command's records and flow, whose kernels have tests of their own that run them interpreted (one
    small MoE step takes most of a second through the interpreter, milliseconds on torch)."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | extra
