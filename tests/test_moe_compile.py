"""The MoE layer at world size 1 compiled (torch.compile, fullgraph) and graph-captured, against eager.

On the CPU the Triton kernels run through the interpreter inside the compiled graph (backend
aot_eager: the custom ops run their eager implementation); on a GPU the same tests compile with
inductor, and the GPU-only tests capture a training step into a CUDA graph and run eager steps under
torch.cuda.set_sync_debug_mode("error") where the plan is static.
"""

import pytest
import torch

from qbench.layers.moe import MoELayer, MoEOptions
from qbench.layers.moe.reference import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "dx", "w1", "b1", "w2", "b2", "gate.weight", "gate.bias")  # _step's order (named_parameters)


def _layer(cf: float, dtype, sizes=(16, 24, 3), hot: int = 0, degree: int = 2):
    d, h, L = sizes
    opts = MoEOptions(d, h, L, 2, capacity_factor=cf, a2a_ffn_overlap_degree=degree, replicate_hot=hot)
    return MoELayer(opts, rank=0, world_size=1, dtype=dtype, device=DEVICE, seed=1)


def _inputs(tokens: int, d: int, dtype, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, d, generator=gen).to(DEVICE, dtype),
            torch.randn(tokens, d, generator=gen).to(DEVICE, dtype))


def _step(module, layer, x, dy):
    """Forward + backward; [out, dx, gate and expert gradients] (fresh gradients)."""
    layer.zero_grad(set_to_none=True)
    xl = x.detach().clone().requires_grad_()
    out = module(xl)
    out.backward(dy)
    return [out.detach(), xl.grad] + [p.grad for p in layer.parameters()]


def _assert_same(got, want, bound: float, what: str) -> None:
    for name, a, b in zip(NAMES, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} {name}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        err = rel_error(a, b)
        assert err <= bound, f"{what} {name}: relative error {err:.2e} > {bound:.0e}"


@pytest.mark.parametrize("cf", [0.5, 0.0], ids=["capacity0.5", "dropless"])
def test_compiled_fullgraph_matches_eager(cf):
    """Static shapes (capacity 0.5 drops tokens; dropless keeps all k * T rows at world size 1)."""
    torch._dynamo.reset()
    dtype = torch.float32
    layer = _layer(cf, dtype)
    assert layer.static_reason() is None
    x, dy = _inputs(37, 16, dtype)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    # compiled first: nothing an eager call sets up on its first use may be needed for the trace
    got = _step(torch.compile(layer, fullgraph=True, backend=backend), layer, x, dy)
    want = _step(layer, layer, x, dy)
    # same kernels (custom ops) in fp32: only inductor's own fusions of the glue may reorder sums
    _assert_same(got, want, 1e-5, f"compiled cf={cf}")


def test_compiled_forward_without_autograd_matches_eager():
    """The forward alone (no_grad, as `qbench moe --eval` runs it) compiles with fullgraph and gives the
    eager output."""
    torch._dynamo.reset()
    dtype = torch.float32
    layer = _layer(0.5, dtype)
    x, _ = _inputs(37, 16, dtype)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    with torch.no_grad():
        got, want = compiled(x), layer(x)
    assert rel_error(got, want) <= 1e-5, f"relative error {rel_error(got, want):.2e}"


def _no_host_reads(monkeypatch):
    """Every way a tensor's value reaches the host raises (the interpreter reads none of them)."""
    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"host read: Tensor.{name}")
        return method

    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


@pytest.mark.skipif(DEVICE == "cuda", reason="the GPU twin runs under set_sync_debug_mode")
@pytest.mark.parametrize("cf", [1.0, 0.0, -0.5], ids=["padded", "dropless", "capped"])
def test_static_step_reads_nothing_on_the_host(cf, monkeypatch):
    """A static step (forward + backward) never reads a tensor value on the host; the capped one must."""
    layer = _layer(cf, torch.float32)
    x, dy = _inputs(37, 16, torch.float32)
    _step(layer, layer, x, dy)  # first launches outside the check
    _no_host_reads(monkeypatch)
    if cf < 0:
        assert layer.static_reason() is not None
        with pytest.raises(AssertionError, match="host read"):
            _step(layer, layer, x, dy)
        return
    _step(layer, layer, x, dy)


