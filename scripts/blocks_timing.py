"""Timings of the block GEMM kernels and transports at the seed config (d 1024, h 4096, 8 local
experts, 4 ranks, 8192 tokens x top-2 per rank), for scripts/gpu_moe_blocks.sh.

  kernels     one GPU, the 4 sources as local tensors: gather_matmul (AG, fused gather) against the
              grouped GEMM on the same gathered rows (Triton and torch._grouped_mm), gather_rows alone,
              matmul_scatter (GA) against the grouped GEMM; TFLOP/s on the valid rows
  transports  4 ranks (NCCL): one layer step's pull + push (forward shapes) through the symm
              transport (fused, split) and the all_to_all fallback, on the same block plan, at
              uniform routing (locality 1/4) and all-local routing (locality 1); max over ranks
Usage: python3 scripts/blocks_timing.py kernels|transports
"""

import json
import sys

import torch

D, H, L, W, ROWS = 1024, 4096, 8, 4, 8192 * 2
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script (tiny sizes)
if DEV == "cpu":
    D, H, L, ROWS = 24, 40, 2, 300


def _counts(local: bool, seed: int = 0):
    """counts_all [W, W*L]: uniform (every (source, expert) pair gets ROWS/E rows +- some) or local."""
    gen = torch.Generator().manual_seed(seed)
    E = W * L
    if local:
        counts = torch.zeros(W, E, dtype=torch.int64)
        for s in range(W):
            pick = torch.multinomial(torch.ones(L), ROWS, True, generator=gen)
            counts[s, s * L:(s + 1) * L] = pick.bincount(minlength=L)
        return counts
    return torch.stack([torch.multinomial(torch.ones(E), ROWS, True, generator=gen).bincount(minlength=E)
                        for _ in range(W)])


def _tflops(rows: int, k: int, n: int, ms: float) -> float:
    return 2.0 * rows * k * n / (ms * 1e9)


def _kernel_inputs(dtype):
    from kernels import block_gemm as bg

    plan = bg.blocks_reference(_counts(False), 0, L, 64, device=DEV)
    rows, sizes = plan.gathered_rows, plan.counts_all.sum(1).tolist()
    new = lambda *shape, scale=1.0: torch.randn(*shape, device=DEV, dtype=dtype) * scale  # noqa: E731
    return dict(plan=plan, srcs=[new(int(c), D) for c in sizes], w1=new(L, D, H, scale=D ** -0.5), b1=new(L, H),
                w2=new(L, H, D, scale=H ** -0.5), g=new(rows, D), o=new(rows, H), act=new(rows, H),
                dsts=[new(int(c), D) for c in sizes])


def _kernel_cases(x):
    """name -> (fn, K, N) on the inputs x (K None: a copy, reported in GB/s)."""
    from kernels import block_gemm as bg
    from kernels.grouped_gemm import grouped_matmul_forward as gmf

    p, off = x["plan"], x["plan"].offsets_local
    return {
        "gather_matmul (AG fused)": (lambda: bg.gather_matmul(x["srcs"], p, x["w1"], x["b1"], out=x["o"],
                                                              gathered=x["g"]), D, H),
        "gather_rows (copy only)": (lambda: bg.gather_rows(x["srcs"], p, x["g"]), None, None),
        "grouped GEMM triton, same rows": (lambda: gmf(x["g"], x["w1"], off, x["b1"], backend="triton"), D, H),
        "grouped GEMM torch, same rows": (lambda: gmf(x["g"], x["w1"], off, x["b1"], backend="torch"), D, H),
        "gather_matmul w2^T (backward AG)": (lambda: bg.gather_matmul(x["srcs"], p, x["w2"].transpose(1, 2), None,
                                                                      out=x["o"], gathered=x["g"]), D, H),
        "matmul_scatter (GA)": (lambda: bg.matmul_scatter(x["act"], x["w2"], None, x["dsts"], p), H, D),
        "grouped GEMM triton, GA shape": (lambda: gmf(x["act"], x["w2"], off, None, backend="triton"), H, D),
    }


def kernels() -> None:
    from qbench.timing import time_fn

    out = []
    for dtype in (torch.float16, torch.bfloat16):
        x = _kernel_inputs(dtype)
        valid = int(x["plan"].block_rows.sum())
        for name, (fn, k, n) in _kernel_cases(x).items():
            try:
                t = time_fn(fn, device=DEV, warmup=5, repeat=30)
            except Exception as exc:  # noqa: BLE001 - a backend without this dtype is reported, not fatal
                print(f"{str(dtype):15s} {name:36s} failed: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            rec = {"dtype": str(dtype), "case": name, "median_ms": t.median, "p20_ms": t.p20, "p80_ms": t.p80,
                   "rows": valid}
            if k is not None:
                rec["tflops_valid_rows"] = _tflops(valid, k, n, t.median)
            else:
                rec["gbps"] = valid * D * x["g"].element_size() / (t.median * 1e6)
            out.append(rec)
            rate = f"{rec['tflops_valid_rows']:7.1f} TFLOP/s" if k else f"{rec['gbps']:7.1f} GB/s"
            print(f"{str(dtype):15s} {name:36s} {t.median:8.4f} ms  {rate}")
    print("JSON", json.dumps(out))


def _transport_step(ctx, local: bool):
    from qbench.layers.moe_blocks import A2ATransport, build_plan
    from qbench.layers.moe_symm import SymmTransport
    from qbench.timing import time_ranks

    dev, dtype = ctx.device, torch.float16
    counts = _counts(local).to(dev)
    plan, _ = build_plan(counts, ctx.rank, L, 64)
    gen = torch.Generator(device=dev).manual_seed(ctx.rank)
    x = torch.randn(plan.src_rows, D, device=dev, dtype=dtype, generator=gen)
    w1 = torch.randn(L, D, H, device=dev, dtype=dtype, generator=gen) / D ** 0.5
    w2 = torch.randn(L, H, D, device=dev, dtype=dtype, generator=gen) / H ** 0.5
    results, ys = {}, {}
    transports = [("a2a", A2ATransport())]
    if DEV == "cuda":
        transports += [("symm " + m, SymmTransport(device=dev, mode=m)) for m in ("split", "fused-ga", "fused")]
    for name, t in transports:
        def step(_i, t=t):
            pre, _ = t.pull_matmul(x, w1, None, plan)
            return t.matmul_push(pre, w2, None, plan)

        ys[name] = step(0)
        timing = time_ranks(step, steps=20, warmup=5, device=dev)
        results[name] = timing.median
    ref = ys["a2a"].float()
    errs = {k: float((v.float() - ref).abs().max() / ref.abs().max()) for k, v in ys.items()}
    return results, errs, plan.num_blocks, plan.blocks_remote


def _transports_body(ctx):
    for local in (False, True):
        times, errs, nb, remote = _transport_step(ctx, local)
        flops = 2 * 2 * ROWS * D * H  # two products over this rank's rows (max over ranks ~ uniform)
        yield {"locality": 1.0 if local else 1.0 / W, "blocks_rank0": nb, "remote_rank0": remote,
               "ms": times, "tflops": {k: flops / (v * 1e9) for k, v in times.items()}, "rel_err_vs_a2a": errs}


def transports() -> None:
    from qbench import dist

    backend = "nccl" if DEV == "cuda" else "gloo"
    for item in dist.launch(_transports_body, world_size=W, backend=backend, device=DEV, timeout_s=90):
        print(json.dumps(item))


if __name__ == "__main__":
    {"kernels": kernels, "transports": transports}[sys.argv[1]]()
