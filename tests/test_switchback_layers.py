"""SwitchBackLinear: forward output and the three gradients against a 16-bit reference, inside the
error bound derived from the quantization step (see qbench/layers/switchback.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.switchback_matmul import expected_relative_error, quantization_error_bound
from kernels.switchback_quantize import QMAX
from qbench.layers.switchback import FUNCTIONS, VARIANTS, StandardLinear, StandardLinearFn, SwitchBackLinear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16]
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
SHAPES = [((1, 1, 40), 24), ((3, 7, 50), 33), ((65, 72), 100)]  # (x shape, out_features)


def _case(x_shape, n_out, dtype, variant):
    torch.manual_seed(sum(x_shape) + n_out)
    x = torch.randn(x_shape, device=DEVICE).to(dtype)
    x.view(-1, x_shape[-1])[0] = 0  # an all-zero row must not produce NaN
    layer = SwitchBackLinear(x_shape[-1], n_out, device=DEVICE, dtype=dtype, variant=variant)
    g = torch.randn(*x_shape[:-1], n_out, device=DEVICE).to(dtype)
    return x, layer, g


def _grads(fn, x, w, b, g):
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(g)
    return y.detach(), x.grad, w.grad, b.grad


def _check(got, want, bound, what):
    err = (got.float() - want.float()).abs()
    bad = err > bound
    if bad.any():
        idx = bad.nonzero()[:4].tolist()
        detail = "; ".join(f"{tuple(i)}: |err| {err[tuple(i)]:.3g} > {bound[tuple(i)]:.3g}" for i in idx)
        pytest.fail(f"{what}: {int(bad.sum())} elements outside the bound, first: {detail}")


def _absmax(t, dim=None):
    return t.float().abs().amax() if dim is None else t.float().abs().amax(dim=dim)


def _weight_scales(w, variant, transposed):
    """Scale of W as the variant quantizes it: global, rowwise (forward) or columnwise (backward)."""
    if variant != "vectorwise":
        return _absmax(w).reshape(1)
    return _absmax(w, dim=0) if transposed else _absmax(w, dim=1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape,n_out", SHAPES)
def test_forward_and_gradients_within_quantization_bound(x_shape, n_out, dtype, variant):
    x, layer, g = _case(x_shape, n_out, dtype, variant)
    w, b = layer.weight, layer.bias
    y, dx, dw, db = _grads(FUNCTIONS[variant].apply, x, w, b, g)
    y_ref, dx_ref, dw_ref, db_ref = _grads(F.linear, x, w, b, g)
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, n_out)
    ulp = ULP[dtype]
    # forward: int8 X (rowwise) x int8 W; both outputs rounded to 16 bits -> 2 ulp of slack
    bound = quantization_error_bound(x2, w, _absmax(x2, 1), _weight_scales(w, variant, False))
    _check(y.reshape(-1, n_out), y_ref.reshape(-1, n_out), bound + 2 * ulp * y_ref.float().abs().reshape(
        -1, n_out) + ulp * _absmax(b), "forward")
    # grad-input dX = G W: int8 G (rowwise) x int8 W^T (global or columnwise)
    wt = w.t()
    bound = quantization_error_bound(g2, wt, _absmax(g2, 1), _weight_scales(w, variant, True))
    dx_ref2 = dx_ref.reshape(-1, x.shape[-1])
    _check(dx.reshape(dx_ref2.shape), dx_ref2, bound + 2 * ulp * dx_ref2.float().abs() + 1e-6, "grad-input")
    # grad-weight: 16-bit G^T X; the memory-efficient variant uses X dequantized from int8
    bound = 2 * ulp * (g2.float().abs().t() @ x2.float().abs()) + 1e-6  # summation-order rounding
    if variant == "global_memeff":
        half_step = 0.5 * _absmax(x2, 1) / QMAX  # [M]
        bound = bound + (g2.float().abs().t() @ half_step)[:, None]
    _check(dw, dw_ref, bound, "grad-weight")
    _check(db, db_ref, 2 * ulp * g2.float().abs().sum(0) + 1e-6, "grad-bias")
    assert torch.isfinite(dx).all() and torch.isfinite(y).all()


@pytest.mark.parametrize("variant", [*VARIANTS, "standard"])
@pytest.mark.parametrize("wanted", ["x,b", "w,b", "b", "x,w", "x"])
def test_backward_computes_the_gradients_asked_for(wanted, variant):
    """Every subset of (dX, dW, db) that autograd may ask for: the bias gradient comes from G's quantizer
    when dX is wanted and from a plain sum otherwise; both equal the 16-bit layer's up to rounding."""
    x, layer, g = _case((37, 50), 24, torch.float16, "global")
    x, w, b = (t.detach().clone().requires_grad_(name in wanted.split(","))
               for name, t in zip("xwb", (x, layer.weight, layer.bias)))
    FUNCTIONS[variant].apply(x, w, b).backward(g)
    for name, t in zip("xwb", (x, w, b)):
        assert (t.grad is not None) == (name in wanted.split(",")), name
    if b.grad is not None:
        _check(b.grad, g.float().sum(0), 2 * ULP[torch.float16] * g.float().abs().sum(0) + 1e-6, "grad-bias")


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("variant", VARIANTS)
def test_relative_error_matches_quantization_noise(variant):
    """Tighter than the worst case: the relative error of forward and grad-input is the predicted
    rms quantization noise (kernels.switchback_matmul.expected_relative_error) within a factor 1.3
    either way (1.3: the prediction is an expectation over ~10^4 elements, plus 16-bit rounding);
    a wrong scale or a missing quantization step falls outside."""
    x, layer, g = _case((200, 256), 192, torch.float16, variant)
    w, b = layer.weight, layer.bias
    y, dx, _, _ = _grads(FUNCTIONS[variant].apply, x, w, b, g)
    y_ref, dx_ref, _, _ = _grads(F.linear, x, w, b, g)
    pred = expected_relative_error(x, w, _absmax(x, 1), _weight_scales(w, variant, False), y_ref - b)
    assert pred / 1.3 < _rel(y, y_ref) < pred * 1.3 + 1e-3, (_rel(y, y_ref), pred)
    pred = expected_relative_error(g, w.t(), _absmax(g, 1), _weight_scales(w, variant, True), dx_ref)
    assert pred / 1.3 < _rel(dx, dx_ref) < pred * 1.3 + 1e-3, (_rel(dx, dx_ref), pred)


