"""Interpreter-mode (CPU) and CUDA tests of the SwitchBack quantizers and int8 matmul against their
torch references: odd, non-power-of-two and single-row shapes, fp16 and bf16, all-zero rows."""

from __future__ import annotations

import pytest
import torch

from kernels import switchback_matmul as sm
from kernels import switchback_matmul_tma as tma
from kernels import switchback_quantize as sq

DTYPES = [torch.float16, torch.bfloat16]
SHAPES = [(1, 7), (37, 100), (5, 1000), (64, 33)]  # single row, odd, non-power-of-two, wide/narrow
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
QUANTIZERS = ["quantize_rowwise", "quantize_global", "quantize_global_transpose",
              "quantize_columnwise_transpose"]
# one unit in the last place of the output dtype: kernel and reference compute the same fp32 value
# up to the order of two multiplies, so they may round to neighbouring 16-bit numbers
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def first_mismatches(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, n: int = 5) -> str:
    idx = bad.nonzero()[:n].tolist()
    return "; ".join(f"{tuple(i)}: got {got[tuple(i)].item()} want {want[tuple(i)].item()}" for i in idx)


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    bad = got != want
    assert not bad.any(), f"{what}: {int(bad.sum())} mismatches, first: {first_mismatches(got, want, bad)}"


def random_input(shape, dtype, zero_row: bool = False) -> torch.Tensor:
    x = torch.randn(shape, dtype=torch.float32, device=DEVICE) * 3
    if zero_row and shape[0] > 2:
        x[shape[0] // 2] = 0
    return x.to(dtype)


@pytest.mark.parametrize("name", QUANTIZERS)
@pytest.mark.parametrize("format", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(37, 100), (130, 33)])
def test_fp8_quantizer_matches_reference(name, format, shape):
    """fp8 formats: the kernel's conversion equals torch's (round to nearest even), the stored scale
    is absmax / QMAX; values spread over many binades so rounding crosses exponent boundaries."""
    x = (random_input(shape, torch.bfloat16, zero_row=True).float() * torch.rand(shape, device=DEVICE) ** 4)
    x = x.to(torch.bfloat16)
    q, s = getattr(sq, name)(x, format)
    q_ref, s_ref = getattr(sq, name + "_reference")(x, format)
    assert q.dtype == q_ref.dtype and q.dtype.itemsize == 1
    assert_equal(s, s_ref, f"{name} {format} scales")
    assert_equal(q.float(), q_ref.float(), f"{name} {format} values")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_global_both_layouts_equal_the_separate_quantizers(dtype, shape):
    x = random_input(shape, dtype, zero_row=True)
    q, qt, s = sq.quantize_global_both(x)
    want_q, want_s = sq.quantize_global_reference(x)
    assert_equal(s, want_s, "scale")
    assert_equal(q, want_q, "plain layout")
    assert_equal(qt, want_q.t().contiguous(), "transposed layout")


