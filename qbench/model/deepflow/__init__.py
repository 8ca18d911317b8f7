"""DeepFlow's analytical LSTM language-model performance model (reference: deepflow-lstm-model.md).

config (the YAML's sections, unit strings, validation) -> machine (device derived from technology and
power, roofline) -> gemm (tiled GEMM traffic) and parallel (collectives, kernel-parallel blocks) ->
lstm (component times, the wavefront that composes them) and memory (bytes per shard, parameters) ->
model (one evaluation and DeepFlow's text report). Pure arithmetic: no files, no printing.
"""

from qbench.model.deepflow.model import Result, evaluate, report_lines

__all__ = ["Result", "evaluate", "report_lines"]
