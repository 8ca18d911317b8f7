"""FragmentedLinear against a direct implementation of the reference math (float64, sample by
sample), on odd, non-power-of-two and single-row shapes in every supported dtype."""

import re

import pytest
import torch

from kernels.fragmented import select_scale, select_scale_reference
from qbench.layers.fragmented import (
    BlockDiagonalLinear,
    FragmentedLinear,
    LowRankLinear,
    fragmented_parameter_count,
    reference_output,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# relative error bound of a low-precision layer against float64 on the same rounded values
TOL = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 4e-3}  # fp32: K <= 256 sums; bf16/fp16: a few roundings of 2^-8 / 2^-11
# (in, out, N, c, batch): odd sizes, F = 1, N = 1, single rows, out = 1
SHAPES = [(96, 40, 3, 5, 7), (64, 33, 64, 2, 1), (256, 130, 8, 8, 5), (32, 1, 1, 1, 1), (120, 24, 5, 3, 11)]


def direct(x, layer, hard):
    """The reference definition, one sample at a time in float64 (the original per-sample gather)."""
    n, f = layer.num_fragments, layer.fragment_size
    S = layer.selector_weights.double()
    W = layer.expert_weights.double()
    C, E = layer.compressor.weight.double(), layer.compressed_net.weight.double()
    rows = []
    for xb in x.double():
        frags = xb.view(n, f)
        p = torch.softmax((frags * S).sum(1), dim=0)
        if hard:
            k = int(p.argmax())
            expert = frags[k] @ W[k]
            keep = torch.ones(n, dtype=torch.float64, device=xb.device)
            keep[k] = 0.0
        else:
            expert = sum(p[k] * (frags[k] @ W[k]) for k in range(n))
            keep = 1 - p
        masked = (frags * keep[:, None]).reshape(-1)
        rows.append(expert + E @ (C @ masked))
    out = torch.stack(rows)
    if layer.has_bias:
        out = out + layer.expert_bias.double() + layer.compressed_bias.double()
    return out


def relerr(out, ref, rows=None):
    ref = ref.detach()
    d = out.detach().double() - ref
    if rows is not None:
        d, ref = d[rows], ref[rows]
    return float(d.norm() / ref.norm())


def first_mismatches(out, ref, tol, k=3):
    out, ref = out.detach().cpu(), ref.detach().cpu()
    bad = ((out.double() - ref).abs() > tol * ref.abs().max()).nonzero()[:k].tolist()
    return [(i, j, float(out[i, j]), float(ref[i, j])) for i, j in bad]


def clear_rows(layer, x, gap=1e-3):
    """Rows whose top-2 selector scores are not a near-tie (where rounding may pick either)."""
    s = layer.scores(x).double()
    if s.shape[1] == 1:
        return torch.ones(s.shape[0], dtype=torch.bool, device=x.device)
    top = s.topk(2, dim=1).values
    return top[:, 0] - top[:, 1] > gap


def make(shape, dtype, bias=False, seed=0, device="cpu"):
    inp, out, n, c, b = shape
    torch.manual_seed(seed)
    layer = FragmentedLinear(inp, out, n, c, bias=bias, dtype=DTYPES[dtype], device=device)
    if bias:
        with torch.no_grad():
            layer.expert_bias.normal_()
            layer.compressed_bias.normal_()
    return layer, torch.randn(b, inp, dtype=DTYPES[dtype], device=device)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GPU_SHAPES = SHAPES + [(2048, 512, 128, 64, 16), (4096, 256, 2, 128, 9)]  # grouped / dense eval paths


def read_seed_groups(fixtures_dir):
    """{size: (linear parameters, {fragments: parameters})} from the seed excerpt."""
    text = (fixtures_dir / "fragmented_seed_excerpt.txt").read_text()
    groups = {}
    for block in text.split("Benchmarking with input_size=")[1:]:
        size = int(block.split(",")[0])
        params = [int(v) for v in re.findall(r"Parameters: (\d+)", block)]
        frags = [int(v) for v in re.findall(r"Fragments: (\d+)", block)]
        groups[size] = (params[0], dict(zip(frags, params[1:])))
    return groups


