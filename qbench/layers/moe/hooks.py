"""What a caller may observe of an MoE layer's step, through hook lists the layer owns.

A layer has two lists (torch-style: `register(fn)` returns a RemovableHandle whose remove() ends it):
  phase_hooks   fn(name) -> a context manager, entered around each named phase of every step:
                gate, plan, dispatch, experts, combine, replicas, backward_a2a, backward_experts
                (system blocks: ag, ga, backward_ag, backward_ga instead of dispatch and backward_a2a);
                a phase entered twice in a step is two regions. `phase(name)` enters every registered
                one (with none, a nullcontext: the step pays nothing).
  plan_hooks    fn(routing, plan) after every forward's plan (the routing with its weights detached,
                so that the caller keeps no autograd graph; not while torch.compile traces the layer)
The layer never reads what its hooks return or keep.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable


class HookList:
    """Registered callables in registration order."""

    def __init__(self) -> None:
        self._hooks: OrderedDict[int, Callable] = OrderedDict()  # RemovableHandle keeps a weak reference

    def register(self, fn: Callable):
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = fn
        return handle

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def __call__(self, *args) -> None:
        for fn in list(self._hooks.values()):
            fn(*args)

    def phase(self, name: str):
        """The context of phase `name`: every hook's context, entered in registration order."""
        hooks = list(self._hooks.values())
        if not hooks:
            return contextlib.nullcontext()
        if len(hooks) == 1:
            return hooks[0](name)
        return _entered(hooks, name)


@contextlib.contextmanager
def _entered(hooks: list[Callable], name: str):
    with contextlib.ExitStack() as stack:
        for fn in hooks:
            stack.enter_context(fn(name))
        yield
