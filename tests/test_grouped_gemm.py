"""Grouped GEMM (kernels/grouped_gemm.py): the Triton kernels (interpreter on CPU, compiled on a GPU)
against the plain-torch reference, on odd shapes, empty and single-row groups, every dtype."""

import pytest
import torch

from kernels import grouped_gemm as gg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 runs with IEEE products in the kernel; 16-bit inputs are multiplied exactly and summed in fp32
# by both sides, so the gap is the final rounding to 16 bits (bf16 has 8 mantissa bits).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOL)
# (group sizes, K, N): empty groups, a single row, non-power-of-two everything, one group
SHAPES = [
    ([5, 0, 1, 13, 0, 18], 19, 23),
    ([1], 7, 5),
    ([0, 0, 3], 16, 33),
    ([40, 2], 24, 17),
]


def _offsets(sizes):
    return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _inputs(sizes, K, N, dtype, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    T, G = sum(sizes), len(sizes)
    x = torch.randn(T, K, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(G, K, N, generator=gen) / K**0.5).to(DEVICE, dtype)
    b = torch.randn(G, N, generator=gen).to(DEVICE, dtype)
    return x, w, b


def _assert_close(got, want, tol, what):
    err = (got.float() - want.float()).abs()
    scale = want.float().abs().max().clamp_min(1e-6)
    bad = (err > tol * scale).nonzero()
    if bad.numel():
        first = [tuple(i.tolist()) for i in bad[:5]]
        raise AssertionError(
            f"{what}: {bad.shape[0]} mismatches (max rel {float(err.max() / scale):.2e} > {tol}); "
            f"first at {first}: got {[float(got[i]) for i in first]} want {[float(want[i]) for i in first]}"
        )


def _dense(x, w, offsets, b):
    """Independent check of the reference itself: a per-row loop over the group index."""
    rows = []
    bounds = offsets.tolist()
    for g in range(w.shape[0]):
        for r in range(bounds[g], bounds[g + 1]):
            rows.append(x[r].double() @ w[g].double() + (0 if b is None else b[g].double()))
    return torch.stack(rows) if rows else torch.zeros(0, w.shape[2], dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}" if isinstance(s, tuple) else None)
def test_forward_matches_reference(shape, dtype):
    sizes, K, N = shape
    x, w, b = _inputs(sizes, K, N, dtype, seed=len(sizes) * 100 + K)
    offsets = _offsets(sizes)
    for bias in (None, b):
        got = gg.grouped_matmul(x, w, offsets, bias)
        want = gg.grouped_matmul_reference(x, w, offsets, bias)
        assert got.dtype == x.dtype and got.shape == (sum(sizes), N)
        _assert_close(got, want, TOL[dtype], f"forward bias={bias is not None}")
        _assert_close(want.cpu(), _dense(x.cpu(), w.cpu(), offsets.cpu(), None if bias is None else b.cpu()),
                      TOL[dtype], "reference vs per-row loop")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_matches_reference(dtype):
    sizes, K, N = [3, 0, 17, 1, 9], 21, 18
    x, w, b = _inputs(sizes, K, N, dtype, seed=7)
    offsets = _offsets(sizes)
    dy = torch.randn(sum(sizes), N, device=DEVICE).to(dtype)
    grads = []
    for fn in (gg.grouped_matmul, gg.grouped_matmul_reference):
        leaves = [t.detach().clone().float().requires_grad_() for t in (x, w, b)]
        args = [t.to(dtype) for t in leaves]
        if fn is gg.grouped_matmul:
            args = [t.detach().requires_grad_() for t in args]
            out = fn(args[0], args[1], offsets, args[2])
            out.backward(dy)
            grads.append([t.grad for t in args])
        else:
            out = fn(args[0], args[1], offsets, args[2])
            out.float().backward(dy.float())
            grads.append([t.grad for t in leaves])
    for name, got, want in zip(("dx", "dw", "db"), *grads):
        assert got.dtype == dtype
        _assert_close(got, want, TOL[dtype], name)


def test_wgrad_empty_groups_are_zero():
    sizes, K, N = [0, 4, 0], 16, 16
    x, _, _ = _inputs(sizes, K, N, torch.float32, seed=3)
    dy = torch.randn(4, N, device=DEVICE)
    dw = gg.grouped_matmul_wgrad(x, dy, _offsets(sizes), 3)
    assert dw[0].abs().max() == 0 and dw[2].abs().max() == 0
    _assert_close(dw[1], x.t() @ dy, TOL[torch.float32], "wgrad group 1")


def test_bad_shapes_are_rejected():
    x, w, _ = _inputs([2, 3], 8, 4, torch.float32, seed=1)
    with pytest.raises(ValueError, match="R \\* G \\+ 1"):
        gg.grouped_matmul(x, w, torch.tensor([0, 5], device=DEVICE))
    with pytest.raises(ValueError, match="bias"):
        gg.grouped_matmul(x, w, _offsets([2, 3]), torch.zeros(2, 5, device=DEVICE))


def _segment_dense(x, w, offsets, b):
    """Per-row loop: row r of segment s uses weight s % G (independent of the reference's code)."""
    bounds, G = offsets.tolist(), w.shape[0]
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    for s in range(len(bounds) - 1):
        for r in range(bounds[s], bounds[s + 1]):
            out[r] = x[r].double() @ w[s % G].double() + (0 if b is None else b[s % G].double())
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_segments_share_their_group_weights(dtype):
    # 3 segments per group x 2 groups, in source-major order (segment s -> group s % 2), empty ones too
    sizes, K, N, G = [2, 0, 5, 1, 0, 3], 19, 13, 2
    x, w, b = _inputs(sizes, K, N, dtype, seed=5)
    w, b = w[:G].contiguous(), b[:G].contiguous()
    offsets = _offsets(sizes)
    want = _segment_dense(x.cpu(), w.cpu(), offsets.cpu(), b.cpu())
    _assert_close(gg.grouped_matmul_forward(x, w, offsets, b).cpu(), want, TOL[dtype], "segment forward")
    _assert_close(gg.grouped_matmul_reference(x, w, offsets, b).cpu(), want, TOL[dtype], "segment reference")
    out = torch.full((sum(sizes) + 4, N), float("nan"), device=DEVICE).to(dtype)
    gg.grouped_matmul_forward(x, w, offsets, b, out=out[2:2 + sum(sizes)])
    _assert_close(out[2:2 + sum(sizes)].cpu(), want, TOL[dtype], "forward into out=")
    assert out[:2].isnan().all() and out[-2:].isnan().all(), "out= wrote outside its view"
    dy = torch.randn(sum(sizes), N, device=DEVICE).to(dtype)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)) % G
    dw_want = torch.stack([x.cpu()[ids == g].double().t() @ dy.cpu()[ids == g].double() for g in range(G)])
    db_want = torch.stack([dy.cpu()[ids == g].double().sum(0) for g in range(G)])
    _assert_close(gg.grouped_matmul_wgrad(x, dy, offsets, G).cpu(), dw_want, TOL[dtype], "segment wgrad")
    _assert_close(gg.grouped_wgrad_reference(x, dy, offsets, G).cpu(), dw_want, TOL[dtype], "segment wgrad ref")
    _assert_close(gg.grouped_bias_grad(dy, offsets, G).cpu(), db_want, TOL[dtype], "segment bias grad")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_large_groups_on_gpu(dtype):
    sizes, K, N = [2048, 0, 1, 3001, 777], 1024, 4096
    x, w, b = _inputs(sizes, K, N, dtype, seed=11)
    offsets = _offsets(sizes)
    _assert_close(gg.grouped_matmul(x, w, offsets, b), gg.grouped_matmul_reference(x, w, offsets, b),
                  TOL[dtype], "large forward")


