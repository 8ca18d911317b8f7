"""The frozen configuration of `qbench moe`, its vocabularies, and the device-dependent defaults.

Fields left None by the command (world size, sizes, steps, dtype) and the "auto" device and backend
are filled by `resolve`: every visible GPU (NCCL) and the seed config on a GPU; 2 gloo ranks and
small sizes on the CPU (`CPU_SIZES`), where timings say nothing about GPU performance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qbench.modes import EXECS  # the execution modes (this bench prepares them in its own modes.py)

BENCH = "moe"
GEMMS = ("auto", "triton", "torch", "reference")  # grouped GEMM backends (kernels/grouped_gemm.py)
TRANSPORTS = ("auto", "symm", "symm-fused-ga", "symm-fused", "a2a")  # blocks: qbench/layers/moe/transport.py
# Every mode the device runs: on a GPU all three (a configuration a mode cannot run is a `skipped`
# record with the reason: compile at world size > 1, graph where the shapes follow the routing), on
# the CPU eager (compile there is a smoke test, asked for with --exec).
DEFAULT_EXECS = {"cuda": EXECS, "cpu": ("eager",)}
KERNEL_BENCHES = ("grouped",)  # --kernels: kernel timings instead of the layer (grouped.py)
GPU_SIZES = {"model_dim": 1024, "hidden_size": 4096, "num_steps": 100, "warmup": 10}  # the seed config
CPU_SIZES = {"model_dim": 64, "hidden_size": 128, "samples": 256, "num_steps": 10, "warmup": 2}


@dataclass(frozen=True)
class MoEBenchConfig:
    world_size: int | None  # ranks; None: every visible GPU (2 on the CPU), or torchrun's WORLD_SIZE
    backend: str  # nccl | gloo | auto
    device: str  # cuda | cpu | auto
    dtype: str | None = "fp16"  # fp16 | bf16 | fp32; None: fp16 on a GPU, fp32 on the CPU
    model_dim: int | None = 1024  # None (here and below): the device's default
    hidden_size: int | None = 4096
    samples: int | None = 8192  # tokens per rank; None: batch_size x num_tokens (256 on the CPU)
    batch_size: int = 16
    num_tokens: int = 512  # tokens per sequence
    num_local_experts: tuple[int, ...] = (8,)
    top_k: int = 2
    activation: str = "gelu"
    capacity_factor: float = 0.0
    fp32_gate: bool = False
    a2a_ffn_overlap_degrees: tuple[int, ...] = (1,)
    replicate_hot: tuple[int, ...] = (0,)
    routings: tuple[str, ...] = ("randn",)
    gemms: tuple[str, ...] = ("auto",)
    model: str = "layer"
    num_steps: int | None = 100
    warmup: int | None = 10
    eval: bool = False
    seed: int = 0
    timeout_s: float = 600.0
    trace_dir: str | None = None  # also record a few profiled steps per configuration here
    variants: tuple[str, ...] = ("a2a",)
    block_size: int = 64
    localities: tuple[float | None, ...] = (None,)  # None: the routing kind alone decides
    transport: str = "auto"  # blocks: auto (symm where available, else a2a) | symm[-fused-ga|-fused] | a2a
    kernels: str | None = None  # "grouped": time the grouped GEMM kernels instead of the layer
    execs: tuple[str, ...] | None = None  # eager | compile | graph (modes.py); None: DEFAULT_EXECS[device]
    backward_threads: tuple[str, ...] = ("device",)  # qbench.timing.backward_thread: device, calling


def threads_of(config: MoEBenchConfig, exec: str) -> tuple[str, ...]:
    """The backward threads a mode runs with: each asked-for one where autograd runs the step's backward
    (eager and compiled training steps); a replayed graph and --eval run no autograd: only the first."""
    return config.backward_threads if exec != "graph" and not config.eval else config.backward_threads[:1]


def resolve(config: MoEBenchConfig) -> MoEBenchConfig:
    """Device, backend, world size and the sizes left None, for this machine (QbenchUsageError when
    the device asked for is missing or torchrun's world size contradicts --world-size)."""
    from qbench import dist
    from qbench.env import NO_CUDA
    from qbench.errors import QbenchUsageError

    gpus = dist.visible_gpus() if config.device != "cpu" else 0
    device = config.device if config.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise QbenchUsageError(NO_CUDA)
    backend = config.backend if config.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
    defaults = CPU_SIZES if device == "cpu" else {**GPU_SIZES, "samples": config.batch_size * config.num_tokens}
    sizes = {name: value for name, value in defaults.items() if getattr(config, name) is None}
    return replace(config, device=device, backend=backend, world_size=_world_size(config.world_size, device, gpus),
                   dtype=config.dtype or ("fp32" if device == "cpu" else "fp16"),
                   execs=config.execs or DEFAULT_EXECS[device], **sizes)


def _world_size(given: int | None, device: str, gpus: int) -> int:
    """torchrun's WORLD_SIZE when started by torchrun, else the given size, else every GPU (2 CPU ranks)."""
    from qbench import dist
    from qbench.errors import QbenchUsageError

    env = dist.torchrun_env()
    if env is not None:
        if given is not None and given != env[1]:
            raise QbenchUsageError(f"--world-size {given} differs from torchrun's WORLD_SIZE {env[1]}; drop it")
        return env[1]
    if given is not None:
        return given
    return gpus if device == "cuda" else 2
