"""Rank bodies for the blocks-layer tests (no tests here: spawned ranks import this module)."""

import torch
import torch.distributed as dist

# (dtype, capacity factor, replicated experts, block size, routing, locality, activation):
# dropless, capacity > 0 (padded) and < 0, with and without replication, block sizes 1, 3, 5 and 64
# (3 and 5 divide no count here; 64 exceeds every count), forced locality, every dtype.
CASES = [
    (torch.float32, 0.0, 0, 3, "randn", None, "gelu"),
    (torch.float32, 1.0, 0, 5, "rand-skew", None, "relu"),
    (torch.float32, -0.5, 2, 3, "zipf:1.5", None, "gelu"),
    (torch.float32, 0.0, 2, 64, "rand-skew", None, "gelu"),
    (torch.float32, 1.5, 1, 1, "randn", 0.7, "gelu"),
    (torch.float16, 0.0, 1, 5, "uniform", None, "gelu"),
    (torch.bfloat16, -1.0, 0, 3, "randn", 0.3, "relu"),
    (torch.float32, 0.0, 0, 5, "randn", 1.0, "gelu"),  # every row stays home: the all-local shortcut
]
TOKENS, DIM, HIDDEN, LOCAL = 37, 16, 24, 3  # odd, non-power-of-two sizes


def _layer(ctx, dtype, cf, hot, block, activation, gemm):
    from qbench.layers.moe import BlocksMoELayer, MoEOptions

    opts = MoEOptions(DIM, HIDDEN, LOCAL, 2, activation=activation, capacity_factor=cf, replicate_hot=hot,
                      gemm=gemm)
    return BlocksMoELayer(opts, rank=ctx.rank, world_size=ctx.world_size, dtype=dtype, device="cpu", seed=3,
                          block_size=block, transport="a2a")


def _inputs(ctx, layer, routing, locality, dtype, salt):
    from qbench.layers.moe.routing import forced_choices, locality_choices, make_input, parse_routing

    gen = torch.Generator().manual_seed(1000 * salt + ctx.rank)
    spec = parse_routing(routing)
    x = make_input(spec, TOKENS, DIM, generator=gen, device="cpu", dtype=dtype)
    choice = forced_choices(spec, TOKENS, 2, layer.num_experts, rank=ctx.rank, step=salt)
    if locality is not None:
        choice = locality_choices(TOKENS, 2, LOCAL, ctx.world_size, locality, rank=ctx.rank, step=salt)
    return x, torch.randn(TOKENS, DIM, generator=gen).to(dtype), choice


def _plans_seen(layer) -> list:
    """Every forward's plan, through the layer's plan hooks."""
    seen: list = []
    layer.plan_hooks.register(lambda routing, plan: seen.append(plan))
    return seen


def check_cases(ctx, gemm="auto"):
    """Each case against the dense reference; yields (case, ok, description, dropped, plan summary),
    then the transport contract's (block, first mismatch) pairs. gemm: the grouped GEMM backend (auto
    runs the Triton kernels under the interpreter; reference keeps the 4-rank run short)."""
    from qbench.layers.moe.reference import check_layer

    for salt, (dtype, cf, hot, block, routing, locality, activation) in enumerate(CASES):
        layer = _layer(ctx, dtype, cf, hot, block, activation, gemm)
        x, dy, choice = _inputs(ctx, layer, routing, locality, dtype, salt)
        plans = _plans_seen(layer)
        result = check_layer(layer, x, dy, choice)
        plan = plans[-1]
        case = (str(dtype), cf, hot, block, routing, locality, activation)
        yield case, result.ok, result.describe(), result.dropped, (plan.num_blocks, plan.hot, layer.transport.name)
    yield from transport_contract(ctx)


def _random_plan(ctx, block, salt):
    """A plan from random per-expert counts (some zero) of every rank, and this rank's source rows."""
    from qbench.layers.moe.blocks import build_plan

    W, E = ctx.world_size, LOCAL * ctx.world_size
    gen = torch.Generator().manual_seed(77 + salt)  # the same table on every rank
    counts_all = torch.randint(0, 9, (W, E), generator=gen) * (torch.rand(W, E, generator=gen) > 0.2)
    plan, _ = build_plan(counts_all, ctx.rank, LOCAL, block)
    src = torch.randn(plan.src_rows, DIM, generator=torch.Generator().manual_seed(salt * 31 + ctx.rank))
    return plan, src