def test_parameter_counts_match_the_seed(fixtures_dir):
    groups = read_seed_groups(fixtures_dir)
    assert sorted(groups) == [2048, 4096, 8192]
    for size, (linear_count, by_n) in groups.items():
        assert sum(p.numel() for p in torch.nn.Linear(size, size, device="meta").parameters()) == linear_count
        for n, expected in by_n.items():
            layer = FragmentedLinear(size, size, n, device="meta")
            assert sum(p.numel() for p in layer.parameters()) == expected, (size, n)
            assert fragmented_parameter_count(size, size) == expected
        names = dict(layer.named_parameters())
        assert names["selector_weights"].shape == (n, size // n)
        assert names["expert_weights"].shape == (n, size // n, size)
        assert names["compressor.weight"].shape == (size // 32, size)
        assert names["compressed_net.weight"].shape == (size, size // 32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_train_mode_matches_reference(shape, dtype, device):
    if device == "cpu" and shape not in SHAPES:
        pytest.skip("large shape: GPU only")
    layer, x = make(shape, dtype, bias=shape[0] == 120, device=device)
    layer.train()
    with torch.no_grad():
        out = layer(x)
    ref = direct(x, layer, hard=False)
    assert out.dtype == x.dtype and out.shape == ref.shape
    err = relerr(out, ref)
    assert err <= TOL[dtype], f"rel err {err:.2e}; first mismatches {first_mismatches(out, ref, TOL[dtype])}"
    assert relerr(reference_output(layer, x, hard=False).float(), ref) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_eval_mode_matches_reference_on_both_paths(shape, dtype, device):
    if device == "cpu" and shape not in SHAPES:
        pytest.skip("large shape: GPU only")
    layer, x = make(shape, dtype, bias=shape[0] == 120, seed=1, device=device)
    layer.eval()
    ref = direct(x, layer, hard=True)
    rows = clear_rows(layer, x)
    assert rows.sum() >= 1
    for path in ("dense", "grouped"):
        layer.eval_path = path
        with torch.no_grad():
            out = layer(x)
        err = relerr(out, ref, rows)
        assert err <= TOL[dtype], f"{path}: {err:.2e}; first {first_mismatches(out[rows], ref[rows], TOL[dtype])}"
    infer = layer.infer(x)
    assert not infer.requires_grad and relerr(infer, ref, rows) <= TOL[dtype]
    assert relerr(reference_output(layer, x, hard=True).float(), ref, rows) <= 1e-6


def forced_layer(choices, n=5, f=6, out=7, dtype=torch.float32):
    """A layer and input whose hard selection is `choices` (uneven loads, some fragments empty):
    selector weights are all ones and each row's chosen fragment gets a large positive offset."""
    torch.manual_seed(2)
    layer = FragmentedLinear(n * f, out, n, 2, dtype=dtype).eval()
    with torch.no_grad():
        layer.selector_weights.fill_(1.0)
    x = torch.randn(len(choices), n, f, dtype=dtype)
    x[torch.arange(len(choices)), torch.tensor(choices)] += 4.0  # score gap >= ~4 * f over noise
    return layer, x.reshape(len(choices), n * f)


def test_grouped_path_on_uneven_loads_with_empty_fragments():
    choices = [0, 0, 0, 0, 3, 3, 1, 0, 3]  # fragments 2 and 4 get no samples
    layer, x = forced_layer(choices)
    assert layer.scores(x).argmax(1).tolist() == choices
    ref = direct(x, layer, hard=True)
    grads = {}
    for path in ("grouped", "dense"):
        layer.eval_path = path
        layer.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_()
        out = layer(xr)
        assert relerr(out, ref) <= 1e-6, first_mismatches(out, ref, 1e-6)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads[path] = (xr.grad, layer.expert_weights.grad, layer.compressor.weight.grad)
        assert layer.selector_weights.grad is None  # argmax has no gradient, as in the reference
    for g, d in zip(grads["grouped"], grads["dense"]):
        assert torch.allclose(g, d, rtol=1e-5, atol=1e-6), (g - d).abs().max()
    empty = grads["grouped"][1][[2, 4]]
    assert torch.count_nonzero(empty) == 0  # fragments without samples get no weight gradient


def test_single_sample_and_all_in_one_fragment():
    for choices in ([4], [2, 2, 2]):
        layer, x = forced_layer(choices)
        layer.eval_path = "grouped"
        assert relerr(layer(x), direct(x, layer, hard=True)) <= 1e-6


def direct_autograd(layer, x, hard):
    """float64 leaf copies of the parameters and x, and the direct reference output built on them."""
    leaves = {k: v.detach().double().requires_grad_() for k, v in layer.named_parameters()}
    xd = x.detach().double().requires_grad_()
    twin = FragmentedLinear(layer.in_features, layer.out_features, layer.num_fragments,
                            layer.compressed_features, device=x.device)
    twin.has_bias = layer.has_bias
    for name, value in leaves.items():
        owner, attr = (twin, name) if "." not in name else (getattr(twin, name.split(".")[0]), "weight")
        owner._parameters[attr] = value
    return leaves, xd, direct(xd, twin, hard)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(96, 40, 3, 5, 7), (64, 33, 64, 2, 1), (120, 24, 5, 3, 2)])
@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("x_grad", [True, False], ids=["x-grad", "x-data"])
def test_gradients_match_reference(shape, hard, x_grad, device, monkeypatch):
    """x-data (x needs no gradient, batch <= F): the soft layer takes the selector's gradient from the
    per-fragment outputs z, never from dy W^T, and the low-rank gradients from dW's pass (the general
    backward and the unfused one are made to fail to prove it)."""
    layer, x = make(shape, "fp32", bias=True, seed=3, device=device)
    layer.train(not hard)
    leaves, xd, ref = direct_autograd(layer, x, hard)
    weight = torch.randn_like(ref)
    (ref * weight).sum().backward()
    if not x_grad and not hard and x.shape[0] <= layer.fragment_size:
        import qbench.layers.fragmented as module

        monkeypatch.setattr(module, "select_scale_backward", lambda *a: pytest.fail("dy W^T was formed"))
        monkeypatch.setattr(module, "expert_weight_grad", lambda *a: pytest.fail("the unfused low-rank backward ran"))
    paths = ("dense", "grouped") if hard else ("auto",)
    for path in paths:
        layer.eval_path = path
        layer.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_(x_grad)
        (layer(xr) * weight.float()).sum().backward()
        got = dict(layer.named_parameters())
        for name, leaf in leaves.items():
            if hard and name == "selector_weights":
                assert got[name].grad is None
                continue
            err = relerr(got[name].grad, leaf.grad)
            assert err <= 1e-5, f"{path} d{name}: rel err {err:.2e}"
        assert (relerr(xr.grad, xd.grad) <= 1e-5) if x_grad else xr.grad is None, f"{path} dx"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,f,b", [(3, 7, 5), (1, 33, 1), (16, 2, 4), (5, 24, 9), (128, 64, 3)])
def test_select_scale_kernel_matches_torch(n, f, b, dtype, device):
    torch.manual_seed(n * 100 + f)
    x = torch.randn(b, n * f, dtype=DTYPES[dtype], device=device)
    s = torch.randn(n, f, dtype=DTYPES[dtype], device=device)
    for hard in (False, True):
        got, want = select_scale(x, s, hard), select_scale_reference(x, s, hard)
        if hard:
            assert torch.equal(got[3], want[3])
        for name, a, e in zip("uvp", got[:3], want[:3]):
            assert a.dtype == e.dtype and a.shape == e.shape
            assert torch.allclose(a.float(), e.float(), rtol=1e-2 if dtype != "fp32" else 1e-5, atol=1e-5), (
                f"{name} hard={hard}: first {(a.float() - e.float()).abs().argmax()}")


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="not divisible"):
        FragmentedLinear(100, 10, 3)
    with pytest.raises(ValueError, match="compressed_features"):
        FragmentedLinear(16, 16, 2)  # in/32 = 0
    with pytest.raises(ValueError, match="positive"):
        FragmentedLinear(64, 0, 2)
    with pytest.raises(ValueError, match="expects 64"):
        FragmentedLinear(64, 8, 2)(torch.randn(2, 65))
    with pytest.raises(ValueError, match="divide"):
        BlockDiagonalLinear(64, 30, 4)


def test_block_diagonal_and_low_rank_baselines():
    torch.manual_seed(4)
    bd = BlockDiagonalLinear(96, 48, 3, bias=True)
    with torch.no_grad():
        bd.bias.normal_()
    x = torch.randn(5, 96)
    dense = torch.block_diag(*bd.weight.double())  # [96, 48]
    assert relerr(bd(x), x.double() @ dense + bd.bias.double()) <= 1e-6
    assert sum(p.numel() for p in bd.parameters()) == 96 * 48 // 3 + 48
    lr = LowRankLinear(96, 48, 3)
    assert sum(p.numel() for p in lr.parameters()) == (96 + 48) * 3
    ref = x.double() @ lr.down.weight.double().t() @ lr.up.weight.double().t()
    assert relerr(lr(x), ref) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,f,b", [(3, 7, 5), (1, 33, 1), (16, 2, 40), (128, 64, 3)])
def test_select_scale_backward_kernels_match_torch(n, f, b, dtype, device):
    """dx and dS of the selector's backward kernels against the plain-torch formula (fp32 inside)."""
    from kernels.fragmented import select_scale_backward, select_scale_backward_reference

    torch.manual_seed(n + 7 * f + b)
    x = torch.randn(b, n * f, dtype=DTYPES[dtype], device=device)
    s = torch.randn(n, f, dtype=DTYPES[dtype], device=device)
    du, dv = torch.randn_like(x), torch.randn_like(x)
    for hard in (False, True):
        p = select_scale(x, s, hard)[2]
        got, want = select_scale_backward(x, s, p, du, dv, hard), select_scale_backward_reference(x, s, p, du, dv, hard)
        for name, a, e in zip(("dx", "dS"), got, want):
            assert a.dtype == e.dtype and a.shape == e.shape, f"{name} hard={hard}: {a.shape} vs {e.shape}"
            if hard and name == "dS":
                assert a.numel() == 0, "the hard selection has no selector gradient"
                continue
            tol = 1e-2 if dtype != "fp32" else 1e-5
            if not e.any():  # one fragment: p = 1, so dscore and dS are exactly zero
                assert not a.any(), f"{name} hard={hard}: expected zeros"
                continue
            assert relerr(a, e) <= tol, f"{name} hard={hard}: rel err {relerr(a, e):.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,f,b,out", [(3, 7, 5, 9), (1, 33, 1, 4), (16, 2, 2, 40), (8, 64, 3, 700), (5, 24, 2, 1000),
                                       (128, 3, 2, 50)])
