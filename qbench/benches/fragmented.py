"""`qbench fragmented`: FragmentedLinear against dense and structured baselines.

Sweep: square sizes x batch sizes x fragment counts x modes x dtypes; layers "fragmented" and
"blockdiag" (N blocks) per fragment count, "linear" (dense, same bias setting) and "lowrank"
(rank c = in/32, the layer's own low-rank path) once per size/batch/mode (fragments = 0).
Modes: "train" (model.train(), soft selection, full Adam step), "eval" (model.eval(): hard
selection, still with autograd and the Adam step, as the seed's "Inference"), "inference"
(torch.inference_mode(), forward only).

Measured per record (ms are medians over the timed steps, samples kept):
  forward_ms             the forward call inside a training step (inference: cold-L2 forward calls)
  backward_ms            loss.backward() alone;  optimizer_ms: Adam's step alone
  backward_optimizer_ms  zero_grad + backward + optimizer step: the seed's "Backward time"
  forward_graph_ms       the forward replayed as one CUDA graph (GPU only; no launch overhead)
  peak_memory_mb         torch.cuda.max_memory_allocated over the timed steps (reset after warm-up):
                         parameters, gradients, both Adam moments, input and target, activations saved
                         for backward and kernel temporaries (inference: parameters, input,
                         activations); param_memory_mb and optimizer_state_mb give the fixed parts
  parameters, tflops (useful forward flops / forward_ms), roofline_fraction (GPU with a preset)
Before timing, FragmentedLinear's train, eval and inference outputs are checked against the float64
reference definition (qbench.layers.fragmented.reference_output); a mismatch is an error record.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, replace

from qbench import units
from qbench.benches.fragmented_seed import format_seed  # noqa: F401  (re-exported: `--format seed`)
from qbench.errors import QbenchUsageError
from qbench.store import make_record
from qbench.timing import PhaseTimer, resolve_device, time_fn
from qbench.units import torch_dtype

BENCH = "fragmented"
LAYERS = ("linear", "fragmented", "blockdiag", "lowrank")
BASELINES = ("linear", "blockdiag", "lowrank")
MODES = ("train", "eval", "inference")
DTYPES = ("fp32", "bf16", "fp16")
GPU_DEFAULTS = {"sizes": (2048, 4096, 8192), "batch_sizes": (1, 8, 16), "fragments": (2, 8, 32, 128),
                "steps": 50, "warmup": 10}  # the seed's sweep; it took the mean of 100 steps
CPU_DEFAULTS = {"sizes": (256,), "batch_sizes": (1, 8), "fragments": (2, 8), "steps": 3, "warmup": 1}
# relative error ||out - ref|| / ||ref|| against float64 on the same (rounded) weights and inputs
TOLERANCE = {
    "fp32": 1e-4,  # fp32 accumulation over K <= 16k: ~1e-6; margin for split-K orderings
    "bf16": 3e-2,  # 8-bit mantissa: each of ~4 roundings (scaled input, partial outputs) adds ~4e-3
    "fp16": 5e-3,  # 11-bit mantissa: ~8x tighter than bf16
}
TIE_GAP = 1e-4  # rows whose top-2 fp64 scores are closer than this may legitimately pick either fragment


@dataclass(frozen=True)
class FragmentedConfig:
    sizes: tuple[int, ...] | None = None  # square in = out; None: GPU or CPU default
    batch_sizes: tuple[int, ...] | None = None
    fragments: tuple[int, ...] | None = None
    modes: tuple[str, ...] = MODES
    baselines: tuple[str, ...] = BASELINES
    dtypes: tuple[str, ...] = ("fp32",)
    bias: bool = False
    steps: int | None = None  # timed training steps (or forward calls) per configuration
    warmup: int | None = None
    cuda_graph: bool = True  # also time the forward as a replayed CUDA graph (GPU only)
    device: str = "auto"
    seed: int = 0


@dataclass(frozen=True)
class Case:
    size: int
    batch: int
    layer: str
    mode: str
    fragments: int
    dtype: str

    def params(self) -> dict:
        return {"in_features": self.size, "out_features": self.size, "batch_size": self.batch,
                "layer": self.layer, "mode": self.mode, "fragments": self.fragments, "dtype": self.dtype}


def resolve(config: FragmentedConfig) -> FragmentedConfig:
    """Fill the defaults for the device and check that every size fits every fragment count."""
    device = resolve_device(config.device)
    if config.device == "cuda" and device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise QbenchUsageError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    config = replace(config, device=device, **{k: v for k, v in defaults.items() if getattr(config, k) is None})
    for size in config.sizes:
        if size < 32:
            raise QbenchUsageError(f"size {size} is below 32: the low-rank path has in/32 features; use >= 32")
        bad = [n for n in config.fragments if size % n]
        if bad:
            raise QbenchUsageError(f"size {size} is not divisible by --fragments {bad[0]}; "
                                   "every fragment count must divide every size")
    return config


def plan(config: FragmentedConfig) -> list[Case]:
    """Every configuration, in the order the seed printed them (per size and batch: baselines first)."""
    cases = []
    for dtype in config.dtypes:
        for size in config.sizes:
            for batch in config.batch_sizes:
                for mode in config.modes:
                    cases += [Case(size, batch, b, mode, 0, dtype) for b in ("linear", "lowrank")
                              if b in config.baselines]
                    for n in config.fragments:
                        cases.append(Case(size, batch, "fragmented", mode, n, dtype))
                        if "blockdiag" in config.baselines:
                            cases.append(Case(size, batch, "blockdiag", mode, n, dtype))
    return cases


def build(case: Case, bias: bool, device: str):
    import torch

    from qbench.layers import fragmented as fl

    kw = {"device": device, "dtype": torch_dtype(case.dtype)}
    s = case.size
    if case.layer == "linear":
        return torch.nn.Linear(s, s, bias=bias, **kw)
    if case.layer == "lowrank":
        return fl.LowRankLinear(s, s, s // 32, bias=bias, **kw)
    if case.layer == "blockdiag":
        return fl.BlockDiagonalLinear(s, s, case.fragments, bias=bias, **kw)
    return fl.FragmentedLinear(s, s, case.fragments, s // 32, bias=bias, **kw)


def _relative_error(out, ref, rows=None) -> float:
    diff, ref = out.double() - ref, ref
    if rows is not None:
        diff, ref = diff[rows], ref[rows]
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def gate(model, x, dtype: str) -> tuple[dict, str | None]:
    """Train, eval and inference outputs of a FragmentedLinear against the float64 reference.
    Returns ({rel_error_train, rel_error_eval}, error text or None)."""
    import torch

    from qbench.layers.fragmented import reference_output

    was_training = model.training
    with torch.no_grad():
        scores = model.scores(x).double()
        top2 = scores.topk(min(2, scores.shape[1]), dim=1).values
        clear = (top2[:, 0] - top2[:, -1] >= TIE_GAP) if scores.shape[1] > 1 else None
        soft, hard = reference_output(model, x, hard=False), reference_output(model, x, hard=True)
        errors = {"rel_error_train": _relative_error(model.train()(x), soft),
                  "rel_error_eval": _relative_error(model.eval()(x), hard, clear),
                  "rel_error_inference": _relative_error(model.infer(x), hard, clear)}
    model.train(was_training)
    bad = {k: v for k, v in errors.items() if not v <= TOLERANCE[dtype]}
    if bad:
        name, value = next(iter(bad.items()))
        return errors, f"{name} = {value:.2e} exceeds the {dtype} bound {TOLERANCE[dtype]:.0e}"
    return errors, None


def _sync_and_reset(device: str) -> None:
    import torch

    if device == "cuda":
        gc.collect()  # frees the previous configuration's tensors before the peak is reset
        torch.cuda.synchronize()
        # cuBLAS workspaces are cached per stream and each CUDA-graph capture uses a new side stream:
        # without this, every earlier configuration would leave ~32-64 MB counted in the next peak
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_mb(device: str, baseline: int = 0) -> float | None:
    """Peak allocated MB since the last reset, less `baseline` bytes held before the model existed."""
    import torch

    return (torch.cuda.max_memory_allocated() - baseline) / 2**20 if device == "cuda" else None


def _allocated(device: str) -> int:
    import torch

    return torch.cuda.memory_allocated() if device == "cuda" else 0


def measure_training(model, x, target, steps: int, warmup: int, device: str, baseline: int = 0
                     ) -> tuple[dict, dict]:
    """Training steps (forward, MSE loss, zero_grad, backward, Adam step) timed phase by phase.
    Returns ({phase: [ms per step]}, memory metrics)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters())
    timer = PhaseTimer(device)

    def step() -> None:
        with timer.phase("forward"):
            out = model(x)
        loss = F.mse_loss(out, target)  # outside the phases, as in the seed
        with timer.phase("zero_grad"):
            optimizer.zero_grad()
        with timer.phase("backward"):
            loss.backward()
        with timer.phase("optimizer"):
            optimizer.step()
        timer.next_step()

    for _ in range(warmup):
        step()
    _sync_and_reset(device)
    timer.discard()
    for _ in range(steps):
        step()
    phases = timer.results_ms()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    return phases, {"peak_memory_mb": _peak_mb(device, baseline), "optimizer_state_mb": state / 2**20}