@pytest.mark.parametrize("name", QUANTIZERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_quantizer_matches_reference(name, dtype, shape):
    x = random_input(shape, dtype, zero_row=True)
    q, s = getattr(sq, name)(x)
    q_ref, s_ref = getattr(sq, name + "_reference")(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert_equal(s, s_ref, f"{name} scales")
    assert_equal(q, q_ref, f"{name} values")


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantizers_reconstruct_within_half_a_step(dtype):
    """Independent of the reference: every value is within half a quantization step (s / 254)."""
    x = random_input((19, 45), dtype)
    xf = x.float()
    q, s = sq.quantize_rowwise(x)
    assert (q.float() * s[:, None] / 127 - xf).abs().le(s[:, None] / 254 * (1 + 1e-5)).all()
    q, s = sq.quantize_columnwise_transpose(x)
    assert (q.float().t() * s[None, :] / 127 - xf).abs().le(s[None, :] / 254 * (1 + 1e-5)).all()
    q, s = sq.quantize_global_transpose(x)
    assert (q.float().t() * s / 127 - xf).abs().le(s / 254 * (1 + 1e-5)).all()
    assert q.abs().max().item() == 127


def test_rounding_is_half_to_even():
    # absmax 254 -> multiplier 0.5: values 1, 3, 5, -1, -3 land exactly on .5 ties
    x = torch.tensor([[254.0, 1.0, 3.0, 5.0, -1.0, -3.0]], dtype=torch.float16, device=DEVICE)
    q, _ = sq.quantize_rowwise(x)
    assert q.tolist() == [[127, 0, 2, 2, 0, -2]]


@pytest.mark.parametrize("name", QUANTIZERS)
def test_all_zero_input_gives_zero_without_nan(name):
    x = torch.zeros((3, 17), dtype=torch.float16, device=DEVICE)
    q, s = getattr(sq, name)(x)
    assert (q == 0).all() and (s == 0).all() and not torch.isnan(s).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_dequantize_rowwise_matches_reference(dtype, shape):
    q, s = sq.quantize_rowwise(random_input(shape, dtype, zero_row=True))
    got, want = sq.dequantize_rowwise(q, s, dtype), sq.dequantize_rowwise_reference(q, s, dtype)
    # 1 ulp: the Triton interpreter converts fp32 to bf16 by truncation, not round-to-nearest
    bad = (got.float() - want.float()).abs() > ULP[dtype] * want.float().abs()
    assert not bad.any(), f"dequantize: {first_mismatches(got, want, bad)}"
    assert (got[want == 0] == 0).all(), "all-zero rows must dequantize to zero"


MATMUL_SHAPES = [(1, 40, 70), (37, 45, 100), (65, 33, 64), (130, 72, 200)]  # (M, N, K)


def _operands(M, N, K, dtype, per_column):
    a = random_input((M, K), dtype, zero_row=True)
    b = random_input((N, K), dtype, zero_row=True)
    aq, sa = sq.quantize_rowwise(a)
    bq, sb = sq.quantize_rowwise(b) if per_column else sq.quantize_global(b)
    return a, b, aq, sa, bq, sb


@pytest.mark.parametrize("per_column", [False, True], ids=["global", "columnwise"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", MATMUL_SHAPES)
def test_int8_matmul_matches_reference_and_bound(mnk, dtype, bias, per_column):
    M, N, K = mnk
    a, b, aq, sa, bq, sb = _operands(M, N, K, dtype, per_column)
    bias_t = random_input((N,), dtype) if bias else None
    fn = sm.int8_matmul_rowwise_columnwise if per_column else sm.int8_matmul_rowwise_global
    c = fn(aq, sa, bq, sb, bias_t, dtype)
    ref = sm.quantized_matmul_reference(aq, sa, bq, sb, bias_t, dtype)
    assert c.dtype == dtype and c.shape == (M, N)
    tol = ULP[dtype] * ref.float().abs() + 1e-6
    bad = (c.float() - ref.float()).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} off by > 1 ulp: {first_mismatches(c, ref, bad)}"
    # and against the exact 16-bit product: within the quantization bound plus output rounding
    exact = a.float() @ b.float().t() + (bias_t.float()[None, :] if bias else 0)
    bound = sm.quantization_error_bound(a, b, sa, sb) + ULP[dtype] * exact.abs() + 1e-5
    bad = (c.float() - exact).abs() > bound
    assert not bad.any(), f"outside the quantization bound: {first_mismatches(c, exact, bad)}"


def test_int8_matmul_rejects_mismatched_shapes():
    aq = torch.zeros((4, 8), dtype=torch.int8, device=DEVICE)
    bq = torch.zeros((5, 9), dtype=torch.int8, device=DEVICE)
    s = torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match="do not share K"):
        sm.int8_matmul_rowwise_global(aq, s, bq, torch.ones(1, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["pointer", "tma"])
@pytest.mark.parametrize("per_column", [False, True])
def test_int8_matmul_autotuned_large_odd_shape(per_column, impl):
    """The autotuned paths (CUDA only): ragged M, N and K tiles (K % 128 = 80, M % 128 = 104)."""
    a, b, aq, sa, bq, sb = _operands(1000, 1408, 8096 // 4 + 8, torch.float16, per_column)
    fn = sm.int8_matmul_rowwise_columnwise if per_column else sm.int8_matmul_rowwise_global
    c = fn(aq, sa, bq, sb, None, torch.float16, impl=impl)
    ref = sm.quantized_matmul_reference(aq, sa, bq, sb, None, torch.float16)
    bad = (c.float() - ref.float()).abs() > ULP[torch.float16] * ref.float().abs() + 1e-3
    assert not bad.any(), first_mismatches(c, ref, bad)


def test_launch_hooks_are_told_apart_from_an_empty_hook_chain():
    """Replays take the compiled kernel's own launcher unless a launch hook is set: None or an empty
    HookChain (triton >= 3.5 keeps one) is no hook; a function or a chain with calls is."""
    from types import SimpleNamespace

    from triton.knobs import HookChain

    from kernels._common.launch import _hooked

    chain = HookChain()
    assert not _hooked(SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))
    assert not _hooked(SimpleNamespace(launch_enter_hook=chain, launch_exit_hook=HookChain()))
    assert _hooked(SimpleNamespace(launch_enter_hook=print, launch_exit_hook=None))
    chain.add(print)
    assert _hooked(SimpleNamespace(launch_enter_hook=None, launch_exit_hook=chain))


_TRITON_36_LAUNCHER = """
def wrap(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):  # reads the cells as triton's does
        return launcher(*args) if tensordesc_indices or tensordesc_meta else None
    return inner
"""


def _compiled_with_descriptor_wrapper(indices, metas, encodings: list, launches: list, scratch: int = 0):
    """A stand-in for a compiled kernel whose launcher wraps its raw launcher the way triton 3.6 does
    (closure cells launcher, tensordesc_indices, tensordesc_meta; 13 base arguments); its
    make_tensordesc_arg records each encoding."""
    from types import SimpleNamespace

    def make_tensordesc_arg(desc, meta):
        encodings.append((desc.base.data_ptr(), tuple(desc.shape), tuple(desc.block_shape), meta))
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape)), *desc.shape, *desc.strides]

    names = {"_BASE_ARGS_FORMAT_LEN": 13, "make_tensordesc_arg": make_tensordesc_arg}
    exec(_TRITON_36_LAUNCHER, names)
    inner = names["wrap"](lambda *args: launches.append(args), indices, metas)
    run = SimpleNamespace(launch=inner, global_scratch_size=scratch, profile_scratch_size=0,
                          launch_cooperative_grid=False, launch_pdl=False)
    return SimpleNamespace(run=run, function="fn", packed_metadata="meta")


