"""`qbench switchback`: int8 SwitchBack matmuls and quantizers against the 16-bit linear layer.

For each (batch_size = M tokens, dim_in = K, dim_out = N) the bench times every component of the
original bitsandbytes benchmark (keys and totals named exactly as in its info.jsonl; see
../shared reference switchback.md), adds speed-ups, % time saved, throughput of every component, the
relative error of each int8 matmul against the 16-bit result, the module-level forward+backward of
SwitchBackLinear against nn.Linear, and peers: fp8 SwitchBack (the fp8 form of SwitchBack's kernels,
rowwise scales; and the same products through torch._scaled_mm) and cuBLAS int8 (torch._int_mm + a scale
epilogue). Peers live in benches/switchback/peers.py.

Correctness comes first: quantizers are compared with their references and every int8 matmul with
the worst-case quantization bound on a sample of rows; a failure gives an "error" record, untimed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from qbench import store
from qbench.benches.switchback import components as comp
from qbench.benches.switchback import modules, peers
from qbench.migration.switchback import shapes, tidy, where
from qbench.modes import resolved_execs
from qbench.telemetry import GpuReadings
from qbench.timing import backward_thread

BENCH = "switchback"
# The seed's (dim_in, dim_out) up-projections; each also runs transposed (the down-projection).
# (dim_in, dim_out, wm as the seed records it: 6144 = round(1408 * 4.3637), 8192 = round(1664 * 4.9231))
SEED_PAIRS = ((1024, 4096, 4), (1280, 5120, 4), (1408, 5632, 4), (1408, 6144, 4.3637), (1664, 6656, 4),
              (1664, 8192, 4.9231), (2048, 8192, 4), (4096, 16384, 4), (8096, 32384, 4))
GPU_BATCHES = tuple(2**i for i in range(10, 18))  # 1024 ... 131072 tokens, as the original
CPU_DIMS = (64, 96)
CPU_BATCHES = (64, 256)
VARIANTS = ("global", "rowwise", "fp8", "fp8_all", "fp8_cublas", "int8_cublas", "module", "torchao")
TIME_BUDGET_MS = {"cuda": 100.0, "cpu": 5.0}  # per component: enough repeats for stable medians
MAX_SAMPLES = 50  # raw samples kept per total (keeps a committed run small)


@dataclass(frozen=True)
class SwitchbackConfig:
    dims: tuple[int, ...] | None = None
    pairs: tuple[tuple[int, int], ...] | None = None
    wm: float = 4.0
    batch_sizes: tuple[int, ...] | None = None
    dtype: str = "fp16"
    variants: tuple[str, ...] = VARIANTS
    repeat: int | None = None
    device: str = "auto"
    execs: tuple[str, ...] | None = None  # module-level execution modes; None: all the device supports
    backward_threads: tuple[str, ...] = ("device",)  # qbench.timing.backward_thread for the module steps
    trace_dir: str | None = None  # also profile 3 eager steps of each module after its timing (modules._trace)


@dataclass(frozen=True)
class Shape:
    batch_size: int
    dim_in: int
    dim_out: int
    wm: float
    switch: bool
    backward_thread: str = "device"  # the thread autograd runs the module steps' backward on

    def params(self, dtype: str) -> dict:
        return {"batch_size": self.batch_size, "dim_in": self.dim_in, "dim_out": self.dim_out,
                "wm": self.wm, "switch": self.switch, "dtype": dtype, "backward_thread": self.backward_thread}


def resolve(config: SwitchbackConfig) -> SwitchbackConfig:
    """Fill the device and the device-dependent defaults (seed sweep on a GPU, small on the CPU)."""
    from qbench.env import usable_device
    from qbench.errors import QbenchUsageError
    from qbench.traces import check_trace_dir

    check_trace_dir(config.trace_dir)
    if config.trace_dir and not {"module", "torchao"} & set(config.variants):
        raise QbenchUsageError("--trace profiles the module steps: add module to --variants")
    device = usable_device(config.device)
    batches = config.batch_sizes or (GPU_BATCHES if device == "cuda" else CPU_BATCHES)
    dims = config.dims if config.dims or config.pairs else (None if device == "cuda" else CPU_DIMS)
    execs = resolved_execs(config.execs, device)
    config = replace(config, device=device, batch_sizes=batches, dims=dims, execs=execs)
    _check_widths(config)
    return config


def _check_widths(config: SwitchbackConfig) -> None:
    """--wm times each --dims must give a layer width of at least 1 (a 0-wide layer has nothing to time)."""
    from qbench.errors import QbenchUsageError
    from qbench.options import MAX_SIZE

    for dim_in, dim_out, _, _ in _pairs(config):
        if not 1 <= dim_out <= MAX_SIZE:
            width = dim_out if dim_out < 1 else f"over {MAX_SIZE}"
            raise QbenchUsageError(f"--wm {config.wm} makes the {dim_in} -> {width} layer; choose --wm so that "
                                   f"--wm x dim is between 1 and {MAX_SIZE}")


def _pairs(config: SwitchbackConfig) -> list[tuple[int, int, float, bool]]:
    """(dim_in, dim_out, wm, switch): up-projection then its transpose, per dim or pair."""
    if config.pairs:
        base = [(i, o) for i, o in config.pairs]
        return [(i, o, round(max(i, o) / min(i, o), 4), i > o) for i, o in base]
    wm = int(config.wm) if float(config.wm).is_integer() else config.wm
    ups = [(d, round(config.wm * d), wm) for d in config.dims] if config.dims else list(SEED_PAIRS)
    return [p for i, o, r in ups for p in ((i, o, r, False), (o, i, r, True))]


def plan(config: SwitchbackConfig) -> list[Shape]:
    """Every shape, once per backward thread (each a whole record: the kernels are timed again beside the
    modules, so every record's ratios come from one stretch of the machine's time)."""
    return [Shape(m, i, o, wm, switch, thread) for m in config.batch_sizes for i, o, wm, switch in _pairs(config)
            for thread in config.backward_threads]


def pending(config: SwitchbackConfig, done: frozenset[str] = frozenset()) -> list[Shape]:
    """The planned shapes whose record (case id) is not in `done` (--resume: what a run still lacks)."""
    return [shape for shape in plan(config) if store.case_id(shape.params(config.dtype)) not in done]


def run(config: SwitchbackConfig, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """The records of each pending shape, in plan order (the store writes each as it comes): one per
    variant, exec and timing (qbench/migration/switchback.py), or one error or skipped record."""
    for shape in pending(config, done):
        yield from measure(shape, config)


def measure(shape: Shape, config: SwitchbackConfig) -> list[dict]:
    params = shape.params(config.dtype)
    note = comp.memory_note(shape, config)
    if note:
        return [store.make_record(BENCH, params, status="skipped", error=note, device=config.device)]
    try:
        ops = comp.Operands.make(shape, config)
        relerrs = comp.relative_errors(ops, config.variants)
        failure = comp.check(ops, config.variants) or comp.error_gate(relerrs)
        if failure:
            return [store.make_record(BENCH, params, status="error", error=failure, device=config.device)]
        budget = config.repeat is None and TIME_BUDGET_MS[config.device] or None
        readings = GpuReadings(config.device)  # the clock and power the components ran at
        timings = comp.time_all(ops, config.variants, repeat=config.repeat, budget_ms=budget, observe=readings)
        module_metrics, module_samples, failure = ({}, {}, None)
        if {"module", "torchao"} & set(config.variants):  # torchao's layer is timed beside the modules
            with backward_thread(shape.backward_thread):
                module_metrics, module_samples, failure = modules.measure(
                    ops, config.execs, config.variants, repeat=config.repeat, budget_ms=budget,
                    trace=(config.trace_dir, trace_label(shape, config.dtype)) if config.trace_dir else None)
        if failure:
            return [store.make_record(BENCH, params, status="error", error=failure, device=config.device)]
        metrics = derive(shape, timings, relerrs, config)
        metrics.update(readings.metrics("kernels"))
        metrics.update(module_metrics)
        metrics.update(modules.derive(metrics))
    except comp.OutOfMemory as exc:
        return [store.make_record(BENCH, params, status="skipped", error=str(exc), device=config.device)]
    except RuntimeError as exc:  # torch.OutOfMemoryError included: one shape fails, the sweep goes on
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        return [store.make_record(BENCH, params, status="error", error=error, device=config.device)]
    finally:
        comp.release()
    samples = {k: total_samples(timings, comp.TOTALS[k]) for k in comp.TOTALS if k in metrics}
    samples.update({k: v[:MAX_SAMPLES] for k, v in module_samples.items()})
    metrics["repeat"] = min(len(t.samples_ms) for t in timings.values())  # the seed's key: timed calls per key
    return tidy_records(params, metrics, samples, config.device)


# (variant, exec, timing) of the record a measured shape writes last: the 16-bit kernel sums, which every
# shape times; a shape whose records a crash cut short lacks it, so --resume measures it again (finished)
LAST = ("16bit", "eager", "per_kernel")


def tidy_records(params: dict, metrics: dict, samples: dict, device: str) -> list[dict]:
    """The tidy records of one measured shape (qbench/migration/switchback.py), LAST last."""
    records = [store.make_record(BENCH, tidy_params, tidy_metrics, samples=tidy_samples, device=device)
               for tidy_params, tidy_metrics, tidy_samples in tidy(params, metrics, samples)]
    return sorted(records, key=lambda record: where(record) == LAST)  # stable: the others keep their order


def finished(records: list[dict], done: tuple[str, ...]) -> frozenset[str]:
    """The shapes (store.measured_id) of a run that --resume keeps: every record's status in `done`, and a
    measured shape's LAST record among them (a crash between a shape's records leaves it out)."""
    from qbench.metrics import FIELDS

    return frozenset(store.measured_id(group[0], FIELDS) for group in shapes(records)
                     if all(r["status"] in done for r in group)
                     and any(where(r) in (LAST, (None, None, None)) for r in group))


def trace_label(shape: Shape, dtype: str) -> str:
    """The end of a shape's trace file names (each starts with its layer): M x in x out, dtype, backward thread."""
    return f"{shape.batch_size}x{shape.dim_in}x{shape.dim_out}-{dtype}-{shape.backward_thread}"