# Fused epilogues. Shapes: segments (R = 3 per group, source-major, empty ones too) and one single row.
# The aligned case (K, N multiples of 8) also runs torch's grouped matmul, which needs 16-byte strides.
EPILOGUE_CASES = [([2, 0, 5, 1, 0, 3], 2, 19, 13), ([1], 1, 7, 5), ([3, 0, 1, 6], 2, 16, 24)]
ACTS = ["gelu", "relu"]


def _backends(dtype, K, N):
    # torch._grouped_mm runs bf16 on CPU and on Hopper GPUs alike, with 16-byte aligned strides only
    torch_ok = dtype == torch.bfloat16 and K % 8 == 0 and N % 8 == 0
    return ["auto", "reference"] + (["torch"] if torch_ok else [])


def _act64(pre, activation):
    return torch.nn.functional.gelu(pre) if activation == "gelu" else torch.relu(pre)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}")
def test_activation_epilogue_matches_torch(case, dtype, activation):
    sizes, G, K, N = case
    x, w, b = _inputs(sizes, K, N, dtype, seed=K * 10 + len(activation))
    w, b, offsets, T = w[:G].contiguous(), b[:G].contiguous(), _offsets(sizes), sum(sizes)
    pre64 = _segment_dense(x.cpu(), w.cpu(), offsets.cpu(), b.cpu())  # float64, independent of the kernel
    act64 = _act64(pre64, activation)
    for backend in _backends(dtype, K, N):
        pre, act = gg.grouped_matmul_forward(x, w, offsets, b, backend=backend, activation=activation)
        assert pre.dtype == act.dtype == dtype and pre.shape == act.shape == (T, N)
        # pre: as the plain product. act: |act'| <= 1.13, so pre's fp32-sum error passes through about
        # unchanged and the gap is act's rounding to dtype (plus pre's, where torch rounds pre first).
        _assert_close(pre.cpu(), pre64, TOL[dtype], f"{backend} pre")
        _assert_close(act.cpu(), act64, TOL[dtype], f"{backend} {activation}(pre)")
    # into views of larger buffers (the MoE layer passes per-chunk views); nothing outside them written
    bufs = [torch.full((T + 4, N), float("nan"), device=DEVICE).to(dtype) for _ in range(2)]
    got = gg.grouped_matmul_forward(x, w, offsets, b, out=bufs[0][2:T + 2], activation=activation,
                                    act_out=bufs[1][1:T + 1])
    assert got[0].data_ptr() == bufs[0][2:].data_ptr() and got[1].data_ptr() == bufs[1][1:].data_ptr()
    _assert_close(bufs[0][2:T + 2].cpu(), pre64, TOL[dtype], "pre into out=")
    _assert_close(bufs[1][1:T + 1].cpu(), act64, TOL[dtype], "act into act_out=")
    assert bufs[0][:2].isnan().all() and bufs[0][T + 2:].isnan().all(), "out= wrote outside its view"
    assert bufs[1][:1].isnan().all() and bufs[1][T + 1:].isnan().all(), "act_out= wrote outside its view"


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}")
def test_activation_grad_epilogue_matches_torch(case, dtype, activation):
    # dact = dy @ w2[g]^T (w2 [G, N, K] passed transposed, a strided view, as the layer does), and the
    # launch stores dpre = dact * act'(pre) for a given pre [T, N]
    sizes, G, K, N = case
    gen = torch.Generator().manual_seed(K * 7 + len(activation))
    T, offsets = sum(sizes), _offsets(sizes)
    dy = torch.randn(T, K, generator=gen).to(DEVICE, dtype)
    w2 = (torch.randn(G, N, K, generator=gen) / K**0.5).to(DEVICE, dtype)
    pre = torch.randn(T, N, generator=gen).to(DEVICE, dtype)
    pre[::2, ::3] = 0  # relu'(0) = 0, as torch's threshold_backward
    dact64 = _segment_dense(dy.cpu(), w2.cpu().transpose(1, 2), offsets.cpu(), None)
    pre64 = pre.cpu().double()
    if activation == "gelu":
        want = torch.ops.aten.gelu_backward(dact64, pre64)
    else:
        want = torch.ops.aten.threshold_backward(dact64, torch.relu(pre64), 0)
    for backend in _backends(dtype, K, N):
        got = gg.grouped_matmul_forward(dy, w2.transpose(1, 2), offsets, backend=backend,
                                        grad_of=(pre, activation))
        assert got.dtype == dtype and got.shape == (T, N)
        # |act'| <= 1.13: dact's fp32-sum error passes through about unchanged; the gap is the rounding
        # of dpre to dtype (plus dact's, where torch rounds dact first)
        _assert_close(got.cpu(), want, TOL[dtype], f"{backend} d{activation}")
    out = torch.full((T + 2, N), float("nan"), device=DEVICE).to(dtype)
    gg.grouped_matmul_forward(dy, w2.transpose(1, 2), offsets, out=out[1:T + 1], grad_of=(pre, activation))
    _assert_close(out[1:T + 1].cpu(), want, TOL[dtype], "dpre into out=")
    assert out[0].isnan().all() and out[T + 1].isnan().all(), "out= wrote outside its view"