def test_host_descriptors_are_encoded_once_per_address_and_passed_beneath_tritons_wrapper():
    """Replays of a kernel with host TMA descriptors (triton 3.6's launcher layout) encode a descriptor
    once per address, shape, strides and block, pass the encodings in argument order to the launcher
    beneath the wrapper, encode again when a tensor moves, and keep at most ENCODED_PER_POSITION per
    argument."""
    from kernels._common.launch import ENCODED_PER_POSITION, HostDescriptor, _descriptor_launcher

    encodings, launches = [], []
    compiled = _compiled_with_descriptor_wrapper({0, 1}, [{"swizzle": 1}, {"swizzle": 2}], encodings, launches)
    launch = _descriptor_launcher(compiled)
    assert launch is not None
    a, b = torch.zeros(64, 32), torch.zeros(16, 32)

    def descs(x, y):
        return HostDescriptor(x, x.shape, (x.stride(0), 1), (16, 32)), HostDescriptor(y, y.shape, (32, 1), (8, 32))

    for _ in range(3):
        launch((5, 1, 1), 7, (*descs(a, b), 3.0, 64), ("C",))
    assert len(encodings) == 2 and [e[3] for e in encodings] == [{"swizzle": 1}, {"swizzle": 2}]
    base = (5, 1, 1, 7, "fn", False, False, None, None, "meta", None, None, None)
    expected = (*base, ("map", a.data_ptr(), (16, 32)), 64, 32, 32, 1, ("map", b.data_ptr(), (8, 32)), 16, 32, 32, 1,
                3.0, 64, "C")
    assert launches == [expected] * 3
    moved = torch.zeros(64, 32)
    launch((5, 1, 1), 7, (*descs(moved, b), 3.0, 64), ("C",))
    assert len(encodings) == 3 and encodings[-1][0] == moved.data_ptr()
    assert launches[-1][13] == ("map", moved.data_ptr(), (16, 32))
    kept = [torch.zeros(64, 32) for _ in range(ENCODED_PER_POSITION + 1)]
    for t in kept:
        launch((5, 1, 1), 7, (*descs(t, b), 3.0, 64), ("C",))
    before = len(encodings)
    launch((5, 1, 1), 7, (*descs(kept[-1], b), 3.0, 64), ("C",))  # still cached after the cache was cleared
    assert len(encodings) == before


