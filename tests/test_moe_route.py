"""Routing and plan kernels (kernels/moe_route.py, kernels/moe_plan.py) against the tensor-op versions they replace
(qbench/layers/moe/routing.route, plan.send_rows / segment_offsets), under the interpreter on CPU."""

import pytest
import torch

from kernels.moe_plan import plan_offsets
from kernels.moe_route import choose_and_position
from qbench.layers.moe import plan as comm
from qbench.layers.moe.routing import capacity_limit, route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _mismatch(got, want, what):
    bad = (got != want).nonzero().flatten()
    assert not bad.numel(), f"{what}: {bad.numel()} differ, first at {bad[:5].tolist()}: " \
                            f"{got[bad[:5]].tolist()} vs {want[bad[:5]].tolist()}"


def _close(got, want, rtol, atol, what):
    err = (got.double() - want.double()).abs()
    bad = (err > rtol * want.double().abs() + atol).flatten().nonzero().flatten()
    assert not bad.numel(), f"{what}: {bad.numel()} off, first at {bad[:5].tolist()}: " \
                            f"{got.flatten()[bad[:5]].tolist()} vs {want.flatten()[bad[:5]].tolist()}"


# On the GPU tl.exp is exp2(x * log2 e): the product's rounding costs |x| * 2^-24 relative for logit
# gaps |x| of up to ~40 here, plus the roundings of the sum and the division.
W_RTOL = 1e-5


@pytest.mark.parametrize("T,E,k", [(37, 6, 2), (1, 3, 1), (130, 17, 3)])
@pytest.mark.parametrize("cf", [0.0, 1.0, -0.5])
def test_routing_kernels_match_route(T, E, k, cf):
    gen = torch.Generator().manual_seed(T * E + k)
    logits = torch.randn(T, E, generator=gen).to(DEVICE).half()
    cap = capacity_limit(cf, T, k, E) if cf else None
    idx, weights, flat_e, pos, keep, counts, kept, rows, source, offsets = choose_and_position(
        logits, k, cap, cf > 0, rows=True)
    # the chosen ids hold the k largest logits, largest first (ties may pick either id)
    _mismatch(logits.gather(1, idx), logits.topk(k, dim=1).values, "top-k values")
    want = route(logits, k, cf, forced=idx)
    assert keep.dtype == torch.bool
    for name in ("flat_e", "pos", "keep", "counts", "kept"):
        _mismatch(locals()[name], getattr(want, name), name)
    _close(weights, want.weights, W_RTOL, 0.0, "weights")
    seg = torch.full_like(kept, cap) if cf > 0 else kept
    _mismatch(rows, comm.send_rows(want, comm.chunk_parts(seg, 1), None), "send rows")
    sent = int(seg.sum())
    tokens = torch.arange(k * T, device=DEVICE) % T
    assert (source[rows[keep]] == tokens[keep]).all(), "source is not the inverse of rows"
    # the send buffer's expert offsets: expert e's rows start at offsets[e] (offsets[E]: the buffer's size)
    _mismatch(offsets, torch.cat([seg.new_zeros(1), seg.cumsum(0)]), "send offsets")
    if cf > 0:  # rows that no assignment fills read the zero row (token T), filled by _choose_kernel
        assert source.numel() == sent
        unused = torch.ones(sent, dtype=torch.bool, device=DEVICE)
        unused[rows[keep]] = False
        _mismatch(source[unused], torch.full_like(source[unused], T), "unfilled source rows")


@pytest.mark.parametrize("T,E,k,cf,D", [(37, 6, 2, 1.0, 2), (130, 17, 3, 0.7, 3), (9, 4, 2, 0.25, 4),
                                        (37, 6, 2, 0.0, 2), (130, 17, 3, 0.0, 3), (9, 5, 2, 0.0, 4),
                                        (61, 7, 2, -0.5, 2), (9, 4, 3, -0.25, 3)])
def test_chunked_send_rows_match_tensor_ops(T, E, k, cf, D):
    """In D chunks the kernels give plan.send_rows' chunk-major rows and their inverse map: padded (cf > 0:
    the capacity of (9, 4, 2, 0.25) is smaller than D, so some chunk parts hold no row; rows no assignment
    fills read the zero row T), dropless (cf 0: every expert's own count split in D parts, some counts
    below D) and capped (cf < 0: the kept counts, dropped assignments get no row)."""
    gen = torch.Generator().manual_seed(T + E + D)
    logits = torch.randn(T, E, generator=gen).to(DEVICE).half()
    cap = capacity_limit(cf, T, k, E) if cf != 0 else None
    idx, _, _, _, keep, _, kept, rows, source, offsets = choose_and_position(logits, k, cap, cf > 0, rows=True,
                                                                             chunks=D)
    assert offsets is None, "offsets of a chunk-major send buffer"
    want = route(logits, k, cf, forced=idx)
    seg = torch.full_like(kept, cap) if cf > 0 else want.kept
    _mismatch(rows, comm.send_rows(want, comm.chunk_parts(seg, D), None), "send rows")
    tokens = torch.arange(k * T, device=DEVICE) % T
    assert (source[rows[keep]] == tokens[keep]).all(), "source is not the inverse of rows"
    sent = int(seg.sum())
    if cf <= 0:  # unpadded: the kept assignments fill the send buffer, one row each
        assert sorted(rows[keep].tolist()) == list(range(sent)), "kept rows do not fill the send buffer"
    else:
        unused = torch.ones(sent, dtype=torch.bool, device=DEVICE)
        unused[rows[keep]] = False
        _mismatch(source[unused], torch.full_like(source[unused], T), "unfilled source rows")