def test_selector_gradient_kernel_matches_torch(n, f, b, out, dtype, device):
    """dS from the per-fragment outputs z (x needs no gradient) against the plain-torch formula, and
    against the general backward given du = dy W^T (the same quantity reached the other way)."""
    from kernels.fragmented import select_scale_backward_reference, selector_gradient, selector_gradient_reference

    torch.manual_seed(n + 7 * f + b + out)
    x = torch.randn(b, n * f, dtype=DTYPES[dtype], device=device)
    s = torch.randn(n, f, dtype=DTYPES[dtype], device=device)
    w = torch.randn(n, f, out, dtype=DTYPES[dtype], device=device) / f**0.5
    dy, dv = torch.randn(b, out, dtype=x.dtype, device=device), torch.randn_like(x)
    p = select_scale(x, s, False)[2]
    z = torch.bmm(x.view(b, n, f).transpose(0, 1).float(), w.float()).to(x.dtype)  # [N, B, out]
    got, want = selector_gradient(x, s, p, dv, z, dy), selector_gradient_reference(x, s, p, dv, z, dy)
    assert got.dtype == s.dtype and got.shape == s.shape
    tol = 1e-2 if dtype != "fp32" else 1e-5
    if n == 1:  # one fragment: p = 1, dscore = 0
        assert not got.any()
        return
    assert relerr(got, want) <= tol, f"rel err {relerr(got, want):.2e}"
    if dtype == "fp32":
        du = dy @ w.view(n * f, out).t()
        general = select_scale_backward_reference(x, s, p, du, dv, False)[1]
        assert relerr(got, general) <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,f,b,out", [(3, 7, 5, 9), (1, 33, 1, 4), (8, 64, 16, 100), (5, 40, 17, 33), (2, 8, 65, 20)])