def test_host_descriptors_keep_tritons_path_for_other_launcher_layouts():
    """No encoding cache where the launcher is not laid out as triton 3.6 lays it out: descriptors that are
    not the leading arguments, a kernel that needs launch scratch memory, or a plain launcher."""
    from types import SimpleNamespace

    from kernels._common.launch import _descriptor_launcher

    metas = [{"swizzle": 1}, {"swizzle": 1}]
    assert _descriptor_launcher(_compiled_with_descriptor_wrapper({0, 2}, metas, [], [])) is None
    assert _descriptor_launcher(_compiled_with_descriptor_wrapper({0, 1}, metas, [], [], scratch=128)) is None
    assert _descriptor_launcher(_compiled_with_descriptor_wrapper({0, 1}, None, [], [])) is None
    plain = SimpleNamespace(run=SimpleNamespace(launch=print), function="fn", packed_metadata="meta")
    assert _descriptor_launcher(plain) is None


def test_only_kernels_with_descriptor_arguments_take_the_descriptor_path():
    """A replay converts HostDescriptors only for kernels whose signature has a descriptor (or cannot be read):
    the others launch as before, with no per-launch check of their arguments."""
    from types import SimpleNamespace

    from kernels._common.launch import _takes_descriptors

    def kernel(**signature):
        return SimpleNamespace(src=SimpleNamespace(signature=signature))

    assert _takes_descriptors(kernel(a_desc="tensordesc<i8[128, 128]>", M="i32"))
    assert not _takes_descriptors(kernel(a_ptr="*fp16", M="i32", BLOCK="constexpr"))
    assert _takes_descriptors(SimpleNamespace())


def test_launch_scratch_is_one_buffer_per_stream_shape_and_dtype():
    """stream_scratch returns the same buffer for the same device, stream, shape and dtype (launches on one
    stream reuse it), and another for another shape or dtype."""
    from kernels._common.launch import stream_scratch

    device = torch.empty(0, device=DEVICE).device  # a CUDA tensor's device carries its index
    first = stream_scratch(device, (3, 5), torch.float32)
    assert stream_scratch(device, (3, 5), torch.float32) is first
    assert stream_scratch(device, (3, 6), torch.float32) is not first
    assert stream_scratch(device, (3, 5), torch.float16).dtype == torch.float16


def test_host_launch_geometry_helpers_equal_tritons():
    """kernels._common's plain-Python cdiv and next_power_of_2 (launch paths call them every step) give
    triton's values, including 0 and 1."""
    import triton

    from kernels._common import cdiv, next_power_of_2

    assert all(next_power_of_2(n) == triton.next_power_of_2(n) for n in range(0, 5000))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 600) for b in (1, 2, 3, 16, 64, 127, 128))


@pytest.mark.gpu
def test_replays_skip_tritons_launch_path(monkeypatch):
    """Once a shape is compiled, its launches never go through CompiledKernel[grid] (Triton's per-call
    metadata and hook path) while no launch hook is set."""
    from triton.compiler.compiler import CompiledKernel

    a = torch.randn(300, 200, device=DEVICE, dtype=torch.float16)
    sq.quantize_rowwise(a), sq.quantize_global(a)

    def refuse(self, grid):
        raise AssertionError("a replay took Triton's launch path")

    monkeypatch.setattr(CompiledKernel, "__getitem__", refuse)
    assert_equal(sq.quantize_rowwise(a)[0], sq.quantize_rowwise_reference(a)[0], "replayed rowwise")
    assert_equal(sq.quantize_global(a)[0], sq.quantize_global_reference(a)[0], "replayed global")