@pytest.mark.parametrize("variant", VARIANTS)
def test_prepare_for_eval_matches_training_forward(variant):
    x, layer, _ = _case((5, 3, 40), 24, torch.float16, variant)
    with torch.no_grad():
        y_train = layer(x)
        layer.eval()
        layer.prepare_for_eval()
        y_eval = layer(x)
    assert layer._eval_weight[0].dtype == torch.int8
    assert torch.equal(y_train, y_eval)


@pytest.mark.parametrize("dtype", DTYPES)
def test_standard_linear_matches_nn_linear(dtype):
    x, layer, g = _case((9, 31), 17, dtype, "global")
    std = StandardLinear(31, 17, device=DEVICE, dtype=dtype)
    std.load_state_dict(layer.state_dict())
    y, dx, dw, db = _grads(StandardLinearFn.apply, x, std.weight, std.bias, g)
    y_ref, dx_ref, dw_ref, db_ref = _grads(F.linear, x, layer.weight, layer.bias, g)
    for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref), ("dw", dw, dw_ref), ("db", db, db_ref)):
        assert torch.allclose(got.float(), want.float(), rtol=4 * ULP[dtype], atol=1e-3), name
    with torch.no_grad():
        assert torch.equal(std(x), StandardLinearFn.apply(x, std.weight, std.bias))


def test_module_forward_runs_the_variant_function():
    x, layer, _ = _case((4, 40), 24, torch.float16, "vectorwise")
    with torch.no_grad():
        assert torch.equal(layer(x), FUNCTIONS["vectorwise"].apply(x, layer.weight, layer.bias))


def test_unknown_variant_is_rejected():
    with pytest.raises(ValueError, match="unknown SwitchBack variant"):
        SwitchBackLinear(8, 8, variant="rowwise-ish")


def _step(layer, x, g):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    y.backward(g)
    return [y.detach(), x.grad, layer.weight.grad, layer.bias.grad]


