"""The case grid of `qbench moe` and each case's recorded parameters.

A case is one configuration of the sweep: local experts x overlap degree x replication x routing x
GEMM backend x locality x system. System "blocks" runs one chunk, so its cases take overlap degree 1
only; its transport ("symm" or the "a2a" fallback) is a recorded parameter, known once the layer is built.
"""

from __future__ import annotations

import itertools
from typing import Any

from qbench.benches.moe.config import MoEBenchConfig, threads_of
from qbench.store import case_id


def cases(config: MoEBenchConfig) -> list[dict[str, Any]]:
    """The case grid; system innermost so that a2a and blocks of one configuration sit together."""
    grid = itertools.product(config.num_local_experts, config.overlap_degrees, config.replicate_hot,
                             config.routings, config.gemms, config.localities, config.systems)
    out, seen = [], set()
    for L, D, N, r, g, p, system in grid:
        case = dict(num_local_experts=L, a2a_ffn_overlap_degree=1 if system == "blocks" else D,
                    replicate_hot=N, routing=r, gemm=g, locality=p, system=system)
        key = tuple(case.values())
        if key not in seen:  # blocks ignores the overlap degree: one case, not one per degree
            seen.add(key)
            out.append(case)
    return out


def case_label(case: dict[str, Any]) -> str:
    """File-name label of one configuration, e.g. a2a-L8-D1-hot0-randn-triton (-loc0.5)."""
    routing = "".join(c if c.isalnum() or c in ".-" else "_" for c in str(case["routing"]).split("/")[-1])
    label = (f"{case.get('system', 'a2a')}-L{case['num_local_experts']}-D{case['a2a_ffn_overlap_degree']}"
             f"-hot{case['replicate_hot']}-{routing}-{case['gemm']}")
    return label + (f"-loc{case['locality']:g}" if case.get("locality") is not None else "")


def params_of(config: MoEBenchConfig, case: dict[str, Any], world_size: int) -> dict[str, Any]:
    return {"world_size": world_size, "dtype": config.dtype, "model_dim": config.model_dim,
            "hidden_size": config.hidden_size, "samples": config.samples, "batch_size": config.batch_size,
            "num_local_experts": case["num_local_experts"], "top_k": config.top_k,
            "a2a_ffn_overlap_degree": case["a2a_ffn_overlap_degree"], "routing": case["routing"],
            "capacity_factor": config.capacity_factor, "model": config.model,
            "replicate_hot": case["replicate_hot"], "gemm": case["gemm"], "activation": config.activation,
            "fp32_gate": config.fp32_gate, "eval": config.eval, "backend": config.backend,
            "system": case.get("system", "a2a"), "locality": case.get("locality"),
            "block_size": config.block_size if case.get("system") == "blocks" else None,
            "transport": case.get("transport", "a2a")}


def resolve_gemm(gemm: str, device: str) -> str:
    """'auto' runs the Triton grouped GEMM (the torch reference on a CPU without the interpreter)."""
    return gemm if gemm != "auto" else ("triton" if device == "cuda" else "auto")


def mode_params(config: MoEBenchConfig, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The params of every record of one configuration: one per execution mode and backward thread."""
    return [dict(params, exec=mode, backward_thread=thread) for mode in config.execs
            for thread in threads_of(config, mode)]


def resume_id(params: dict[str, Any]) -> str:
    """A record's case id without its `transport`, which is known only once the layer is built."""
    return case_id({k: v for k, v in params.items() if k != "transport"})


def pending_cases(config: MoEBenchConfig, world_size: int, device: str, done: frozenset[str]) -> list[dict]:
    """The cases of the sweep that lack a record in `done` in some execution mode or backward thread."""
    def lacking(case: dict[str, Any]) -> bool:
        params = params_of(config, dict(case, gemm=resolve_gemm(case["gemm"], device)), world_size)
        return any(resume_id(p) not in done for p in mode_params(config, params))

    return [case for case in cases(config) if lacking(case)]