def _all_sources(src, world_size):
    """Every rank's source rows (rows differ per rank: all_gather of padded copies)."""
    n = torch.tensor([src.shape[0]])
    sizes = [torch.zeros_like(n) for _ in range(world_size)]
    dist.all_gather(sizes, n)
    top = max(int(s) for s in sizes)
    padded = torch.cat([src, src.new_zeros((top - src.shape[0], src.shape[1]))])
    out = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(out, padded)
    return [o[: int(s)] for o, s in zip(out, sizes)]


def transport_contract(ctx):
    """The fallback transport against the interface, element by element, for block sizes 1, 4, 7, 64:
    gathered[block_start[b] + j] = source(block_src[b])[block_row[b] + j] for j < block_rows[b]; out =
    the grouped product; matmul_push delivers a[block_start[b] + j] @ w[block_expert[b]] to that source row.
    Yields (block, first mismatch or None)."""
    from qbench.layers.moe.transport import A2ATransport

    transport = A2ATransport(backend="reference")
    for salt, block in enumerate((1, 4, 7, 64)):
        plan, src = _random_plan(ctx, block, salt)
        sources = _all_sources(src, ctx.world_size)
        w = torch.randn(LOCAL, DIM, HIDDEN, generator=torch.Generator().manual_seed(5))
        bias = torch.randn(LOCAL, HIDDEN, generator=torch.Generator().manual_seed(6))
        out, gathered = transport.pull_matmul(src, w, bias, plan)
        a = torch.randn(plan.gathered_rows, DIM, generator=torch.Generator().manual_seed(9 + ctx.rank))
        w2 = torch.randn(LOCAL, 11, DIM, generator=torch.Generator().manual_seed(7)).transpose(1, 2)  # strided
        back = transport.matmul_push(a, w2, None, plan)
        yield block, _first_mismatch(ctx, plan, sources, gathered, out, (w, bias, w2), a, back)


def _first_mismatch(ctx, plan, sources, gathered, out, weights, a, back):
    """Walk every block by the definition; name the first block that differs (None when all agree)."""
    w, bias, w2 = weights
    sent = [[] for _ in range(ctx.world_size)]  # (first row, values) pushed to each source rank
    blocks = zip(plan.block_src.tolist(), plan.block_row.tolist(), plan.block_rows.tolist(),
                 plan.block_expert.tolist(), plan.block_start.tolist())
    covered = 0
    for b, (s, row, rows, l, p) in enumerate(blocks):
        if p != covered:  # packed: each block starts where the previous one ended
            return f"block {b} starts at local row {p}, not {covered}"
        covered += rows
        want = sources[s][row:row + rows]
        if not torch.equal(gathered[p:p + rows], want):
            return f"gathered block {b} (source {s}, row {row}, rows {rows})"
        if not torch.allclose(out[p:p + rows], want @ w[l] + bias[l], atol=1e-5):
            return f"out block {b}"
        sent[s].append((row, (a[p:p + rows] @ w2[l]).tolist()))
    if covered != gathered.shape[0]:
        return f"blocks cover {covered} of {gathered.shape[0]} gathered rows"
    return _check_push(ctx, sent, back)


def _check_push(ctx, sent, back):
    """Every rank's pushed rows, gathered to their source: each source row received exactly once."""
    objs = [None] * ctx.world_size
    dist.all_gather_object(objs, [(s, r + j, v) for s, rows in enumerate(sent) for r, vs in rows
                                  for j, v in enumerate(vs)])
    mine = sorted((r, v) for pushed in objs for s, r, v in pushed if s == ctx.rank)
    if [r for r, _ in mine] != list(range(back.shape[0])):
        return f"rank {ctx.rank} received rows {[r for r, _ in mine][:8]}... for {back.shape[0]} source rows"
    for r, v in mine:
        if not torch.allclose(back[r], torch.tensor(v), atol=1e-5):
            return f"pushed row {r} of rank {ctx.rank}"
    return None
