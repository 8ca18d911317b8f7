"""SwitchBack int8 linear layers (Wortsman et al. 2023) and the 16-bit baseline, as autograd Functions.

Shapes: x [..., K] (K = in_features), W [N, K], bias [N], y [..., N]; M = all leading dims together.
- global (default):  forward  Y  = int8(X rowwise) . int8(W global)^T
                     backward dX = int8(G rowwise) . int8(W global, transposed); dW = G^T X in 16-bit
- vectorwise:        W rowwise in forward, columnwise-and-transposed in backward
- memory-efficient global ("global_memeff"): saves int8 X and its scales (half the activation
                     memory) instead of X; dW = G^T dequant(X_q); dX reuses the forward's int8 W
- standard:          the same three matmuls in 16-bit, written as the same kind of Function (the fair
                     baseline: identical autograd overhead)
Bias grad is G summed over rows in every variant (by G's quantizer, from the same read of G, where dX is wanted).
`prepare_for_eval()` quantizes W once for inference; forward then skips the weight quantizer.

Error bound (tests/test_switchback_layers.py checks it elementwise): every int8 operand is within
half a step, 0.5 * absmax / 127, of its 16-bit value, so |dC_ij| <= h_a[i] sum_k |B_jk| +
h_b[j] sum_k |A_ik| + K h_a[i] h_b[j] (kernels.switchback_matmul.quantization_error_bound), plus
rounding to 16 bits; dW is 16-bit (exact up to rounding) except in the memory-efficient variant.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels._common import is_compiling, register_op
from kernels.switchback_matmul import int8_matmul_rowwise_columnwise, int8_matmul_rowwise_global
from kernels.switchback_quantize import (
    dequantize_rowwise,
    quantize_columnwise_transpose,
    quantize_global,
    quantize_global_both,
    quantize_rowwise,
    quantize_rowwise_colsum,
)
from qbench.layers.autocast import in_autocast_dtype

VARIANTS = ("global", "vectorwise", "global_memeff")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """[M, last] view of t (a 2-D t as it is: a reshape costs host time on every call)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def _unflat(t: torch.Tensor, lead: tuple, last: int) -> torch.Tensor:
    """[*lead, last] view of a 2-D t (as it is when lead has one dimension)."""
    return t if len(lead) == 1 else t.reshape(*lead, last)


def grad_operands(g2: torch.Tensor, need_x: bool, need_b: bool, format: str = "int8"):
    """((Gq [M, N], s_g [M]) where dX is wanted, else None; db = G summed over rows [N] where the bias
    gradient is wanted, else None): one read of G (quantize_rowwise_colsum) when both are wanted."""
    if need_x and need_b:
        gq, sg, db = quantize_rowwise_colsum(g2, format)
        return (gq, sg), db
    return (quantize_rowwise(g2, format) if need_x else None), (g2.sum(dim=0) if need_b else None)


# Where a backward issues the 16-bit grad-weight product (results/README.md lists the runs):
# - first in a layer small enough that the host is on the step's critical path: it needs nothing quantized,
#   so the GPU runs it while the host issues G's quantizer and the grad-input product, which otherwise each
#   waited for the host (H200, eager, old and new order run alternately: the speed-up over nn.Linear rose at
#   all 8 shapes of results/switchback-h200-backward-order, up to M N K = 2^39, e.g. 0.9841 -> 1.074 at
#   32768 x 4096 -> 1024);
# - last where the GPU bounds the step: an H200 runs int8 products slower the longer it has been under load,
#   so the int8 grad-input product goes before it (graphed, 131072 x 4096 -> 16384: 56.66 ms with it last,
#   59.82 with it first, medians of runs that overlap; results/switchback-h200-backward-order-graph).
WEIGHT_GRAD_FIRST_BELOW = 2**40  # multiply-adds of one of the layer's products, M * N * K


def weight_grad_first(g2: torch.Tensor, x2: torch.Tensor) -> bool:
    """Whether a backward of G [M, N] and X [M, K] issues its grad-weight product first (see above)."""
    return g2.shape[0] * g2.shape[1] * x2.shape[1] < WEIGHT_GRAD_FIRST_BELOW


def in_order(weight_grad, rest, first: bool):
    """(weight_grad(), rest()), the calls made in that order when first, else rest() first."""
    if first:
        dw = weight_grad()
        return dw, rest()
    other = rest()
    return weight_grad(), other


