"""`qbench moe --kernels grouped` (qbench/benches/moe/grouped.py): the grouped GEMM kernel bench on tiny
shapes through the Triton interpreter (on a GPU it runs at the seed config's sizes from the command)."""

from dataclasses import replace

import pytest

from kernels._common import interpreting
from qbench.benches import moe as bench
from qbench.benches.moe import grouped
from qbench.dtypes import tolerance
from qbench.errors import QbenchUsageError

# d and h multiples of the interpreter's 16-wide K tile (plain w needs K % BK == 0); 40 routed rows
# over 2 groups x 2 sources leave partial row tiles and maybe empty segments
CONFIG = bench.MoEBenchConfig(world_size=1, backend="gloo", device="cpu", dtype="bf16", model_dim=32, hidden_size=48,
                              samples=20, num_local_experts=(2,), kernels="grouped")


@pytest.mark.slow
@pytest.mark.skipif(not interpreting(), reason="tiny shapes for the interpreter; a GPU runs the command's sizes")
def test_every_case_is_checked_then_timed():
    records = list(bench.run(CONFIG))
    shapes = [c.name for c in grouped.plan(CONFIG)]
    assert len(shapes) == 4  # a-d; the group-count and expert-major cases run in fp16 only
    # tidy: one record per shape and variant (tma, pointer, dense), exec eager, timing per_kernel
    assert [(r["params"]["shape"], r["params"]["variant"]) for r in records] == [
        (shape, variant) for shape in shapes for variant in ("tma", "pointer", "dense")]
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    for r in records:
        m, variant = r["metrics"], r["params"]["variant"]
        assert r["bench"] == "grouped_gemm" and r["params"]["dtype"] == "bf16" and r["params"]["rows"] == 40
        assert (r["params"]["exec"], r["params"]["timing"]) == ("eager", "per_kernel")
        assert m["kernel_ms"] > 0 and m["tflops"] > 0 and len(r["samples"]["kernel_ms"]) == 2
        if variant != "dense":  # the yardstick is not checked against the grouped reference
            assert m["rel_err"] <= tolerance("bf16").gemm, m
        assert ("speedup" in m) == (variant == "tma")


@pytest.mark.skipif(not interpreting(), reason="tiny shapes for the interpreter; a GPU runs the command's sizes")
def test_a_failed_check_times_nothing_and_says_why(monkeypatch):
    """One case failing its check: it is an error, the others are skipped naming it, nothing is timed."""
    real_check = grouped.check

    def check(case, inp, dtype, device):
        metrics, error = real_check(case, inp, dtype, device)
        return metrics, "tma_rel_err above 0.016: (forced)" if case.name.startswith("b ") else error

    def no_timing(*_):
        raise AssertionError("timed after a failed check")

    monkeypatch.setattr(grouped, "check", check)
    monkeypatch.setattr(grouped, "timings", no_timing)
    records = list(bench.run(CONFIG))
    failed = [r for r in records if r["status"] == "error"]
    assert {r["params"]["shape"] for r in failed} == {"b fwd act@w2"}
    others = [r for r in records if r["status"] != "error"]
    assert others and all(r["status"] == "skipped" and "b fwd act@w2 failed the check" in r["error"] for r in others)
    assert all("kernel_ms" not in r["metrics"] for r in records)


def test_fp16_adds_the_group_count_and_expert_major_cases():
    names = [c.name for c in grouped.plan(replace(CONFIG, dtype="fp16"))]
    assert names[4:] == ["e fwd x@w1 G=4", "f a, expert-major", "f d, expert-major"]


def test_usage_errors():
    runnable = replace(CONFIG, device="cpu" if interpreting() else "cuda")  # where the kernels can run
    with pytest.raises(QbenchUsageError, match="fp16 or bf16"):
        bench.validate(replace(runnable, dtype="fp32"))
