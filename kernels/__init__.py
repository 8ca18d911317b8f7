"""Triton kernels, one file per kernel family; each file also holds a plain-torch reference.

Launchers run the Triton kernel on CUDA tensors, and on CPU tensors only under the Triton
interpreter (TRITON_INTERPRET=1, set before triton is imported); otherwise they fall back to the
torch reference, so every subcommand runs end to end on a machine without a GPU. Helpers shared by
several families live in kernels/_common/ (jit helpers and launch geometry; launch.py: launch replay
and cooperative launches; formats.py: the 8-bit formats); no family imports another's internals.
"""
