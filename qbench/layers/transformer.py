"""A pre-norm transformer block stack whose linear layers are 16-bit, SwitchBack int8 or fp8.

Shapes: x [B, T, C] (B sequences or images, T tokens each, C = width), H heads of D = C / H.
One block:
    h = x + proj(attention(qkv(LN1(x))))     qkv: C -> 3C (fused), proj: C -> C
    y = h + fc2(GELU(fc1(LN2(h))))            fc1: C -> F (the MLP width), fc2: F -> C
attention = torch.nn.functional.scaled_dot_product_attention over q, k, v [B, H, T, D] (causal for
decoder models). A stack is `layers` blocks and a final LayerNorm (as in ViT and GPT-2).

The four linear layers of every block come from LINEARS[variant]; everything else (LayerNorms,
attention, GELU, residuals, embeddings, the LM head) stays in the 16-bit dtype in every variant, so
two variants differ only in their linear layers:
    16bit       torch.nn.Linear
    switchback  SwitchBackLinear, global variant (int8 forward and grad-input, 16-bit grad-weight)
    fp8         Fp8Linear, recipe "switchback" (fp8 forward and grad-input, 16-bit grad-weight)
    fp8_all     Fp8Linear, recipe "all" (all three matmuls in fp8, rowwise scales)
    torchao     torchao's Float8Linear with its "rowwise" recipe (only when torchao is importable:
                never a dependency), made by converting the 16-bit stack's block linears
TinyLM wraps the stack as a decoder-only next-token model (token + position embeddings, causal
blocks, final LayerNorm, 16-bit LM head) for the training-quality check.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from qbench.layers.fp8 import Fp8Linear, fp8_matmuls_supported
from qbench.layers.switchback import SwitchBackLinear

LINEARS = {
    "16bit": nn.Linear,
    "switchback": partial(SwitchBackLinear, variant="global"),
    "fp8": partial(Fp8Linear, recipe="switchback"),
    "fp8_all": partial(Fp8Linear, recipe="all"),
    "torchao": nn.Linear,  # converted to Float8Linear after the stack is built (torchao_convert)
}
VARIANTS = tuple(LINEARS)


@dataclass(frozen=True)
class StackShape:
    width: int  # C
    mlp: int  # F, the MLP's hidden width
    heads: int  # H; C must be a multiple of H
    layers: int
    causal: bool = False  # decoder (GPT) attention mask

    def __post_init__(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of {self.heads} heads")


class Attention(nn.Module):
    def __init__(self, shape: StackShape, linear, device=None, dtype=None):
        super().__init__()
        self.heads, self.causal = shape.heads, shape.causal
        self.qkv = linear(shape.width, 3 * shape.width, bias=True, device=device, dtype=dtype)
        self.proj = linear(shape.width, shape.width, bias=True, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # [B, T, 3C] -> three [B, T, C] slices -> q, k, v [B, H, T, D] as SDPA wants them. Split, not a
        # select of a permuted [3, B, H, T, D] view: the backward of split is a cat, which reads each of
        # dq, dk, dv once; Inductor builds the select's backward as a sum of three zero-padded selects that
        # reads all three for every element (vit-h probe on an H200: 1.81 ms against 0.92 per step when a
        # custom op consumes the gradient, 1.02 against 0.93 for nn.Linear)
        q, k, v = (t.unflatten(-1, (self.heads, C // self.heads)).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # [B, H, T, D]
        return self.proj(out.transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, shape: StackShape, linear, device=None, dtype=None):
        super().__init__()
        self.fc1 = linear(shape.width, shape.mlp, bias=True, device=device, dtype=dtype)
        self.fc2 = linear(shape.mlp, shape.width, bias=True, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, shape: StackShape, linear, device=None, dtype=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.width, device=device, dtype=dtype)
        self.attn = Attention(shape, linear, device, dtype)
        self.ln2 = nn.LayerNorm(shape.width, device=device, dtype=dtype)
        self.mlp = Mlp(shape, linear, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class BlockStack(nn.Module):
    """`layers` blocks and a final LayerNorm: [B, T, C] -> [B, T, C]."""

    def __init__(self, shape: StackShape, variant: str = "16bit", device=None, dtype=None):
        super().__init__()
        linear = LINEARS[variant]
        self.blocks = nn.ModuleList(Block(shape, linear, device, dtype) for _ in range(shape.layers))
        self.ln = nn.LayerNorm(shape.width, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.ln(x)


class TinyLM(nn.Module):
    """Decoder-only next-token model: tokens [B, T] (int64) -> logits [B, T, vocab] (16-bit)."""

    def __init__(self, vocab: int, seq: int, shape: StackShape, variant: str = "16bit", device=None, dtype=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, shape.width, device=device, dtype=dtype)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, shape.width, device=device).to(dtype))
        self.stack = BlockStack(shape, variant, device, dtype)
        self.head = nn.Linear(shape.width, vocab, bias=False, device=device, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(self.embed(tokens) + self.pos[: tokens.shape[1]]))


def block_linears(model: nn.Module) -> list[nn.Linear]:
    """The variant's linear layers (qkv, proj, fc1, fc2 of every block), in order; not the LM head."""
    return [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and ".blocks." in f".{name}"]


def unavailable(variant: str, device: str) -> str | None:
    """Why `variant` cannot run on `device` (a reason to record as skipped), or None."""
    if variant in ("fp8", "fp8_all") and device == "cuda" and not fp8_matmuls_supported("cuda"):
        return "fp8 matmuls need CUDA compute capability >= 8.9 (fp8 tensor cores)"
    if variant != "torchao":
        return None
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "torchao is not installed (optional peer: pip install torchao)"
    if not fp8_matmuls_supported(device):
        return "torchao Float8Linear needs a CUDA device of compute capability >= 8.9"
    return None


def torchao_shape_reason(*dims: int) -> str | None:
    """Why torchao's Float8Linear cannot run at a linear layer's dims (tokens M, in, out), or None:
    torch._scaled_mm needs every dimension of its three products a multiple of 16 (M is the grad-weight
    product's inner dimension)."""
    odd = [n for n in dims if n % 16]
    return f"torch._scaled_mm needs dims that are multiples of 16, got {odd[0]}" if odd else None


def torchao_convert(model: nn.Module) -> nn.Module:
    """Swap the block linears of a 16-bit model for torchao's Float8Linear (recipe "rowwise")."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name("rowwise")
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: ".blocks." in f".{fqn}")


def torchao_linear(linear: nn.Linear) -> nn.Module:
    """torchao's Float8Linear (recipe "rowwise") holding `linear`'s weight and bias (the layer peer of
    `qbench switchback`)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(linear, config=Float8LinearConfig.from_recipe_name("rowwise"))


def build(make, variant: str, state: dict | None = None) -> nn.Module:
    """make(variant) -> a fresh model; the reference weights `state` loaded into it (every variant
    starts from the same numbers), then torchao's conversion where the variant asks for it."""
    model = make(variant)
    if state is not None:
        model.load_state_dict(state)
    return torchao_convert(model) if variant == "torchao" else model
