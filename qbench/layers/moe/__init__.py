"""The distributed mixture-of-experts layer (expert parallel), in two systems.

    options.py    MoEOptions
    hooks.py      the hook lists through which a caller observes a step (phases, the plan)
    routing.py    inputs, gate top-k or forced choice, capacity and drops
    plan.py       the all-to-all layer's per-step row plan (split sizes, segments, hot experts)
    experts.py    dispatch -> expert FFN (grouped GEMMs) -> combine, pipelined in chunks
    replicas.py   hot-expert replicas: weights out to every rank, gradients home
    transport.py  how rows move: the all-to-all exchange, the blocks transports (all_to_all, symmetric memory)
    layer.py      MoELayer (all-to-all system) and the seeds' attention + MoE model
    blocks.py     the block plan and BlocksMoELayer (block dispatch fused into the expert GEMMs)
    reference.py  the dense fp32 reference and the check of a layer against it
Each module imports only modules listed above it (options, hooks, routing, plan, replicas and
transport import none of them; experts imports hooks); no module here imports a bench or a command.
"""

from qbench.layers.moe.blocks import BlockPlan, BlocksMoELayer, build_plan
from qbench.layers.moe.layer import ExampleModel, MoELayer, MultiHeadSelfAttention, expert_parameter_names
from qbench.layers.moe.options import MoEOptions
from qbench.layers.moe.reference import CheckResult, check_layer
from qbench.layers.moe.routing import RoutingSpec, parse_routing

__all__ = [
    "BlockPlan", "BlocksMoELayer", "CheckResult", "ExampleModel", "MoELayer", "MoEOptions", "MultiHeadSelfAttention",
    "RoutingSpec", "build_plan", "check_layer", "expert_parameter_names", "parse_routing",
]