def total_samples(timings: dict, keys: tuple[str, ...]) -> list[float]:
    """Samples of a total: the i-th samples of its components summed (repeats are independent)."""
    if not all(k in timings for k in keys):
        return []
    n = min(MAX_SAMPLES, *(len(timings[k].samples_ms) for k in keys))
    return [sum(timings[k].samples_ms[i] for k in keys) for i in range(n)]


def derive(shape: Shape, timings: dict, relerrs: dict, config: SwitchbackConfig) -> dict:
    """Medians, the seed's totals, speed-ups, % saved, throughput, errors and the roofline fraction."""
    m = {k: t.median for k, t in timings.items()}
    for total, keys in comp.TOTALS.items():
        if all(k in m for k in keys):
            m[total] = sum(m[k] for k in keys)
    base = m["time_standard"]
    for name in ("global", "rowwise", "fp8", "fp8_all", "fp8_cublas", "int8_cublas"):
        if f"time_{name}" in m:
            m[f"speedup_{name}"] = base / m[f"time_{name}"]
            if name in ("global", "rowwise"):
                m[f"pct_saved_{name}"] = 100.0 * (base - m[f"time_{name}"]) / base
    m.update(comp.throughputs(shape, m))
    m.update(peers.twin_ratios(m))
    m.update(relerrs)
    fraction = comp.roofline_fraction(shape, m, config)
    if fraction is not None:
        m["roofline_fraction"] = fraction
    return m


def measured_id(record: dict) -> str:
    """The shape a record was measured at: its params without variant, exec and timing."""
    from qbench.metrics import FIELDS

    return store.measured_id(record, FIELDS)
