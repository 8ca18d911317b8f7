"""kernels/moe_permute.py against its torch reference (the interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.moe_permute import from_expert_major, to_expert_major, to_expert_major_reference


def _segments(W: int, L: int, gen, empty_every: int = 4) -> torch.Tensor:
    """Offsets [W * L + 1] of uneven source-major segments, every `empty_every`-th one empty."""
    counts = torch.randint(0, 9, (W * L,), generator=gen)
    counts[::empty_every] = 0
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])


def _first_mismatch(got, want) -> str:
    bad = (got != want).any(1).nonzero().flatten()[:3].tolist()
    return f"rows {bad}: got {got[bad[:1]].tolist()} want {want[bad[:1]].tolist()}" if bad else ""


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("W, L, K", [(3, 5, 37), (1, 1, 20), (4, 2, 1)])
def test_permutation_matches_reference_and_inverts(dtype, W, L, K):
    gen = torch.Generator().manual_seed(W * 100 + L * 10 + K)
    offsets = _segments(W, L, gen)
    x = torch.randn(int(offsets[-1]), K, generator=gen).to(dtype)
    want, want_off = to_expert_major_reference(x, offsets, L)
    got, eoff = to_expert_major(x, offsets, L)
    assert torch.equal(eoff, want_off), f"expert offsets {eoff.tolist()} != {want_off.tolist()}"
    assert torch.equal(got, want), _first_mismatch(got, want)
    back = from_expert_major(got, offsets, L)
    assert torch.equal(back, x), _first_mismatch(back, x)


def test_inverse_writes_into_a_strided_view_and_empty_input():
    gen = torch.Generator().manual_seed(7)
    offsets = _segments(2, 3, gen, empty_every=5)
    x = torch.randn(int(offsets[-1]), 19, generator=gen)
    wide = torch.full((x.shape[0], 25), -1.0)
    xe, _ = to_expert_major(x, offsets, 3)
    from_expert_major(xe, offsets, 3, out=wide[:, 2:21])
    assert torch.equal(wide[:, 2:21], x), _first_mismatch(wide[:, 2:21], x)
    assert bool((wide[:, :2] == -1).all() and (wide[:, 21:] == -1).all()), "wrote outside the view"
    none = torch.zeros(7, dtype=torch.int64)
    xe, eoff = to_expert_major(torch.empty(0, 4), none, 2)
    assert xe.shape == (0, 4) and eoff.tolist() == [0, 0, 0]
