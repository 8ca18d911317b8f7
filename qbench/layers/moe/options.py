"""Options of the MoE layer (shared by the all-to-all and the blocks layer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEOptions:
    model_dim: int  # d
    hidden_size: int  # h of the expert FFN
    num_local_experts: int  # L experts per rank (E = L x W in all)
    top_k: int = 2
    activation: str = "gelu"  # "gelu" | "relu"
    capacity_factor: float = 0.0  # > 0: padded capacity; 0: dropless; < 0: capped, unpadded (routing.py)
    fp32_gate: bool = False  # gate weights and logits in fp32
    a2a_ffn_overlap_degree: int = 1  # D chunks pipelined through dispatch / experts / combine
    replicate_hot: int = 0  # N hot experts computed locally on every rank
    gemm: str = "auto"  # grouped GEMM backend: auto | triton | torch | reference
