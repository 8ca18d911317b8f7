"""What one eager MoE step asks of the host: the torch ops it dispatches and the Triton kernels it launches
(forward + backward of the layer, after two warm-up steps), at world sizes 1 and 2 (gloo), dropless and
with a fixed capacity, at world size 2 also in two chunks (--a2a-ffn-overlap-degree 2). Each count is
pinned at most at what the layer issues today, so that a change that adds launches or ops to the step
fails here. Ops inside a Triton launch (the interpreter's own copies) are not the step's and are not
counted. CPU only: the Triton launches are counted at the interpreter."""

import collections

import pytest
import torch

from kernels._common import interpreting
from qbench import dist

pytestmark = pytest.mark.skipif(not interpreting(), reason="counts Triton launches at the interpreter (CPU)")

TOKENS, DIM, HIDDEN, LOCAL = 32, 16, 16, 4
# (world size, capacity factor, overlap degree) -> (ops, launches) of one step, the most of any rank
BOUNDS = {(1, 0.0, 1): (44, 12), (1, 1.0, 1): (45, 12), (2, 0.0, 1): (58, 13), (2, 1.0, 1): (57, 13),
          (2, 0.0, 2): (78, 17), (2, 1.0, 2): (77, 17)}


def _counted(fn):
    """(Counter of dispatched op names, Counter of Triton kernel launches) of fn()."""
    import triton.runtime.interpreter as interpreter
    from torch.utils._python_dispatch import TorchDispatchMode

    ops, launches, inside = collections.Counter(), collections.Counter(), [0]

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0]:
                ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    launch = interpreter.GridExecutor.__call__

    def counted_launch(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        inside[0] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    interpreter.GridExecutor.__call__ = counted_launch
    try:
        with Ops():
            fn()
    finally:
        interpreter.GridExecutor.__call__ = launch
    return ops, launches


def step_counts(ctx, cf, degree):
    """Rank body: (ops, launches, op names) of one eager step, the most of any rank."""
    from qbench.layers.moe import MoELayer, MoEOptions

    opts = MoEOptions(DIM, HIDDEN, LOCAL, 2, capacity_factor=cf, a2a_ffn_overlap_degree=degree)
    layer = MoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=torch.float32, device="cpu", seed=2)
    gen = torch.Generator().manual_seed(ctx.rank)
    x, dy = torch.randn(TOKENS, DIM, generator=gen).requires_grad_(), torch.randn(TOKENS, DIM, generator=gen)
    for _ in range(2):  # first launches
        layer(x).backward(dy)
    ops, launches = _counted(lambda: layer(x).backward(dy))
    most = dist.max_over_ranks([float(sum(ops.values())), float(sum(launches.values()))])
    yield int(most[0]), int(most[1]), dict(ops.most_common())


@pytest.mark.parametrize("world_size,cf,degree", list(BOUNDS), ids=[f"ws{w}-cf{c:g}-d{d}" for w, c, d in BOUNDS])
def test_one_eager_step_issues_no_more_ops_and_launches_than_pinned(world_size, cf, degree):
    [(ops, launches, names)] = list(dist.launch(step_counts, (cf, degree), world_size=world_size, backend="gloo",
                                                device="cpu"))
    max_ops, max_launches = BOUNDS[(world_size, cf, degree)]
    assert launches <= max_launches, f"{launches} Triton launches per step (at most {max_launches})"
    assert ops <= max_ops, f"{ops} ops per step (at most {max_ops}): {names}"


def graph_nodes(ctx, cf, degree):
    """Rank body: the autograd nodes of one step's output, by class name."""
    from qbench.layers.moe import MoELayer, MoEOptions

    opts = MoEOptions(DIM, HIDDEN, LOCAL, 2, capacity_factor=cf, a2a_ffn_overlap_degree=degree)
    layer = MoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=torch.float32, device="cpu", seed=2)
    x = torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(ctx.rank)).requires_grad_()
    seen, todo = {}, [layer(x).grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen[id(node)] = type(node).__name__
            todo += [n for n, _ in node.next_functions]
    yield dict(collections.Counter(seen.values()))


@pytest.mark.parametrize("world_size,cf,degree", [(1, 0.0, 1), (2, 0.0, 1), (2, 1.0, 2)],
                         ids=["ws1-cf0", "ws2-cf0", "ws2-cf1-d2"])
def test_one_python_autograd_node_holds_the_gather_the_experts_and_the_combine(world_size, cf, degree):
    """Every Python node costs the backward its host time (more on autograd's engine thread): the step's graph is
    the gate's linear, its parameters' leaves and the layer's one node, at every world size."""
    [nodes] = list(dist.launch(graph_nodes, (cf, degree), world_size=world_size, backend="gloo", device="cpu"))
    python = {name: n for name, n in nodes.items() if name.endswith("Backward") and not name.endswith("Backward0")}
    assert python == {"_ExpertsBackward": 1}, nodes
    assert sum(nodes.values()) <= 10, nodes  # the node, the linear's (addmm, t), 7 leaves (x, gate's 2, experts' 4)
