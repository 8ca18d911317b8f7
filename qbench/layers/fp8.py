"""fp8 linear layers: the fair fp8 peers of SwitchBack, with the same fused quantizers.

Shapes: x [..., K] (K = in_features), W [N, K], bias [N], G = dY [M, N]; M = all leading dims together.
Every quantizer is a fused Triton kernel (kernels/switchback_quantize.py): one scale per row, or per
column with the output written transposed; e4m3 for activations and weights, e5m2 for gradients (its
wider range). The matmuls are torch._scaled_mm with rowwise scales (one per row of A, one per column
of the product), which writes bf16; an fp16 layer casts its outputs back.
- recipe "switchback": Y = X W^T and dX = G W in fp8, dW = G^T X in 16-bit (SwitchBack's layout)
      Y:  A = Xq [M, K] (row scales),  B = Wq [N, K] (row scales: one per output feature)
      dX: A = Gq [M, N] (row scales),  B = (W^T)q [K, N] (one scale per input feature k)
- recipe "all": dW in fp8 too, the rowwise recipe of current fp8 training
      dW: A = (G^T)q [N, M] (one scale per output feature, over the tokens), B = (X^T)q [K, M]
Bias grad is G summed over rows. Without a CUDA device of compute capability >= 8.9 the matmuls run
as their plain-torch reference (dequantize in fp32, multiply), so the layer runs on a CPU in tests.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.switchback_quantize import quantize_columnwise_transpose, quantize_rowwise

RECIPES = ("switchback", "all")
ACT, GRAD = "e4m3", "e5m2"


def fp8_matmuls_supported(device) -> bool:
    """torch._scaled_mm with fp8 operands: CUDA compute capability 8.9 or newer."""
    device = torch.device(device)
    return device.type == "cuda" and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_mm(a, sa, b, sb, out_dtype):
    """A [M, K] fp8 (row scales sa [M]) times B [N, K]^T fp8 (row scales sb [N]) -> [M, N] in out_dtype;
    the scales are dequantization multipliers (absmax / QMAX)."""
    if a.is_cuda:
        y = torch._scaled_mm(a, b.t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16)
        return y if out_dtype == torch.bfloat16 else y.to(out_dtype)
    return scaled_mm_reference(a, sa, b, sb, out_dtype)


def scaled_mm_reference(a, sa, b, sb, out_dtype):
    """Plain torch: dequantize both operands in fp32 and multiply (exact products of fp8 values)."""
    return ((a.float() * sa[:, None]) @ (b.float() * sb[:, None]).t()).to(out_dtype)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, recipe: str):
        x2 = _flat(x)
        xq, sx = quantize_rowwise(x2, ACT)
        wq, sw = quantize_rowwise(w, ACT)
        y = scaled_mm(xq, sx, wq, sw, x.dtype)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x2, w)
        ctx.lead, ctx.has_bias, ctx.recipe = x.shape[:-1], bias is not None, recipe
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors
        g2 = _flat(g)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_x:
            gq, sg = quantize_rowwise(g2, GRAD)
            wtq, swt = quantize_columnwise_transpose(w, ACT)  # [K, N], one scale per input feature
            dx = scaled_mm(gq, sg, wtq, swt, g.dtype).reshape(*ctx.lead, w.shape[1])
        if need_w:
            dw = _weight_grad(g2, x2, ctx.recipe).to(w.dtype)
        if need_b and ctx.has_bias:
            db = g2.sum(dim=0).to(w.dtype)
        return dx, dw, db, None


def _weight_grad(g2, x2, recipe: str):
    """dW = G^T X [N, K]: 16-bit (switchback) or fp8 with one scale per output feature of G^T and per
    input feature of X^T, both taken over the tokens (all)."""
    if recipe == "switchback":
        return g2.t() @ x2
    gtq, sgt = quantize_columnwise_transpose(g2, GRAD)  # [N, M]
    xtq, sxt = quantize_columnwise_transpose(x2, ACT)  # [K, M]
    return scaled_mm(gtq, sgt, xtq, sxt, g2.dtype)


class Fp8Linear(nn.Linear):
    """nn.Linear whose training matmuls run in fp8 (recipe "switchback": forward and grad-input;
    recipe "all": grad-weight too). Dimensions must be multiples of 16 for torch._scaled_mm."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, recipe="switchback"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"unknown fp8 recipe {recipe!r}; choose from {', '.join(RECIPES)}")
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Fp8LinearFn.apply(x, self.weight, self.bias, self.recipe)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"