def test_fragment_outputs_kernel_matches_torch(n, f, b, out, dtype, device):
    """z = x_f W_f per fragment and c = v C^T in one kernel, then y = sum_f p_f z_f + c E^T from z, each
    kernel against its plain-torch formula and float64 (17 rows: a padded row block; 65 rows: beyond the
    kernels' row limit, the torch path; rank 70: two chunks of the low-rank product and five blocks of c's
    programs, the last ragged)."""
    from kernels.fragmented_experts import (
        expert_sum,
        expert_sum_reference,
        fragment_outputs,
        fragment_outputs_reference,
    )

    torch.manual_seed(n + 3 * f + b + out)
    x = torch.randn(b, n * f, dtype=DTYPES[dtype], device=device)
    v = torch.randn(b, n * f, dtype=DTYPES[dtype], device=device)
    w = torch.randn(n, f, out, dtype=DTYPES[dtype], device=device) / f**0.5
    cw = torch.randn(70, n * f, dtype=x.dtype, device=device) / (n * f) ** 0.5
    p = torch.softmax(torch.randn(b, n, device=device), dim=1)
    e = torch.randn(out, 70, dtype=x.dtype, device=device) / 70**0.5
    z, c = fragment_outputs(x, w, v, cw)
    y = expert_sum(z, p, c, e)
    z_alone, no_c = fragment_outputs(x, w)  # without v and C: no programs for c (a GPU may tune other tiles)
    assert no_c is None and relerr(z_alone, z) <= (1e-2 if dtype != "fp32" else 1e-5)
    assert z.shape == (n, b, out) and c.shape == (b, 70) and y.shape == (b, out)
    assert z.dtype == c.dtype == y.dtype == x.dtype
    exact = torch.bmm(x.double().view(b, n, f).transpose(0, 1), w.double())
    c_exact = v.double() @ cw.double().t()
    y_exact = torch.einsum("bn,nbo->bo", p.double(), z.double()) + c.double() @ e.double().t()
    z_want, c_want = fragment_outputs_reference(x, w, v, cw)
    tol = 1e-2 if dtype != "fp32" else 1e-5
    for name, got, want in (("z", z, z_want), ("c", c, c_want), ("y", y, expert_sum_reference(z, p, c, e)),
                            ("z exact", z, exact), ("c exact", c, c_exact), ("y exact", y, y_exact)):
        assert relerr(got, want) <= tol, f"{name}: rel err {relerr(got, want):.2e}"


