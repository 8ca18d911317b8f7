"""DeepFlow's communication and kernel-parallel GEMM blocks.

collective(): a ring all-reduce (or all-gather) of a D0 x D1 matrix over p devices with link
bandwidth ib: (p - 1) steps each moving prec*D0*D1/p bytes and paying the line latency, plus the
local reduction of the received chunks. kp1 is a column-row split of the inner dimension over d1
devices (partial sums reduced); kp2 a row-column split over d1 x d2 devices (outputs gathered).
DeepFlow's quirks are kept unless the trace fixes them (qbench.model.deepflow.quirks): exact mode must
print DeepFlow's digits.
"""

from __future__ import annotations

from qbench.model.deepflow.gemm import gemm_time
from qbench.model.deepflow.machine import Machine, roofline
from qbench.model.deepflow.quirks import KP1_GATHER_TWICE, SMALL_COLLECTIVE


def collective(m: Machine, trace, D0, D1, p, ib, partial: bool, all_reduce: bool):
    """Time (s) of one collective; integer 0 when p == 1 (nothing to exchange)."""
    if p == 1:
        return 0
    prec = m.prec
    if prec * D0 * D1 < 128:
        phi = 1 / p if partial else 1
        transfer = prec * D0 * D1 * phi  # DeepFlow returns these bytes as the time (a unit quirk)
        if trace.fixed(SMALL_COLLECTIVE):  # bytes over the link (B/s) plus one line latency (s)
            transfer = transfer / ib + m.ll
        prep_f = D0 * D1 * (p - 1) * phi
        prep_m = 3 * prec * D0 * D1 * (p - 1) * phi
        prep = roofline(m, trace, prep_f, prep_m)
    else:
        phi = 1 if (partial or not all_reduce) else 2
        trace.always(f"!!!!!!!!!!!!!!!!!!!!!!****************factor: {phi}")
        transfer = (((prec * D0 * D1) / p) / ib + m.ll) * phi * (p - 1)
        prep_f = (D0 * D1) / p
        prep_m = 3 * prec * D0 * D1 / p
        prep = (roofline(m, trace, prep_f, prep_m) + m.O) * (p - 1)
        trace.always(f"R1: {((prec * D0 * D1) / p) * phi * (p - 1)}, factor: {phi}")
        trace.always("")
    trace.debug(f"(gr) allReduce_flop: {int(prep_f):,}, allReduce_mem: {int(prep_m):,}")
    return transfer + (prep if all_reduce else 0)


def f_kp1(m, trace, rows, k, n, d1, name):
    """Forward, inner dimension split over d1: local GEMM, then an all-reduce of partial outputs."""
    t = gemm_time(m, trace, rows, k / d1, n, name)
    r = collective(m, trace, rows, n, d1, m.IB, True, True)
    return t, r


def b_kp1(m, trace, rows, k, n, d1, name):
    """Backward of f_kp1: all-gather the output gradient, then weight and input gradients.
    DeepFlow adds the gather into the GEMM time and also returns it (callers count it twice)."""
    r = collective(m, trace, rows, n, d1, m.IB, False, False)
    t_wt = gemm_time(m, trace, k / d1, rows, n, name + "wt")
    t_act = gemm_time(m, trace, rows, n, k / d1, name + "act")
    if trace.fixed(KP1_GATHER_TWICE):
        return t_wt + t_act, r
    return (t_wt + t_act) + r, r


def f_kp2(m, trace, rows, k, n, d1, d2, name):
    """Forward, rows over d1 and columns over d2: local GEMM, then an all-gather of the outputs."""
    t = gemm_time(m, trace, rows / d1, k, n / d2, name)
    r = collective(m, trace, rows / d1, n, d2, m.IB, False, False)
    return t, r


def b_kp2(m, trace, rows, k, n, d1, d2, name):
    """Backward of f_kp2: six gathers / partial reductions, then weight and input gradients."""
    ib = m.IB
    r = (collective(m, trace, k, rows, d1, ib, True, False)
         + collective(m, trace, rows, n / d2, d1, ib, False, False)
         + collective(m, trace, rows, n / d2, d1, ib, False, False)
         + collective(m, trace, rows / d1, n, d2, ib, False, False)
         + collective(m, trace, k, n, d2, ib, True, False)
         + collective(m, trace, rows / d1, k, d2, ib, False, False))
    t_wt = gemm_time(m, trace, k / d1, rows, n / d2, name + "wt")
    t_act = gemm_time(m, trace, rows / d1, n, k / d2, name + "act")
    return t_wt + t_act, r