@pytest.mark.gpu
def test_tma_matmul_replays_pass_encoded_descriptors_beneath_triton(monkeypatch):
    """With triton 3.6's launcher (the layout kernels._common.launch._descriptor_launcher knows), replays of the
    int8 TMA matmul never take Triton's launch path, and stay right with fresh operands every call (the
    caching allocator hands back the same addresses with new contents)."""
    import triton
    from triton.compiler.compiler import CompiledKernel

    if not triton.__version__.startswith("3.6."):
        pytest.skip(f"triton {triton.__version__}: replays keep Triton's descriptor path")
    a, b, aq, sa, bq, sb = _operands(777, 1024, 1536, torch.float16, False)
    if not tma.supported(aq, bq, torch.float16):
        pytest.skip("no TMA on this GPU")
    sm.int8_matmul_rowwise_global(aq, sa, bq, sb, None, torch.float16, impl="tma")

    def refuse(self, grid):
        raise AssertionError("a replay took Triton's launch path")

    monkeypatch.setattr(CompiledKernel, "__getitem__", refuse)
    for call in range(4):
        a, b, aq, sa, bq, sb = _operands(777, 1024, 1536, torch.float16, False)
        c = sm.int8_matmul_rowwise_global(aq, sa, bq, sb, None, torch.float16, impl="tma")
        ref = sm.quantized_matmul_reference(aq, sa, bq, sb, None, torch.float16)
        bad = (c.float() - ref.float()).abs() > ULP[torch.float16] * ref.float().abs() + 1e-3
        assert not bad.any(), f"call {call}: {first_mismatches(c, ref, bad)}"
        del c, aq, bq


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["pointer", "tma"])
def test_replayed_launches_match_the_references(impl):
    """Later launches of a shape replay the compiled kernels (kernels._common.launch.LaunchCache): fresh
    inputs every call, every output checked; a misaligned view gets its own compiled kernel."""
    for call in range(3):
        a, b, aq, sa, bq, sb = _operands(777, 1024, 1536, torch.bfloat16, False)
        for name in QUANTIZERS:
            q, s = getattr(sq, name)(a)
            q_ref, s_ref = getattr(sq, name + "_reference")(a)
            assert_equal(s, s_ref, f"call {call} {name} scales")
            assert_equal(q, q_ref, f"call {call} {name} values")
        c = sm.int8_matmul_rowwise_global(aq, sa, bq, sb, None, torch.bfloat16, impl=impl)
        ref = sm.quantized_matmul_reference(aq, sa, bq, sb, None, torch.bfloat16)
        bad = (c.float() - ref.float()).abs() > ULP[torch.bfloat16] * ref.float().abs() + 1e-3
        assert not bad.any(), f"call {call}: {first_mismatches(c, ref, bad)}"
    shifted = torch.randn(777 * 1536 + 3, device=DEVICE, dtype=torch.bfloat16)[3:].view(777, 1536)
    q, s = sq.quantize_rowwise(shifted)
    assert_equal(q, sq.quantize_rowwise_reference(shifted)[0], "misaligned rows")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["pointer", "tma"])
@pytest.mark.parametrize("shape", [(777, 1024, 1536), (4096, 16384, 1024), (8192, 1024, 4096), (300, 200, 72)])
def test_fp8_matmul_matches_the_reference_at_layer_sizes(impl, shape):
    """The fp8 form of the kernels (an e5m2 gradient times an e4m3 weight, as in the grad-input product;
    fp32 accumulation on the tensor cores, bias in the epilogue) within bf16 rounding of the exact
    product, over K up to 16384, replayed with fresh inputs; (300, 200, 72) is unaligned for TMA
    descriptors (the pointer kernel takes it under impl "tma" too)."""
    M, K, N = shape
    for call in range(2):
        torch.manual_seed(call)
        a, b = (torch.randn(r, K, device=DEVICE, dtype=torch.bfloat16) for r in (M, N))
        bias = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
        (aq, sa), (bq, sb) = sq.quantize_rowwise(a, "e5m2"), sq.quantize_rowwise(b, "e4m3")
        c = sm.fp8_matmul_rowwise_columnwise(aq, sa, bq, sb, bias, torch.bfloat16,
                                             impl="pointer" if K % 16 else impl)
        ref = sm.quantized_matmul_reference(aq, sa, bq, sb, bias, torch.bfloat16)
        err = float((c.float() - ref.float()).norm() / ref.float().norm())
        assert err < 5e-3, f"call {call}: relative error {err:.2e}"  # bf16 rounding alone: ~1e-3


@pytest.mark.parametrize("name", ["quantize_global_both", "quantize_columnwise_transpose"])
def test_weight_quantizer_barrier_leaves_its_counters_at_zero(name):
    """The one-launch weight quantizers' barrier counters (arrived, left) are zero again after each
    launch, so the next launch on the stream starts from zero; the result still matches the reference."""
    from kernels._common.launch import barrier_flags

    w = random_input((70, 50), torch.float16)
    for _ in range(2):
        got, want = getattr(sq, name)(w), getattr(sq, name + "_reference")(w)
        for g, r in zip(got, want):
            assert_equal(g, r, name)
        assert barrier_flags(w.device).tolist() == [0, 0]


