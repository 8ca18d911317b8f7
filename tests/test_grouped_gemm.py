"""Grouped GEMM (kernels/grouped_gemm.py): the Triton kernels (interpreter on CPU, compiled on a GPU)
against the plain-torch reference, on odd shapes, empty and single-row groups, every dtype."""

import pytest
import torch

from kernels import grouped_gemm as gg
from tests.helpers import assert_close, env_without_interpreter, gemm_tol

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 runs with IEEE products in the kernel; 16-bit inputs are multiplied exactly and summed in fp32
# by both sides, so the gap is the final rounding to 16 bits (bf16 has 8 mantissa bits).
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
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
        assert_close(got, want, gemm_tol(dtype), f"forward bias={bias is not None}")
        assert_close(want.cpu(), _dense(x.cpu(), w.cpu(), offsets.cpu(), None if bias is None else b.cpu()),
                      gemm_tol(dtype), "reference vs per-row loop")


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
        assert_close(got, want, gemm_tol(dtype), name)


def test_wgrad_empty_groups_are_zero():
    sizes, K, N = [0, 4, 0], 16, 16
    x, _, _ = _inputs(sizes, K, N, torch.float32, seed=3)
    dy = torch.randn(4, N, device=DEVICE)
    dw = gg.grouped_matmul_wgrad(x, dy, _offsets(sizes), 3)
    assert dw[0].abs().max() == 0 and dw[2].abs().max() == 0
    assert_close(dw[1], x.t() @ dy, gemm_tol(torch.float32), "wgrad group 1")


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
    assert_close(gg.grouped_matmul_forward(x, w, offsets, b).cpu(), want, gemm_tol(dtype), "segment forward")
    assert_close(gg.grouped_matmul_reference(x, w, offsets, b).cpu(), want, gemm_tol(dtype), "segment reference")
    out = torch.full((sum(sizes) + 4, N), float("nan"), device=DEVICE).to(dtype)
    gg.grouped_matmul_forward(x, w, offsets, b, out=out[2:2 + sum(sizes)])
    assert_close(out[2:2 + sum(sizes)].cpu(), want, gemm_tol(dtype), "forward into out=")
    assert out[:2].isnan().all() and out[-2:].isnan().all(), "out= wrote outside its view"
    dy = torch.randn(sum(sizes), N, device=DEVICE).to(dtype)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)) % G
    dw_want = torch.stack([x.cpu()[ids == g].double().t() @ dy.cpu()[ids == g].double() for g in range(G)])
    db_want = torch.stack([dy.cpu()[ids == g].double().sum(0) for g in range(G)])
    assert_close(gg.grouped_matmul_wgrad(x, dy, offsets, G).cpu(), dw_want, gemm_tol(dtype), "segment wgrad")
    assert_close(gg.grouped_wgrad_reference(x, dy, offsets, G).cpu(), dw_want, gemm_tol(dtype), "segment wgrad ref")
    assert_close(gg.grouped_bias_grad(dy, offsets, G).cpu(), db_want, gemm_tol(dtype), "segment bias grad")
    for backend in ("auto", "reference"):  # one launch on the kernel path, the two references otherwise
        dw, db = gg.grouped_wgrad_bias(x, dy, offsets, G, backend=backend)
        assert dw.dtype == x.dtype and db.dtype == dy.dtype and db.shape == (G, N)
        assert_close(dw.cpu(), dw_want, gemm_tol(dtype), f"fused wgrad ({backend})")
        assert_close(db.cpu(), db_want, gemm_tol(dtype), f"fused bias grad ({backend})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}" if isinstance(s, tuple) else None)
