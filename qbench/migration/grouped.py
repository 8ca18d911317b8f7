"""`qbench grouped`'s measured values and their tidy records: the bench measures one shape's kernels into
one dict keyed `<variant>_<metric>` (`tma_ms`, `pointer_rel_err`, `speedup_tma`, the names schema-1 records
stored); tidy() makes one record per variant (exec eager, timing per_kernel) with the metrics of
qbench/metrics/grouped.py. The bench records through it and schema-1 runs load through it.
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.metrics.grouped import VARIANTS

# measured name -> (variant, tidy metric)
WIDE = {
    **{f"{v}_ms": (v, "kernel_ms") for v in VARIANTS},
    **{f"{v}_tflops": (v, "tflops") for v in VARIANTS},
    **{f"{v}_first_call_ms": (v, "first_call_ms") for v in ("tma", "pointer")},
    **{f"{v}_max_abs_err": (v, "max_abs_err") for v in ("tma", "pointer")},
    **{f"{v}_rel_err": (v, "rel_err") for v in ("tma", "pointer")},
    "tma_vs_pointer_rel_err": ("tma", "cross_rel_err"),
    "speedup_tma": ("tma", "speedup"),
}

Part = tuple[dict, dict, dict]  # (params, metrics, samples) of one tidy record


def tidy(params: Mapping, metrics: Mapping, samples: Mapping | None = None) -> list[Part]:
    """One (params, metrics, samples) per variant that has values, in VARIANTS order. A name the table
    does not know is a KeyError naming it (a new measured value is declared here and in the metrics)."""
    groups: dict[str, tuple[dict, dict]] = {v: ({}, {}) for v in VARIANTS}
    for source, keep in ((metrics, False), (samples or {}, True)):
        for name, value in source.items():
            if name not in WIDE:
                raise KeyError(f"grouped_gemm: no tidy place for {name!r} (qbench/migration/grouped.py)")
            variant, tidy_name = WIDE[name]
            groups[variant][1 if keep else 0][tidy_name] = list(value) if keep else value
    return [({**params, "variant": v, "exec": "eager", "timing": "per_kernel"}, values, kept)
            for v, (values, kept) in groups.items() if values or kept]


OLD_BENCH = "grouped_gemm"


def migrate(record: dict) -> list[dict]:
    """A schema-1 grouped_gemm record as its tidy records (an error without metrics stays one record)."""
    from qbench.migration import split

    return split(record, tidy(record["params"], record.get("metrics") or {}, record.get("samples")))
