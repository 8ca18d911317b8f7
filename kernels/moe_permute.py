"""Rows of the MoE receive buffer between source-major and expert-major order, in one launch.

all_to_all delivers a rank's rows source-major: segment q = s * L + l holds what source s sent to
local expert l, rows offsets[q] .. offsets[q + 1] ([W * L + 1], int64, on the device). A grouped GEMM
over those W * L segments has a partial row tile at every segment end (~12% more tiles than rows at
the seed config: 32 segments of ~512 rows, 128-row tiles), which the expert-major order (segment
(l, s) at expert_offsets[l] + the rows of the sources before s) avoids: one segment per expert
(results/grouped-tma-h200: 0.284 -> 0.242 ms forward, 0.276 -> 0.220 ms input gradient, 16k rows).

  to_expert_major(x, offsets, L)            -> (xe [R, K], expert_offsets [L + 1])
  from_expert_major(xe, offsets, L, out)    -> out [R, K] source-major (out may be a view)
Grid (W * L, PARTS): program (q, p) copies row blocks p, p + PARTS, ... of segment q; every program
finds both starts from the W * L counts (a few hundred integers), so no plan is built on the host,
and program (0, 0) of the forward copy also writes expert_offsets.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import interpreting

PARTS = 2 if interpreting() else 8  # programs per segment
BLOCK_ROWS = 4 if interpreting() else 16
BLOCK_K = 16 if interpreting() else 256


@triton.jit
def _permute_kernel(src_ptr, dst_ptr, off_ptr, eoff_ptr, K, s_src, s_dst, L, N,
                    TO_EXPERT: tl.constexpr, PARTS: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr,
                    BK: tl.constexpr):
    q = tl.program_id(0)  # segment (s, l) = (q // L, q % L) in the source-major buffer
    p = tl.program_id(1)
    qs = tl.arange(0, BQ)
    q_ok = qs < N
    counts = tl.load(off_ptr + qs + 1, mask=q_ok, other=0) - tl.load(off_ptr + qs, mask=q_ok, other=0)
    l = q % L
    # expert-major start: rows of experts before l (all sources), then of expert l from sources before s
    before = (qs % L < l) | ((qs % L == l) & (qs < q))
    e_start = tl.sum(tl.where(q_ok & before, counts, 0), 0)
    s_start = tl.load(off_ptr + q)
    n = tl.load(off_ptr + q + 1) - s_start
    if TO_EXPERT:
        if (q == 0) & (p == 0):  # expert_offsets [L + 1]: exclusive sums of the per-expert totals
            ls = tl.arange(0, BQ)
            totals = tl.sum(tl.where(q_ok[None, :] & (qs[None, :] % L < ls[:, None]), counts[None, :], 0), 1)
            tl.store(eoff_ptr + ls, totals, mask=ls <= L)
        src_row, dst_row = s_start, e_start
    else:
        src_row, dst_row = e_start, s_start
    rs = tl.arange(0, BR)
    ks = tl.arange(0, BK)
    for r0 in range(p * BR, n, PARTS * BR):
        r_ok = (r0 + rs) < n
        src = src_ptr + (src_row + r0 + rs).to(tl.int64)[:, None] * s_src
        dst = dst_ptr + (dst_row + r0 + rs).to(tl.int64)[:, None] * s_dst
        for k0 in range(0, K, BK):
            ok = r_ok[:, None] & ((k0 + ks) < K)[None, :]
            tl.store(dst + (k0 + ks)[None, :], tl.load(src + (k0 + ks)[None, :], mask=ok), mask=ok)


def _launch(src, dst, offsets, eoff, L: int, to_expert: bool) -> None:
    N = offsets.numel() - 1
    if N == 0 or src.shape[0] == 0:
        return
    _permute_kernel[(N, PARTS)](src, dst, offsets, eoff, src.shape[1], src.stride(0), dst.stride(0), L, N,
                                TO_EXPERT=to_expert, PARTS=PARTS, BQ=triton.next_power_of_2(max(N, L + 1)),
                                BR=BLOCK_ROWS, BK=BLOCK_K)


def to_expert_major(x, offsets, L: int, out=None):
    """x [R, K] source-major (segment q = s * L + l at offsets[q]) -> (xe [R, K] expert-major,
    expert_offsets int64 [L + 1])."""
    import torch

    xe = torch.empty_like(x) if out is None else out
    eoff = torch.empty(L + 1, dtype=torch.int64, device=x.device)
    if x.shape[0] == 0 or offsets.numel() == 1:
        eoff.zero_()
    _launch(x, xe, offsets, eoff, L, True)
    return xe, eoff


def from_expert_major(xe, offsets, L: int, out=None):
    """The inverse of to_expert_major: xe [R, K] expert-major -> out [R, K] source-major."""
    import torch

    out = torch.empty_like(xe) if out is None else out
    _launch(xe, out, offsets, offsets, L, False)
    return out


def to_expert_major_reference(x, offsets, L: int):
    """Plain torch: the segments (s, l) reordered l-major, and the per-expert offsets."""
    import torch

    bounds = [int(v) for v in offsets.tolist()]
    W = (len(bounds) - 1) // L
    order = [s * L + l for l in range(L) for s in range(W)]
    pieces = [x[bounds[q]:bounds[q + 1]] for q in order]
    eoff = [0]
    for l in range(L):
        eoff.append(eoff[-1] + sum(bounds[s * L + l + 1] - bounds[s * L + l] for s in range(W)))
    return (torch.cat(pieces) if pieces else x[:0]), torch.tensor(eoff, dtype=torch.int64)
