"""Persistent TMA grouped GEMM (kernels/grouped_gemm_tma.py) against the plain-torch reference.

On this CPU machine the kernel runs through the Triton interpreter (TRITON_INTERPRET=1 from
conftest), which executes host tensor descriptors (zero fill past the edges included), with 16x16x16
tiles and 3 persistent programs, so every program walks several work items. On a Hopper GPU the same
tests run the compiled kernel; `test_real_size_on_gpu` adds MoE-sized shapes there.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import grouped_gemm as gg
from kernels import grouped_gemm_tma as tma
from kernels._common import epilogue, interpreting
from tests.helpers import assert_close, env_without_interpreter, gemm_tol

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Both sides sum exact 16-bit products in fp32; the gap is the final rounding to 16 bits
# (fp16: 11 mantissa bits, bf16: 8), relative to the largest output.
DTYPES = [torch.float16, torch.bfloat16]  # what the TMA kernel takes
# (segment sizes, G, K for plain w, K for transposed w, N): R = S / G segments per group.
# Plain w needs K % 64 == 0 (the Hopper K tile; the interpreter's is 16); transposed w only K % 8,
# so its K tail is exercised. N = 24 and 40 leave partial N tiles (transposed: rows of group g + 1
# are read into the masked columns).
CASES = {
    "R1-empty-and-1-row": ([7, 0, 1, 19], 4, 64, 24, 24),
    "R3-source-major": ([2, 0, 5, 1, 0, 17], 2, 64, 40, 40),
    "single-row": ([1], 1, 64, 8, 8),
    "R2-straddling-tiles": ([9, 30, 0, 3], 2, 128, 56, 16),
}


def _offsets(sizes):
    return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _weights(G, K, N, dtype, transposed, gen):
    """w [G, K, N]: contiguous, or the transpose(1, 2) view of a contiguous [G, N, K] tensor."""
    if transposed:
        return (torch.randn(G, N, K, generator=gen) / K**0.5).to(DEVICE, dtype).transpose(1, 2)
    return (torch.randn(G, K, N, generator=gen) / K**0.5).to(DEVICE, dtype)


def _inputs(case, dtype, transposed, seed):
    sizes, G, k_plain, k_trans, N = CASES[case]
    K = k_trans if transposed else k_plain
    gen = torch.Generator().manual_seed(seed)  # fresh random inputs per case, reproducible on failure
    x = torch.randn(sum(sizes), K, generator=gen).to(DEVICE, dtype)
    return x, _weights(G, K, N, dtype, transposed, gen), torch.randn(G, N, generator=gen).to(DEVICE, dtype)


def _runs_here() -> bool:
    """The kernel runs under the interpreter, or compiled on a Hopper (or newer) GPU."""
    return interpreting() or (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0))


needs_kernel = pytest.mark.skipif(not _runs_here(), reason="needs the Triton interpreter or a Hopper GPU")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, transposed, dtype):
    x, w, b = _inputs(case, dtype, transposed, seed=list(CASES).index(case) * 2 + transposed)
    offsets = _offsets(CASES[case][0])
    T, N = x.shape[0], w.shape[2]
    assert tma.weight_layout(w) == ("transposed" if transposed else "plain")
    for bias in (None, b):
        # y is a view into a NaN-filled buffer: rows outside it must stay NaN (masked store)
        buf = torch.full((T + 4, N), float("nan"), device=DEVICE).to(dtype)
        y = buf[2:2 + T]
        assert tma.shapes_supported(x, w, offsets, y, bias), "test shape should suit the kernel"
        tma.launch_fwd(x, w, offsets, bias, y)
        assert_close(y, gg.grouped_matmul_reference(x, w, offsets, bias), gemm_tol(dtype),
                      f"{case} {tma.weight_layout(w)} bias={bias is not None}")
        assert buf[:2].isnan().all() and buf[-2:].isnan().all(), "the kernel wrote outside its rows"


@needs_kernel
@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("case", ["R1-empty-and-1-row", "R2-straddling-tiles"])
def test_activation_after_the_tma_product_matches_torch(case, act):
    """The TMA kernel's product with the activation after it (grouped_gemm._launch_fwd): forward, the
    product in pre and act(pre) in y; backward (w transposed), y = (dy @ w) * act'(pre) in place."""
    dtype = torch.float16
    x, w, b = _inputs(case, dtype, False, seed=7)
    offsets = _offsets(CASES[case][0])
    T, N = x.shape[0], w.shape[2]
    pre, y = (torch.full((T, N), float("nan"), device=DEVICE, dtype=dtype) for _ in range(2))
    gg._launch_fwd(x, w, offsets, b, y, impl="tma", epi=epilogue("act", act, pre))
    want = gg.grouped_matmul_reference(x, w, offsets, b)
    assert_close(pre, want, gemm_tol(dtype), f"{case} pre")
    f = torch.nn.functional.gelu if act == "gelu" else torch.relu
    assert_close(y, f(pre.float()), gemm_tol(dtype), f"{case} {act}(pre)")
    # backward: dpre = (dz @ v^T) * act'(pre), v [G, N, M] contiguous passed as its transpose (the layout
    # of an input gradient's weights), dz [T, M]
    G, M = w.shape[0], CASES[case][3]
    gen = torch.Generator().manual_seed(8)
    v, dz = _weights(G, M, N, dtype, True, gen), torch.randn(T, M, generator=gen).to(DEVICE, dtype)
    dpre = torch.full((T, N), float("nan"), device=DEVICE, dtype=dtype)
    gg._launch_fwd(dz, v, offsets, None, dpre, impl="tma", epi=epilogue("act_grad", act, pre))
    dact = gg.grouped_matmul_reference(dz, v, offsets).float()
    want = (torch.ops.aten.gelu_backward(dact, pre.float()) if act == "gelu"
            else torch.ops.aten.threshold_backward(dact, pre.float(), 0))
    assert_close(dpre, want, gemm_tol(dtype), f"{case} {act} backward")


