"""Helpers shared by the kernel families: where Triton can run, and the jit helpers that more than
one family uses. Every kernel file imports from here only (never from a sibling family), so the
families form no import loop.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import triton
import triton.language as tl
from triton.language.extra import libdevice

# Read once: triton reads TRITON_INTERPRET when it is first imported, so the value cannot change later.
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    """True under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return _INTERPRETING


def use_triton(*tensors) -> bool:
    """True when the Triton kernel can run on these tensors (CUDA, or CPU under the interpreter)."""
    if not tensors:
        return False
    return _INTERPRETING or all(t.is_cuda for t in tensors)


def ieee(dtype) -> bool:
    """fp32 inputs get IEEE products (no TF32), so a kernel matches the fp32 reference."""
    import torch

    return dtype == torch.float32 or upcast(dtype)


def upcast(dtype) -> bool:
    """The Triton interpreter's bf16 tl.dot returns garbage (checked with triton 3.9), so under the
    interpreter bf16 tiles are widened to fp32 before the product; compiled kernels never upcast."""
    import torch

    return interpreting() and dtype == torch.bfloat16


@triton.jit
def dot_accumulate(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc += a @ b in fp32. UPCAST widens 16-bit tiles first (only under the interpreter, whose bf16
    dot is wrong); IEEE asks for exact fp32 products (no TF32) so fp32 matches the fp32 reference."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


_SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)