def _train_step(layer, x, g, x_grad=True):
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x_grad)
    y = layer(x)
    y.backward(g)
    return [y.detach()] + ([x.grad] if x_grad else []) + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("x_grad", [True, False], ids=["x-grad", "x-data"])
@pytest.mark.parametrize("path", ["train", "grouped", "dense"])
def test_compiled_fullgraph_step_matches_eager(path, x_grad):
    """torch.compile(fullgraph=True) of the layer (kernels as custom ops; on the CPU the Triton kernels run
    through the interpreter) gives the eager output and gradients: in training mode with and without a
    gradient for x (the second keeps the per-fragment outputs), and in eval mode on both hard-selection
    paths (the grouped one lost dW under torch 2.11's compile while its output was built in place)."""
    torch._dynamo.reset()
    layer, x = make((96, 40, 3, 5, 7), "fp32", bias=True, seed=5, device="cuda" if torch.cuda.is_available() else "cpu")
    if path != "train":
        layer.eval()
        layer.eval_path = path
    g = torch.randn(x.shape[0], 40, device=x.device)
    backend = "inductor" if x.is_cuda else "aot_eager"
    got = _train_step(torch.compile(layer, fullgraph=True, backend=backend), x, g, x_grad)
    want = _train_step(layer, x, g, x_grad)
    assert [t is None for t in got] == [t is None for t in want]  # eval: the selector gets no gradient
    for i, (a, e) in enumerate(zip(got, want)):
        if e is not None:
            assert relerr(a, e) <= 1e-5, f"tensor {i}: rel err {relerr(a, e):.2e}"


