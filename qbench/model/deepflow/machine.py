"""DeepFlow's device: derived from technology and power parameters, and its roofline.

A device is what the LSTM model needs: peak rate th (flop/s, derated x0.7), DRAM bandwidth mem_bw
(B/s, derated x0.7), memory size, L2 and shared-memory bandwidth and size, network bandwidth, line
latency, launch overhead O (s) and element size prec (bytes). Every formula keeps DeepFlow's
evaluation order: the model's printed digits depend on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TH_SCALE = 0.7  # derate of the peak rate
MEM_SCALE = 0.7  # derate of DRAM bandwidth
MEM_LATENCY = 50e-9  # s, added to every memory-bound roofline time and embedding time


@dataclass(frozen=True)
class Machine:
    th: float  # flop/s (derated)
    mem_bw: float  # B/s (derated)
    mem_size: float  # B
    L2_bw: float  # B/s
    L2_size: float  # B
    sm_bw: float  # B/s (only sets the shared-memory size)
    sm_size: float  # B
    IB: float  # B/s, kernel-, layer- and data-parallel links alike
    ll: float  # s per ring step
    O: float  # s per kernel launch
    prec: int  # bytes per element
    construction_lines: tuple[str, ...] = field(default=())

    @property
    def X1(self) -> int:
        """L2 tile edge (elements)."""
        return tile(self.L2_size, self.prec)

    @property
    def X2(self) -> int:
        """Shared-memory tile edge (elements)."""
        return tile(self.sm_size, self.prec)


def tile(size: float, prec: int) -> int:
    """Largest power of two t with three t x t tiles of `prec`-byte elements fitting in `size` bytes."""
    if size <= 0:
        return 0
    return math.ceil(2 ** math.floor(math.log(math.sqrt((size / prec) / 3)) / math.log(2)))


def derive(cfg: dict) -> Machine:
    """DeepFlow's machine from tech_param, power_breakdown, arch_param and the topology."""
    tech, power, arch = cfg["tech_param"], cfg["power_breakdown"], cfg["arch_param"]
    tdp = power["TDP"]
    e_dram = tech["DRAM_energy_per_bit_trans"] * 8
    e_l2 = tech["L2_energy_per_bit"] * 8
    e_sm = tech["shared_mem_energy_per_bit"] * 8
    e_ib = tech["internode_energy_per_bit"] * 8
    mem_bw = ((power["DRAM"] * tdp) / e_dram) * MEM_SCALE
    mem_size = ((mem_bw / MEM_SCALE) / tech["HBM_stack_bw"]) * tech["HBM_stack_capacity"]
    th = ((power["core"] * tdp) / tech["core_energy_per_flop"]) * TH_SCALE
    l2_bw = (power["L2"] * tdp) / e_l2
    l2_size = (l2_bw / tech["L2_bank_bw"]) * tech["L2_bank_capacity"]
    sm_bw = (power["shared_mem"] * tdp) / e_sm
    sm_size = (sm_bw / tech["shared_mem_bank_bw"]) * tech["shared_mem_bank_capacity"]
    ib, lines = _network(cfg, power["IB"] * tdp, e_ib)
    return Machine(th, mem_bw, mem_size, l2_bw, l2_size, sm_bw, sm_size, ib, tech["line_latency"],
                   arch["kernel_launch_overhead"], arch["precision"], tuple(lines))


def _network(cfg: dict, pw_ib: float, e_ib: float) -> tuple[float, list[str]]:
    """Only a mesh has links: their count follows the number of parallel grid dimensions."""
    sched = cfg["scheduling_param"]
    if sched["topology"] != "mesh":
        return 0, []
    kp_dims = [sched[f"kp_{n}_dim{i}"] for n in ("hidden", "softmax", "embedding", "projection") for i in (1, 2)]
    grid_dim = int(sched["dp"] > 1) + int(sched["lp"] > 1) + int(any(d > 1 for d in kp_dims))
    dp, h1, lp = sched["dp"], sched["kp_hidden_dim1"], sched["lp"]
    num_links = dp * h1 if grid_dim == 1 else 2 * dp * h1 if grid_dim == 2 else 3 * dp * h1 * lp
    ib = 0 if grid_dim == 0 else pw_ib / (num_links * e_ib)
    return ib, [f"grid_dim: {grid_dim}"]


def roofline(m: Machine, trace, flop: float, mem: float, mem2: float = 0) -> float:
    """DeepFlow's roofline time (s, no launch overhead): memory-bound below the ridge th/mem_bw."""
    ip = m.th / m.mem_bw
    ci = flop / mem
    trace.debug(f"inflection_point: {ip:.2f}")
    trace.debug(f"comp_int: {ci:.2f}")
    if ci < ip:
        return (mem / m.mem_bw + MEM_LATENCY) + (mem2 / m.L2_bw if m.L2_bw != 0 else 0)
    return flop / m.th


class Trace:
    """One evaluation's context: the lines DeepFlow prints while it evaluates (debug-only ones and
    always-printed ones) and the quirks it fixes (qbench.model.deepflow.quirks; none: DeepFlow exact)."""

    def __init__(self, debug: bool = False, fixes: frozenset[str] = frozenset()):
        self.on = debug
        self.fixes = frozenset(fixes)
        self.lines: list[str] = []

    def fixed(self, quirk: str) -> bool:
        return quirk in self.fixes

    def debug(self, text: str) -> None:
        if self.on:
            self.lines.append(text)

    def always(self, text: str) -> None:
        self.lines.append(text)


def hardware_block(m: Machine) -> list[str]:
    """The printed hardware configuration (derates undone, binary units behind decimal labels)."""
    return [
        "======================", "Hardware Configuration", "======================",
        f"Throughput: {(m.th / 1e12) / TH_SCALE:.1f} Tflops",
        f"Memory Bandwidth: {(m.mem_bw / 2**30) / MEM_SCALE:.1f} GB/s",
        f"Memory Size: {m.mem_size / 2**30:.1f} GB",
        f"L2 Bandwidth: {m.L2_bw / 2**40:.1f} TB/s",
        f"L2 Size: {m.L2_size / 2**20:.1f} MB",
        f"Shared Memory Size: {m.sm_size / 2**20:.1f} MB",
        f"Interconnection Bandwidth: {m.IB / 2**30:.1f} GB/s",
    ]
