"""Rank bodies for the distributed MoE tests (no tests here: spawned ranks import this module)."""

import torch

CASES = [  # (dtype, capacity factor, overlap degree, replicated experts, routing)
    (torch.float32, 0.0, 1, 0, "randn"),
    (torch.float32, 1.0, 2, 0, "rand-skew"),
    (torch.float32, -0.5, 3, 2, "zipf:1.5"),
    (torch.float32, 0.0, 2, 2, "rand-skew"),
    (torch.float16, 0.0, 1, 1, "uniform"),
    (torch.float32, 1.0, 1, 2, "rand-skew"),  # one chunk: the replication kernels, padded send buffer
    (torch.bfloat16, 1.5, 2, 1, "randn"),
    (torch.float32, 0.5, 1, 0, "rand-skew"),  # padded, one chunk, drops: the static plan at any world size
    (torch.float32, 0.0, 2, 0, "rand-skew"),  # dropless in chunks: the routing kernel's chunk-major send rows
    (torch.float16, -0.5, 3, 0, "randn"),  # capped in chunks: the same with drops
]
CASES_4 = [CASES[i] for i in (1, 2, 5, 7)]  # world size 4: chunks, capped + replication, padded kernels, static
TOKENS, DIM, HIDDEN, LOCAL = 37, 16, 24, 3  # odd, non-power-of-two sizes


def _layer(ctx, dtype, cf, degree, hot, seed=1):
    from qbench.layers.moe import MoELayer, MoEOptions

    opts = MoEOptions(DIM, HIDDEN, LOCAL, 2, capacity_factor=cf, a2a_ffn_overlap_degree=degree, replicate_hot=hot)
    return MoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=dtype, device="cpu", seed=seed)


def _inputs(ctx, layer, routing, dtype, salt):
    from qbench.layers.moe.routing import forced_choices, make_input, parse_routing

    gen = torch.Generator().manual_seed(1000 * salt + ctx.rank)
    spec = parse_routing(routing)
    x = make_input(spec, TOKENS, DIM, generator=gen, device="cpu", dtype=dtype)
    choice = forced_choices(spec, TOKENS, 2, layer.num_experts, rank=ctx.rank, step=salt)
    return x, torch.randn(TOKENS, DIM, generator=gen).to(dtype), choice


def _hot_seen(layer) -> list:
    """Every forward's replicated experts, through the layer's plan hooks."""
    seen: list = []
    layer.plan_hooks.register(lambda routing, plan: seen.append(plan.hot))
    return seen


def check_cases(ctx, cases=None):
    """Each case (default: CASES) against the dense reference; yields (case, ok, description, dropped, rows)."""
    from qbench.layers.moe.reference import check_layer

    for salt, (dtype, cf, degree, hot, routing) in enumerate(cases or CASES):
        layer = _layer(ctx, dtype, cf, degree, hot)
        x, dy, choice = _inputs(ctx, layer, routing, dtype, salt)
        result = check_layer(layer, x, dy, choice)
        yield (str(dtype), cf, degree, hot, routing), result.ok, result.describe(), result.dropped, result.conservation


def replication_equal(ctx):
    """Outputs and gradients with and without replication (fp32, same weights and inputs)."""
    outs = []
    for hot in (0, 3):
        layer = _layer(ctx, torch.float32, 0.0, 2, hot)
        x, dy, choice = _inputs(ctx, layer, "rand-skew", torch.float32, 99)
        x.requires_grad_()
        seen = _hot_seen(layer)
        out = layer(x, choice)
        out.backward(dy)
        outs.append([out.detach(), x.grad] + [p.grad for p in layer.parameters()])
        hot_list = seen[-1]
    yield hot_list, [float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(*outs)]


def replication_under_autocast(ctx):
    """A replicating layer with fp32 weights under autocast (bf16) against the bf16 layer of the same weights:
    (dtypes of output and parameter gradients, relative error of output, dx and each gradient)."""
    from qbench.layers.moe.reference import rel_error

    steps, layers = [], []
    for dtype in (torch.float32, torch.bfloat16):
        layer = _layer(ctx, dtype, 0.0, 2, 2)
        if layers:
            layer.load_state_dict(layers[0].state_dict())
        layers.append(layer)
        x, dy, choice = _inputs(ctx, layer, "rand-skew", torch.float32, 98)
        x = x.to(dtype).requires_grad_()
        seen = _hot_seen(layer)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.float32):
            out = layer(x, choice)
        out.backward(dy.to(out.dtype))
        steps.append((seen, [out.detach(), x.grad] + [p.grad for p in layer.parameters()]))
    (_, got), (half_hot, want) = steps
    yield ([str(t.dtype) for t in got[:1] + got[2:]], half_hot[-1],
           [rel_error(a.float(), b.float()) for a, b in zip(got, want)])


def freeze_rank(ctx, bad_rank):
    """Rank `bad_rank` stops itself (SIGSTOP) while the others wait for it in a collective."""
    import os
    import signal

    import torch.distributed as dist

    dist.barrier()  # every rank is up (and beating)
    if ctx.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.barrier()
    yield "unreachable"


def fail_on_rank(ctx, bad_rank):
    """Rank `bad_rank` raises mid-run while the others wait in a collective."""
    import torch.distributed as dist

    if ctx.rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {bad_rank}")
    dist.barrier()
    yield "unreachable"


def job_seen(ctx):
    """What a spawned rank knows of its job: its context's rank and world size, and the job variables in its
    environment (none: they are arguments; RANK / WORLD_SIZE in the environment mean a torchrun job)."""
    import os

    yield ctx.rank, ctx.world_size, os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
