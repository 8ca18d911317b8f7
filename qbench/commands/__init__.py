"""Thin click commands, one module per family: parse -> config -> run -> store -> print.

qbench.cli loads each module lazily, so `qbench --help` imports neither torch nor triton.
"""