@pytest.mark.parametrize("path", ["grouped", "dense"])
def test_compiled_inference_matches_eager(path):
    """The eval-mode layer compiled with fullgraph, called under inference_mode (as `infer` calls it), gives
    the eager output on both hard-selection paths."""
    torch._dynamo.reset()
    layer, x = make((96, 40, 3, 5, 7), "fp32", bias=True, seed=7, device="cuda" if torch.cuda.is_available() else "cpu")
    layer.eval()
    layer.eval_path = path
    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if x.is_cuda else "aot_eager")
    with torch.inference_mode():
        got, want = compiled(x), layer(x)
    assert relerr(got, want) <= 1e-5, f"rel err {relerr(got, want):.2e}"


@pytest.mark.parametrize("path", ["train", "grouped", "dense"])
def test_autocast_runs_the_layer_in_the_autocast_dtype(path):
    """Under autocast with fp32 master weights the layer runs as nn.Linear does there: what the layer with
    bf16 parameters gives for bf16 input (output in bf16), the gradients landing in the fp32 parameters; in
    training mode and on both eval paths (before, training under autocast failed on mixed dtypes)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layer, x = make((96, 40, 3, 5, 7), "fp32", bias=True, seed=8, device=device)
    half = FragmentedLinear(96, 40, 3, 5, bias=True, dtype=torch.bfloat16, device=device)
    half.load_state_dict(layer.state_dict())
    for m in (layer, half):
        m.train(path == "train")
        m.eval_path = "auto" if path == "train" else path
    g = torch.randn(x.shape[0], 40, device=device).to(torch.bfloat16)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(x)
    y.backward(g)
    want = half(x.to(torch.bfloat16))
    want.backward(g)
    # the same bf16 computation; on a GPU the backward's fp32 atomics may add in another order
    assert y.dtype == torch.bfloat16 and relerr(y, want) <= 1e-3
    for (name, p), q in zip(layer.named_parameters(), half.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert p.grad.dtype == torch.float32 and relerr(p.grad, q.grad.float()) <= 1e-3, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cuda_graph_train_step_matches_eager_without_syncs(dtype):
    """The training step captured into a CUDA graph replays to the eager results; eager steps make no
    host synchronisation (sync debug mode 'error')."""
    layer, x = make((1024, 512, 8, 32, 16), dtype, bias=False, seed=6, device="cuda")
    g = torch.randn(x.shape[0], 512, device="cuda", dtype=x.dtype)
    want = _train_step(layer, x, g)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            _train_step(layer, x, g)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    xs = x.detach().clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(xs).backward(g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    xs.grad = None
    with torch.cuda.graph(graph):
        y = layer(xs)
        y.backward(g)
    graph.replay()
    torch.cuda.synchronize()
    for i, (a, e) in enumerate(zip([y, xs.grad] + [p.grad for p in layer.parameters()], want)):
        assert relerr(a, e) <= 1e-2, f"tensor {i}: rel err {relerr(a, e):.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("b,n_in,out", [(5, 70, 33), (1, 64, 160), (16, 96, 40), (17, 33, 65), (65, 24, 20)])
def test_expert_weight_grad_matches_torch(b, n_in, out, dtype, device):
    """dW = u^T dy from the persistent kernel (a few programs walking many tiles, ragged edges, 17 rows: a
    second row chunk; 65 rows: the torch path) against torch and float64."""
    from kernels.fragmented_backward import expert_weight_grad, expert_weight_grad_reference

    torch.manual_seed(b + 3 * n_in + out)
    u = torch.randn(b, n_in, dtype=DTYPES[dtype], device=device)
    dy = torch.randn(b, out, dtype=DTYPES[dtype], device=device)
    got = expert_weight_grad(u, dy)
    assert got.shape == (n_in, out) and got.dtype == u.dtype
    tol = 1e-2 if dtype != "fp32" else 1e-6
    assert relerr(got, expert_weight_grad_reference(u, dy)) <= tol
    assert relerr(got, u.double().t() @ dy.double()) <= tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("b,n_in,out,r", [(5, 70, 33, 9), (1, 64, 160, 70), (17, 96, 40, 64), (3, 24, 20, 130),
                                         (65, 24, 20, 3)])
def test_expert_backward_and_low_rank_input_grad_match_torch(b, n_in, out, r, dtype, device):
    """dW = u^T dy with dE = dy^T c and dc = dy E from one persistent pass (a few programs, ragged tiles, rank
    70: a ragged second chunk; 17 rows: a second row chunk; 65 rows: the torch path), then dv = dc C and
    dC = dc^T v from one pass, against torch and float64."""
    from kernels.fragmented_backward import (
        expert_backward,
        expert_backward_reference,
        low_rank_input_grad,
        low_rank_input_grad_reference,
    )

    torch.manual_seed(b + 3 * n_in + out + 7 * r)
    dt = DTYPES[dtype]
    u, v = torch.randn(b, n_in, dtype=dt, device=device), torch.randn(b, n_in, dtype=dt, device=device)
    dy, c = torch.randn(b, out, dtype=dt, device=device), torch.randn(b, r, dtype=dt, device=device)
    e, cw = torch.randn(out, r, dtype=dt, device=device), torch.randn(r, n_in, dtype=dt, device=device)
    dw, de, dc = expert_backward(u, dy, c, e)
    assert dw.shape == (n_in, out) and de.shape == (out, r) and dc.shape == (b, r) and dc.dtype == torch.float32
    dv, dcw = low_rank_input_grad(dc, cw, v)
    assert dv.shape == (b, n_in) and dcw.shape == (r, n_in) and dv.dtype == dcw.dtype == dt
    tol = 1e-2 if dtype != "fp32" else 1e-5
    d64 = dy.double()
    dc64 = d64 @ e.double()
    for name, got, want, exact in (
            ("dW", dw, expert_backward_reference(u, dy, c, e)[0], u.double().t() @ d64),
            ("dE", de, expert_backward_reference(u, dy, c, e)[1], d64.t() @ c.double()),
            ("dc", dc, expert_backward_reference(u, dy, c, e)[2], dc64),
            ("dv", dv, low_rank_input_grad_reference(dc, cw, v)[0], dc64 @ cw.double()),
            ("dC", dcw, low_rank_input_grad_reference(dc, cw, v)[1], dc64.t() @ v.double())):
        assert relerr(got, want) <= tol, f"{name}: rel err {relerr(got, want):.2e}"
        assert relerr(got, exact) <= tol, f"{name} exact: rel err {relerr(got, exact):.2e}"


def test_expert_backward_is_the_torch_reference_under_deterministic_algorithms():
    """dc's fp32 atomics sum in a run-dependent order; torch.use_deterministic_algorithms(True) takes the
    reference instead (equal to it bit for bit)."""
    from kernels.fragmented_backward import expert_backward, expert_backward_reference

    torch.manual_seed(0)
    u, dy, c = torch.randn(5, 40), torch.randn(5, 48), torch.randn(5, 70)
    e = torch.randn(48, 70)
    torch.use_deterministic_algorithms(True)
    try:
        got = expert_backward(u, dy, c, e)
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(got, expert_backward_reference(u, dy, c, e)):
        assert torch.equal(a, b)
