"""Does keeping the int8 tensor-core product in flight make SwitchBack's int8 matmul faster on Hopper?

Triton compiles the library's int8 matmul (kernels/switchback_matmul_tma.py) with each wgmma waited for
before the next k-step, and fp8 with one in flight (scripts/wgmma_shapes.py). This script answers whether
that wait is what int8 loses: it holds a persistent int8/fp8 matmul written in Gluon with the loop written
out, so every wgmma is asynchronous and only the one before it is waited for (when its shared-memory stage
is refilled); TMA loads run STAGES - 1 (tile, k-step) items ahead across tile boundaries. Same contract and
epilogue as the library kernel (scales, bias, fp16 output). For each shape and format it checks the Gluon
kernel's output against the library kernel's (bitwise: int32 / fp32 accumulation, same epilogue order),
then times both GPU-only (qbench.timing.time_fn) in alternation and writes one record per shape and format
through qbench's store (bench "async_wgmma", metrics library_tops, async_tops, speedup_async):

    PYTHONPATH=. python3 scripts/int8_async_wgmma.py --out results/scratch/async-wgmma/run1
    qbench summary results/scratch/async-wgmma/run1 --metric speedup_async

Hopper GPU only (wgmma); Gluon kernels do not run under the Triton interpreter. The kernel is kept here,
not in kernels/: it is slower than the library kernel (README, switchback section).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import switchback_matmul_tma as library
from kernels._common import cdiv, device_properties
from kernels._common.launch import LaunchCache, aligned
from qbench import store, units
from qbench.env import capture_env
from qbench.samples import percentile
from qbench.timing import time_fn

INV_QMAX_SQUARED = gl.constexpr(1.0 / (127.0 * 127.0))


@gluon.jit
def _tile_origin(tile, num_m, num_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(row, column) of an output tile in grouped order: GROUP_M rows of tiles walked column by column,
    so the programs running at once share operand tiles in L2."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_size = gl.minimum(num_m - first_m, GROUP_M)
    return (first_m + (tile % per_group) % group_size) * BLOCK_M, ((tile % per_group) // group_size) * BLOCK_N


@gluon.jit
def _issue_load(a_desc, b_desc, a_smem, b_smem, ready, item, start, num_m, num_n, k_tiles,
                NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr):
    """TMA loads of this program's item (tile start + (item // k_tiles) * NUM_PROGRAMS, k-step item % k_tiles)
    into stage item % STAGES, completing on that stage's barrier."""
    tile = start + (item // k_tiles) * NUM_PROGRAMS
    k = (item % k_tiles) * BLOCK_K
    off_m, off_n = _tile_origin(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
    s = item % STAGES
    bar = ready.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_smem.index(s))
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_smem.index(s))


