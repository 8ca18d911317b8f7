"""One evaluation of DeepFlow's LSTM model, and DeepFlow's text report of it.

`evaluate(cfg, machine)` is a pure function of a normalized config and a machine (so a search can call
it in a loop); it returns the component times, Time, memory and parameter count, plus the lines
DeepFlow prints while it runs. `report_lines(result)` renders DeepFlow's full report, line for line.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.model.deepflow import lstm, memory, quirks
from qbench.model.deepflow.machine import Machine, Trace, hardware_block
from qbench.model.deepflow.parallel import collective


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


def evaluate(cfg: dict, machine: Machine, *, debug: bool = False, fixes: frozenset[str] = frozenset()) -> Result:
    """DeepFlow's step time of the configured LSTM language model on `machine` (seconds); `fixes` names
    the quirks to correct (qbench.model.deepflow.quirks; none: DeepFlow exact)."""
    s = lstm.shape_of(cfg)
    m, t, c = machine, Trace(debug, fixes), lstm.Components()
    t.lines.extend(machine.construction_lines)
    hidden, softmax = _updated_weights(t, s)
    c.W = 0 if s.lp == 1 else ((m.prec * s.b) * s.D) / m.IB
    r = collective(m, t, *hidden, s.dp, m.IB, False, True)  # data-parallel LSTM all-reduce
    c.apply_hidden = lstm.apply_grad(m, t, *hidden, "Hidden")
    c.apply_projection = lstm.apply_grad(m, t, s.D, s.P, "Projection")
    c.apply_softmax = lstm.apply_grad(m, t, *softmax, "Softmax")
    if t.fixed(quirks.DP_SOFTMAX_ALLREDUCE):  # the softmax weight gradients are data-parallel too
        c.allreduce_softmax = collective(m, t, *s.softmax_shard(), s.dp, m.IB, False, True)
    c.R = r + c.apply_hidden
    c.Cf = lstm.cell_forward(m, t, s)
    c.Cb = lstm.cell_backward(m, t, s)
    c.softmax_f = lstm.softmax_forward(m, t, s)
    c.softmax_b = lstm.softmax_backward(m, t, s)
    c.projection_f, c.projection_b = lstm.projection(m, t, s)
    c.embedding_f, c.embedding_b = lstm.embedding(m, t, s)
    _summaries(t, cfg, c)
    lstm.compose(c, s)
    shard = memory.per_data_shard(s, m.prec, m.mem_size, t.fixes)
    model_shard = memory.per_model_shard(s, m.prec, m.mem_size, t.fixes)
    return Result(cfg, m, s, c, shard, model_shard, memory.parameter_count(s, t.fixes), t.lines)


def _updated_weights(t: Trace, s: lstm.Shape) -> tuple[tuple, tuple]:
    """(rows, columns) of the LSTM gate weights and of the softmax weights that one device updates and
    all-reduces: DeepFlow takes whole matrices, the corrected model each device's shard."""
    if t.fixed(quirks.OPTIMIZER_UNSHARDED):
        return s.hidden_shard(), s.softmax_shard()
    return (2 * s.D, s.G * s.D), (s.Ks, s.V)


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


def report_lines(r: Result, *, time_per_step: float | None = None) -> list[str]:
    """DeepFlow's report: the evaluation lines, parameters, hardware, memory, strategy, Time; then, when
    a time budget per step (s) is given, the `time_per_step:` line DeepFlow's search harness appended
    (the seed's 0.00071939 is the harness's own budget: a day over 100 x 768,648,884 tokens at batch 32)."""
    sp = r.cfg["scheduling_param"]
    strategy = (f"dp: {sp['dp']}, lp: {sp['lp']}, hlp: {sp['hlp']}, kp_hidden_dim1: {sp['kp_hidden_dim1']}, "
                f"kp_hidden_dim2: {sp['kp_hidden_dim2']},kp_softmax_dim1: {sp['kp_softmax_dim1']}, "
                f"kp_softmax_dim2: {sp['kp_softmax_dim2']}, kp_embedding: {sp['kp_embedding_dim1']},"
                f"kp_projection_dim1: {sp['kp_projection_dim1']}, kp_proejction_dim2: {sp['kp_projection_dim2']}")
    lines = list(r.lines) + [f"#Parameters: {r.parameters / 1e9:.2f} Billion", ""]
    lines += hardware_block(r.machine) + _memory_lines(r)
    lines += ["", "", "=" * 20, "Parallelism Strategy", "=" * 20, strategy, "", f"Time: {r.time:.8f}"]
    if time_per_step is not None:
        lines.append(f"time_per_step: {time_per_step:.8f}")
    return lines