def test_weight_layouts_are_told_apart():
    w = torch.randn(3, 16, 24)
    assert tma.weight_layout(w) == "plain"
    assert tma.weight_layout(torch.randn(3, 24, 16).transpose(1, 2)) == "transposed"
    assert tma.weight_layout(w[:, :, ::2]) is None  # strided columns
    assert tma.weight_layout(w.permute(2, 1, 0).contiguous().permute(2, 1, 0)) is None  # group-minor
    assert tma.weight_layout(torch.randn(3, 16, 48)[:, :, :24]) is None  # padded rows


def test_unsupported_inputs_keep_the_pointer_kernel():
    x, w = torch.randn(10, 64, dtype=torch.float16), torch.randn(2, 64, 24, dtype=torch.float16)
    off, y = torch.tensor([0, 4, 10]), torch.empty(10, 24, dtype=torch.float16)
    assert tma.shapes_supported(x, w, off, y)
    assert not tma.supported(x, w, off, y), "CPU tensors never take the TMA kernel"
    f32 = lambda t: t.float()  # noqa: E731
    rejected = {
        "fp32": (f32(x), f32(w), off, f32(y)),
        "mixed dtypes": (x, w.bfloat16(), off, y),
        "K % 64 != 0 (plain w)": (x[:, :40], w[:, :40].contiguous(), off, y),
        "N % 8 != 0 (plain w rows unaligned)": (x, w[:, :, :20].contiguous(), off, y[:, :20]),
        "K % 8 != 0 (transposed w rows unaligned)": (
            x[:, :36], torch.randn(2, 24, 36, dtype=torch.float16).transpose(1, 2), off, y),
        "x base not 16-byte aligned": (torch.randn(10, 65, dtype=torch.float16)[:, 1:], w, off, y),
        "x inner stride": (torch.randn(64, 10, dtype=torch.float16).t(), w, off, y),
        "out inner stride": (x, w, off, torch.empty(24, 10, dtype=torch.float16).t()),
        "int32 offsets": (x, w, off.int(), y),
        "no rows": (x[:0], w, torch.tensor([0, 0, 0]), y[:0]),
    }
    for name, args in rejected.items():
        assert not tma.shapes_supported(*args), name