@triton.jit
def activation_epilogue(acc, pre_ptrs, mask, EPI: tl.constexpr, ACT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """A GEMM epilogue around an elementwise activation (ACT 1: relu, 2: exact erf GELU, as F.gelu), on
    the fp32 tile acc rounded to OUT_DTYPE first (what an unfused activation reads):
    EPI 0: acc as is; 1: store the pre-activation at pre_ptrs, return act(pre); 2: return acc * act'(pre)
    with pre loaded from pre_ptrs (the activation's backward: acc is the gradient of its output)."""
    if EPI == 0:
        return acc
    v = acc.to(OUT_DTYPE).to(tl.float32)
    if EPI == 1:
        tl.store(pre_ptrs, v.to(OUT_DTYPE), mask=mask)
        if ACT == 1:
            return tl.maximum(v, 0.0)
        return 0.5 * v * (1.0 + tl.math.erf(v * _SQRT_HALF))
    p = tl.load(pre_ptrs, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        return tl.where(p > 0.0, v, 0.0)
    return v * (0.5 * (1.0 + tl.math.erf(p * _SQRT_HALF)) + p * tl.exp(-0.5 * p * p) * _INV_SQRT_2PI)


ACTIVATIONS = {"relu": 1, "gelu": 2}  # the ACT codes of activation_epilogue
EPILOGUES = {None: 0, "act": 1, "act_grad": 2}  # its EPI codes


_INV_QMAX_SQUARED = tl.constexpr(1.0 / (127.0 * 127.0))


@triton.jit
def quantized_zeros(BM: tl.constexpr, BN: tl.constexpr, FP8: tl.constexpr):
    """The accumulator tile [BM, BN] of an 8-bit product: int32 for int8 (exact), fp32 for fp8."""
    if FP8:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    return acc


@triton.jit
def quantized_dot(a, b, acc, FP8: tl.constexpr):
    """acc + a . b of 8-bit tiles a [BM, BK], b [BK, BN]. int8 sums exactly in int32. fp8 (e4m3 or e5m2,
    in any pairing) sums in fp32 with Triton's default accumulation (on Hopper the tensor cores' own,
    without periodic promotion: the fast-accumulation mode of torch._scaled_mm)."""
    if FP8:
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    return acc


@triton.jit
def dequantize_tile(acc, rm, rn, M, N, sa_ptr, sb_ptr, bias_ptr, PER_COLUMN: tl.constexpr, HAS_BIAS: tl.constexpr,
                    FP8: tl.constexpr):
    """The SwitchBack matmuls' fused dequantizing epilogue (pointer and TMA kernels): tile [BM, BN] ->
    fp32 acc * s_a[rm] * s_b (+ bias[rn]); s_b is one scale (global) or one per column. int8 scales are
    absmax values (the product is divided by 127^2 here), fp8 scales are multipliers (absmax / QMAX)."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    if PER_COLUMN:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr + tl.zeros([1], dtype=tl.int32))[:, None]
    if FP8:
        c = acc * sa[:, None] * sb
    else:
        c = acc.to(tl.float32) * (sa[:, None] * _INV_QMAX_SQUARED) * sb
    if HAS_BIAS:
        c += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return c


# ------------------------------------------------------------------------------ repeated launches


class LaunchCache:
    """Compiled kernels by launch key, so that a launch repeated with the same shapes (a layer in a
    training loop) skips Triton's argument binding, specialization and cache lookup: measured on an
    H200 host (triton 3.6), `kernel[grid](...)` costs about 17 us of host time and the compiled
    kernel's own runner about 7 us.

    The key must fix everything Triton specializes a compiled kernel on: tensor dtypes, 16-byte
    alignment of every pointer, and the integer arguments' values (== 1, divisible by 16); launchers
    use the exact shapes and strides plus `aligned(...)` of their tensors. The first launch of a key
    goes through Triton (compiling, autotuning) and returns what later launches replay. Under the
    interpreter nothing is cached (there is no compiled kernel).
    """

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[tuple, tuple] = {}

    def launch(self, key: tuple, args: tuple, first, grid: tuple | None = None) -> None:
        """args: the kernel's runtime arguments in signature order (constexprs excluded). first():
        launches through Triton and returns (compiled kernel, grid, constexpr values in signature
        order, config dict for the record). grid (three sizes): this launch's grid where it varies
        between launches of one key (a key may then fix only how Triton specializes a size, not the
        size itself); None replays the first launch's grid."""
        entry = self._entries.get(key)
        if entry is None:
            self.store(key, *first())
        elif grid is None:
            entry[0](*args)
        else:
            entry[0](*args, grid=grid)

    def entry(self, key: tuple):
        """(replay(*args), grid, constexprs, extra) stored for key, or None."""
        return self._entries.get(key)

    def store(self, key: tuple, compiled, grid: tuple, constexprs: tuple, config: dict, extra=None) -> None:
        """Remember a first launch's compiled kernel (never under the interpreter, which has none)."""
        if compiled is not None and not _INTERPRETING:
            grid = tuple(grid) + (1,) * (3 - len(grid))  # the launcher takes three grid sizes
            self._entries[key] = (_replay(compiled, grid, tuple(constexprs)), grid, tuple(constexprs), extra)
            record_pick(self.name, key, config)


class HostDescriptor(NamedTuple):
    """What a host TMA descriptor covers: base tensor, shape and strides (elements, last stride 1) and the
    block one load or store moves. Launchers pass these to a replay, which encodes each distinct one once
    (see _descriptor_launcher); a first launch goes through Triton with `tensor_descriptor(...)` of it."""

    base: Any
    shape: tuple
    strides: tuple
    block: tuple


def tensor_descriptor(d: HostDescriptor):
    """Triton's host TensorDescriptor of d (what a launch through Triton takes)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(d.base, list(d.shape), list(d.strides), list(d.block))


def _replay(compiled, grid: tuple, constexprs: tuple):
    """replay(*args): the compiled kernel's own launcher on the current stream, with the arguments Triton's
    JIT passes it (runtime args, then constexprs), skipping its per-call device, stream and metadata
    lookups; launch hooks (profilers) still get the path through Triton. Descriptor arguments come as
    HostDescriptor."""
    import torch
    from triton import knobs

    compiled._init_handles()
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    device = torch.cuda.current_device()
    raw_stream = torch._C._cuda_getCurrentRawStream
    g0, g1, g2 = grid
    encoded = _descriptor_launcher(compiled)
    described = _takes_descriptors(compiled)  # then only Triton's path turns HostDescriptors into arguments

    def through_triton(args, grid):
        args = tuple(tensor_descriptor(a) if isinstance(a, HostDescriptor) else a for a in args)
        return compiled[grid or (g0, g1, g2)](*args, *constexprs)

    def replay(*args, grid=None):
        if _hooked(knobs.runtime):
            return through_triton(args, grid)
        if encoded is not None:
            return encoded(grid or (g0, g1, g2), raw_stream(device), args, constexprs)
        if described:
            return through_triton(args, grid)
        if grid is None:
            run(g0, g1, g2, raw_stream(device), function, meta, None, None, None, *args, *constexprs)
        else:
            run(*grid, raw_stream(device), function, meta, None, None, None, *args, *constexprs)

    return replay


def _takes_descriptors(compiled) -> bool:
    """Whether the kernel's signature has a tensor-descriptor argument (read once per launch key, so that
    replays of every other kernel pay nothing for descriptors); True where the signature cannot be read."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if not isinstance(signature, dict):
        return True
    return any(str(kind).startswith("tensordesc") for kind in signature.values())


ENCODED_PER_POSITION = 64  # encoded descriptors kept per descriptor argument of a launch key (addresses recur)


def _descriptor_launcher(compiled):
    """For a kernel whose leading arguments are host TMA descriptors: launch(grid, stream, args,
    constexprs) that encodes each distinct descriptor (address, shape, strides, block) once and calls the
    launcher beneath Triton's descriptor wrapper, which otherwise re-encodes every descriptor on every
    launch (a driver call and Python per descriptor: on an H200 host the int8 TMA matmul cost 25 us more
    host time per launch than the pointer kernel). The encoding depends on nothing else, so a cached one
    equals a fresh one; a training loop's tensors come back at the same addresses. None where the
    launcher is not laid out as triton 3.6 lays it out (other versions keep the path through Triton)."""
    inner = getattr(compiled.run, "launch", None)
    code, closure = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or closure is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
    names = inner.__globals__
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys() or \
            names.get("_BASE_ARGS_FORMAT_LEN") != 13 or "make_tensordesc_arg" not in names:
        return None
    count, metas = len(cells["tensordesc_indices"]), cells["tensordesc_meta"]
    run = compiled.run
    if (cells["tensordesc_indices"] != set(range(count)) or not metas or None in metas
            or run.global_scratch_size or run.profile_scratch_size):
        return None
    raw, make, function, meta = cells["launcher"], names["make_tensordesc_arg"], compiled.function, \
        compiled.packed_metadata
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    caches: list[dict] = [{} for _ in range(count)]

    def encode(d: HostDescriptor, position: int) -> tuple:
        key = (d.base.data_ptr(), d.shape, d.strides, d.block, d.base.dtype)
        cache = caches[position]
        found = cache.get(key)
        if found is None:
            if len(cache) >= ENCODED_PER_POSITION:
                cache.clear()
            found = cache[key] = tuple(make(tensor_descriptor(d), metas[position]))
        return found

    def launch(grid, stream, args, constexprs):
        expanded = [v for i in range(count) for v in encode(args[i], i)]
        raw(*grid, stream, function, cooperative, pdl, None, None, meta, None, None, None, *expanded,
            *args[count:], *constexprs)

    return launch


def _hooked(runtime) -> bool:
    """Whether a launch hook (a profiler's) is set. Triton before 3.5 keeps None or a function; later
    versions keep a HookChain whose `calls` list is empty when nothing is hooked (testing it against None
    sent every replay down Triton's own launch path)."""
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))


