"""The replication plan kernels (kernels/moe_hot.py) against the tensor ops they replace
(qbench/layers/moe/plan.py: hottest, hot_rows, send_rows and the count exchange), under the interpreter on CPU."""

import dataclasses

import pytest
import torch

from kernels.moe_hot import hot_plan
from qbench.layers.moe import plan as comm
from qbench.layers.moe.routing import route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _mismatch(got, want, what):
    got, want = torch.as_tensor(got).cpu(), torch.as_tensor(want).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    bad = (got != want).nonzero().flatten()
    assert not bad.numel(), f"{what}: {bad.numel()} differ, first at {bad[:5].tolist()}: " \
                            f"{got.flatten()[bad[:5]].tolist()} vs {want.flatten()[bad[:5]].tolist()}"


def _case(W, L, T, k, cf, rank, seed):
    """This rank's routing (gate on skewed logits) and counts_all whose row `rank` is its kept counts."""
    gen = torch.Generator().manual_seed(seed)
    E = W * L
    logits = torch.randn(T, E, generator=gen) + torch.linspace(0, 2, E)  # later experts hotter
    routing = route(logits.to(DEVICE), k, cf)
    others = torch.randint(0, 3 * T * k // E + 2, (W, E), generator=gen).to(DEVICE)
    if cf > 0:
        others = others.clamp(max=routing.capacity)
    others[rank] = routing.kept
    others[(rank + 1) % W, 0] = others[rank, 0]  # a tie in the global load somewhere is likely anyway
    return routing, others


@pytest.mark.parametrize("W,L,T,k,cf,n,rank", [
    (2, 3, 37, 2, 0.0, 2, 1), (4, 2, 29, 2, 1.0, 3, 0), (3, 5, 50, 3, -0.5, 4, 2), (1, 4, 11, 1, 0.0, 1, 0),
    (4, 16, 40, 2, 0.0, 6, 3), (2, 2, 1, 1, 0.0, 4, 0),
])
@pytest.mark.parametrize("unpadded", [False, True], ids=["as-routed", "unpadded"])
def test_hot_plan_matches_tensor_ops(W, L, T, k, cf, n, rank, unpadded):
    """unpadded: the blocks layer's source layout (capacity drops, no padding)."""
    routing, counts_all = _case(W, L, T, k, cf, rank, seed=W * 100 + L * 10 + T)
    if unpadded:
        routing = dataclasses.replace(routing, padded=False)
    hp = hot_plan(counts_all, routing, rank, L, n, T, routing.padded)
    want_hot = comm.hottest(counts_all.sum(0).tolist(), n)
    _mismatch(hp.hot_ids, want_hot, "hot ids")
    hot_ids = torch.tensor(want_hot, dtype=torch.int64, device=DEVICE)
    hot_mask = torch.zeros(W * L, dtype=torch.bool, device=DEVICE).index_fill_(0, hot_ids, True)
    want_hot_rows, want_off = comm.hot_rows(routing, hot_ids)
    _mismatch(hp.hot_rows, want_hot_rows, "hot rows")
    _mismatch(hp.hot_offsets, want_off, "hot offsets")
    per_rank = torch.full_like(counts_all, routing.capacity) if routing.padded else counts_all
    per_rank = per_rank.masked_fill(hot_mask, 0)  # what every rank sends per expert
    _mismatch(hp.seg, per_rank[rank], "seg")
    _mismatch(hp.got, per_rank[:, rank * L:(rank + 1) * L].reshape(-1), "got (the count exchange)")
    _mismatch(hp.masked, counts_all.masked_fill(hot_mask, 0), "masked counts")
    want_rows = comm.send_rows(routing, comm.chunk_parts(hp.seg, 1), hot_mask)
    _mismatch(hp.rows, want_rows, "send rows")
    tokens = torch.arange(k * T, device=DEVICE) % T
    sent, local = want_rows >= 0, want_hot_rows >= 0
    _mismatch(hp.source[want_rows[sent]], tokens[sent], "source (inverse of rows)")
    _mismatch(hp.hot_source[want_hot_rows[local]], tokens[local], "hot source (inverse of hot rows)")
    if routing.padded:  # send rows no assignment fills read the zero row (token T)
        unused = torch.ones(int(hp.seg.sum()), dtype=torch.bool, device=DEVICE)
        unused[want_rows[sent]] = False
        assert (hp.source[: unused.numel()][unused] == T).all()
