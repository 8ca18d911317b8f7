"""`qbench moe --kernels grouped`: the grouped GEMM kernels of the expert FFN on one device, the
persistent TMA kernel (kernels/grouped_gemm_tma.py) against the pointer kernel (kernels/grouped_gemm.py,
both through grouped_matmul_forward's `impl`), with a dense matmul of the same FLOPs as a yardstick.

Shapes of one rank at the configured sizes (seed config: d 1024, h 4096, G = 8 local experts,
samples x top_k = 16384 routed rows, arriving from R = 4 source ranks as R x G segments):
  a  forward x @ w1        x [T, d] @ w [G, d, h] + bias    plain w
  b  forward act @ w2      x [T, h] @ w [G, h, d] + bias    plain w
  c  input grad dy @ w2^T  x [T, d] @ w2.transpose(1, 2)     transposed w (a strided view)
  d  input grad @ w1^T     x [T, h] @ w1.transpose(1, 2)     transposed w
  e  shape a with 2G, 4G and 8G groups (fp16 only)
  f  shapes a and d with expert-major rows (one segment per group, the row counts a and d draw;
     fp16 only): what the partial row tiles at the R x G segment ends cost
Rows per segment are uneven and seeded (expert popularity: softmax of N(0, 0.6^2) logits).

Every case is first checked (both kernels against the plain-torch reference and each other); any
mismatch makes every record an error and nothing is timed. Then all three are timed (qbench.timing,
L2 flushed between repeats). The wall clock of each kernel's first call (Triton compile + autotune)
is kept as a note, not a result. Records: bench "grouped_gemm", one per case and variant (tma, pointer,
dense; qbench/metrics/grouped.py), through qbench/migration/grouped.py's tidy().
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench import store
from qbench.dtypes import tolerance
from qbench.metrics.grouped import BENCH
from qbench.migration.grouped import tidy


@dataclass(frozen=True)
class Case:
    name: str
    K: int
    N: int
    groups: int
    transposed: bool
    bias: bool
    sources: int  # segments per group (1: expert-major rows)


def plan(config) -> list[Case]:
    """a-d in every dtype; e and f in fp16 only (how time scales with the group count does not depend
    on the dtype, and each group count compiles its own kernels)."""
    d, h, G, R = config.model_dim, config.hidden_size, config.num_local_experts[0], _sources(config)
    fp16 = config.dtype == "fp16"
    more = (2, 4, 8) if config.device == "cuda" else (2,)  # the interpreter: one more group count
    e = [Case(f"e fwd x@w1 G={G * m}", d, h, G * m, False, True, R) for m in more] if fp16 else []
    f = [Case("f a, expert-major", d, h, G, False, True, 1), Case("f d, expert-major", h, d, G, True, False, 1)]
    return [Case("a fwd x@w1", d, h, G, False, True, R), Case("b fwd act@w2", h, d, G, False, True, R),
            Case("c dgrad dy@w2^T", d, h, G, True, False, R), Case("d dgrad dpre@w1^T", h, d, G, True, False, R),
            *e, *(f if fp16 else [])]


def _sources(config) -> int:
    """Source ranks R whose rows arrive as separate segments: the seed config's 4 on a GPU, 2 on the CPU."""
    return 4 if config.device == "cuda" else 2


def resolve(config):
    """A grouped-GEMM config is a MoEBenchConfig with kernels="grouped" (its sizes are the layer's)."""
    from qbench.benches.moe.config import resolve as resolve_moe

    return resolve_moe(config)


def pending(config, done: frozenset[str] = frozenset()) -> list[Case]:
    """The cases run(config) measures (the grouped bench has no --resume: `done` is empty)."""
    return plan(config)


def measured_id(record: dict) -> str:
    """A case's records (one per variant) are one measurement."""
    from qbench.metrics import FIELDS

    return store.measured_id(record, FIELDS)


def run(config, done: frozenset[str] = frozenset()):
    """The config validated now (usage errors before any record), then its records as run_cases gives them
    (nothing measured until they are read)."""
    from qbench.benches.moe.validate import validate_here

    validate_here(config)
    return run_cases(config)


def run_cases(config):
    """Check every case, then time them (none when any check failed: the cases that passed are then
    recorded as skipped, with the failed ones named); yields one record per case."""
    from qbench.dtypes import torch_dtype

    dtype, rows, R = torch_dtype(config.dtype), config.samples * config.top_k, _sources(config)
    device = "cuda" if config.device == "cuda" else "cpu"
    inputs = {case: make_inputs(case, dtype, rows, R, device, seed=_seed(case)) for case in plan(config)}
    checked = {case: check(case, inp, config.dtype, device) for case, inp in inputs.items()}
    failed = [case.name for case, (_, error) in checked.items() if error]
    for case, (metrics, error) in checked.items():
        samples, status = {}, "error" if error else "ok"
        if not failed:
            timed, samples = timings(case, inputs[case], device)
            metrics = {**timed, **metrics}
        elif not error:  # checked and right, but a record without timings is not a result
            status, error = "skipped", f"not timed: {', '.join(failed)} failed the check"
        params = _params(case, config.dtype, inputs[case])
        for tidy_params, values, kept in tidy(params, metrics, samples) or [(params, {}, {})]:
            yield store.make_record(BENCH, tidy_params, values, samples=kept, status=status, error=error,
                                    device=device)


