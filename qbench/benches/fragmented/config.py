"""`qbench fragmented`: what a run sweeps. Square sizes x batch sizes x fragment counts x tasks x
dtypes x execution modes; variants "fragmented" and "blockdiag" (N blocks) per fragment count,
"dense" (nn.Linear, same bias setting) and "lowrank" (rank c = in/32, the layer's own low-rank path)
once per size/batch/task (fragments = 0).
Tasks (the `task` param): "train" (model.train(), soft selection, full Adam step), "eval" (model.eval():
hard selection, still with autograd and the Adam step, as the seed's "Inference"), "inference"
(torch.inference_mode(), forward only).
Execution modes (the `exec` param): "eager", "compile" (torch.compile(fullgraph=True), inductor,
static shapes) and "graph" (forward + loss + backward, or the inference forward, captured into one
CUDA graph; GPU only).
Backward threads (the `backward_thread` param, qbench.timing.backward_thread): "device" (PyTorch's default)
or "calling"; train and eval steps in eager and compiled mode run with each one asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qbench.env import usable_device
from qbench.errors import QbenchUsageError
from qbench.metrics.fragmented import BENCH, TASKS, VARIANTS  # noqa: F401  (the package exports them)
from qbench.modes import resolved_execs

BASELINES = ("dense", "blockdiag", "lowrank")
GPU_DEFAULTS = {"sizes": (2048, 4096, 8192), "batch_sizes": (1, 8, 16), "fragments": (2, 8, 32, 128),
                "steps": 50, "warmup": 10}  # the seed's sweep; it took the mean of 100 steps
CPU_DEFAULTS = {"sizes": (256,), "batch_sizes": (1, 8), "fragments": (2, 8), "steps": 3, "warmup": 1}


@dataclass(frozen=True)
class FragmentedConfig:
    sizes: tuple[int, ...] | None = None  # square in = out; None: GPU or CPU default
    batch_sizes: tuple[int, ...] | None = None
    fragments: tuple[int, ...] | None = None
    tasks: tuple[str, ...] = TASKS
    baselines: tuple[str, ...] = BASELINES
    dtypes: tuple[str, ...] = ("fp32",)
    bias: bool = False
    steps: int | None = None  # timed training steps (or forward calls) per configuration
    warmup: int | None = None
    cuda_graph: bool = True  # also time the eager forward as a replayed CUDA graph (GPU only)
    device: str = "auto"
    seed: int = 0
    execs: tuple[str, ...] | None = None  # None: all the device supports (GPU: all three; CPU: eager)
    backward_threads: tuple[str, ...] = ("device",)  # qbench.timing.backward_thread: device, calling
    trace_dir: str | None = None  # also profile 3 steps of each eager configuration, traces here (steps.trace)


@dataclass(frozen=True, kw_only=True)
class Case:
    size: int  # square in = out features
    batch: int
    variant: str  # VARIANTS
    task: str  # TASKS
    fragments: int  # N (0 for dense and lowrank)
    dtype: str
    exec: str = "eager"
    backward_thread: str = "device"

    def params(self) -> dict:
        return {"in_features": self.size, "out_features": self.size, "batch_size": self.batch,
                "variant": self.variant, "task": self.task, "fragments": self.fragments, "dtype": self.dtype,
                "exec": self.exec, "backward_thread": self.backward_thread}


def resolve(config: FragmentedConfig) -> FragmentedConfig:
    """Fill the defaults for the device and check that every size fits every fragment count and that the trace
    directory can be made."""
    from qbench.traces import check_trace_dir

    check_trace_dir(config.trace_dir)
    device = usable_device(config.device)
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    config = replace(config, device=device, **{k: v for k, v in defaults.items() if getattr(config, k) is None})
    execs = resolved_execs(config.execs, device)
    for size in config.sizes:
        if size < 32:
            raise QbenchUsageError(f"size {size} is below 32: the low-rank path has in/32 features; use >= 32")
        bad = [n for n in config.fragments if size % n]
        if bad:
            raise QbenchUsageError(f"size {size} is not divisible by --fragments {bad[0]}; "
                                   "every fragment count must divide every size")
    return replace(config, execs=execs)


def plan(config: FragmentedConfig) -> list[Case]:
    """Every configuration, in the order the seed printed them (per size and batch: baselines first),
    each in every execution mode."""
    cases = []
    for dtype in config.dtypes:
        for size in config.sizes:
            for batch in config.batch_sizes:
                for task in config.tasks:
                    cases += [Case(size=size, batch=batch, variant=variant, task=task, fragments=n, dtype=dtype,
                                   exec=ex, backward_thread=thread)
                              for variant, n in _variants(config) for ex in config.execs
                              for thread in _threads(config, task, ex)]
    return cases


def _variants(config: FragmentedConfig) -> list[tuple[str, int]]:
    """(variant, fragments) in the seed's order: the dense and low-rank baselines, then per fragment count
    FragmentedLinear and its block-diagonal baseline."""
    out = [(b, 0) for b in ("dense", "lowrank") if b in config.baselines]
    for n in config.fragments:
        out += [("fragmented", n)] + ([("blockdiag", n)] if "blockdiag" in config.baselines else [])
    return out


def pending(config: FragmentedConfig, done: frozenset[str] = frozenset()) -> list[Case]:
    """The planned configurations whose record (case id) is not in `done` (--resume: what a run still lacks)."""
    from qbench.store import case_id

    return [case for case in plan(config) if case_id(case.params()) not in done]


def _threads(config: FragmentedConfig, task: str, exec: str) -> tuple[str, ...]:
    """The backward threads a case runs with: each asked-for one where autograd runs a backward at every step
    (train and eval steps, eager or compiled); elsewhere (inference, a replayed graph) only the first."""
    steps_backward = task != "inference" and exec != "graph"
    return config.backward_threads if steps_backward else config.backward_threads[:1]


def measured_id(record: dict) -> str:
    """One configuration, one record: its case id."""
    return record["case"]
