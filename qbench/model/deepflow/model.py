"""One evaluation of DeepFlow's LSTM model, and DeepFlow's text report of it.

`evaluate(cfg, machine)` is a pure function of a normalized config and a machine (so a search can call
it in a loop); it returns the component times, Time, memory and parameter count, plus the lines
DeepFlow prints while it runs. `report_lines(result)` renders DeepFlow's full report, line for line.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.model.deepflow import lstm, memory
from qbench.model.deepflow.machine import Machine, Trace, hardware_block
from qbench.model.deepflow.parallel import collective

# The search harness that produced DeepFlow's summaries appended a time budget per step: one day of
# training on data_scale x 768,648,884 tokens in sequences of 20, batch 32 (its own constants).
HARNESS_DATA_SCALE = 100
HARNESS_BATCH = 32
HARNESS_TOKENS = 768_648_884


@dataclass
class Result:
    cfg: dict
    machine: Machine
    shape: lstm.Shape
    components: lstm.Components
    memory_shard: memory.Memory
    memory_model_shard: memory.Memory
    parameters: int
    lines: list[str]  # what DeepFlow prints while evaluating (debug lines only when debug=True)

    @property
    def time(self) -> float:
        return self.components.time


def evaluate(cfg: dict, machine: Machine, *, debug: bool = False) -> Result:
    """DeepFlow's step time of the configured LSTM language model on `machine` (seconds)."""
    s = lstm.shape_of(cfg)
    m, t, c = machine, Trace(debug), lstm.Components()
    t.lines.extend(machine.construction_lines)
    c.W = 0 if s.lp == 1 else ((m.prec * s.b) * s.D) / m.IB
    r = collective(m, t, 2 * s.D, s.G * s.D, s.dp, m.IB, False, True)  # data-parallel LSTM all-reduce
    c.apply_hidden = lstm.apply_grad(m, t, 2 * s.D, s.G * s.D, "Hidden")
    c.apply_projection = lstm.apply_grad(m, t, s.D, s.P, "Projection")
    c.apply_softmax = lstm.apply_grad(m, t, s.Ks, s.V, "Softmax")
    c.R = r + c.apply_hidden
    c.Cf = lstm.cell_forward(m, t, s)
    c.Cb = lstm.cell_backward(m, t, s)
    c.softmax_f = lstm.softmax_forward(m, t, s)
    c.softmax_b = lstm.softmax_backward(m, t, s)
    c.projection_f, c.projection_b = lstm.projection(m, t, s)
    c.embedding_f, c.embedding_b = lstm.embedding(m, t, s)
    _summaries(t, cfg, c)
    lstm.compose(c, s)
    shard = memory.per_data_shard(s, m.prec, m.mem_size)
    model_shard = memory.per_model_shard(s, m.prec, m.mem_size)
    return Result(cfg, m, s, c, shard, model_shard, memory.parameter_count(s), t.lines)


def _summaries(t: Trace, cfg: dict, c: lstm.Components) -> None:
    sp = cfg["scheduling_param"]
    t.debug(f"dp: {sp['dp']}, lp: {sp['lp']}, hlp: {sp['hlp']}, kp_hidden_dim1: {sp['kp_hidden_dim1']}, "
            f"kp_hidden_dim2: {sp['kp_hidden_dim2']}, kp_softmax_dim1: {sp['kp_softmax_dim1']}, "
            f"kp_softmax_dim2: {sp['kp_softmax_dim2']}, kp_embedding_dim1: {sp['kp_embedding_dim1']}, "
            f"kp_embedding_dim2: {sp['kp_embedding_dim2']},  kp_hidden_type: {sp['kp_hidden_type']}, "
            f"kp_softmax_type: {sp['kp_softmax_type']}, kp_embedding_type: {sp['kp_embedding_type']}")
    t.debug("")
    t.debug(f"Cf: {c.Cf}, Cb:; {c.Cb}, R: {c.R}, softmax_f: {c.softmax_f}, softmax_b:{c.softmax_b}, "
            f"embedding_f: {c.embedding_f}, embedding_b: {c.embedding_b}, projection_f: {c.projection_f}, "
            f"projection_b: {c.projection_b}")
    t.debug("")


def harness_time_per_step(data_scale: int = HARNESS_DATA_SCALE, batch: int = HARNESS_BATCH) -> float:
    """Seconds per step allowed by the harness's one-day budget (integer number of steps)."""
    steps = (data_scale * HARNESS_TOKENS) // (batch * 20)
    return 86400 / steps


def _gb(x: float) -> str:
    return f"{x / 2**30:.1f} GB"


def _memory_lines(r: Result) -> list[str]:
    a, b = r.memory_shard, r.memory_model_shard
    overflow = "Memory Overflow Rate (Total Memory Required per Data Shard / Memory capacity per node)"
    cats = [f"Total Memory: {_gb(a.total)}", f"Weight Memory: {_gb(a.weight)}",
            f"Activation Memory: {_gb(a.activation)}", f"Pointwise Memory: {_gb(a.pointwise)}"]

    def layers(x):
        return [f"Total Memory: {_gb(x.total)}", f"Embedding Memory: {_gb(x.embedding)}",
                f"Hidden Memory: {_gb(x.hidden)}", f"Softmax Memory: {_gb(x.softmax)}",
                f"Projection Memory: {_gb(x.projection)}"]

    return (["", "", "=" * 43, "Memory Requirement Breakdown per Data Shard", "=" * 43] + layers(a) + [""]
            + cats + ["", "", f"{overflow}: {a.overflow:.1f}", "", "", "", "=" * 57,
                      "Memory Requirement Breakdown per Data Shard Per Model Shard", "=" * 59] + layers(b)
            + ["", f"{overflow}: {b.overflow:.1f}", "", "", f"Total Memory: {_gb(b.total)}"] + cats[1:] + [""])


def report_lines(r: Result, *, harness_line: bool = True) -> list[str]:
    """DeepFlow's report: the evaluation lines, parameters, hardware, memory, strategy, Time."""
    sp = r.cfg["scheduling_param"]
    strategy = (f"dp: {sp['dp']}, lp: {sp['lp']}, hlp: {sp['hlp']}, kp_hidden_dim1: {sp['kp_hidden_dim1']}, "
                f"kp_hidden_dim2: {sp['kp_hidden_dim2']},kp_softmax_dim1: {sp['kp_softmax_dim1']}, "
                f"kp_softmax_dim2: {sp['kp_softmax_dim2']}, kp_embedding: {sp['kp_embedding_dim1']},"
                f"kp_projection_dim1: {sp['kp_projection_dim1']}, kp_proejction_dim2: {sp['kp_projection_dim2']}")
    lines = list(r.lines) + [f"#Parameters: {r.parameters / 1e9:.2f} Billion", ""]
    lines += hardware_block(r.machine) + _memory_lines(r)
    lines += ["", "", "=" * 20, "Parallelism Strategy", "=" * 20, strategy, "", f"Time: {r.time:.8f}"]
    if harness_line:
        lines.append(f"time_per_step: {harness_time_per_step():.8f}")
    return lines