def _assert_same(got, want, what):
    for name, a, b in zip(("output", "dX", "dW", "db"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} {name}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        err = (a.float() - b.float()).abs().max().item()
        # same kernels, same inputs: only the 16-bit grad-weight may be computed in another order
        assert err <= 1e-2 * b.float().abs().max().item() + 1e-6, f"{what} {name}: max |diff| {err:.3e}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_fullgraph_matches_eager(variant):
    """torch.compile(fullgraph=True) traces the layer (the kernels are custom ops) and gives the eager
    results; on the CPU the Triton kernels run through the interpreter inside the compiled graph."""
    torch._dynamo.reset()
    x, layer, g = _case((3, 7, 48), 40, torch.float16, variant)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    _assert_same(_step(compiled, x, g), _step(layer, x, g), f"compiled {variant}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_inference_forwards_match_eager(variant):
    """The forwards without autograd compile too (fullgraph) and give the eager outputs: under no_grad (W
    quantized on the call) and after prepare_for_eval (W quantized once), under inference_mode."""
    x, layer, _ = _case((3, 7, 48), 40, torch.float16, variant)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    for prepared in (False, True):
        torch._dynamo.reset()
        if prepared:
            layer.eval()
            layer.prepare_for_eval()
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        with torch.inference_mode() if prepared else torch.no_grad():
            got, want = compiled(x), layer(x)
        assert got.shape == want.shape and got.dtype == want.dtype
        err = (got.float() - want.float()).abs().max().item()
        assert err <= 1e-2 * want.float().abs().max().item() + 1e-6, f"prepared={prepared}: max |diff| {err:.3e}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_autocast_runs_the_layer_in_the_autocast_dtype(variant):
    """Under autocast with fp32 master weights the layer runs as nn.Linear does there: its operands in the
    autocast dtype, its output in it, its gradients into the fp32 parameters: what the layer with 16-bit
    parameters gives for the 16-bit operands, in training and without autograd (prepared for eval, the output
    is in the autocast dtype too)."""
    dtype = torch.bfloat16
    torch.manual_seed(5)
    layer = SwitchBackLinear(48, 40, device=DEVICE, variant=variant)
    half = SwitchBackLinear(48, 40, device=DEVICE, dtype=dtype, variant=variant)
    half.load_state_dict(layer.state_dict())
    x, g = torch.randn(3, 7, 48, device=DEVICE), torch.randn(3, 7, 40, device=DEVICE)
    with torch.autocast(DEVICE, dtype=dtype):
        y = layer(x)
    y.backward(g.to(dtype))
    want = half(x.to(dtype))
    want.backward(g.to(dtype))
    # the same 16-bit computation (a GPU library may pick another reduction order for a product: not bitwise)
    assert y.dtype == dtype and _rel(y, want) <= 1e-3
    for p, q in ((layer.weight, half.weight), (layer.bias, half.bias)):
        assert p.grad.dtype == torch.float32 and _rel(p.grad, q.grad) <= 1e-3
    with torch.no_grad(), torch.autocast(DEVICE, dtype=dtype):
        got = layer(x)
    with torch.no_grad():
        assert got.dtype == dtype and _rel(got, half(x.to(dtype))) <= 1e-3
    layer.eval()
    layer.prepare_for_eval()  # W quantized once, from the fp32 weights themselves: close, not equal
    with torch.no_grad(), torch.autocast(DEVICE, dtype=dtype):
        prepared = layer(x)
    err = (prepared.float() - got.float()).abs().max().item()
    assert prepared.dtype == dtype and err <= 2e-2 * got.float().abs().max().item(), err


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_graph_replay_matches_eager_without_syncs(variant):
    """A whole training step of the layer captured into a CUDA graph replays to the eager results, and
    an eager step makes no host synchronisation (sync debug mode 'error')."""
    x, layer, g = _case((4, 256, 512), 768, torch.bfloat16, variant)
    want = _step(layer, x, g)
    x_static = x.detach().clone().requires_grad_(True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # warm-up: compilation and autotuning happen here, outside the capture
            _step(layer, x, g)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer.zero_grad(set_to_none=True)
        layer(x_static).backward(g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    x_static.grad = None
    with torch.cuda.graph(graph):
        y = layer(x_static)
        y.backward(g)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same([y.detach(), x_static.grad, layer.weight.grad, layer.bias.grad], want, f"graphed {variant}")



class _OpOrder(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run while active, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("variant", VARIANTS + ("fp8",))
def test_backward_orders_the_weight_gradient_by_layer_size(variant, large, monkeypatch):
    """The 16-bit grad-weight product (an aten mm) runs before G is quantized in a small layer (the host is on
    the critical path: the GPU runs it while the host issues the rest) and after the grad-input product in a
    large one (WEIGHT_GRAD_FIRST_BELOW lowered to make this layer large)."""
    import qbench.layers.fp8 as fp8
    import qbench.layers.switchback as switchback

    if large:
        monkeypatch.setattr(switchback, "WEIGHT_GRAD_FIRST_BELOW", 1)

    module = fp8 if variant == "fp8" else switchback
    order = _OpOrder()
    ops_before_quantizing, grad_operands = [], switchback.grad_operands

    def spy(*args, **kwargs):
        ops_before_quantizing.extend(order.ops)
        return grad_operands(*args, **kwargs)

    torch.manual_seed(0)
    layer = fp8.Fp8Linear(32, 16) if variant == "fp8" else SwitchBackLinear(32, 16, variant=variant)
    x = torch.randn(8, 32, requires_grad=True)
    y = layer(x)
    monkeypatch.setattr(module, "grad_operands", spy)
    with order:
        y.backward(torch.randn_like(y))
    assert ("mm" in ops_before_quantizing) != large, order.ops


def test_weight_gradient_goes_first_below_2_to_the_40_multiply_adds():
    from qbench.layers.switchback import weight_grad_first

    def first(m, n, k):
        return weight_grad_first(torch.empty(m, n, device="meta"), torch.empty(m, k, device="meta"))

    assert first(32768, 2048, 8192) and first(8192, 16384, 4096)  # 2^39
    assert not first(32768, 16384, 4096) and not first(131072, 8192, 2048)  # 2^41, 2^41
