"""The analytical model, pure arithmetic (no files, no printing, no records, no timing, no torch):

hardware (presets and device descriptions), roofline and floors (floors of a GEMM and of qbench's own
workloads), deepflow/ (DeepFlow's LSTM language-model model), transformer (a dense transformer on
DeepFlow's machine), objective (a workload's time and memory fit as a function of the config), search
(parallelism strategies) and search_hw (the power split). Reading files, writing records and timing
live in qbench.benches.model.
"""
