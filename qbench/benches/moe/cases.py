"""The case grid of `qbench moe` and each case's recorded parameters.

A case is one configuration of the sweep: local experts x overlap degree x replication x routing x
GEMM backend x locality x variant. Variant "blocks" runs one chunk, so its cases take overlap degree 1
only; its transport ("symm" or the "a2a" fallback) is a recorded parameter, known once the layer is built.
One case measured in one exec and backward thread is one measurement; it gives several records (timing
per_step and loop, and per rank for blocks: qbench/migration/moe.py MEASURED_APART).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any

from qbench.benches.moe.config import MoEBenchConfig, threads_of
from qbench.migration.moe import MEASURED_APART
from qbench.store import case_id


@dataclass(frozen=True, kw_only=True)
class Case:
    """The swept fields of one configuration (the config holds the fields every case shares)."""
    num_local_experts: int
    a2a_ffn_overlap_degree: int
    replicate_hot: int
    routing: str
    gemm: str  # a GEMMS backend; "auto" until resolve_gemm picks one for the device
    locality: float | None  # None: the routing kind alone decides
    variant: str  # a2a | blocks | tutel (config.VARIANTS)

    def params(self) -> dict[str, Any]:
        return asdict(self)


def cases(config: MoEBenchConfig) -> list[Case]:
    """The case grid; variant innermost so that a2a and blocks of one configuration sit together."""
    grid = itertools.product(config.num_local_experts, config.a2a_ffn_overlap_degrees, config.replicate_hot,
                             config.routings, config.gemms, config.localities, config.variants)
    out: list[Case] = []
    for L, D, N, r, g, p, variant in grid:
        case = Case(num_local_experts=L, a2a_ffn_overlap_degree=1 if variant == "blocks" else D, replicate_hot=N,
                    routing=r, gemm=g, locality=p, variant=variant)
        if case not in out:  # blocks ignores the overlap degree: one case, not one per degree
            out.append(case)
    return out


def case_label(case: Case) -> str:
    """File-name label of one configuration, e.g. a2a-L8-D1-hot0-randn-triton (-loc0.5)."""
    routing = "".join(c if c.isalnum() or c in ".-" else "_" for c in str(case.routing).split("/")[-1])
    label = (f"{case.variant}-L{case.num_local_experts}-D{case.a2a_ffn_overlap_degree}"
             f"-hot{case.replicate_hot}-{routing}-{case.gemm}")
    return label + (f"-loc{case.locality:g}" if case.locality is not None else "")


def params_of(config: MoEBenchConfig, case: Case, world_size: int) -> dict[str, Any]:
    """The record params of one case (without exec, backward thread and timing)."""
    return {"world_size": world_size, "dtype": config.dtype, "model_dim": config.model_dim,
            "hidden_size": config.hidden_size, "samples": config.samples, "batch_size": config.batch_size,
            "top_k": config.top_k, "capacity_factor": config.capacity_factor, "model": config.model,
            "activation": config.activation, "fp32_gate": config.fp32_gate, "eval": config.eval,
            "backend": config.backend, **case.params(),
            "block_size": config.block_size if case.variant == "blocks" else None, "transport": "a2a"}


def resolve_gemm(case: Case, device: str) -> Case:
    """'auto' runs the Triton grouped GEMM (the torch reference on a CPU without the interpreter)."""
    return case if case.gemm != "auto" or device != "cuda" else replace(case, gemm="triton")


def mode_params(config: MoEBenchConfig, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The params of every measurement of one configuration: one per execution mode and backward thread."""
    return [dict(params, exec=mode, backward_thread=thread) for mode in config.execs
            for thread in threads_of(config, mode)]


def resume_id(params: dict[str, Any]) -> str:
    """The id of the measurement a record came from: its case id without the params that split one
    measurement into records (timing, rank) and its `transport`, known only once the layer is built."""
    return case_id({k: v for k, v in params.items() if k not in (*MEASURED_APART, "transport")})


def pending_cases(config: MoEBenchConfig, world_size: int, device: str, done: frozenset[str]) -> list[Case]:
    """The cases of the sweep that lack a record in `done` in some execution mode or backward thread."""
    def lacking(case: Case) -> bool:
        params = params_of(config, resolve_gemm(case, device), world_size)
        return any(resume_id(p) not in done for p in mode_params(config, params))

    return [case for case in cases(config) if lacking(case)]
