"""Usage errors of `qbench moe`, found before any process starts or any record is written: the one
place where a resolved configuration is checked (QbenchUsageError: one line, exit 2)."""

from __future__ import annotations

from qbench.benches.moe.config import MoEBenchConfig
from qbench.errors import QbenchUsageError
from qbench.traces import check_trace_dir


def validate_here(config: MoEBenchConfig) -> None:
    """validate(config) against the GPUs this process may spawn ranks on (unknown under torchrun)."""
    from qbench import dist

    validate(config, dist.visible_gpus() if config.device == "cuda" and dist.torchrun_env() is None else None)


def validate(config: MoEBenchConfig, visible_gpus: int | None = None) -> None:
    """visible_gpus: GPUs this process may spawn ranks on (None: not known, e.g. under torchrun)."""
    if config.device == "cuda" and visible_gpus is not None and config.world_size > visible_gpus:
        raise QbenchUsageError(f"--world-size {config.world_size} needs {config.world_size} GPUs but "
                               f"{visible_gpus} are visible; lower it or use --device cpu")
    if config.execs and "graph" in config.execs and config.device != "cuda":
        raise QbenchUsageError("--exec graph needs a CUDA device; on the CPU use eager or compile")
    if config.backend == "nccl" and config.device != "cuda":
        raise QbenchUsageError("--backend nccl needs --device cuda; use gloo on the CPU")
    for L in config.num_local_experts:
        if config.top_k > L * config.world_size:
            raise QbenchUsageError(f"--top-k {config.top_k} exceeds the {L * config.world_size} experts")
    if config.model == "attn-moe" and config.samples % config.batch_size:
        raise QbenchUsageError(f"--samples {config.samples} is not a multiple of --batch-size {config.batch_size}")
    if config.model == "attn-moe" and config.model_dim % 64:
        raise QbenchUsageError(f"--model attn-moe needs --model-dim divisible by 64, not {config.model_dim}")
    _validate_routings(config)
    _validate_blocks(config)
    _validate_tutel(config)
    _validate_gemms(config)
    check_trace_dir(config.trace_dir)
    if config.kernels is not None:
        _validate_kernels(config)


def _validate_routings(config: MoEBenchConfig) -> None:
    """Every --routing parses, and a trace file has rows of top_k valid expert ids."""
    from qbench.layers.moe.routing import load_trace, parse_routing

    for text in config.routings:
        try:
            spec = parse_routing(text)
            if spec.kind == "trace":
                for L in config.num_local_experts:
                    load_trace(spec.trace, config.top_k, L * config.world_size)
        except UnicodeDecodeError:
            raise QbenchUsageError(f"--routing {text}: the trace file is not text (a trace has a row of top_k "
                                   "expert ids per token)") from None
        except ValueError as exc:
            raise QbenchUsageError(f"--routing: {exc}") from None


def _validate_gemms(config: MoEBenchConfig) -> None:
    """--gemm triton runs Triton kernels: a GPU, or the interpreter (else every case fails at run time)."""
    from kernels._common import interpreting

    if "triton" in config.gemms and config.device != "cuda" and not interpreting():
        raise QbenchUsageError("--gemm triton needs a CUDA GPU; on the CPU use --gemm auto, torch or reference")


def _validate_blocks(config: MoEBenchConfig) -> None:
    from qbench.layers.moe.routing import parse_routing

    if any(p is not None for p in config.localities):
        if any(not 0.0 <= p <= 1.0 for p in config.localities):
            raise QbenchUsageError("--locality values are probabilities: give numbers in [0, 1]")
        bad = [r for r in config.routings if parse_routing(r).kind not in ("randn", "uniform")]
        if bad:
            raise QbenchUsageError(f"--locality chooses the experts itself; it works with --routing randn or "
                                   f"uniform, not {bad[0]}")
        if min(config.num_local_experts) < config.top_k:
            raise QbenchUsageError(f"--locality needs --num-local-experts >= --top-k {config.top_k} (a token's "
                                   "k distinct experts may all live on its own rank)")
    if config.transport.startswith("symm") and config.backend != "nccl":
        raise QbenchUsageError(f"--transport {config.transport} needs CUDA GPUs with NCCL; use --transport auto")


def _validate_tutel(config: MoEBenchConfig) -> None:
    """--variant tutel: Tutel importable, and only what Tutel's layer does (its gate routes; no replication)."""
    if "tutel" not in config.variants:
        return
    from qbench.benches.moe.tutel import tutel_info
    from qbench.layers.moe.routing import parse_routing

    if tutel_info() is None:
        raise QbenchUsageError("--variant tutel needs Tutel importable: pip install --no-build-isolation --no-deps "
                               "--target DIR <a tutel checkout>, then put DIR on PYTHONPATH")
    if any(p is not None for p in config.localities) or any(
            parse_routing(r).kind not in ("randn", "rand-skew") for r in config.routings):
        raise QbenchUsageError("--variant tutel routes with Tutel's gate: use --routing randn or rand-skew, "
                               "no --locality")
    if any(config.replicate_hot) or config.model != "layer":
        raise QbenchUsageError("--variant tutel times Tutel's layer alone: no --replicate-hot, --model layer")


def _validate_kernels(config: MoEBenchConfig) -> None:
    """--kernels grouped: the TMA kernel takes fp16 / bf16, and the Triton kernels need a GPU (or the
    interpreter, TRITON_INTERPRET=1, for a smoke run on the CPU)."""
    from kernels._common import interpreting

    if config.device != "cuda" and not interpreting():
        raise QbenchUsageError(f"--kernels {config.kernels} needs a CUDA GPU (on the CPU: TRITON_INTERPRET=1, "
                               "a smoke run whose times mean nothing)")
    if config.dtype not in ("fp16", "bf16"):
        raise QbenchUsageError(f"--kernels {config.kernels} times 16-bit kernels; use --dtype fp16 or bf16")