def forward_fn(model, x, mode: str):
    """The forward call of a mode: under inference_mode for 'inference', with autograd otherwise."""
    import torch

    if mode != "inference":
        return lambda: model(x)

    def infer():
        with torch.inference_mode():
            return model(x)

    return infer


def measure_inference(model, x, steps: int, warmup: int, device: str, baseline: int = 0
                      ) -> tuple[dict, dict]:
    """Forward calls under torch.inference_mode(), cold L2 before each (as inside a larger model)."""
    fn = forward_fn(model, x, "inference")
    for _ in range(warmup):
        fn()
    _sync_and_reset(device)
    fn()  # peak memory of one call, before the timer's L2-flush buffer exists
    peak = _peak_mb(device, baseline)
    timing = time_fn(fn, device=device, warmup=1, repeat=steps)
    return {"forward": list(timing.samples_ms)}, {"peak_memory_mb": peak}


def graph_forward_ms(model, x, mode: str, steps: int, device: str) -> list[float] | None:
    """The forward replayed as a CUDA graph (what a training loop gets from graph capture), or None
    on the CPU or when this forward cannot be captured."""
    if device != "cuda":
        return None
    try:
        timing = time_fn(forward_fn(model, x, mode), device=device, warmup=3, repeat=steps, cuda_graph=True)
    except RuntimeError:
        return None
    return list(timing.samples_ms)