def test_fused_bias_gradient_matches_the_row_sums(shape, dtype):
    """Empty groups (zero bias gradient), a single row, K smaller than one K tile and larger."""
    sizes, K, N = shape
    x, _, _ = _inputs(sizes, K, N, dtype, seed=11)
    dy = torch.randn(sum(sizes), N, generator=torch.Generator().manual_seed(12)).to(DEVICE, dtype)
    dw, db = gg.grouped_wgrad_bias(x, dy, _offsets(sizes), len(sizes))
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    db_want = torch.stack([dy.cpu()[ids == g].double().sum(0) for g in range(len(sizes))])
    assert_close(db.cpu(), db_want, gemm_tol(dtype), "fused bias grad")
    assert_close(dw.cpu(), gg.grouped_wgrad_reference(x, dy, _offsets(sizes), len(sizes)).cpu(), gemm_tol(dtype),
                  "fused wgrad")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_large_groups_on_gpu(dtype):
    sizes, K, N = [2048, 0, 1, 3001, 777], 1024, 4096
    x, w, b = _inputs(sizes, K, N, dtype, seed=11)
    offsets = _offsets(sizes)
    assert_close(gg.grouped_matmul(x, w, offsets, b), gg.grouped_matmul_reference(x, w, offsets, b),
                  gemm_tol(dtype), "large forward")


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + [([3, 2], 0, 5)], ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
def test_activation_in_the_epilogue_matches_torch(shape, dtype, act, backend):
    """(pre, act(pre)) of x @ w + b, and (dz @ v) * act'(pre), against the product then torch's
    activation and its backward (K = 0: no launch, the same results)."""
    sizes, K, N = shape
    x, w, b = _inputs(sizes, K, N, dtype, seed=21)
    offsets, T = _offsets(sizes), sum(sizes)
    pre, out = gg.grouped_matmul_act(x, w, offsets, b, act, backend=backend)
    want = gg.grouped_matmul_reference(x, w, offsets, b)
    assert_close(pre.cpu(), want.cpu(), gemm_tol(dtype), f"{act} pre")
    f = torch.nn.functional.gelu if act == "gelu" else torch.relu
    assert_close(out.cpu(), f(pre.float()).cpu(), gemm_tol(dtype), f"{act}(pre)")
    gen = torch.Generator().manual_seed(22)
    M = 11  # the product back to N columns: dz [T, M] @ v, v [G, M, N] seen through a transpose
    v = torch.randn(len(sizes), N, M, generator=gen).to(DEVICE, dtype).transpose(1, 2)
    dz = torch.randn(T, M, generator=gen).to(DEVICE, dtype)
    dpre = gg.grouped_matmul_act_grad(dz, v, offsets, pre, act, backend=backend)
    dact = gg.grouped_matmul_reference(dz, v, offsets).float()
    grad = (torch.ops.aten.gelu_backward(dact, pre.float()) if act == "gelu"
            else torch.ops.aten.threshold_backward(dact, pre.float(), 0))
    assert_close(dpre.cpu(), grad.cpu(), gemm_tol(dtype) * 2, f"{act} backward")  # dact rounded once more