def test_chunked_send_rows_need_rows():
    logits = torch.randn(8, 4).to(DEVICE)
    with pytest.raises(ValueError, match="rows=True"):
        choose_and_position(logits, 2, None, False, rows=False, chunks=2)


def test_forced_choices_pass_through():
    T, E, k = 29, 5, 2
    forced = torch.stack([torch.arange(T) % E, (torch.arange(T) + 2) % E], 1).to(DEVICE)
    logits = torch.randn(T, E, device=DEVICE)
    idx, weights, flat_e, pos, *_ = choose_and_position(logits, k, None, False, forced=forced)
    want = route(logits, k, 0.0, forced=forced)
    _mismatch(idx, forced, "idx")
    _mismatch(pos, want.pos, "pos")


def test_no_tokens_gives_zero_counts_and_a_filled_source():
    logits = torch.randn(0, 7, device=DEVICE)
    idx, weights, flat_e, pos, keep, counts, kept, rows, source, offsets = choose_and_position(
        logits, 2, 1, True, rows=True)
    assert offsets.tolist() == list(range(8))  # padded to the capacity 1: one row per expert
    assert idx.shape == weights.shape == (0, 2) and flat_e.numel() == keep.numel() == 0
    assert (counts == 0).all() and (kept == 0).all() and counts.numel() == 7
    assert source.numel() == 7 and (source == 0).all()  # every padded row reads token T = 0


def _forced_ids(T, E, k, gen):
    """Random ids [T, k]; row 0 repeats one id (trace files may hold such rows)."""
    ids = torch.randint(0, E, (T, k), generator=gen)
    ids[0] = ids[0, 0]
    return ids.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T,E,k", [(1, 3, 2), (37, 6, 2), (130, 11, 3)])
@pytest.mark.parametrize("forced", [False, True], ids=["gate", "forced"])
def test_weights_and_logit_gradient_match_torch_autograd(dtype, T, E, k, forced):
    gen = torch.Generator().manual_seed(1000 * T + 10 * E + k)
    logits = (torch.randn(T, E, generator=gen) * 4).to(DEVICE, dtype).requires_grad_()
    ids = _forced_ids(T, E, k, gen) if forced else None
    d_weights = torch.randn(T, k, generator=gen).to(DEVICE)
    idx, weights = choose_and_position(logits, k, None, False, forced=ids)[:2]
    assert weights.dtype == torch.float32 and weights.requires_grad
    weights.backward(d_weights)
    # the formula it replaces: softmax over the gathered logits in fp32, torch's autograd
    leaf = logits.detach().float().requires_grad_()
    want = torch.softmax(leaf.gather(1, idx), dim=1)
    want.backward(d_weights)
    _close(weights, want, W_RTOL, 0.0, "weights")
    assert logits.grad.dtype == dtype and logits.grad.shape == (T, E)
    chosen = torch.zeros(T, E, dtype=torch.bool, device=DEVICE).scatter_(1, idx, True)
    assert (logits.grad[~chosen] == 0).all(), "logits that were not chosen must get zero gradient"
    # one rounding to dtype (unit roundoff; bf16: one ulp, the interpreter's fp32 -> bf16 cast truncates
    # where the GPU rounds to nearest), after fp32 roundings of w * (g - sum w g), terms of size max |g|
    u = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}[dtype]
    _close(logits.grad, leaf.grad, u, 1e-6 * float(d_weights.abs().max()), "d_logits")


def test_weights_without_autograd_are_the_same_values():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(23, 9, generator=gen).to(DEVICE).requires_grad_()
    with_grad = choose_and_position(logits, 2, None, False)[1]
    with torch.no_grad():
        plain = choose_and_position(logits, 2, None, False)[1]
    assert not plain.requires_grad
    _mismatch(plain.flatten(), with_grad.detach().flatten(), "weights")


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


@pytest.mark.parametrize("W,L,D,cap", [(1, 3, 1, 5), (2, 2, 3, 7), (3, 5, 2, 1)])
def test_padded_plan_needs_no_counts(W, L, D, cap):
    """cap given: every (rank, expert) count is cap, whatever seg and got hold."""
    junk = torch.full((W * L,), 99, dtype=torch.int64, device=DEVICE)
    got = plan_offsets(junk, junk, W, D, cap)
    full = torch.full((W * L,), cap, dtype=torch.int64, device=DEVICE)
    for name, a, b in zip(("splits", "offsets", "offsets_all"), got, plan_offsets(full, full, W, D)):
        _mismatch(a.flatten(), b.flatten(), name)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_combine_kernels_match_plain_torch(dtype, impl):
    """The kernels and the static-shape references (the path without Triton) against autograd in fp64."""
    from kernels import moe_combine

    combine_rows, combine_backward = moe_combine.combine_rows, moe_combine.combine_backward
    if impl == "reference":
        combine_rows, combine_backward = moe_combine.combine_reference, moe_combine.combine_backward_reference

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