def forward_cost(case: Case, selected: int | None) -> tuple[float, float]:
    """(useful flops, minimal HBM bytes) of one forward. Hard selection needs only the selected
    fragments' weights (`selected` distinct fragments) and 1/N of the expert flops per sample."""
    s, b, n = case.size, case.batch, max(case.fragments, 1)
    c, e = s // 32, {"fp32": 4, "bf16": 2, "fp16": 2}[case.dtype]
    io = b * 2 * s  # input and output elements
    if case.layer == "linear":
        flops, weights = 2 * b * s * s, s * s
    elif case.layer == "lowrank":
        flops, weights = 2 * b * 2 * s * c, 2 * s * c
    elif case.layer == "blockdiag":
        flops, weights = 2 * b * s * s / n, s * s / n
    elif case.mode == "train":
        flops, weights = 2 * b * (s * s + 2 * s * c + s), s * s + 2 * s * c + s
    else:
        used = selected if selected is not None else min(b, n)
        flops, weights = 2 * b * (s * s / n + 2 * s * c + s), used * s * s / n + 2 * s * c + s
    return flops, (weights + io) * e


def _roofline(flops: float, moved: float, dtype: str, forward_ms: float, device: str) -> float | None:
    from qbench.model.hardware import current_gpu_preset
    from qbench.model.roofline import floor_ms, roofline_fraction

    hardware = current_gpu_preset(device)
    if hardware is None or not forward_ms:
        return None
    return roofline_fraction(floor_ms(flops, moved, hardware, dtype), forward_ms)