@gluon.jit
def _epilogue(acc, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, off_m, off_n, M, N, layout: gl.constexpr,
              PER_COLUMN: gl.constexpr, HAS_BIAS: gl.constexpr, FP8: gl.constexpr):
    """acc [BLOCK_M, BLOCK_N] dequantized (as kernels._common.dequantize_tile) and stored at (off_m, off_n)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    sa = gl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    if not FP8:
        sa = sa * INV_QMAX_SQUARED
    if PER_COLUMN:
        sb = gl.load(sb_ptr + rn, mask=rn < N, other=0.0)
    else:
        sb = gl.load(sb_ptr + rn * 0)  # the one global scale, broadcast along the columns
    c = acc.to(gl.float32) * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
    if HAS_BIAS:
        c += gl.expand_dims(gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32), 0)
    tma.store_wait(pendings=0)  # the previous tile's store has read c_smem
    c_smem.store(c.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def _wgmma_matmul_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                         GROUP_M: gl.constexpr, STAGES: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                         INSTR_N: gl.constexpr, PER_COLUMN: gl.constexpr, HAS_BIAS: gl.constexpr,
                         FP8: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # wgmma: m16 per warp, k = 32 bytes of 8-bit values; warps stacked along M (one warpgroup per 64 rows)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, INSTR_N, 32])
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    start = gl.program_id(0)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    my_tiles = gl.cdiv(num_m * num_n - start, NUM_PROGRAMS)
    items = my_tiles * k_tiles  # this program's (tile, k-step) items, one flat sequence

    for i in gl.static_range(STAGES - 1):  # prologue: the first STAGES - 1 items' operands
        if i < items:
            _issue_load(a_desc, b_desc, a_smem, b_smem, ready, i, start, num_m, num_n, k_tiles, NUM_PROGRAMS,
                        STAGES, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)

    if FP8:
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    else:
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.int32, layout=layout)
    ki = 0
    tile = start
    for item in range(items):
        s = item % STAGES
        mbarrier.wait(ready.index(s), (item // STAGES) & 1)
        acc = warpgroup_mma(a_smem.index(s), b_smem.index(s).permute((1, 0)), acc, use_acc=ki > 0, is_async=True)
        # the previous item's product is done: its stage, (item - 1) % STAGES, takes item + STAGES - 1
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_smem.index(s), b_smem.index(s)))
        if item + STAGES - 1 < items:
            _issue_load(a_desc, b_desc, a_smem, b_smem, ready, item + STAGES - 1, start, num_m, num_n, k_tiles,
                        NUM_PROGRAMS, STAGES, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        ki += 1
        if ki == k_tiles:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            off_m, off_n = _tile_origin(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
            _epilogue(acc, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, off_m, off_n, M, N, layout, PER_COLUMN,
                      HAS_BIAS, FP8)
            ki = 0
            tile += NUM_PROGRAMS
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


# ---------------------------------------------------------------------------------------- launcher

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps, programs per SM), the library kernel's large-shape tile;
# shared memory per program = STAGES * (BM + BN) * BK + BM * BN * 2
CONFIG = (128, 256, 128, 3, 8, 1)
_CACHES = {False: LaunchCache("async_wgmma_int8_matmul"), True: LaunchCache("async_wgmma_fp8_matmul")}
_GL_DTYPES = {torch.int8: gl.int8, torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5,
              torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def instr_n(block_n: int, fp8: bool) -> int:
    """The widest wgmma N that divides BLOCK_N: up to 256 for fp8, and at most 224 for int8 (the int8
    widths stop there), so a 256-wide int8 tile takes two 128-wide instructions per k-step."""
    n = min(block_n, 256 if fp8 else 224)
    while block_n % n:
        n -= 16
    return n


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def launch(a, sa, b, sb, bias, out_dtype, per_column, config=None):
    """C [M, N] in out_dtype from int8 or fp8 operands (a.dtype says which); config as CONFIG (the
    default). Later launches of a shape replay the compiled kernel."""
    bm, bn, bk, stages, warps, per_sm = config or CONFIG
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    descs = (_descriptor(a, [bm, bk]), _descriptor(b, [bn, bk]), _descriptor(c, [bm, bn]))
    tail = (sa, sb, bias if bias is not None else sa, M, N, K)
    fp8 = a.dtype != torch.int8
    key = (M, N, K, a.dtype, b.dtype, out_dtype, per_column, bias is not None, (bm, bn, bk, stages, warps, per_sm),
           aligned(a, b, c, sa, sb, bias), a.device)
    sms = device_properties(a.device).multi_processor_count
    grid = (min(per_sm * sms, cdiv(M, bm) * cdiv(N, bn)),)
    consts = (8, stages, grid[0], instr_n(bn, fp8), per_column, bias is not None, fp8)

    def first():
        compiled = _wgmma_matmul_kernel[grid](*descs, *tail, *consts, num_warps=warps)
        pick = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "STAGES": stages, "num_warps": warps,
                "programs_per_sm": per_sm}
        return compiled, grid, consts + (warps,), pick

    _CACHES[fp8].launch(key, (*descs, *tail), first)
    return c


def _operands(fmt: str, M: int, K: int, N: int):
    """Random 8-bit operands on the GPU with positive scales (int8 absmax values, fp8 multipliers)."""
    if fmt == "int8":
        a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda")
        return a, torch.rand(M, device="cuda") + 0.5, b, torch.rand(N, device="cuda") + 0.5
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    return a, torch.rand(M, device="cuda") * 0.01, b, torch.rand(N, device="cuda") * 0.01


def measure(fmt: str, M: int, K: int, N: int, config: tuple, repeat: int) -> dict:
    """One record: the Gluon kernel against the library's persistent TMA kernel at C [M, N] = A [M, K] B^T."""
    a, sa, b, sb = _operands(fmt, M, K, N)
    bias = torch.randn(N, device="cuda", dtype=torch.float16)
    params = {"format": fmt, "M": M, "K": K, "N": N, "config": "x".join(map(str, config))}
    want = library.launch(a, sa, b, sb, bias, torch.float16, True)
    got = launch(a, sa, b, sb, bias, torch.float16, True, config)
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs().max().item()
        return store.make_record("async_wgmma", params, status="error", device="cuda",
                                 error=f"output differs from the library kernel's by up to {diff:.3g}")
    ops = 2.0 * M * N * K
    metrics, samples = {}, {}
    fns = {"library": lambda: library.launch(a, sa, b, sb, bias, torch.float16, True),
           "async": lambda: launch(a, sa, b, sb, bias, torch.float16, True, config)}
    for _ in range(2):  # alternated, so a drift of the clocks falls on both
        for name, fn in fns.items():
            timing = time_fn(fn, device="cuda", repeat=repeat, flush_l2=True, gpu_only=True)
            samples.setdefault(f"{name}_ms", []).extend(timing.samples_ms)
    for name in fns:
        ms = percentile(samples[f"{name}_ms"], 50)
        metrics[f"{name}_ms"], metrics[f"{name}_tops"] = ms, ops / ms / 1e9
    metrics["speedup_async"] = metrics["library_ms"] / metrics["async_ms"]
    unit = {"library_ms": units.MS, "async_ms": units.MS, "library_tops": units.TOPS, "async_tops": units.TOPS,
            "speedup_async": units.SPEEDUP}
    return store.make_record("async_wgmma", params, metrics, units=unit, samples=samples, device="cuda")


# the SwitchBack layer products of `qbench switchback`'s six pairs at M = 8192 and 32768 (forward and
# grad-input alike: [M, K] x [N, K]^T), and the vit-h stack's four at M = 256 x 257 tokens
SHAPES = [(M, K, N) for M in (8192, 32768) for K, N in ((1024, 4096), (4096, 1024), (2048, 8192), (8192, 2048),
                                                          (4096, 16384), (16384, 4096))]
SHAPES += [(65792, 1280, 3840), (65792, 1280, 1280), (65792, 1280, 5120), (65792, 5120, 1280)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="run directory to create")
    parser.add_argument("--repeat", type=int, default=20, help="samples per kernel and round (two rounds)")
    args = parser.parse_args()
    script = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    env = capture_env(config={"script_sha256": script, "config": list(CONFIG)})
    with store.RunWriter(args.out, env, bench="async_wgmma") as writer:
        for fmt in ("int8", "fp8"):
            for M, K, N in SHAPES:
                record = measure(fmt, M, K, N, CONFIG, args.repeat)
                writer.write(record)
                m = record["metrics"]
                print(record["case"], record["status"], *(f"{k}={m[k]:.4g}" for k in ("library_tops", "async_tops",
                                                                                     "speedup_async") if k in m),
                      record["error"] or "", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