def _counts(groups: int, rows: int, sources: int, R: int, gen):
    """Rows per segment [R * G], source-major; sources = 1: the same draw with each group's R
    segments merged into one (expert-major rows)."""
    import torch

    p = torch.softmax(torch.randn(groups, generator=gen) * 0.6, 0)
    per_source = [torch.multinomial(p, rows // R, True, generator=gen).bincount(minlength=groups)
                  for _ in range(R)]
    return torch.cat(per_source) if sources == R else torch.stack(per_source).sum(0)


def make_inputs(case: Case, dtype, rows: int, R: int, device: str, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    counts = _counts(case.groups, rows, case.sources, R, gen)
    G, K, N, T = case.groups, case.K, case.N, int(counts.sum())
    new = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(device, dtype)  # noqa: E731
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device)
    # w [G, K, N]; the input-gradient cases use the transpose view of a [G, N, K] weight, as autograd does
    w = new(G, N, K, scale=K**-0.5).transpose(1, 2) if case.transposed else new(G, K, N, scale=K**-0.5)
    out = {name: torch.empty(T, N, device=device, dtype=dtype) for name in ("tma", "pointer", "dense")}
    return dict(x=new(T, K), w=w, offsets=offsets, b=new(G, N) if case.bias else None, out=out, rows=T,
                empty=int((counts == 0).sum()))


def calls(inp: dict) -> dict:
    """name -> zero-argument call returning that kernel's output, written into its own buffer. Only the
    kernel runs inside a call, so a timing holds nothing else."""
    import torch

    from kernels.grouped_gemm import grouped_matmul_forward

    x, w, off, b, out = inp["x"], inp["w"], inp["offsets"], inp["b"], inp["out"]
    fwd = lambda impl: grouped_matmul_forward(x, w, off, b, backend="triton", out=out[impl], impl=impl)  # noqa: E731
    return {"tma": lambda: fwd("tma"), "pointer": lambda: fwd("pointer"),
            "dense": lambda: torch.matmul(x, w[0], out=out["dense"])}


def _reference(inp: dict):
    """The plain-torch result a case's kernels are checked against (calls' layout)."""
    from kernels.grouped_gemm import grouped_matmul_reference

    return grouped_matmul_reference(inp["x"], inp["w"], inp["offsets"], inp["b"])


def check(case: Case, inp: dict, dtype: str, device: str) -> tuple[dict, str | None]:
    """First calls (compile + autotune, wall clock), then errors against the reference and each
    other: (metrics, error or None)."""
    from qbench.timing import PhaseTimer

    fns, timer, outs = calls(inp), PhaseTimer(device="cpu"), {}
    for name in ("tma", "pointer"):
        try:
            with timer.phase(name):
                outs[name] = fns[name]()
                _synchronize(device)
        except ValueError as exc:  # impl="tma" on shapes or a device the TMA kernel does not take
            return {}, str(exc)
    metrics = {f"{k}_first_call_ms": v[0] for k, v in timer.results_ms().items()}
    ref = _reference(inp)
    for name in ("tma", "pointer"):
        metrics[f"{name}_max_abs_err"], metrics[f"{name}_rel_err"] = _errors(outs[name], ref)
    metrics["tma_vs_pointer_rel_err"] = _errors(outs["tma"], outs["pointer"])[1]
    bound = tolerance(dtype).gemm  # relative to the largest |reference| entry
    bad = [k for k in ("tma_rel_err", "pointer_rel_err", "tma_vs_pointer_rel_err") if metrics[k] > bound]
    error = f"{', '.join(bad)} above {bound}: " + str({k: metrics[k] for k in bad}) if bad else None
    return metrics, error


def timings(case: Case, inp: dict, device: str) -> tuple[dict, dict]:
    """Median ms (and samples) of the TMA kernel, the pointer kernel and the dense yardstick."""
    from qbench.timing import time_fn

    fns, metrics, samples = calls(inp), {}, {}
    flops = 2.0 * inp["rows"] * case.K * case.N  # over the real rows, no padding counted
    small = {} if device == "cuda" else {"warmup": 1, "repeat": 2}  # the interpreter: a smoke run
    for name in ("tma", "pointer", "dense"):
        t = time_fn(fns[name], device=device, flush_l2=True, **small)
        metrics[f"{name}_ms"], metrics[f"{name}_tflops"] = t.median, flops / (t.median * 1e9)
        samples[f"{name}_ms"] = list(t.samples_ms)
    metrics["speedup_tma"] = metrics["pointer_ms"] / metrics["tma_ms"]
    return metrics, samples


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _errors(got, want) -> tuple[float, float]:
    """(max abs error, max abs error / max |want|)."""
    err = float((got.float() - want.float()).abs().max())
    return err, err / max(float(want.float().abs().max()), 1e-6)


def _params(case: Case, dtype: str, inp: dict) -> dict:
    return {"shape": case.name, "dtype": dtype, "groups": case.groups, "segments_per_group": case.sources,
            "rows": inp["rows"], "empty_segments": inp["empty"], "K": case.K, "N": case.N,
            "w_layout": "transposed" if case.transposed else "plain", "bias": case.bias}


def _seed(case: Case) -> int:
    """Same seed for cases of one shape, so that an expert-major case draws the row counts of its
    source-major twin."""
    return case.K * 7 + case.N * 3 + case.groups * 11 + int(case.transposed)


def table(records: list[dict]):
    from qbench.report import records_table

    metrics = ["kernel_ms", "tflops", "speedup", "rel_err", "first_call_ms"]
    return records_table(records, ["shape", "dtype", "rows", "w_layout", "variant"], metrics,
                         title="grouped GEMM, TMA vs pointer kernels (first_call_ms: compile + autotune, a note)")
