"""`qbench switchback --model NAME`: a training step of a transformer block stack whose linear layers
are 16-bit, SwitchBack int8 or fp8 (qbench.layers.transformer), in each execution mode.

One record (bench "switchback_model") per preset x batch size x variant x execution mode; params:
model, batch_size (images or sequences), tokens (per sequence), layers, width, mlp, heads, variant,
exec, dtype. Metrics (ms are medians, their samples kept):
  step_ms          forward + loss + backward + AdamW step (model_steps.py)
  tokens_per_s     batch_size * tokens / step time
  speedup_step     step_ms of 16bit / step_ms, same preset, batch size and execution mode
  linear_ms        forward + backward of the stack's linear layers alone, same mode and shapes
  linear_share     linear_ms / step_ms (see model_steps.py for what it does and does not say)
  speedup_linears  linear_ms of 16bit / linear_ms
  host_ms          CPU time spent issuing one step (steps issued back to back: qbench.timing.host_time)
  sm_clock_mhz_step, power_w_step   the GPU's SM clock and power over the timed steps (medians, NVML;
                   qbench.telemetry; GPU only)
  peak_memory_mb   torch.cuda.max_memory_allocated over one step after warm-up (graph mode: over the
                   eager step before its capture and the capture), less what was allocated before the
                   model existed (input and target)
  memory_estimate_mb  the estimate the bench checks against free memory before building anything
  model_tflops     matmul flop of the step (6 x tokens x linear weights + 12 x B T^2 C x layers for
                   attention, counted dense even when causal) / step time
  relerr_output, relerr_loss, relerr_grads   against the eager 16-bit stack from the same weights
Before timing, every (variant, mode) step from the reference weights is compared with the eager
16-bit step: a relative error above REL_ERROR[variant] is an error record, never timed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qbench import store, units
from qbench.modes import resolved_execs

BENCH = "switchback_model"
# the linear layers of qbench.layers.transformer.LINEARS (named here too: the CLI parses them without torch)
VARIANTS = ("16bit", "switchback", "fp8", "fp8_all", "torchao")


@dataclass(frozen=True)
class Preset:
    width: int  # C
    mlp: int  # F
    heads: int
    tokens: int  # T per image or sequence
    causal: bool = False
    hidden: bool = False  # not offered in --help (test sizes)


PRESETS = {
    "vit-h": Preset(1280, 5120, 16, 257),  # CLIP ViT-Huge/14 at 224 px: 256 patches + class token
    "vit-l": Preset(1024, 4096, 16, 257),  # CLIP ViT-L/14 at 224 px
    "gpt2-xl": Preset(1600, 6400, 25, 1024, causal=True),
    "tiny": Preset(32, 128, 2, 9, hidden=True),
}
PUBLIC_PRESETS = tuple(name for name, p in PRESETS.items() if not p.hidden)
GPU_BATCHES = {"vit-h": (256,), "vit-l": (256,), "gpt2-xl": (32,), "tiny": (4,)}  # ~33-66k tokens
CPU_BATCH = 1
GPU_LAYERS, CPU_LAYERS = 4, 1  # 4 blocks: every kind of layer, fits any GPU, compiles in about a minute


@dataclass(frozen=True)
class ModelConfig:
    models: tuple[str, ...] = ("vit-h",)
    batch_sizes: tuple[int, ...] | None = None
    layers: int | None = None
    dtype: str = "bf16"
    variants: tuple[str, ...] = VARIANTS
    execs: tuple[str, ...] | None = None
    repeat: int | None = None
    device: str = "auto"
    seed: int = 0


@dataclass(frozen=True)
class Case:
    model: str
    batch_size: int
    layers: int

    @property
    def preset(self) -> Preset:
        return PRESETS[self.model]

    def params(self, variant: str, exec: str, dtype: str) -> dict:
        p = self.preset
        return {"model": self.model, "batch_size": self.batch_size, "tokens": p.tokens, "layers": self.layers,
                "width": p.width, "mlp": p.mlp, "heads": p.heads, "variant": variant, "exec": exec, "dtype": dtype}


def resolve(config: ModelConfig) -> ModelConfig:
    """Device and its defaults; 16bit always runs first (every speed-up is over it)."""
    from qbench.env import usable_device

    device = usable_device(config.device)
    execs = resolved_execs(config.execs, device)
    variants = ("16bit", *(v for v in config.variants if v != "16bit"))
    layers = config.layers or (GPU_LAYERS if device == "cuda" else CPU_LAYERS)
    return replace(config, device=device, execs=execs, variants=variants, layers=layers)


def plan(config: ModelConfig) -> list[Case]:
    cases = []
    for name in config.models:
        default = GPU_BATCHES[name] if config.device == "cuda" else (CPU_BATCH,)
        cases += [Case(name, b, config.layers) for b in config.batch_sizes or default]
    return cases


def count(config: ModelConfig) -> int:
    return len(plan(config)) * len(config.execs) * len(config.variants)


def memory_estimate_bytes(case: Case, dtype_bytes: int = 2) -> int:
    """Bytes a training step holds at its peak (an estimate, checked against free memory):
    activations saved for backward per token and block, 9C + 2F values (LN1 in/out, q, k, v, attention
    out, its reshaped copy, LN2 in/out: 9C; fc1 out, GELU out: 2F); weights, grads and two AdamW
    moments, all 16-bit; the fp32 loss terms (2 x tokens x C) and backward scratch (4 x tokens x
    max(F, 3C) values)."""
    p, tokens = case.preset, case.batch_size * case.preset.tokens
    activations = tokens * (9 * p.width + 2 * p.mlp) * dtype_bytes * case.layers
    weights = case.layers * (4 * p.width**2 + 2 * p.width * p.mlp) * dtype_bytes * 4
    scratch = tokens * (2 * p.width * 4 + 4 * max(p.mlp, 3 * p.width) * dtype_bytes)
    return activations + weights + scratch


def step_flop(case: Case) -> float:
    """Matmul flop of one training step: 3 matmuls of 2*M*K*N per linear layer, and QK^T, PV (2*T*T*C
    each per sequence, x3 for forward + backward)."""
    p, tokens = case.preset, case.batch_size * case.preset.tokens
    linear = 6.0 * tokens * (4 * p.width**2 + 2 * p.width * p.mlp)
    attention = 3.0 * 4.0 * case.batch_size * p.tokens**2 * p.width
    return (linear + attention) * case.layers


def units_of(metrics: dict) -> dict:
    special = {"tokens_per_s": units.TOKENS_PER_S, "model_tflops": units.TFLOPS}
    return {name: special.get(name) or units.by_name(name) or units.SHARE for name in metrics}


def record(case: Case, config: ModelConfig, variant: str, exec: str, metrics=None, samples=None,
           status: str = "ok", error: str | None = None) -> dict:
    return store.make_record(BENCH, case.params(variant, exec, config.dtype), metrics,
                             units=units_of(metrics or {}), samples=samples, status=status, error=error,
                             device=config.device)
