"""`qbench block`: a training step of a transformer block stack whose linear layers are 16-bit,
SwitchBack int8, fp8 or torchao's (qbench.layers.transformer), in each execution mode.

One record (bench "block") per preset x batch size x variant x exec; params: preset, batch_size (images or
sequences), tokens (per sequence), layers, width, mlp, heads, variant, exec, dtype. Metrics: declared in
qbench/metrics/block.py (steps.py says what linear_ms does and does not say; attention flops are counted
dense even when causal; peak_memory_mb in graph mode is over the eager step before its capture and the
capture). Before timing, every (variant, exec) step from the reference weights is compared with the eager
16-bit step: a relative error above REL_ERROR[variant] is an error record, never timed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qbench import store
from qbench.metrics.block import BENCH, VARIANTS
from qbench.modes import resolved_execs


@dataclass(frozen=True)
class Preset:
    width: int  # C
    mlp: int  # F
    heads: int
    tokens: int  # T per image or sequence
    causal: bool = False
    hidden: bool = False  # not offered in --help (test sizes)


PRESETS = {
    "vit-h": Preset(width=1280, mlp=5120, heads=16, tokens=257),  # CLIP ViT-H/14 at 224 px: 256 patches + class token
    "vit-l": Preset(width=1024, mlp=4096, heads=16, tokens=257),  # CLIP ViT-L/14 at 224 px
    "gpt2-xl": Preset(width=1600, mlp=6400, heads=25, tokens=1024, causal=True),
    "tiny": Preset(width=32, mlp=128, heads=2, tokens=9, hidden=True),
}
PUBLIC_PRESETS = tuple(name for name, p in PRESETS.items() if not p.hidden)
GPU_BATCHES = {"vit-h": (256,), "vit-l": (256,), "gpt2-xl": (32,), "tiny": (4,)}  # ~33-66k tokens
CPU_BATCH = 1
GPU_LAYERS, CPU_LAYERS = 4, 1  # 4 blocks: every kind of layer, fits any GPU, compiles in about a minute


@dataclass(frozen=True)
class BlockConfig:
    presets: tuple[str, ...] = ("vit-h",)
    batch_sizes: tuple[int, ...] | None = None
    layers: int | None = None
    dtype: str = "bf16"
    variants: tuple[str, ...] = VARIANTS
    execs: tuple[str, ...] | None = None
    repeat: int | None = None
    device: str = "auto"
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Case:
    preset_name: str  # a PRESETS name
    batch_size: int
    layers: int

    @property
    def preset(self) -> Preset:
        return PRESETS[self.preset_name]

    def params(self, variant: str, exec: str, dtype: str) -> dict:
        p = self.preset
        return {"preset": self.preset_name, "batch_size": self.batch_size, "tokens": p.tokens, "layers": self.layers,
                "width": p.width, "mlp": p.mlp, "heads": p.heads, "variant": variant, "exec": exec, "dtype": dtype}


def resolve(config: BlockConfig) -> BlockConfig:
    """Device and its defaults; 16bit always runs first (every speed-up is over it)."""
    from qbench.env import usable_device

    device = usable_device(config.device)
    execs = resolved_execs(config.execs, device)
    variants = ("16bit", *(v for v in config.variants if v != "16bit"))
    layers = config.layers or (GPU_LAYERS if device == "cuda" else CPU_LAYERS)
    return replace(config, device=device, execs=execs, variants=variants, layers=layers)


def plan(config: BlockConfig) -> list[Case]:
    cases = []
    for name in config.presets:
        default = GPU_BATCHES[name] if config.device == "cuda" else (CPU_BATCH,)
        cases += [Case(preset_name=name, batch_size=b, layers=config.layers) for b in config.batch_sizes or default]
    return cases


def pending(config: BlockConfig, done: frozenset[str] = frozenset()) -> list[tuple[Case, str, str]]:
    """The measurements run(config) makes, one record each: (case, exec, variant) (block has no --resume, so
    `done` is empty)."""
    return [(case, ex, variant) for case in plan(config) for ex in config.execs for variant in config.variants]


def measured_id(record: dict) -> str:
    return record["case"]


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


def record(case: Case, config: BlockConfig, variant: str, exec: str, metrics=None, samples=None,
           status: str = "ok", error: str | None = None) -> dict:
    """A record of one variant in one exec (units: qbench/metrics/block.py)."""
    return store.make_record(BENCH, case.params(variant, exec, config.dtype), metrics, samples=samples,
                             status=status, error=error, device=config.device)
