"""Routing and plan kernels (kernels/moe_route.py) against the tensor-op versions they replace
(qbench/layers/moe_routing.route, moe_comm.send_rows / segment_offsets), under the interpreter on CPU."""

import pytest
import torch

from kernels.moe_route import choose_and_position, plan_offsets
from qbench.layers import moe_comm as comm
from qbench.layers.moe_routing import capacity_limit, route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _mismatch(got, want, what):
    bad = (got != want).nonzero().flatten()
    assert not bad.numel(), f"{what}: {bad.numel()} differ, first at {bad[:5].tolist()}: " \
                            f"{got[bad[:5]].tolist()} vs {want[bad[:5]].tolist()}"


@pytest.mark.parametrize("T,E,k", [(37, 6, 2), (1, 3, 1), (50, 17, 3)])
@pytest.mark.parametrize("cf", [0.0, 1.0, -0.5])
def test_routing_kernels_match_route(T, E, k, cf):
    gen = torch.Generator().manual_seed(T * E + k)
    logits = torch.randn(T, E, generator=gen).to(DEVICE).half()
    cap = capacity_limit(cf, T, k, E) if cf else None
    idx, flat_e, pos, keep, counts, kept, rows, source = choose_and_position(logits, k, cap, cf > 0, rows=True)
    # the chosen ids hold the k largest logits, largest first (ties may pick either id)
    _mismatch(logits.gather(1, idx), logits.topk(k, dim=1).values, "top-k values")
    want = route(logits, k, cf, forced=idx)
    for name in ("flat_e", "pos", "keep", "counts", "kept"):
        _mismatch(locals()[name], getattr(want, name), name)
    seg = torch.full_like(kept, cap) if cf > 0 else kept
    _mismatch(rows, comm.send_rows(want, comm.chunk_parts(seg, 1), None), "send rows")
    sent = int(seg.sum())
    tokens = torch.arange(k * T, device=DEVICE) % T
    assert (source[rows[keep]] == tokens[keep]).all(), "source is not the inverse of rows"
    if cf > 0:  # rows that no assignment fills read the zero row (token T)
        unused = torch.ones(sent, dtype=torch.bool, device=DEVICE)
        unused[rows[keep]] = False
        assert (source[unused] == T).all()


def test_forced_choices_pass_through():
    T, E, k = 29, 5, 2
    forced = torch.stack([torch.arange(T) % E, (torch.arange(T) + 2) % E], 1).to(DEVICE)
    logits = torch.randn(T, E, device=DEVICE)
    idx, flat_e, pos, *_ = choose_and_position(logits, k, None, False, forced=forced)
    want = route(logits, k, 0.0, forced=forced)
    _mismatch(idx, forced, "idx")
    _mismatch(pos, want.pos, "pos")


@pytest.mark.parametrize("W,L,D", [(1, 3, 1), (2, 2, 3), (3, 5, 2), (4, 1, 4)])
def test_plan_kernel_matches_tensor_ops(W, L, D):
    gen = torch.Generator().manual_seed(W * 10 + L + D)
    seg = torch.randint(0, 9, (W * L,), generator=gen).to(DEVICE)
    got = torch.randint(0, 9, (W * L,), generator=gen).to(DEVICE)
    splits, offsets, offsets_all = plan_offsets(seg, got, W, D)
    sent, recv = comm.chunk_parts(seg, D), comm.chunk_parts(got, D)
    want_splits = torch.stack([sent, recv]).view(2, W, L, D).sum(2).transpose(1, 2).reshape(-1)
    want_off, want_all = comm.segment_offsets(recv)
    _mismatch(splits, want_splits, "splits")
    _mismatch(offsets.flatten(), want_off.flatten(), "offsets")
    _mismatch(offsets_all, want_all, "offsets_all")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_combine_kernels_match_plain_torch(dtype):
    from kernels.moe_combine import combine_backward, combine_rows

    T, k, d, S = 23, 2, 37, 50
    gen = torch.Generator().manual_seed(9)
    src = torch.randn(S, d, generator=gen).to(DEVICE, dtype)
    rows = torch.randperm(S, generator=gen)[: k * T].to(DEVICE)
    rows[::7] = -1  # dropped assignments
    weights = torch.softmax(torch.randn(T, k, generator=gen), 1).to(DEVICE)
    dout = torch.randn(T, d, generator=gen).to(DEVICE, dtype)
    leaf, w = src.double().requires_grad_(), weights.double().requires_grad_()
    taken = torch.where((rows >= 0).unsqueeze(1), leaf[rows.clamp(min=0)], 0).view(k, T, d)
    want = (taken * w.t().unsqueeze(-1)).sum(0)
    want.backward(dout.double())
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]  # one rounding to dtype
    scale = want.abs().max()
    assert ((combine_rows(src, rows, weights, T).double() - want).abs().max() / scale) < tol
    plain = (taken.sum(0) - combine_rows(src, rows, None, T).double()).abs().max() / scale
    assert plain < tol, f"unweighted sum off by {plain:.2e}"
    d_src, d_w = combine_backward(src, rows, weights, dout, zero_unused=True)
    assert ((d_src.double() - leaf.grad).abs().max() / leaf.grad.abs().max()) < tol
    assert ((d_w.double() - w.grad).abs().max() / w.grad.abs().max()) < tol * 10  # dot of d terms in dtype
    unused = torch.ones(S, dtype=torch.bool, device=DEVICE)
    unused[rows[rows >= 0]] = False
    assert (d_src[unused] == 0).all(), "rows nobody reads must get zero gradient"