def assert_column_sums(got: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """got = x summed over its rows in x.dtype: within one unit in the last place of the reference plus
    what fp32 sums in another order may differ by (rows x 2^-24 x the sum of magnitudes)."""
    want = x.float().sum(dim=0)
    assert got.dtype == x.dtype and got.shape == want.shape, what
    bound = ULP[x.dtype] * want.abs() + x.shape[0] * 2.0**-24 * x.float().abs().sum(dim=0) + 1e-6
    bad = (got.float() - want).abs() > bound
    assert not bad.any(), f"{what}: {first_mismatches(got.float(), want, bad)}"


@pytest.mark.parametrize("format", ["int8", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(300, 24)])
def test_rowwise_with_column_sums_matches_the_quantizer_and_the_sums(shape, dtype, format):
    """The output gradient's quantizer with the bias gradient: Xq and s exactly the rowwise quantizer's,
    the column sums X.sum(0) within rounding, the same on a second call (a fixed order), and the grid
    barrier's counters back at zero."""
    from kernels._common.launch import barrier_flags

    x = random_input(shape, dtype, zero_row=True)
    q, s, sums = sq.quantize_rowwise_colsum(x, format)
    want_q, want_s = sq.quantize_rowwise_reference(x, format)
    assert_equal(s, want_s, "scales")
    assert_equal(q.view(torch.uint8), want_q.view(torch.uint8), "values")
    assert_column_sums(sums, x, "column sums")
    assert_equal(sq.quantize_rowwise_colsum(x, format)[2], sums, "second call")
    assert barrier_flags(x.device).tolist() == [0, 0]


def test_rowwise_with_column_sums_of_empty_inputs():
    for shape in [(0, 5), (4, 0)]:
        q, s, sums = sq.quantize_rowwise_colsum(torch.zeros(shape, dtype=torch.float16, device=DEVICE))
        assert q.shape == shape and s.shape == (shape[0],) and sums.shape == (shape[1],)
        assert not sums.any()


@pytest.mark.gpu
def test_rowwise_with_column_sums_at_layer_sizes_and_in_a_graph():
    """Many row tiles per program (every program of the cooperative launch loops), and replays of a
    captured CUDA graph on new data."""
    for shape in [(65792, 1280), (20000, 5120), (8192, 4096)]:
        x = random_input(shape, torch.bfloat16)
        q, s, sums = sq.quantize_rowwise_colsum(x)
        assert_equal(q, sq.quantize_rowwise_reference(x)[0], f"{shape} values")
        assert_column_sums(sums, x, f"{shape} column sums")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sq.quantize_rowwise_colsum(x)
    for i in range(3):
        x.copy_(random_input(x.shape, x.dtype) * (i + 1))
        graph.replay()
        assert_equal(out[1], sq.quantize_rowwise_reference(x)[1], f"graph replay {i} scales")
        assert_column_sums(out[2], x, f"graph replay {i} column sums")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["quantize_global_both", "quantize_columnwise_transpose"])
def test_weight_quantizer_in_graphs_and_on_two_streams(name):
    """The cooperative weight quantizers at a size with many items per program: replays of a captured
    CUDA graph on new data, and launches alternating between two streams (a barrier per stream)."""
    from kernels._common.launch import BARRIERS

    quantize, reference = getattr(sq, name), getattr(sq, name + "_reference")
    w = random_input((4096, 3000), torch.float16)
    w[1234, 2345] = 500.0  # one absmax far above the rest
    quantize(w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quantize(w)
    for i in range(4):
        w.copy_(random_input(w.shape, w.dtype) * (i + 1))
        graph.replay()
        for k, (got, want) in enumerate(zip(out, reference(w))):
            assert_equal(got, want, f"graph replay {i} output {k}")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for i in range(6):
        stream = streams[i % 2]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got = quantize(w, "e4m3")
        torch.cuda.current_stream().wait_stream(stream)
        for k, (g, r) in enumerate(zip(got, reference(w, "e4m3"))):
            assert_equal(g.view(torch.uint8) if g.dtype != torch.float32 else g,
                         r.view(torch.uint8) if r.dtype != torch.float32 else r, f"stream {i % 2} call {i} output {k}")
    assert all(c.tolist() == [0, 0] for c in BARRIERS.values())


def test_cooperative_launch_shrinks_a_refused_grid():
    """The driver refuses a cooperative grid larger than what the process's SMs hold (MPS): the launch
    is retried with fewer programs; any other error, or a refusal of one program, is raised."""
    from kernels._common.launch import cooperative_launch

    tried = []

    def launch(grid, fits=300):
        tried.append(grid[0])
        if grid[0] > fits:
            raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")
        return "compiled"

    assert cooperative_launch(launch, 528) == ("compiled", (297,))
    assert tried == [528, 396, 297]
    with pytest.raises(RuntimeError, match="cooperative"):
        cooperative_launch(lambda grid: launch(grid, fits=0), 4)
    with pytest.raises(RuntimeError, match="out of memory"):
        cooperative_launch(lambda grid: (_ for _ in ()).throw(RuntimeError("out of memory")), 528)