def compile_wgrad_for_sm90() -> None:
    """Compile the weight-gradient kernel (every config, with and without the fused bias gradient) for
    sm_90 without a GPU, with the specializations of a real launch (unit column strides, 16-byte aligned
    pointers and row strides); prints per kernel: wgmma and cp.async counts in the PTX, shared bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import grouped_gemm_wgrad as wg

    fn = wg._grouped_wgrad_kernel.fn
    names = list(fn.arg_names)
    aligned = ("x_ptr", "dy_ptr", "dw_ptr", "db_ptr", "off_ptr", "N", "K", "sxm", "sdm", "swg", "swk")
    for cfg in wg._WGRAD_CONFIGS:
        for has_db in (False, True):
            const = dict(sxk=1, sdn=1, HAS_DB=has_db, IEEE=False, UPCAST=False, **cfg.kwargs)
            sig = {n: "constexpr" if n in const else ("*i64" if n == "off_ptr" else "*fp16" if n.endswith("_ptr")
                                                      else "i32") for n in names}
            attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
            kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                                    target=GPUTarget("cuda", 90, 64),
                                    options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
            ptx = kernel.asm["ptx"]
            print(has_db, ptx.count("wgmma.mma_async"), ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                  kernel.metadata.shared, flush=True)


def _compile_in_child(function: str) -> list[list[str]]:
    """Run tests.test_grouped_gemm.<function>() in a child process without TRITON_INTERPRET; its lines."""
    import subprocess
    import sys
    from pathlib import Path

    env = env_without_interpreter(TRITON_DEFAULT_FP_FUSION="1")  # triton 3.9 warns when unset; 1 is its default
    code = f"from tests.test_grouped_gemm import {function}; {function}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split() for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_wgrad_compiles_for_hopper_pipelined_without_a_gpu():
    """With and without the fused bias gradient, every config is pipelined (cp.async loads), multiplies
    on wgmma and fits an H100/H200 SM's 227 KiB of shared memory."""
    lines = _compile_in_child("compile_wgrad_for_sm90")
    assert len(lines) == 8, lines
    for has_db, wgmma, loads, shared in lines:
        assert int(wgmma) > 0 and int(loads) > 0, f"bias fused={has_db}: not pipelined on wgmma ({wgmma}, {loads})"
        assert int(shared) <= 227 * 1024, f"bias fused={has_db}: needs {shared} bytes of shared memory"


def _forced_wgrad(cfg, x, dy, offsets, G: int, with_bias: bool):
    """(dw, db or None) of one config of the weight-gradient kernel, bypassing the autotuner."""
    from kernels import grouped_gemm_wgrad as wg

    K, N, R = x.shape[1], dy.shape[1], (offsets.numel() - 1) // G
    dw = torch.full((G, K, N), float("nan"), device=x.device, dtype=x.dtype)
    db = torch.full((G, N), float("nan"), device=x.device, dtype=dy.dtype) if with_bias else dw
    flags = dict(HAS_DB=with_bias, IEEE=False, UPCAST=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                 **cfg.kwargs)
    grid = wg._grid(G, K, N, with_bias)(cfg.kwargs)
    wg._grouped_wgrad_kernel.fn[grid](x, dy, dw, db, offsets, N, K, G, R, x.stride(0), x.stride(1), dy.stride(0),
                                      dy.stride(1), dw.stride(0), dw.stride(1), **flags)
    return dw, db if with_bias else None


@pytest.mark.gpu
def test_every_wgrad_config_on_gpu():
    """Every autotuner config of the weight-gradient kernel, with and without the bias gradient, one and
    four segments per group, against the reference: the autotuner may pick any of them, so a config that
    compiles wrongly (triton 3.6 did, for two pointer configs with the bias sum inside the dot's loop)
    must fail here rather than in a layer's gradients."""
    from kernels import grouped_gemm_wgrad as wg

    dtype = torch.float16
    for R, K, N in ((1, 1024, 4096), (4, 1024, 4096), (4, 4096, 1024)):
        G, gen = 8, torch.Generator().manual_seed(R * K)
        sizes = torch.multinomial(torch.ones(G * R), 8192, replacement=True, generator=gen).bincount(minlength=G * R)
        offsets = _offsets(sizes.tolist())
        x = torch.randn(int(sizes.sum()), K, generator=gen).to(DEVICE, dtype)
        dy = torch.randn(int(sizes.sum()), N, generator=gen).to(DEVICE, dtype)
        want_dw, want_db = wg.grouped_wgrad_reference(x, dy, offsets, G), wg.grouped_bias_reference(dy, offsets, G)
        for cfg in wg._WGRAD_CONFIGS:
            for with_bias in (False, True):
                dw, db = _forced_wgrad(cfg, x, dy, offsets, G, with_bias)
                what = f"{cfg.kwargs} warps {cfg.num_warps} stages {cfg.num_stages} R {R} bias {with_bias}"
                assert_close(dw, want_dw, gemm_tol(dtype), f"{what}: dw")
                if with_bias:
                    assert_close(db, want_db, gemm_tol(dtype), f"{what}: db")