def specialization(n: int) -> tuple:
    """What Triton specializes an integer argument on (its value 1, divisibility by 16, 64-bit range):
    the launch-key part of a size that varies between launches of one compiled kernel."""
    return n == 1, n % 16 == 0, n >= 2**31


def aligned(*tensors) -> bool:
    """True when every tensor's data pointer is 16-byte aligned (what Triton specializes on)."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits % 16 == 0


class _PickLog:
    """The configurations kernels launched with, per (kernel, launch key): the latest pick, with the
    sequence number of its note, so that a run writer can take exactly the picks made while it was
    open (qbench.env.autotune_mark / autotune_picks read this log)."""

    def __init__(self) -> None:
        self.seq = 0
        self.picks: dict[tuple[str, str], tuple[int, dict]] = {}

    def note(self, kernel: str, key, config: dict) -> None:
        key = [str(v) for v in key] if isinstance(key, tuple) else key
        self.seq += 1
        self.picks[(kernel, repr(key))] = (self.seq, {"kernel": kernel, "key": key, "config": dict(config)})

    def since(self, mark: int) -> list[dict]:
        return [pick for ident, (seq, pick) in sorted(self.picks.items()) if seq > mark]


PICKS = _PickLog()


def record_pick(kernel: str, key, config: dict | None) -> None:
    """Remember the configuration a kernel launched with for one launch key (autotuner picks)."""
    if config:
        PICKS.note(kernel, key, config)


def best_tile(autotuner) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps) the autotuner picked last."""
    best = autotuner.best_config
    bm, bn, bk = (best.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    return bm, bn, bk, best.kwargs["GROUP_M"], best.num_stages, best.num_warps


_DEVICE_PROPERTIES: dict = {}  # CUDA device index -> torch's properties


def device_properties(device):
    """torch.cuda.get_device_properties of a CUDA device, queried once per device: each query costs
    about 2 us of host time, and launchers ask on every call."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_PROPERTIES:
        _DEVICE_PROPERTIES[index] = torch.cuda.get_device_properties(index)
    return _DEVICE_PROPERTIES[index]


def capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (cached)."""
    props = device_properties(device)
    return props.major, props.minor


def descriptor_aligned(t, row_elems: int) -> bool:
    """A tensor descriptor's rules: 16-byte aligned base and row stride (row_elems elements per row)."""
    return t.data_ptr() % 16 == 0 and (row_elems * t.element_size()) % 16 == 0


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host-side launch geometry. triton.cdiv is a constexpr_function in recent triton: its
    wrapper costs a few microseconds of host time per call, and launch paths run it on every step."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0, as triton.next_power_of_2), on the host (see cdiv)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def dot_rows(n: int) -> int:
    """The row block that holds n rows in one tl.dot operand: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, next_power_of_2(n))


# fp32 kernels take exact (IEEE) products: the dot becomes unrolled FMA code, whose compile time grows with
# the tile (minutes for 128 x 128 and 64 x 256 tiles); their autotuners keep to tiles of at most this many
FP32_LARGEST_TILE = 64 * 128


def fp32_tile_limit(pointer: str, dims: tuple[str, str]):
    """An autotuner's early_config_prune: with an fp32 tensor at argument `pointer`, only the configs whose
    tile dims[0] x dims[1] is at most FP32_LARGEST_TILE; every config otherwise."""
    def prune(configs, named_args, **kwargs):
        import torch

        if named_args[pointer].dtype != torch.float32:
            return configs
        return [c for c in configs if c.kwargs[dims[0]] * c.kwargs[dims[1]] <= FP32_LARGEST_TILE]

    return prune


def config_dict(config) -> dict:
    """A triton.Config as a plain dict (its kwargs, num_warps, num_stages)."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


# ------------------------------------------------------------------------------ cooperative launches
# A kernel whose programs wait for each other (a grid barrier between two phases) must have every program
# resident at once: it is launched cooperatively (the driver refuses a grid that cannot be), with as many
# programs as the SMs hold.


@triton.jit
def grid_barrier(sync_ptr, programs):
    """Every program of a cooperative launch waits here for all the others. sync_ptr: int32 [2],
    (arrived, left), zero at the launch (barrier_flags); the last program to leave zeroes them for the
    next launch on the stream. Thread-block barriers around it order all threads' memory operations with
    the one thread that runs a scalar atomic (release on arrival, acquire while waiting)."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu") < programs:
        pass
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="relaxed", scope="gpu") == programs - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


BARRIERS: dict = {}  # (device, raw stream) -> int32 [2] grid-barrier flags


def barrier_flags(device):
    """The grid barrier's int32 (arrived, left) of this device and stream, zero between launches: one per
    stream, so that launches on two streams never count each other's programs."""
    import torch

    key = (device, current_stream(device))
    if key not in BARRIERS:
        BARRIERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return BARRIERS[key]


def current_stream(device) -> int:
    """The raw handle of the device's current stream (0 off CUDA): the key of per-stream launch state."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


SCRATCH: dict = {}  # (device, raw stream, shape, dtype) -> a launch's scratch buffer


def stream_scratch(device, shape: tuple, dtype):
    """An uninitialized buffer for partial results that one launch writes and reads itself (partial maxima,
    partial sums), one per device, stream, shape and dtype: launches on one stream run in order, so each
    reuses it instead of allocating anew (a CUDA allocation costs ~7.5 us of host time on an H200 host).
    Keyed by stream as barrier_flags is, so launches on two streams never share one."""
    import torch

    key = (device, current_stream(device), shape, dtype)
    buf = SCRATCH.get(key)
    if buf is None:
        buf = SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf


def sm_count(device) -> int:
    """Multiprocessors of a CUDA device, 2 otherwise (the interpreter: few programs, each looping)."""
    if device.type != "cuda":
        return 2
    return device_properties(device).multi_processor_count


def resident_programs(compiled, device, cap: int) -> int:
    """Programs of a compiled kernel that one SM holds at once (registers, threads, shared memory), at
    most cap."""
    props = device_properties(device)
    compiled._init_handles()
    warps = compiled.metadata.num_warps
    regs = cdiv(compiled.n_regs * 32, 256) * 256 * warps  # registers are allocated per warp, 256 at a time
    by_regs = props.regs_per_multiprocessor // max(regs, 1)
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    by_smem = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)  # 1 KB kept per block
    return max(1, min(by_regs, by_threads, by_smem, cap))


def cooperative_launch(launch, programs: int):
    """(compiled kernel, grid) of launch((programs,)), with fewer programs each time the driver refuses the
    grid: a process that gets fewer SMs than the device has (MPS with a thread limit) cannot hold every
    program that `resident_programs` counts, and the driver says so rather than letting the barrier wait."""
    while True:
        try:
            return launch((programs,)), (programs,)
        except RuntimeError as exc:
            if "cooperative" not in str(exc) or programs == 1:
                raise
            programs = programs * 3 // 4


def launch_with_grid_barrier(kernel, args: tuple, consts: tuple, num_warps: int, device, cap: int):
    """(compiled kernel, grid) of the first launch of a kernel with a grid barrier: every program resident at
    once, as many as the SMs hold (at most cap per SM; cooperative_launch shrinks a refused grid). Under the
    interpreter, whose programs run one after another, one program does every item."""
    if _INTERPRETING:
        return kernel[(1,)](*args, *consts, num_warps=num_warps), (1,)
    compiled = kernel.warmup(*args, *consts, grid=(1,), num_warps=num_warps, launch_cooperative_grid=True)
    programs = sm_count(device) * resident_programs(compiled, device, cap)
    return cooperative_launch(lambda grid: kernel[grid](*args, *consts, num_warps=num_warps,
                                                        launch_cooperative_grid=True), programs)


# ------------------------------------------------------------------------------ torch custom ops


def is_compiling() -> bool:
    """True while torch.compile traces: launchers then call their registered custom op, so the
    compiled graph treats the kernel as one opaque node with a known output shape. In eager mode
    they launch directly (a custom op's dispatch costs ~11 us of host time per call on an H200 host)."""
    import torch

    return torch.compiler.is_compiling()


_LIBRARY = None  # the qbench namespace of torch.ops, made on the first registration


def register_op(name: str, impl, fake):
    """torch.ops.qbench.<name> with `impl` (type-annotated, no mutation, outputs never alias inputs) and
    its fake (shapes only). Defined through torch.library.Library, not torch.library.custom_op: a compiled
    step calls these ops at run time, and custom_op's Python wrappers cost ~18 us per call against ~6 us
    for a Library-defined op (CPU, torch 2.13: a no-op impl called 20,000 times)."""
    import torch

    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("qbench", "FRAGMENT")
    _LIBRARY.define(name + torch.library.infer_schema(impl, mutates_args=()))
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"qbench::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.qbench, name).default


# ------------------------------------------------------------------------------ quantization formats

# name -> (torch dtype of the stored elements, QMAX: the largest magnitude the format stores)
QUANT_FORMATS = {"int8": ("int8", 127.0), "e4m3": ("float8_e4m3fn", 448.0), "e5m2": ("float8_e5m2", 57344.0)}
_FORMAT_CODE = {"int8": 0, "e4m3": 1, "e5m2": 2}
# 1.5 * 2**23: adding and subtracting it rounds an fp32 |v| < 2**22 to the nearest integer, ties to
# even, in IEEE arithmetic. Used only under the interpreter, which has no libdevice.
_ROUND_MAGIC = tl.constexpr(12582912.0)


def format_consts(format: str) -> tuple[int, float, bool]:
    """(FORMAT code, QMAX, INTERPRET): the constexprs every quantizing kernel takes."""
    if format not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {format!r}; choose from {', '.join(QUANT_FORMATS)}")
    return _FORMAT_CODE[format], QUANT_FORMATS[format][1], _INTERPRETING


_FORMAT_DTYPES: dict = {}


def format_dtype(format: str):
    """The torch dtype of a quantization format's stored elements."""
    if format not in _FORMAT_DTYPES:
        import torch

        format_consts(format)  # validates the name
        _FORMAT_DTYPES[format] = getattr(torch, QUANT_FORMATS[format][0])
    return _FORMAT_DTYPES[format]


@triton.jit
def rint(v, INTERPRET: tl.constexpr):
    """Round half to even in fp32 (libdevice on the GPU, the magic-number add under the interpreter)."""
    if INTERPRET:
        v = v.to(tl.float32)
        magic = tl.full(v.shape, _ROUND_MAGIC, tl.float32)  # keep numpy in fp32, not fp64
        return (v + magic) - magic
    else:
        return libdevice.rint(v)


@triton.jit
def _fp8_grid(v, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    """v (fp32) rounded half to even onto the fp8 grid with MANTISSA bits and smallest normal
    exponent MIN_EXP; only under the interpreter, whose own fp8 conversion misrounds across binades
    (127.3 -> e5m2 gave 64, checked with triton 3.9)."""
    bits = v.to(tl.int32, bitcast=True)
    drop: tl.constexpr = 23 - MANTISSA
    odd = (bits >> drop) & 1
    normal = ((bits + (1 << (drop - 1)) - 1 + odd) >> drop) << drop
    step = tl.full(v.shape, 2.0 ** (MIN_EXP - MANTISSA), tl.float32)  # subnormal spacing
    magic = tl.full(v.shape, _ROUND_MAGIC, tl.float32)
    sub = ((v / step + magic) - magic) * step
    return tl.where(tl.abs(v) < 2.0**MIN_EXP, sub, normal.to(tl.float32, bitcast=True))


@triton.jit
def encode(v, FORMAT: tl.constexpr, INTERPRET: tl.constexpr):
    """v (fp32, |v| <= QMAX of the format) -> the stored element: int8 (round half to even), e4m3 or
    e5m2 (the hardware's round-to-nearest-even conversion)."""
    if FORMAT == 0:
        return rint(v, INTERPRET).to(tl.int8)
    elif FORMAT == 1:
        if INTERPRET:
            v = _fp8_grid(v, 3, -6)
        return v.to(tl.float8e4nv)
    else:
        if INTERPRET:
            v = _fp8_grid(v, 2, -14)
        return v.to(tl.float8e5)


@triton.jit
def multiplier(s, QMAX: tl.constexpr):
    """QMAX / s with IEEE rounding; 0 where s == 0 (an all-zero row or tensor)."""
    # fp32 constants, not Python floats: the interpreter would otherwise compute in fp64
    zero = tl.zeros(s.shape, tl.float32)
    safe = tl.where(s > 0, s, zero + 1.0)
    return tl.where(s > 0, tl.math.div_rn(zero + QMAX, safe), zero)


@triton.jit
def stored_scale(s, FORMAT: tl.constexpr, QMAX: tl.constexpr):
    """int8 keeps the absmax (the original SwitchBack convention); fp8 keeps the dequantization
    multiplier absmax / QMAX, the form torch._scaled_mm takes."""
    if FORMAT == 0:
        return s
    else:
        return tl.math.div_rn(s, tl.zeros(s.shape, tl.float32) + QMAX)


def encode_reference(x, s, format: str):
    """The plain-torch twin of `encode(x * multiplier(s))` and `stored_scale(s)`: (q, stored scale);
    s (the absmax) broadcasts against x."""
    import torch

    qmax = QUANT_FORMATS[format][1]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    # tensor / tensor: IEEE division (the scalar form `qmax / safe` is not correctly rounded on CPU)
    mult = torch.where(s > 0, torch.full_like(safe, qmax) / safe, torch.zeros_like(s))
    v = x.float() * mult
    if format == "int8":
        return torch.round(v).to(torch.int8), s  # torch.round: half to even
    return v.to(format_dtype(format)), s / torch.full_like(s, qmax)