def test_bad_epilogue_arguments_are_rejected():
    x, w, _ = _inputs([2, 3], 8, 4, torch.float32, seed=2)
    offsets, pre = _offsets([2, 3]), torch.zeros(5, 4, device=DEVICE)
    with pytest.raises(ValueError, match="gelu, relu or None"):
        gg.grouped_matmul_forward(x, w, offsets, activation="tanh")
    with pytest.raises(ValueError, match="not both"):
        gg.grouped_matmul_forward(x, w, offsets, activation="gelu", grad_of=(pre, "gelu"))
    with pytest.raises(ValueError, match="must be \\[T, N\\]"):
        gg.grouped_matmul_forward(x, w, offsets, grad_of=(pre[:, :3], "relu"))
    with pytest.raises(ValueError, match="alias"):
        gg.grouped_matmul_forward(x, w, offsets, out=pre, grad_of=(pre, "relu"))


@pytest.mark.parametrize("activation", ACTS)
def test_expert_ffn_matches_autograd(activation):
    """ffn_forward / ffn_input_grad (fused epilogues) against autograd through plain torch ops."""
    from qbench.layers.moe_experts import ExpertConfig, ffn_forward, ffn_input_grad

    sizes, L, d, h = [3, 1, 0, 4], 2, 11, 18  # 2 segments per expert
    gen = torch.Generator().manual_seed(13)
    x, dy = torch.randn(8, d, generator=gen), torch.randn(8, d, generator=gen)
    w1, w2 = torch.randn(L, d, h, generator=gen) / d**0.5, torch.randn(L, h, d, generator=gen) / h**0.5
    b1, b2 = torch.randn(L, h, generator=gen), torch.randn(L, d, generator=gen)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)) % L
    xd = x.double().requires_grad_()
    pre = torch.einsum("td,tdh->th", xd, w1.double()[ids]) + b1.double()[ids]
    y = torch.einsum("th,thd->td", _act64(pre, activation), w2.double()[ids]) + b2.double()[ids]
    (dx_want,) = torch.autograd.grad(y, xd, dy.double())
    cfg, offsets = ExpertConfig(activation, "auto", None), _offsets(sizes)
    dev = [t.to(DEVICE) for t in (x, w1, b1, w2, b2, dy)]
    p, a, y_got = ffn_forward(dev[0], offsets, *dev[1:5], cfg)
    _assert_close(y_got.cpu(), y.detach(), TOL[torch.float32], "ffn y")
    dpre, dx = ffn_input_grad(dev[5], p, a, offsets, dev[1], dev[3], cfg)
    _assert_close(dx.cpu(), dx_want, TOL[torch.float32], "ffn dx")
