"""The symmetric-memory transport on real GPUs: NCCL ranks, symmetric buffers, peer loads and stores.

Every rank runs the sequence of one layer step (pull, push, pull with w^T, a second pull in a row,
push) and checks each result against the torch references of the same plans, computed from every
rank's inputs (regenerated from the same seeds). Needs 2 or more GPUs with peer access.
"""

import pytest
import torch

from qbench import dist

pytestmark = [pytest.mark.gpu, pytest.mark.dist]

K, N, L, B = 200, 136, 3, 64  # odd-ish widths; blocks of 1..64 rows from random counts
# fp32: IEEE products on both sides, only the summation order differs: with K = 200 unit-variance
# products that moves a sum by up to ~K * 2^-24 * |terms| ~ 1.2e-5 (measured on H200: 1.3e-5), so
# 1e-4; 16-bit: both round one fp32 accumulator, an order difference may flip the last bit (2 ulps)
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _counts(world, seed):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 150, (world, world * L), generator=gen)
    counts[0, :L] = 0  # rank 0 sends nothing to owner 0 (empty local experts on the owner side)
    counts[-1, -1] = 1  # a single-row block
    return counts


def _inputs(rank, counts, dtype, device):
    from qbench.layers.moe.blocks import reference_plan

    gen = torch.Generator().manual_seed(1000 + rank)
    S = int(counts[rank].sum())
    plan = reference_plan(counts.to(device), rank, L, B, device=device)
    draw = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).to(device)  # noqa: E731
    return {"plan": plan, "src": draw(S, K), "dy": draw(S, N), "w1": draw(L, K, N), "b1": draw(L, N),
            "w2": draw(L, N, K), "b2": draw(L, K), "a": draw(plan.gathered_rows, N)}


def _first_bad(got, want, tol):
    bad = ~torch.isclose(got.float(), want.float(), rtol=tol, atol=tol)
    if not bad.any():
        return None
    i = tuple(bad.nonzero()[0].tolist())
    return f"{int(bad.sum())}/{bad.numel()} differ, first {i}: {float(got[i])} vs {float(want[i])}"


def _step(transport, d):
    p = d["plan"]
    return {
        "pre": transport.pull_matmul(d["src"], d["w1"], d["b1"], p),
        "y": transport.matmul_push(d["a"], d["w2"], None, p),
        "back": transport.pull_matmul(d["dy"], d["w1"].transpose(1, 2), None, p),
        "again": transport.pull_matmul(d["src"], d["w1"], None, p),
        "dx": transport.matmul_push(d["a"], d["w2"], d["b2"], p),
    }


def _check(rank, world, counts, dtype, got, device):
    from kernels import block_gemm as bg

    ins = [_inputs(r, counts, dtype, device) for r in range(world)]
    d, tol, errors = ins[rank], TOL[dtype], []
    srcs, dys = [x["src"] for x in ins], [x["dy"] for x in ins]
    want, want_g = bg.gather_matmul_reference(srcs, d["plan"], d["w1"], d["b1"])
    errors.append(("pull", _first_bad(got["pre"][0], want, tol)))
    errors.append(("gathered", None if torch.equal(got["pre"][1], want_g) else "gathered rows differ"))
    back, _ = bg.gather_matmul_reference(dys, d["plan"], d["w1"].transpose(1, 2), None)
    errors.append(("pull w^T", _first_bad(got["back"][0], back, tol)))
    again, _ = bg.gather_matmul_reference(srcs, d["plan"], d["w1"], None)
    errors.append(("second pull", _first_bad(got["again"][0], again, tol)))
    for key, with_bias in (("y", False), ("dx", True)):
        dst = [torch.full((int(c.sum()), K), float("nan"), dtype=dtype, device=device) for c in counts]
        for x in ins:
            bg.matmul_scatter_reference(x["a"], x["w2"], x["b2"] if with_bias else None, dst, x["plan"])
        errors.append((f"push {key}", _first_bad(got[key], dst[rank], tol)))
    return [(name, err) for name, err in errors if err is not None]


def symm_cases(ctx):
    """Rank body: yields (dtype, mode, world, errors of every rank) and symm_available's answer."""
    import torch.distributed as tdist

    from qbench.layers.moe.transport import SymmTransport, symm_available

    ok, reason = symm_available(None, ctx.device)
    yield ("available", ok, reason)
    for seed, dtype in enumerate((torch.float16, torch.bfloat16, torch.float32)):
        for mode in ("fused", "fused-ga", "split"):
            counts = _counts(ctx.world_size, seed)
            transport = SymmTransport(device=ctx.device, mode=mode)
            got = _step(transport, _inputs(ctx.rank, counts, dtype, ctx.device))
            torch.cuda.synchronize()
            errors = _check(ctx.rank, ctx.world_size, counts, dtype, got, ctx.device)
            every = [None] * ctx.world_size
            tdist.all_gather_object(every, errors)
            yield (str(dtype), mode, ctx.world_size, every)


def test_symm_transport_matches_references_on_every_rank():
    world = min(4, torch.cuda.device_count())
    if world < 2:
        pytest.skip("needs 2 or more GPUs")
    items = list(dist.launch(symm_cases, world_size=world, backend="nccl", device="cuda", timeout_s=300))
    (_, ok, reason), cases = items[0], items[1:]
    assert ok, f"symmetric memory unavailable: {reason}"
    assert len(cases) == 9  # 3 dtypes x 3 modes
    bad = [(dt, mode, r, errs) for dt, mode, _, every in cases for r, errs in enumerate(every) if errs]
    assert not bad, f"{len(bad)} (dtype, mode, rank) differ from the references; first: {bad[0]}"
