"""Grouped GEMM on Hopper: the persistent TMA kernel (kernels/grouped_gemm_tma.py) against the
pointer kernel (kernels/grouped_gemm.py), at the shapes of `qbench moe`'s seed config on one rank
(d 1024, h 4096, 8 local experts, 16384 routed rows = 8192 tokens x top-2, R = 4 source ranks).

  a  forward x @ w1        x [T, 1024] @ w [G, 1024, 4096] + bias   plain w
  b  forward act @ w2      x [T, 4096] @ w [G, 4096, 1024] + bias   plain w
  c  input grad dy @ w2^T  x [T, 1024] @ w2.transpose(1, 2), w2 [G, 4096, 1024]   transposed w
  d  input grad @ w1^T     x [T, 4096] @ w1.transpose(1, 2), w1 [G, 1024, 4096]   transposed w
  e  shape a with 16, 32 and 64 groups (fp16 only)
  f  shapes a and d with the rows expert-major (one segment per group, the same row counts per group as
     a and d draw; fp16 only): what partial row tiles at the R x G segment ends cost
Rows arrive source-major (segment s = source * G + expert, R = 4 segments per group) with uneven,
seeded random routing; fp16 and bf16.

First every case is checked (TMA kernel, pointer kernel and the plain-torch reference; max abs and
relative error); any mismatch stops the script with exit 1 before anything is timed. Then both
kernels (and a dense cuBLAS matmul with the same FLOPs, as a yardstick) are timed with
qbench.timing.time_fn, L2 flushed between repeats. The first call of each kernel per case is also
measured, as a wall-clock note of Triton's compile + autotune cost, not as a result.

Writes a run directory through qbench.store into --out (env.json, results.jsonl, results.csv) and the
printed table as table.txt. Without a GPU it runs a tiny smoke version through the interpreter.

Usage: PYTHONPATH=. python3 scripts/gpu_grouped_tma.py --out DIR [--dtypes fp16,bf16]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

if "TRITON_INTERPRET" not in os.environ and shutil.which("nvidia-smi") is None:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU smoke run: must be set before triton is imported

import torch  # noqa: E402

from kernels import grouped_gemm as gg  # noqa: E402
from kernels import grouped_gemm_tma as tma  # noqa: E402
from qbench import store, units  # noqa: E402
from qbench.timing import PhaseTimer, time_fn  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
D, H, ROWS, R = (1024, 4096, 16384, 4) if GPU else (64, 48, 150, 2)  # CPU: interpreter-sized smoke run
E_GROUPS = (16, 32, 64) if GPU else (3,)
# Relative to the largest |reference| entry: both kernels sum exact 16-bit products in fp32, the
# reference too; what differs is summation order (K up to 4096) and the final rounding to 16 bits.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPE_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    name: str
    K: int
    N: int
    groups: int
    transposed: bool
    bias: bool
    sources: int = R  # segments per group (1: expert-major rows)


def cases(dtype) -> list[Case]:
    """a-d in every dtype; e in fp16 only (how time scales with the group count does not depend on
    the dtype, and each group count compiles its own kernels: this keeps the script under 4 minutes)."""
    fp16 = dtype == torch.float16
    e = [Case(f"e fwd x@w1 G={g}", D, H, g, False, True) for g in E_GROUPS] if fp16 else []
    f = [Case("f a, expert-major", D, H, 8, False, True, 1),
         Case("f d, expert-major", H, D, 8, True, False, 1)] if fp16 else []
    return [Case("a fwd x@w1", D, H, 8, False, True), Case("b fwd act@w2", H, D, 8, False, True),
            Case("c dgrad dy@w2^T", D, H, 8, True, False), Case("d dgrad dpre@w1^T", H, D, 8, True, False), *e, *f]


def _counts(groups: int, gen, sources: int = R) -> torch.Tensor:
    """Rows per segment [R * G], source-major. Expert popularity is uneven (softmax of N(0, 0.6^2)
    logits: the busiest expert gets ~2-3x the rows of the idlest), each source draws its own rows.
    sources = 1: the same draw with each group's R segments merged into one (expert-major rows)."""
    p = torch.softmax(torch.randn(groups, generator=gen) * 0.6, 0)
    per_source = [torch.multinomial(p, ROWS // R, True, generator=gen).bincount(minlength=groups)
                  for _ in range(R)]
    return torch.cat(per_source) if sources == R else torch.stack(per_source).sum(0)


def make_inputs(case: Case, dtype, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    counts = _counts(case.groups, gen, case.sources)
    G, K, N, T = case.groups, case.K, case.N, int(counts.sum())
    new = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)  # noqa: E731
    # w [G, K, N]; the input-gradient cases use the transpose view of a [G, N, K] weight, as autograd does
    w = new(G, N, K, scale=K**-0.5).transpose(1, 2) if case.transposed else new(G, K, N, scale=K**-0.5)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(DEV)
    return dict(x=new(T, K), w=w, offsets=offsets, b=new(G, N) if case.bias else None,
                y_tma=torch.empty(T, N, device=DEV, dtype=dtype), y_ptr=torch.empty(T, N, device=DEV, dtype=dtype),
                y_dense=torch.empty(T, N, device=DEV, dtype=dtype), rows=T, empty=int((counts == 0).sum()))


@contextlib.contextmanager
def grouped_tma(on: bool):
    """QBENCH_GROUPED_TMA for the calls inside (read by kernels/grouped_gemm.py at every call)."""
    old = os.environ.get("QBENCH_GROUPED_TMA")
    os.environ["QBENCH_GROUPED_TMA"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["QBENCH_GROUPED_TMA"]
        else:
            os.environ["QBENCH_GROUPED_TMA"] = old


def calls(inp: dict) -> dict:
    """name -> zero-argument call. On a GPU the TMA kernel runs through the real dispatch of
    grouped_matmul_forward (the caller holds grouped_tma(True)); the interpreter has no device
    capability to dispatch on, so the CPU smoke run launches it directly."""
    x, w, off, b = inp["x"], inp["w"], inp["offsets"], inp["b"]
    fwd = lambda out: gg.grouped_matmul_forward(x, w, off, b, backend="triton", out=out)  # noqa: E731
    return {"tma": (lambda: fwd(inp["y_tma"])) if GPU else (lambda: tma.launch_fwd(x, w, off, b, inp["y_tma"])),
            "pointer": lambda: fwd(inp["y_ptr"]),
            "dense": lambda: torch.matmul(x, w[0], out=inp["y_dense"])}


def _errors(got, want) -> tuple[float, float]:
    """(max abs error, max abs error / max |want|)."""
    err = float((got.float() - want.float()).abs().max())
    return err, err / max(float(want.float().abs().max()), 1e-6)


def _first_calls(inp: dict) -> tuple[dict, str]:
    """Wall clock of each kernel's first call (compile + autotune happen on the host) and the
    configs the autotuner picked."""
    fns, timer, picked = calls(inp), PhaseTimer(device="cpu"), []
    for name, on, kernel in (("tma", True, tma._grouped_fwd_tma_kernel), ("pointer", False, gg._grouped_fwd_kernel)):
        with grouped_tma(on), timer.phase(name):
            fns[name]()
            if GPU:
                torch.cuda.synchronize()
        picked.append(f"{name} {_config_text(getattr(kernel, 'best_config', None))}")
    return {f"{k}_first_call_ms": v[0] for k, v in timer.results_ms().items()}, "; ".join(picked)


def _config_text(config) -> str:
    """BMxBNxBK/stages/warps of an autotuner pick."""
    if config is None:
        return "n/a"
    kw = config.kwargs
    return f"{kw['BM']}x{kw['BN']}x{kw['BK']} s{config.num_stages} w{config.num_warps}"


def check(case: Case, dtype, inp: dict) -> tuple[dict, str | None, str]:
    """First calls, then errors against the reference and each other: (metrics, error, configs)."""
    x, w, off, b = inp["x"], inp["w"], inp["offsets"], inp["b"]
    if GPU and not tma.supported(x, w, off, inp["y_tma"], b):
        return {}, "tma.supported() is False: the TMA kernel would not run for this case", ""
    first, picked = _first_calls(inp)
    ref = gg.grouped_matmul_reference(x, w, off, b)
    (tma_abs, tma_rel), (ptr_abs, ptr_rel) = _errors(inp["y_tma"], ref), _errors(inp["y_ptr"], ref)
    metrics = {**first, "tma_max_abs_err": tma_abs, "tma_rel_err": tma_rel, "pointer_max_abs_err": ptr_abs,
               "pointer_rel_err": ptr_rel, "tma_vs_pointer_rel_err": _errors(inp["y_tma"], inp["y_ptr"])[1]}
    bad = [k for k in ("tma_rel_err", "pointer_rel_err", "tma_vs_pointer_rel_err") if metrics[k] > TOL[dtype]]
    error = f"{', '.join(bad)} above {TOL[dtype]}: " + str({k: metrics[k] for k in bad}) if bad else None
    return metrics, error, picked


def timings(case: Case, inp: dict) -> tuple[dict, dict]:
    """Median ms (and samples) of the TMA kernel, the pointer kernel and the dense yardstick."""
    fns, metrics, samples = calls(inp), {}, {}
    flops = 2.0 * inp["rows"] * case.K * case.N  # over the real rows, no padding counted
    for name, on in (("tma", True), ("pointer", False), ("dense", True)):
        with grouped_tma(on):
            t = time_fn(fns[name], device=DEV, flush_l2=True, **({} if GPU else {"repeat": 2}))
        metrics[f"{name}_ms"], metrics[f"{name}_tflops"] = t.median, flops / (t.median * 1e9)
        samples[f"{name}_ms"] = t.samples_ms
    metrics["speedup_tma"] = metrics["pointer_ms"] / metrics["tma_ms"]
    return metrics, samples


ABS_ERROR = "abs. error"  # no such constant in qbench.units: an informative unit for compare


def _units(metrics: dict) -> dict:
    suffix = {"_ms": units.MS, "_tflops": units.TFLOPS, "_rel_err": units.REL_ERROR, "_abs_err": ABS_ERROR,
              "speedup_tma": units.SPEEDUP}
    return {k: next(u for end, u in suffix.items() if k.endswith(end)) for k in metrics}


def _params(case: Case, dtype, inp: dict) -> dict:
    return {"shape": case.name, "dtype": DTYPE_NAME[dtype], "groups": case.groups, "segments_per_group": case.sources,
            "rows": inp["rows"], "empty_segments": inp["empty"], "K": case.K, "N": case.N,
            "w_layout": "transposed" if case.transposed else "plain", "bias": case.bias}


def _seed(case: Case) -> int:
    """Same seed for cases of one shape, so that an expert-major case draws the row counts of its
    source-major twin."""
    return case.K * 7 + case.N * 3 + case.groups * 11 + int(case.transposed)


def run_all(dtypes: list) -> tuple[list[dict], list[str]]:
    """Check every case first (stop on any mismatch), then time them all; records + config notes."""
    plan = [(case, dtype) for dtype in dtypes for case in cases(dtype)]
    inputs = {key: make_inputs(key[0], key[1], seed=_seed(key[0])) for key in plan}
    checked = {key: check(*key, inputs[key]) for key in plan}
    configs = [f"{c.name} {DTYPE_NAME[d]}: {picked}" for (c, d), (_, _, picked) in checked.items()]
    if any(err for _, err, _ in checked.values()):
        return [store.make_record("grouped_gemm", _params(c, d, inputs[(c, d)]), m, units=_units(m),
                                  status="error" if err else "ok", error=err, device=DEV)
                for (c, d), (m, err, _) in checked.items()], configs
    records = []
    for (case, dtype), (first, _, _) in checked.items():
        metrics, samples = timings(case, inputs[(case, dtype)])
        metrics.update(first)
        records.append(store.make_record("grouped_gemm", _params(case, dtype, inputs[(case, dtype)]), metrics,
                                         units=_units(metrics), samples=samples, device=DEV))
    return records, configs


def report(records: list[dict], configs: list[str], out: Path) -> None:
    from rich.console import Console

    from qbench.report import records_table

    metrics = ["tma_ms", "pointer_ms", "dense_ms", "tma_tflops", "pointer_tflops", "dense_tflops", "speedup_tma",
               "tma_rel_err", "tma_first_call_ms", "pointer_first_call_ms"]
    console = Console(record=True, width=220)
    name = torch.cuda.get_device_name() if GPU else "CPU (interpreter smoke run; times mean nothing)"
    console.print(records_table(records, ["shape", "dtype", "rows", "w_layout"], metrics,
                                title=f"grouped GEMM, TMA vs pointer kernel, {name}"))
    console.print("first_call_ms: wall clock of the first call (Triton compile + autotune), a note, not a result")
    console.print("\n".join(configs))
    (out / "table.txt").write_text(console.export_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="run directory to write (must be empty)")
    parser.add_argument("--dtypes", default="fp16,bf16", help="comma list of fp16, bf16 (default both)")
    args = parser.parse_args(argv)
    dtypes = [d for d, name in DTYPE_NAME.items() if name in args.dtypes.split(",")]
    if not dtypes:
        parser.error(f"--dtypes must name fp16 and/or bf16, got {args.dtypes!r}")
    from qbench.env import capture_env

    writer = store.RunWriter(args.out, capture_env(sys.argv, {"D": D, "H": H, "rows": ROWS, "R": R}))
    records, configs = run_all(dtypes)
    with writer:
        for rec in records:
            writer.write(rec)
    report(records, configs, args.out)
    failed = [r for r in records if r["status"] != "ok"]
    for rec in failed:
        print(f"MISMATCH {rec['case']}: {rec['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
