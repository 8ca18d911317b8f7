"""How the bench watches and steers an MoE layer from outside: the layer knows nothing of the bench.

  observed(moe, phase)  a context in which phase(name) (a PhaseTimer's, a profiler range, a host clock)
                        wraps each of the layer's phases (the layer's phase hooks, qbench/layers/moe/hooks.py)
  last_plan(moe, fn)    (routing, plan) of the layer's last forward inside fn() (its plan hooks)
  Routed(model, choice) the model with the routing kind's forced choice [T, k] passed to every forward
  no_phase(name)        the phase of an unobserved step (a nullcontext)
"""

from __future__ import annotations

import contextlib

from torch import nn


def no_phase(name: str):
    return contextlib.nullcontext()


@contextlib.contextmanager
def observed(moe, phase):
    """phase(name) -> context manager, entered around every phase of the layer's steps inside this context."""
    handle = moe.phase_hooks.register(phase)
    try:
        yield
    finally:
        handle.remove()


def last_plan(moe, fn):
    """(routing, plan) of the last forward of `moe` that fn() runs, and fn's result."""
    seen = []
    handle = moe.plan_hooks.register(lambda routing, plan: seen.append((routing, plan)))
    try:
        result = fn()
    finally:
        handle.remove()
    return seen[-1], result


class Routed(nn.Module):
    """model(x, choice) for a fixed forced choice (expert ids [T, k]); its parameters are the model's."""

    def __init__(self, model: nn.Module, choice):
        super().__init__()
        self.model, self.choice = model, choice

    def forward(self, x):
        return self.model(x, self.choice)