@needs_kernel
def test_dispatch_and_opt_out(monkeypatch):
    """grouped_matmul_forward takes the TMA kernel where `supported` says so (impl="auto") or when
    asked (impl="tma"), and the pointer kernel with impl="pointer"; all agree with the reference."""
    x, w, b = _inputs("R3-source-major", torch.float16, True, seed=3)
    offsets = _offsets(CASES["R3-source-major"][0])
    calls = []
    launch = tma.launch_fwd
    monkeypatch.setattr(tma, "supported", tma.shapes_supported)  # the interpreter has no device to ask
    monkeypatch.setattr(tma, "launch_fwd", lambda *a: calls.append(1) or launch(*a))
    want = gg.grouped_matmul_reference(x, w, offsets, b)
    for impl, expect_tma in (("auto", True), ("tma", True), ("pointer", False)):
        calls.clear()
        got = gg.grouped_matmul_forward(x, w, offsets, b, backend="triton", impl=impl)
        assert bool(calls) == expect_tma, f"impl={impl}: TMA kernel used = {bool(calls)}"
        assert_close(got, want, gemm_tol(torch.float16), f"dispatch impl={impl}")
    with pytest.raises(ValueError, match="impl must be one of"):
        gg.grouped_matmul_forward(x, w, offsets, b, backend="triton", impl="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_real_size_on_gpu(dtype, transposed):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the TMA kernel needs compute capability 9.0 or newer")
    gen = torch.Generator().manual_seed(17)
    G, R, K, N = 8, 4, 1024, 4096
    counts = torch.multinomial(torch.ones(G * R), 6000, True, generator=gen).bincount(minlength=G * R)
    counts[5] = 0  # an empty segment and a one-row segment among the routed ones
    counts[9] = 1
    x = torch.randn(int(counts.sum()), K, generator=gen).to(DEVICE, dtype)
    w, b = _weights(G, K, N, dtype, transposed, gen), torch.randn(G, N, generator=gen).to(DEVICE, dtype)
    offsets = _offsets(counts.tolist())
    y = torch.empty(x.shape[0], N, device=DEVICE, dtype=dtype)
    assert tma.supported(x, w, offsets, y, b)
    got = gg.grouped_matmul_forward(x, w, offsets, b)
    assert_close(got, gg.grouped_matmul_reference(x, w, offsets, b), gemm_tol(dtype), "real size")


def compile_for_sm90() -> None:
    """Compile every Hopper config for both layouts in fp16, and the first config in bf16 (same code
    but for the element type), for sm_90 without a GPU (in a child process without
    TRITON_INTERPRET); prints one line per kernel: wgmma and TMA instruction counts in the PTX, shared
    memory bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = tma._grouped_fwd_tma_kernel.fn  # the JIT function under the autotuner
    variants = [("fp16", trans, cfg) for trans in (False, True) for cfg in tma._HOPPER]
    variants += [("bf16", trans, tma._HOPPER[0]) for trans in (False, True)]
    for dt, trans, (bm, bn, stages, warps) in variants:
        bk = tma.BK_TMA
        w_block = f"{bn}, {bk}" if trans else f"{bk}, {bn}"
        sig = {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<{dt}[{w_block}]>",
               "b_ptr": f"*{dt}", "y_ptr": f"*{dt}", "off_ptr": "*i64",
               **dict.fromkeys(("N", "K", "S", "G", "sbg", "sym"), "i32")}
        const = dict(TRANS_W=trans, HAS_BIAS=True, IEEE=False, UPCAST=False,
                     BLOCK_S=64, NUM_PROGRAMS=132, BM=bm, BN=bn, BK=bk, GROUP_M=8)
        sig.update(dict.fromkeys(const, "constexpr"))
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                                options={"num_warps": warps, "num_stages": stages})
        ptx = kernel.asm["ptx"]
        print(dt, trans, bm, bn, ptx.count("wgmma.mma_async"), ptx.count("cp.async.bulk.tensor"),
              kernel.metadata.shared, flush=True)


@pytest.mark.slow
def test_compiles_for_hopper_without_a_gpu():
    """Every config compiles for sm_90 with wgmma products and TMA loads, inside an H100/H200 SM's
    227 KiB of shared memory (a config over it would only fail at launch on the GPU)."""
    env = env_without_interpreter(TRITON_DEFAULT_FP_FUSION="1")  # triton 3.9 warns when unset; 1 is its default
    code = "from tests.test_grouped_gemm_tma import compile_for_sm90; compile_for_sm90()"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines()]
    assert len(lines) == 2 * len(tma._HOPPER) + 2, done.stdout
    for dt, trans, bm, bn, wgmma, tma_loads, shared in lines:
        what = f"{dt} transposed={trans} {bm}x{bn}"
        assert int(wgmma) > 0 and int(tma_loads) > 0, f"{what}: no wgmma/TMA in the PTX"
        assert int(shared) <= 227 * 1024, f"{what}: needs {shared} bytes of shared memory"