def _grads(ctx, g2, x2, dx_fn, quantize_g: bool):
    """(dX [.., K], dW [N, K], db [N]) for the inputs that need them. dx_fn computes dX [M, K]: from G
    quantized rowwise, dx_fn(Gq, s_g), when quantize_g (grad_operands), else from G itself, dx_fn(G)."""
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    need_b = need_b and ctx.has_bias

    def rest():
        if quantize_g:
            quantized, db = grad_operands(g2, need_x, need_b)
            return dx_fn(*quantized) if need_x else None, db
        return dx_fn(g2) if need_x else None, g2.sum(dim=0) if need_b else None

    # 16-bit grad-weight: the "switch back"
    dw, (dx, db) = in_order(lambda: (g2.t() @ x2).to(ctx.w_dtype) if need_w else None, rest, weight_grad_first(g2, x2))
    return (dx.reshape(*ctx.lead, x2.shape[1]) if need_x else None, dw,
            db.to(ctx.w_dtype) if need_b else None)


def _remember(ctx, x, w, bias):
    ctx.lead, ctx.has_bias, ctx.w_dtype = x.shape[:-1], bias is not None, w.dtype


def _global_forward(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Y [M, N], Wq^T [K, N] int8, s_w [1]) of the global variant: X rowwise, W once into both layouts."""
    xq, sx = quantize_rowwise(x2)
    wq, wtq, sw = quantize_global_both(w)
    return int8_matmul_rowwise_global(xq, sx, wq, sw, bias, x2.dtype), wtq, sw


def _global_backward(g2: torch.Tensor, x2: torch.Tensor, wtq: torch.Tensor, sw: torch.Tensor, need_x: bool,
                     need_w: bool, need_b: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX [M, K], dW [N, K], db [N]) of the global variant; an input that needs none gets an empty tensor."""
    empty = None if need_x and need_w and need_b else g2.new_empty(0)

    def rest():
        quantized, db = grad_operands(g2, need_x, need_b)
        # Wq^T [K, N]: K-major for G W
        return int8_matmul_rowwise_global(*quantized, wtq, sw, None, g2.dtype) if need_x else empty, db

    # 16-bit grad-weight: the "switch back"
    dw, (dx, db) = in_order(lambda: g2.t() @ x2 if need_w else empty, rest, weight_grad_first(g2, x2))
    return dx, dw, db if need_b else empty


# One torch custom op per direction: a compiled graph dispatches two ops per step instead of eight
# kernel ops (each dispatch costs ~11-20 us of host time on an H200 host); eager calls the functions.
_FORWARD_OP = register_op(
    "switchback_global_forward", _global_forward,
    lambda x2, w, bias: (x2.new_empty((x2.shape[0], w.shape[0])), w.new_empty((w.shape[1], w.shape[0]),
                                                                               dtype=torch.int8),
                         w.new_empty(1, dtype=torch.float32)))
_BACKWARD_OP = register_op(
    "switchback_global_backward", _global_backward,
    lambda g2, x2, wtq, sw, nx, nw, nb: (x2.new_empty(x2.shape if nx else 0),
                                         g2.new_empty((g2.shape[1], x2.shape[1]) if nw else 0),
                                         g2.new_empty(g2.shape[1] if nb else 0)))


class SwitchBackGlobalFn(torch.autograd.Function):
    """Forward quantizes W once into both layouts (one read of W): Wq for Y = X W^T now, Wq^T (int8,
    N*K bytes kept for backward) for dX = G W, so backward quantizes only G."""

    @staticmethod
    def forward(ctx, x, w, bias):
        x2 = _flat(x)
        y, wtq, sw = (_FORWARD_OP if is_compiling() else _global_forward)(x2, w, bias)
        ctx.save_for_backward(x2, wtq, sw)
        _remember(ctx, x, w, bias)
        return _unflat(y, x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, wtq, sw = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        dx, dw, db = (_BACKWARD_OP if is_compiling() else _global_backward)(
            _flat(g), x2, wtq, sw, need_x, need_w, need_b)
        return (_unflat(dx, ctx.lead, x2.shape[1]) if need_x else None, _as(dw, ctx.w_dtype) if need_w else None,
                _as(db, ctx.w_dtype) if need_b else None)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


class SwitchBackVectorwiseFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias):
        x2 = _flat(x)
        xq, sx = quantize_rowwise(x2)
        wq, sw = quantize_rowwise(w)  # one scale per output feature
        ctx.save_for_backward(x2, w)
        _remember(ctx, x, w, bias)
        y = int8_matmul_rowwise_columnwise(xq, sx, wq, sw, bias, x.dtype)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors

        def dx_fn(gq, sg):
            wtq, sw = quantize_columnwise_transpose(w)  # [K, N], one scale per input feature
            return int8_matmul_rowwise_columnwise(gq, sg, wtq, sw, None, g.dtype)

        return _grads(ctx, _flat(g), x2, dx_fn, quantize_g=True)


class SwitchBackGlobalMemEffFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias):
        x2 = _flat(x)
        xq, sx = quantize_rowwise(x2)
        wq, wtq, sw = quantize_global_both(w)
        ctx.save_for_backward(xq, sx, wtq, sw)  # int8 X: half the activation memory of X
        _remember(ctx, x, w, bias)
        ctx.x_dtype = x.dtype
        return int8_matmul_rowwise_global(xq, sx, wq, sw, bias, x.dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        xq, sx, wtq, sw = ctx.saved_tensors
        x2 = dequantize_rowwise(xq, sx, ctx.x_dtype) if ctx.needs_input_grad[1] else xq

        def dx_fn(gq, sg):
            return int8_matmul_rowwise_global(gq, sg, wtq, sw, None, g.dtype)  # the forward's Wq^T

        return _grads(ctx, _flat(g), x2, dx_fn, quantize_g=True)


class StandardLinearFn(torch.autograd.Function):
    """16-bit Y = X W^T + b with an explicit backward: the baseline with the same autograd overhead."""

    @staticmethod
    def forward(ctx, x, w, bias):
        x2 = _flat(x)
        ctx.save_for_backward(x2, w)
        _remember(ctx, x, w, bias)
        y = x2 @ w.t()
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors
        return _grads(ctx, _flat(g), x2, lambda g2: g2 @ w, quantize_g=False)


FUNCTIONS = {
    "global": SwitchBackGlobalFn,
    "vectorwise": SwitchBackVectorwiseFn,
    "global_memeff": SwitchBackGlobalMemEffFn,
    "standard": StandardLinearFn,
}


class SwitchBackLinear(nn.Linear):
    """nn.Linear whose training matmuls run in int8 (forward, grad-input) and 16-bit (grad-weight)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, variant="global"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if variant not in VARIANTS:
            raise ValueError(f"unknown SwitchBack variant {variant!r}; choose from {', '.join(VARIANTS)}")
        self.variant = variant
        self._eval_weight = None  # (W_q, scale) once prepare_for_eval() ran

    def prepare_for_eval(self) -> None:
        """Quantize W once (global or rowwise, as the variant's forward does) for inference."""
        with torch.no_grad():
            vectorwise = self.variant == "vectorwise"
            self._eval_weight = quantize_rowwise(self.weight) if vectorwise else quantize_global(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._eval_weight is not None and not self.training:
            x, _, bias = in_autocast_dtype(x, None, self.bias)  # W was quantized once: no cast of it
            return self._forward_prepared(x, bias)
        x, weight, bias = in_autocast_dtype(x, self.weight, self.bias)
        if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return self._forward_no_grad(x, weight, bias)  # nothing to save for a backward that will not come
        return FUNCTIONS[self.variant].apply(x, weight, bias)

    def _forward_no_grad(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The training forward's math (W quantized now, one layout) without an autograd node."""
        xq, sx = quantize_rowwise(_flat(x))
        if self.variant == "vectorwise":
            wq, sw = quantize_rowwise(weight)
            y = int8_matmul_rowwise_columnwise(xq, sx, wq, sw, bias, x.dtype)
        else:
            wq, sw = quantize_global(weight)
            y = int8_matmul_rowwise_global(xq, sx, wq, sw, bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _forward_prepared(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        wq, sw = self._eval_weight
        xq, sx = quantize_rowwise(_flat(x))
        matmul = int8_matmul_rowwise_columnwise if self.variant == "vectorwise" else int8_matmul_rowwise_global
        return matmul(xq, sx, wq, sw, bias, x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, variant={self.variant}"


class StandardLinear(nn.Linear):
    """nn.Linear through StandardLinearFn (16-bit, explicit backward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return StandardLinearFn.apply(*in_autocast_dtype(x, self.weight, self.bias))
