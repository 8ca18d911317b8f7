"""DeepFlow's GEMM model: a two-level tiling (L2, shared memory) that sets how often each operand is
reloaded, and the choice between a GEMM and its transpose.

A GEMM (A, B, C) has output A x C and inner dimension B (left operand A x B, right operand B x C).
With a square tile of edge X elements at a level, the left operand is re-read once per column tile
(ceil(C / X)) unless the inner dimension fits in one tile, and the right operand once per row tile
(ceil(A / X)). Shapes may be fractional after a kernel-parallel split (then flop and bytes are doubles).
"""

from __future__ import annotations

import math

from qbench.model.deepflow.machine import Machine, roofline


def reloads(A: float, B: float, C: float, X: int) -> tuple[int, int, int]:
    """(r_AB, r_BC, r_AC): how many times each operand / the output crosses this level."""
    if X == 0:
        return 1, 1, 1
    if B <= X:
        return 1, math.ceil(A / X), 1
    return math.ceil(C / X), math.ceil(A / X), 1


def _traffic(A, B, C, r: tuple[int, int, int], prec: int) -> float:
    r_ab, r_bc, r_ac = r
    return (A * B * r_ab + B * C * r_bc + A * C * r_ac) * prec


def _print_reloads(trace, level: str, r: tuple[int, int, int]) -> None:
    trace.debug(f"{level}: reload_AB: {{}}, reload_AC: {{}}, reload_BC: {{}}")
    trace.debug(f" {r[0]} {r[2]} {r[1]}")  # DeepFlow prints AB, AC, BC


def gemm(m: Machine, trace, A, B, C) -> tuple[float, float, float]:
    """(flop, DRAM bytes, L2 bytes) of one GEMM, with the per-output epilogue work DeepFlow adds."""
    flop = 2 * A * B * C
    r1 = reloads(A, B, C, m.X1)
    gmem = _traffic(A, B, C, r1, m.prec)
    _print_reloads(trace, "gmem", r1)
    X2 = m.X2
    r2 = reloads(A, B, C, X2)
    l2mem = _traffic(A, B, C, r2, m.prec)
    flop = flop + A * C * (15 + 5 * math.ceil(B / X2))
    _print_reloads(trace, "l2mem", r2)
    return flop, gmem, l2mem


def gemm_time(m: Machine, trace, A, B, C, name: str) -> float:
    """Time (s) of the faster of the GEMM and its transpose, launch overhead included."""
    f, g, l2 = gemm(m, trace, A, B, C)
    ft, gt, l2t = gemm(m, trace, C, B, A)
    t = roofline(m, trace, f, g, l2) + m.O
    tt = roofline(m, trace, ft, gt, l2t) + m.O
    if t > tt:
        trace.debug(f"{name} GEMM_flop_t: {int(ft):,}, GEMM_gmem_t: {int(gt):,}")
        trace.debug(f"{name} GEMM_time_t: {t:,}")  # DeepFlow prints the untransposed time here
        trace.debug("")
        return tt
    trace.debug(f"{name} GEMM_flop: {int(f):,}, GEMM_gmem: {int(g):,}, GEMM_l2mem: {int(l2):,}")
    trace.debug(f"{name} GEMM_time: {t:,}")
    trace.debug("")
    return t
