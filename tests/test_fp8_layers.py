"""Fp8Linear (recipes "switchback" and "all") against the 16-bit layer: outputs and gradients within
the error of fp8 rounding, the weight gradient exact in 16-bit for the switchback recipe, and the
compiled layer equal to eager. On the CPU the quantizers run through the Triton interpreter and the
matmuls through their reference."""

from __future__ import annotations

import pytest
import torch

from kernels.switchback_matmul import (
    fp8_matmul_rowwise_columnwise,
    int8_matmul_rowwise_columnwise,
    quantized_matmul_reference,
)
from kernels.switchback_quantize import quantize_rowwise
from qbench.layers.fp8 import RECIPES, Fp8Linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# e4m3 keeps 3 mantissa bits (relative rounding <= 2^-4 per element), e5m2 2 bits (<= 2^-3); over a
# K-long dot product the errors average out to ~1/sqrt(3) of that: 2-4 % for Y, up to ~7 % for dX
BOUND = {"y": 0.05, "dx": 0.08, "dw_fp8": 0.08}


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def grads(layer, x, g):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    y.backward(g)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", [((48, 64), 32), ((2, 24, 32), 48)])
def test_fp8_layer_matches_16bit_within_fp8_rounding(recipe, shape):
    x_shape, n_out = shape
    torch.manual_seed(n_out)
    x = torch.randn(x_shape, device=DEVICE).to(torch.bfloat16)
    g = torch.randn(*x_shape[:-1], n_out, device=DEVICE).to(torch.bfloat16)
    fp8 = Fp8Linear(x_shape[-1], n_out, device=DEVICE, dtype=torch.bfloat16, recipe=recipe)
    ref = torch.nn.Linear(x_shape[-1], n_out, device=DEVICE, dtype=torch.bfloat16)
    ref.load_state_dict(fp8.state_dict())
    (y, dx, dw, db), (y0, dx0, dw0, db0) = grads(fp8, x, g), grads(ref, x, g)
    assert rel(y, y0) < BOUND["y"], f"output rel err {rel(y, y0):.3f}"
    assert rel(dx, dx0) < BOUND["dx"], f"dX rel err {rel(dx, dx0):.3f}"
    assert rel(db, db0) < 1e-2  # bias grad: G summed in 16-bit in both
    if recipe == "switchback":
        assert rel(dw, dw0) < 1e-2, "16-bit grad-weight"
    else:
        assert 1e-4 < rel(dw, dw0) < BOUND["dw_fp8"], f"fp8 dW rel err {rel(dw, dw0):.3f}"


@pytest.mark.parametrize("formats", [("e4m3", "e4m3"), ("e5m2", "e4m3")])
@pytest.mark.parametrize("shape", [(32, 48, 16), (40, 24, 56)])  # (M, K, N); the second unaligned for TMA
def test_fp8_matmul_matches_its_reference(formats, shape):
    M, K, N = shape
    torch.manual_seed(M)
    a, b = torch.randn(M, K, device=DEVICE).to(torch.bfloat16), torch.randn(N, K, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(N, device=DEVICE).to(torch.bfloat16)
    (aq, sa), (bq, sb) = quantize_rowwise(a, formats[0]), quantize_rowwise(b, formats[1])
    got = fp8_matmul_rowwise_columnwise(aq, sa, bq, sb, bias, torch.bfloat16)
    want = quantized_matmul_reference(aq, sa, bq, sb, bias, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (M, N)
    assert rel(got, want) < 1e-2
    assert rel(want, a.float() @ b.float().t() + bias.float()) < BOUND["dx"]  # the scales are multipliers


def test_fp8_matmul_refuses_int8_operands():
    q = torch.zeros(16, 16, dtype=torch.int8, device=DEVICE)
    s = torch.ones(16, device=DEVICE)
    with pytest.raises(ValueError, match="fp8 operands expected"):
        fp8_matmul_rowwise_columnwise(q, s, q, s)


def test_compiled_fp8_layer_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(3)
    layer = Fp8Linear(64, 32, device=DEVICE, dtype=torch.bfloat16, recipe="all")
    x = torch.randn(16, 64, device=DEVICE).to(torch.bfloat16)
    g = torch.randn(16, 32, device=DEVICE).to(torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if DEVICE == "cuda" else "aot_eager")
    for a, b in zip(grads(compiled, x, g), grads(layer, x, g)):
        assert rel(a, b) < 1e-2


@pytest.mark.parametrize("recipe", RECIPES)
def test_autocast_runs_the_layer_in_the_autocast_dtype(recipe):
    """Under autocast with fp32 master weights the layer runs as nn.Linear does there: what the layer with
    bf16 parameters gives for bf16 operands, the gradients landing in the fp32 parameters."""
    torch.manual_seed(4)
    layer = Fp8Linear(64, 32, device=DEVICE, recipe=recipe)
    half = Fp8Linear(64, 32, device=DEVICE, dtype=torch.bfloat16, recipe=recipe)
    half.load_state_dict(layer.state_dict())
    x, g = torch.randn(16, 64, device=DEVICE), torch.randn(16, 32, device=DEVICE).to(torch.bfloat16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = layer(x)
    y.backward(g)
    want = half(x.to(torch.bfloat16))
    want.backward(g)
    # the same computation, up to reduction order
    assert y.dtype == torch.bfloat16 and rel(y.detach(), want.detach()) <= 1e-3
    for p, q in ((layer.weight, half.weight), (layer.bias, half.bias)):
        assert p.grad.dtype == torch.float32 and rel(p.grad, q.grad) <= 1e-3


def test_unknown_recipe_is_rejected():
    with pytest.raises(ValueError, match="unknown fp8 recipe"):
        Fp8Linear(16, 16, recipe="tensorwise")


def test_int8_matmul_refuses_fp8_operands():
    q = torch.zeros(16, 16, device=DEVICE).to(torch.float8_e4m3fn)
    s = torch.ones(16, device=DEVICE)
    with pytest.raises(ValueError, match="int8 operands expected"):
        int8_matmul_rowwise_columnwise(q, s, q, s)