@pytest.mark.gpu
@pytest.mark.parametrize("cf", [1.0, 0.0], ids=["padded", "dropless"])
def test_cuda_graph_step_matches_eager_without_syncs(cf):
    """Eager steps of a static configuration make no host synchronisation, and the step captured
    into one CUDA graph replays to the eager results (fp16, realistic tile shapes)."""
    dtype = torch.float16
    layer = _layer(cf, dtype, sizes=(256, 512, 4))
    x, dy = _inputs(1024, 256, dtype)
    want = _step(layer, layer, x, dy)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # warm-up: autotuning and first launches happen here, outside the capture
            _step(layer, layer, x, dy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    xs = x.detach().clone().requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(xs).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    layer.zero_grad(set_to_none=True)
    xs.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(xs)
        out.backward(dy)
    graph.replay()
    torch.cuda.synchronize()
    got = [out.detach(), xs.grad] + [p.grad for p in layer.parameters()]
    _assert_same(got, want, 1e-3, f"graphed cf={cf}")  # same kernels: only dW summation order may move


@pytest.mark.gpu
def test_capture_of_a_step_that_reads_its_plan_says_why():
    layer = _layer(-0.5, torch.float16, sizes=(64, 128, 4))
    x, _ = _inputs(256, 64, torch.float16)
    layer(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph: capped capacity"):
        with torch.cuda.graph(graph):
            layer(x)


def test_layer_keeps_no_autograd_graph_after_its_step():
    """What the layer gives its plan hooks of a step (the bench keeps it for its statistics) holds no autograd
    graph: a kept
    graph keeps the step's AccumulateGrad nodes, so that the next backward joins their stream (a sync
    in eager, a failed CUDA-graph capture)."""
    layer = _layer(1.0, torch.float32)
    x, dy = _inputs(37, 16, torch.float32)
    seen = []
    layer.plan_hooks.register(lambda routing, plan: seen.append(routing))
    _step(layer, layer, x, dy)
    assert seen and seen[-1].weights.grad_fn is None
    assert seen[-1].weights.requires_grad is False


@pytest.mark.parametrize("cf,fp32_gate", [(0.5, False), (0.0, True)], ids=["capacity0.5", "dropless-fp32-gate"])
def test_autocast_runs_the_layer_in_the_autocast_dtype(cf, fp32_gate):
    """Under autocast with fp32 master weights the layer runs as nn.Linear does there: what the layer with
    16-bit parameters (the same numbers) gives for the 16-bit input, its output in that dtype, its gradients
    into the fp32 parameters; an fp32 gate stays fp32 (same routing in both). Before, the experts ran in fp32.
    Replicated experts under autocast: tests/test_moe_dist.py."""
    dtype = torch.bfloat16
    opts = MoEOptions(16, 24, 3, 2, capacity_factor=cf, fp32_gate=fp32_gate)
    layer = MoELayer(opts, rank=0, world_size=1, dtype=torch.float32, device=DEVICE, seed=1)
    half = MoELayer(opts, rank=0, world_size=1, dtype=dtype, device=DEVICE, seed=1)
    half.load_state_dict(layer.state_dict())
    x, dy = _inputs(37, 16, torch.float32)
    with torch.autocast(DEVICE, dtype=dtype):
        got = _step(layer, layer, x, dy.to(dtype))
    want = _step(half, half, x.to(dtype), dy.to(dtype))
    assert got[0].dtype == dtype and got[1].dtype == torch.float32  # out, and dx through the input's cast
    for name, p, q in zip(NAMES[2:], got[2:], want[2:]):
        assert p.dtype == torch.float32 and q.dtype == (torch.float32 if fp32_gate and "gate" in name else dtype)
    # the same 16-bit computation; dx and fp32-gate gradients differ only by where fp32 results are rounded
    for name, a, b in zip(NAMES, got, want):
        assert rel_error(a.float(), b.float()) <= 1e-2, f"{name}: relative error {rel_error(a.float(), b.float()):.2e}"


def test_compiled_under_autocast_matches_eager():
    """fp32 master weights under autocast, compiled with fullgraph: the eager step's outputs and gradients."""
    torch._dynamo.reset()
    layer = _layer(0.5, torch.float32)
    x, dy = _inputs(37, 16, torch.float32)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        got = _step(torch.compile(layer, fullgraph=True, backend=backend), layer, x, dy.to(torch.bfloat16))
        want = _step(layer, layer, x, dy.to(torch.bfloat16))
    # the same bf16 kernels; inductor may fuse the casts and the glue around them differently
    _assert_same(got, want, 1e-2, "compiled under autocast")
