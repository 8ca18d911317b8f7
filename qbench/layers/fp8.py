"""fp8 linear layers: the fair fp8 peers of SwitchBack, with the same fused quantizers.

Shapes: x [..., K] (K = in_features), W [N, K], bias [N], G = dY [M, N]; M = all leading dims together.
Every quantizer is a fused Triton kernel (kernels/switchback_quantize.py): one scale per row, or per
column with the output written transposed; e4m3 for activations and weights, e5m2 for gradients (its
wider range). The matmuls are SwitchBack's own kernels in their fp8 form (kernels/switchback_matmul.py:
the same tiles, persistence and fused epilogue as int8, fp32 accumulation, one scale per row of A and
one per column of the product, the bias added and the activation dtype written in the epilogue).
- recipe "switchback": Y = X W^T and dX = G W in fp8, dW = G^T X in 16-bit (SwitchBack's layout)
      Y:  A = Xq [M, K] (row scales),  B = Wq [N, K] (row scales: one per output feature)
      dX: A = Gq [M, N] (row scales),  B = (W^T)q [K, N] (one scale per input feature k)
- recipe "all": dW in fp8 too, the rowwise recipe of current fp8 training
      dW: A = (G^T)q [N, M] (one scale per output feature, over the tokens), B = (X^T)q [K, M]
Bias grad is G summed over rows (by G's quantizer where dX is computed). fp8 tensor cores need a CUDA
device of compute capability >= 8.9; on a CPU the kernels run through the Triton interpreter in tests, or
as their plain-torch reference (dequantize in fp32, multiply).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels._common import is_compiling, register_op
from kernels.switchback_matmul import fp8_matmul_rowwise_columnwise
from kernels.switchback_quantize import quantize_columnwise_transpose, quantize_rowwise
from qbench.layers.autocast import in_autocast_dtype
from qbench.layers.switchback import grad_operands, in_order, weight_grad_first

RECIPES = ("switchback", "all")
ACT, GRAD = "e4m3", "e5m2"


def fp8_matmuls_supported(device) -> bool:
    """fp8 tensor cores: a CUDA device of compute capability 8.9 or newer."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _fp8_forward(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Y [M, N] = Xq Wq^T (+ bias), X and W rowwise in e4m3."""
    xq, sx = quantize_rowwise(x2, ACT)
    wq, sw = quantize_rowwise(w, ACT)
    return fp8_matmul_rowwise_columnwise(xq, sx, wq, sw, bias, x2.dtype)


def _fp8_backward(g2: torch.Tensor, x2: torch.Tensor, w: torch.Tensor, recipe: str, need_x: bool, need_w: bool,
                  need_b: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX [M, K], dW [N, K], db [N]); an input that needs none gets an empty tensor."""
    empty = g2.new_empty(0)

    def rest():
        quantized, db = grad_operands(g2, need_x, need_b, GRAD)  # as SwitchBack's: one read of G for both
        if not need_x:
            return empty, db
        wtq, swt = quantize_columnwise_transpose(w, ACT)  # [K, N], one scale per input feature
        return fp8_matmul_rowwise_columnwise(*quantized, wtq, swt, None, g2.dtype), db

    # in SwitchBack's order (layers/switchback.py, weight_grad_first)
    dw, (dx, db) = in_order(lambda: _weight_grad(g2, x2, recipe) if need_w else empty, rest,
                            weight_grad_first(g2, x2))
    return dx, dw, db if need_b else empty


def _weight_grad(g2, x2, recipe: str):
    """dW = G^T X [N, K]: 16-bit (switchback) or fp8 with one scale per output feature of G^T and per
    input feature of X^T, both taken over the tokens (all)."""
    if recipe == "switchback":
        return g2.t() @ x2
    gtq, sgt = quantize_columnwise_transpose(g2, GRAD)  # [N, M]
    xtq, sxt = quantize_columnwise_transpose(x2, ACT)  # [K, M]
    return fp8_matmul_rowwise_columnwise(gtq, sgt, xtq, sxt, None, g2.dtype)


# One torch custom op per direction: a compiled graph dispatches two ops per step (see layers/switchback.py)
_FORWARD_OP = register_op("fp8_linear_forward", _fp8_forward,
                          lambda x2, w, bias: x2.new_empty((x2.shape[0], w.shape[0])))
_BACKWARD_OP = register_op(
    "fp8_linear_backward", _fp8_backward,
    lambda g2, x2, w, recipe, nx, nw, nb: (x2.new_empty(x2.shape if nx else 0), w.new_empty(w.shape if nw else 0),
                                           g2.new_empty(g2.shape[1] if nb else 0)))


class Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, recipe: str):
        x2 = _flat(x)
        y = (_FORWARD_OP if is_compiling() else _fp8_forward)(x2, w, bias)
        ctx.save_for_backward(x2, w)
        ctx.lead, ctx.has_bias, ctx.recipe = x.shape[:-1], bias is not None, recipe
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        dx, dw, db = (_BACKWARD_OP if is_compiling() else _fp8_backward)(_flat(g), x2, w, ctx.recipe, need_x,
                                                                          need_w, need_b)
        return (dx.reshape(*ctx.lead, w.shape[1]) if need_x else None, dw.to(w.dtype) if need_w else None,
                db.to(w.dtype) if need_b else None, None)


class Fp8Linear(nn.Linear):
    """nn.Linear whose training matmuls run in fp8 (recipe "switchback": forward and grad-input;
    recipe "all": grad-weight too)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, recipe="switchback"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"unknown fp8 recipe {recipe!r}; choose from {', '.join(RECIPES)}")
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Fp8LinearFn.apply(*in_autocast_dtype(x, self.weight, self.bias), self.recipe)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"