UNITS = {"forward_ms": units.MS, "backward_ms": units.MS, "optimizer_ms": units.MS,
         "backward_optimizer_ms": units.MS, "forward_graph_ms": units.MS, "peak_memory_mb": units.MB,
         "param_memory_mb": units.MB, "optimizer_state_mb": units.MB, "parameters": units.COUNT,
         "tflops": units.TFLOPS, "graph_tflops": units.TFLOPS,
         "roofline_fraction": units.FRACTION_OF_ROOFLINE, "selected_fragments": units.COUNT,
         "rel_error_train": units.REL_ERROR, "rel_error_eval": units.REL_ERROR,
         "rel_error_inference": units.REL_ERROR}


def _median(values) -> float | None:
    from qbench.timing import percentile

    return percentile(values, 50) if values else None


def _phase_metrics(phases: dict) -> tuple[dict, dict]:
    """Medians and samples per phase; backward_optimizer = zero_grad + backward + optimizer per step."""
    samples = {f"{k}_ms": v for k, v in phases.items() if k in ("forward", "backward", "optimizer")}
    if "backward" in phases:
        samples["backward_optimizer_ms"] = [sum(t) for t in zip(
            phases["zero_grad"], phases["backward"], phases["optimizer"])]
    return {k: _median(v) for k, v in samples.items()}, samples


def _inputs(case: Case, device: str, seed: int):
    """Fresh normal inputs and targets (never zeros), and the model, seeded per configuration."""
    import torch

    torch.manual_seed(seed)
    dtype = torch_dtype(case.dtype)
    x = torch.randn(case.batch, case.size, device=device, dtype=dtype)
    target = torch.randn(case.batch, case.size, device=device, dtype=dtype)
    return x, target


def measure(case: Case, config: FragmentedConfig) -> dict:
    """One record: build, gate (FragmentedLinear), time, count."""
    import torch

    device = config.device
    _sync_and_reset(device)
    baseline = _allocated(device)  # anything still held from earlier configurations (normally 0)
    x, target = _inputs(case, device, config.seed)
    model = build(case, config.bias, device)
    metrics: dict = {"parameters": sum(p.numel() for p in model.parameters()),
                     "param_memory_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20}
    selected = None
    if case.layer == "fragmented":
        errors, failure = gate(model, x, case.dtype)
        metrics.update(errors)
        if failure:
            return make_record(BENCH, case.params(), metrics, units=UNITS, status="error", error=failure,
                               device=device)
        if case.mode != "train":
            with torch.no_grad():
                selected = int(model.scores(x).argmax(dim=1).unique().numel())
            metrics["selected_fragments"] = selected
    model.train(case.mode == "train")
    if case.mode == "inference":
        phases, memory = measure_inference(model, x, config.steps, config.warmup, device, baseline)
    else:
        phases, memory = measure_training(model, x, target, config.steps, config.warmup, device, baseline)
    medians, samples = _phase_metrics(phases)
    metrics.update(medians)
    metrics.update(memory)
    graph = graph_forward_ms(model, x, case.mode, config.steps, device) if config.cuda_graph else None
    if graph:
        samples["forward_graph_ms"] = graph
        metrics["forward_graph_ms"] = _median(graph)
    flops, moved = forward_cost(case, selected)
    metrics["tflops"] = flops / metrics["forward_ms"] / 1e9 if metrics.get("forward_ms") else None
    if metrics.get("forward_graph_ms"):
        metrics["graph_tflops"] = flops / metrics["forward_graph_ms"] / 1e9
    metrics["roofline_fraction"] = _roofline(flops, moved, case.dtype, metrics.get("forward_ms"), device)
    return make_record(BENCH, case.params(), metrics, units=UNITS, samples=samples, device=device)


def run(config: FragmentedConfig) -> Iterator[dict]:
    """Records of every planned configuration, as they are measured (config must be resolved)."""
    for case in plan(config):
        try:
            yield measure(case, config)
        except torch_oom_errors() as exc:
            yield make_record(BENCH, case.params(), status="error", device=config.device,
                              error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def torch_oom_errors() -> tuple[type[BaseException], ...]:
    """Errors that fail one configuration, not the sweep (out of memory, a kernel that cannot run)."""
    import torch

    return (torch.cuda.OutOfMemoryError, RuntimeError)
