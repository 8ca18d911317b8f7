"""Block GEMM kernels (kernels/block_gemm.py) against their plain-torch references.

Several local tensors stand in for the peer GPUs: the kernels reach them through a table of their
addresses, exactly as they reach symmetric-memory buffers on GPUs. Odd K and N, blocks of 1..B rows,
a non-power-of-two block size, empty experts, a rank that sends nothing, strided w^T views, every dtype.
On CPU the kernels run under the Triton interpreter (tiny tiles).
"""

import pytest
import torch

from kernels import block_gemm as bg
from kernels import grouped_gemm as gg
from kernels._common import use_triton
from qbench.layers.moe.blocks import reference_plan  # the block plan by plain loops
from tests.helpers import assert_close, gemm_tol

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32: IEEE products, only the summation order differs; 16-bit: both round one fp32 accumulator
# to the output dtype, so an order difference can flip the last bit (2 ulps of slack).

# counts_all[s, e]: rows rank s sends to global expert e (W = 3 ranks, L = 2 local experts, E = 6).
# Owner 1 owns experts 2 and 3: expert 2 gets 1 row from rank 0, 11 from rank 1 (3 blocks of B = 5:
# 5, 5, 1), none from rank 2 (which sends nothing at all); expert 3 gets 7 rows from rank 0 (5, 2).
COUNTS = torch.tensor([[2, 0, 1, 7, 3, 4], [0, 3, 11, 0, 2, 1], [0, 0, 0, 0, 0, 0]])
EMPTY_EXPERT = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])  # owner 1 (L = 2): both experts empty


def _sources(counts, K, dtype, gen):
    return [torch.randn(int(c.sum()), K, generator=gen).to(dtype).to(DEVICE) for c in counts]


def _weights(L, K, N, dtype, gen, transposed):
    """w [L, K, N]; transposed: a strided view of a [L, N, K] tensor, as w^T in the backward."""
    if transposed:
        return torch.randn(L, N, K, generator=gen).to(dtype).to(DEVICE).transpose(1, 2)
    return torch.randn(L, K, N, generator=gen).to(dtype).to(DEVICE)


def test_kernels_run_through_triton_here():
    # the comparisons below would be reference-vs-reference without the kernel path
    assert use_triton(torch.empty(1, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed,with_bias", [(False, True), (True, False)])
def test_gather_matmul_matches_reference(dtype, transposed, with_bias):
    gen = torch.Generator().manual_seed(7)
    K, N, L = 19, 21, 2
    plan = reference_plan(COUNTS, 1, L, 5, device=DEVICE)
    assert plan.num_blocks == 6
    srcs = _sources(COUNTS, K, dtype, gen)
    w = _weights(L, K, N, dtype, gen, transposed)
    bias = torch.randn(L, N, generator=gen).to(dtype).to(DEVICE) if with_bias else None
    out, gathered = bg.gather_matmul(srcs, plan, w, bias)
    want_out, want_g = bg.gather_matmul_reference(srcs, plan, w, bias)
    assert torch.equal(gathered.cpu(), want_g.cpu()), "gathered rows are copies: they must be exact"
    assert_close(out, want_out, gemm_tol(dtype), f"gather_matmul {dtype}")


def test_gathered_rows_are_the_source_rows_packed():
    gen = torch.Generator().manual_seed(3)
    plan = reference_plan(COUNTS, 1, 2, 5, device=DEVICE)
    srcs = _sources(COUNTS, 9, torch.float16, gen)
    w = _weights(2, 9, 17, torch.float16, gen, False)
    _, gathered = bg.gather_matmul(srcs, plan, w, None, gathered=torch.full((19, 9), 7.0, dtype=torch.float16,
                                                                             device=DEVICE))
    # packed: the owner's (expert, source) segments back to back, every row written once
    want = torch.cat([srcs[0][2:3], srcs[1][3:14], srcs[0][3:10]]).cpu()
    assert torch.equal(gathered.cpu(), want)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_fused_activation_stores_pre_and_act(activation):
    gen = torch.Generator().manual_seed(11)
    plan = reference_plan(COUNTS, 0, 2, 4, device=DEVICE)
    srcs = _sources(COUNTS, 18, torch.float32, gen)
    w = _weights(2, 18, 23, torch.float32, gen, False)
    bias = torch.randn(2, 23, generator=gen).to(DEVICE)
    rows = plan.gathered_rows
    pre = torch.empty(rows, 23, device=DEVICE)
    out, _ = bg.gather_matmul(srcs, plan, w, bias, activation=activation, pre=pre)
    want_pre = torch.empty_like(pre)
    want, _ = bg.gather_matmul_reference(srcs, plan, w, bias, activation=activation, pre=want_pre)
    assert_close(pre, want_pre, gemm_tol(torch.float32), "pre-activation")
    assert_close(out, want, 1e-5, f"{activation}(pre)")  # erf in fp32 on both sides


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed,with_bias", [(False, True), (True, False)])
def test_matmul_scatter_matches_reference_and_writes_only_its_rows(dtype, transposed, with_bias):
    gen = torch.Generator().manual_seed(5)
    K, N, L, B = 17, 13, 2, 5
    plan = reference_plan(COUNTS, 1, L, B, device=DEVICE)
    a = torch.randn(plan.gathered_rows, K, generator=gen).to(dtype).to(DEVICE)
    w = _weights(L, K, N, dtype, gen, transposed)
    bias = torch.randn(L, N, generator=gen).to(dtype).to(DEVICE) if with_bias else None
    sentinel = -1234.0  # rows no block of this owner targets must keep it
    got = [torch.full((int(c.sum()), N), sentinel, dtype=dtype, device=DEVICE) for c in COUNTS]
    want = [t.clone() for t in got]
    bg.matmul_scatter(a, w, bias, got, plan)
    bg.matmul_scatter_reference(a, w, bias, want, plan)
    for s in range(len(got)):
        assert_close(got[s], want[s], gemm_tol(dtype), f"rank {s} rows after matmul_scatter {dtype}")
    targeted = sum(plan.block_rows.tolist())
    untouched = sum(int((t == sentinel).all(1).sum()) for t in want)
    assert targeted + untouched == int(COUNTS.sum()) and targeted == 19


def test_gather_rows_copy_matches_reference():
    gen = torch.Generator().manual_seed(2)
    plan = reference_plan(COUNTS, 0, 2, 3, device=DEVICE)
    srcs = _sources(COUNTS, 21, torch.bfloat16, gen)
    rows = plan.gathered_rows
    got = bg.gather_rows(srcs, plan, torch.full((rows, 21), 5.0, dtype=torch.bfloat16, device=DEVICE))
    want = bg.gather_rows_reference(srcs, plan, torch.empty(rows, 21, dtype=torch.bfloat16, device=DEVICE))
    assert torch.equal(got.cpu(), want.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_rows_copies_valid_rows_only(dtype):
    gen = torch.Generator().manual_seed(4)
    B, N = 5, 13
    plan = reference_plan(COUNTS, 1, 2, B, device=DEVICE)
    out = torch.randn(plan.gathered_rows, N, generator=gen).to(dtype).to(DEVICE)
    sentinel = -1234.0  # rows no block of this owner targets (and padding rows' targets) keep it
    got = [torch.full((int(c.sum()), N), sentinel, dtype=dtype, device=DEVICE) for c in COUNTS]
    want = [t.clone() for t in got]
    bg.scatter_rows(out, got, plan)
    bg.scatter_rows_reference(out, want, plan)
    for s in range(len(got)):
        assert torch.equal(got[s].cpu(), want[s].cpu()), f"rank {s} rows after scatter_rows {dtype}"
    assert sum(int((t != sentinel).all(1).sum()) for t in want) == 19  # the owner's valid rows


def test_empty_experts_and_no_blocks():
    gen = torch.Generator().manual_seed(1)
    plan = reference_plan(EMPTY_EXPERT, 1, 2, 4, device=DEVICE)
    assert plan.num_blocks == 0 and plan.offsets_local.tolist() == [0, 0, 0]
    srcs = _sources(EMPTY_EXPERT, 5, torch.float16, gen)
    out, gathered = bg.gather_matmul(srcs, plan, _weights(2, 5, 6, torch.float16, gen, False))
    assert out.shape == (0, 6) and gathered.shape == (0, 5)
    dst = [torch.zeros(int(c.sum()), 6, dtype=torch.float16, device=DEVICE) for c in EMPTY_EXPERT]
    bg.matmul_scatter(torch.empty(0, 5, dtype=torch.float16, device=DEVICE),
                      _weights(2, 5, 6, torch.float16, gen, False), None, dst, plan)
    assert all(not t.any() for t in dst)


def test_unaligned_peers_take_the_unhinted_path_and_stay_exact():
    gen = torch.Generator().manual_seed(4)
    plan = reference_plan(COUNTS, 1, 2, 5, device=DEVICE)
    wide = [torch.randn(int(c.sum()), 20, generator=gen).to(torch.float16).to(DEVICE) for c in COUNTS]
    srcs = [t[:, 1:] for t in wide]  # rows start 2 bytes into a 40-byte row: no 16-byte alignment
    assert not bg.peer_table(srcs).aligned
    assert not bg.peer_table(wide).aligned  # 40-byte rows are not 16-byte multiples
    assert bg.peer_table([torch.empty(3, 24, dtype=torch.float16, device=DEVICE) for _ in range(2)]).aligned
    w = _weights(2, 19, 24, torch.float16, gen, False)
    out, gathered = bg.gather_matmul(srcs, plan, w)
    want, want_g = bg.gather_matmul_reference(srcs, plan, w)
    assert torch.equal(gathered.cpu(), want_g.cpu())
    assert_close(out, want, gemm_tol(torch.float16), "gather_matmul from unaligned peers")


def test_reference_plan_layout():
    plan = reference_plan(COUNTS, 1, 2, 5)
    # expert 2: rank 0 row 2 (1 row), rank 1 rows [3, 8), [8, 13), [13, 14); expert 3: rank 0 rows [3, 8), [8, 10)
    assert plan.block_src.tolist() == [0, 1, 1, 1, 0, 0]
    assert plan.block_row.tolist() == [2, 3, 8, 13, 3, 8]
    assert plan.block_rows.tolist() == [1, 5, 5, 1, 5, 2]
    assert plan.block_expert.tolist() == [0, 0, 0, 0, 1, 1]
    assert plan.block_start.tolist() == [0, 1, 6, 11, 12, 17]  # packed local rows, no padding
    assert plan.offsets_local.tolist() == [0, 12, 19] and plan.gathered_rows == 19
    assert plan.src_rows == 17 and plan.blocks_remote == 3


# --- the symmetric-memory transport's protocol, with threads standing in for the ranks -----------
# Each thread is one rank with its own SymmTransport; "symmetric" buffers are CPU tensors shared
# through a table of addresses, and handle.barrier is a threading.Barrier. Kernel launches hold one
# lock (the interpreter is not thread-safe); copy-in, barriers and clone-out run concurrently.


class _FakeHandle:
    def __init__(self, world, ptrs, rank):
        self.world, self.buffer_ptrs, self.rank = world, ptrs, rank

    def barrier(self, channel=0):
        self.world.barriers[self.rank] += 1
        self.world.sync.wait(timeout=60)


class _World:
    def __init__(self, size):
        import threading

        self.size, self.sync, self.lock = size, threading.Barrier(size), threading.Lock()
        self.allocs: dict = {}
        self.barriers = [0] * size


def _fake_transport(world, rank, **kw):
    from qbench.layers.moe.transport import SymmTransport, _Buffer

    class FakeSymm(SymmTransport):
        count = 0

        def _allocate(self, nbytes):
            key = FakeSymm.count = FakeSymm.count + 1
            pad = 24  # the tensor sits inside its "segment", as with a pooled allocation
            seg = torch.empty(nbytes + pad, dtype=torch.uint8)
            world.allocs.setdefault(key, {})[rank] = seg
            world.sync.wait(timeout=60)  # rendezvous: every rank allocated the same size
            assert len({t.numel() for t in world.allocs[key].values()}) == 1, "ranks sized buffers differently"
            ptrs = [world.allocs[key][r].data_ptr() for r in range(world.size)]
            handle = _FakeHandle(world, ptrs, rank)
            return _Buffer(seg[pad:], handle, [p + pad for p in ptrs])

    return FakeSymm(group=None, device="cpu", **kw)


def _locked(world, fn):
    def run(*args, **kwargs):
        with world.lock:
            return fn(*args, **kwargs)

    return run


def _rank_inputs(rank, counts, K, N, L, dtype):
    gen = torch.Generator().manual_seed(100 + rank)
    B = 4
    plan = reference_plan(counts, rank, L, B)
    return {
        "plan": plan,
        "src": torch.randn(int(counts[rank].sum()), K, generator=gen).to(dtype),
        "dy": torch.randn(int(counts[rank].sum()), N, generator=gen).to(dtype),
        "w1": torch.randn(L, K, N, generator=gen).to(dtype),
        "b1": torch.randn(L, N, generator=gen).to(dtype),
        "w2": torch.randn(L, N, K, generator=gen).to(dtype),
        "a": torch.randn(plan.gathered_rows, N, generator=gen).to(dtype),
    }


def _rank_body(world, rank, counts, mode, out):
    """pull, push, pull (w^T view), pull again, push: every result kept for the checks."""
    t = _fake_transport(world, rank, mode=mode)
    d = _rank_inputs(rank, counts, 9, 13, 2, torch.float32)
    p = d["plan"]
    out[rank] = {
        "pre": t.pull_matmul(d["src"], d["w1"], d["b1"], p),
        "y": t.matmul_push(d["a"], d["w2"], None, p),
        "back": t.pull_matmul(d["dy"], d["w1"].transpose(1, 2), None, p),
        "again": t.pull_matmul(d["src"], d["w1"], None, p),
        "dx": t.matmul_push(d["a"], d["w2"], d["b1"][:, :9], p),
        "epoch": t._epoch,
    }


@pytest.mark.parametrize("world_size,mode", [(2, "fused"), (3, "split"), (4, "fused-ga")])
def test_symm_transport_protocol_matches_references(world_size, mode, monkeypatch):
    import threading

    if DEVICE != "cpu":
        pytest.skip("the simulated ranks share CPU memory")
    gen = torch.Generator().manual_seed(world_size)
    L = 2
    counts = torch.randint(0, 9, (world_size, world_size * L), generator=gen)
    counts[0, L] = 0  # an empty (source, expert) pair
    world, out = _World(world_size), {}
    for name in ("gather_matmul", "matmul_scatter", "gather_rows", "scatter_rows"):
        monkeypatch.setattr(bg, name, _locked(world, getattr(bg, name)))
    monkeypatch.setattr(gg, "grouped_matmul_forward", _locked(world, gg.grouped_matmul_forward))
    threads = [threading.Thread(target=_rank_body, args=(world, r, counts, mode, out)) for r in range(world_size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert len(out) == world_size, "a rank failed (see the thread's exception above)"
    ins = [_rank_inputs(r, counts, 9, 13, 2, torch.float32) for r in range(world_size)]
    srcs, dys = [d["src"] for d in ins], [d["dy"] for d in ins]
    for r, d in enumerate(ins):
        want, want_g = bg.gather_matmul_reference(srcs, d["plan"], d["w1"], d["b1"])
        assert_close(out[r]["pre"][0], want, 1e-5, f"rank {r} pull_matmul")
        assert torch.equal(out[r]["pre"][1], want_g), f"rank {r} gathered rows"
        back, _ = bg.gather_matmul_reference(dys, d["plan"], d["w1"].transpose(1, 2), None)
        assert_close(out[r]["back"][0], back, 1e-5, f"rank {r} pull_matmul with w^T")
    for key, bias in (("y", None), ("dx", [d["b1"][:, :9] for d in ins])):
        dst = [torch.full((int(c.sum()), 9), float("nan")) for c in counts]
        for r, d in enumerate(ins):
            bg.matmul_scatter_reference(d["a"], d["w2"], None if bias is None else bias[r], dst, d["plan"])
        for s in range(world_size):
            assert_close(out[s][key], dst[s], 1e-5, f"rank {s} rows after matmul_push ({key})")
    # one barrier per call, plus one for the second pull in a row (its buffer was just read)
    assert [o["epoch"] for o in out.values()] == [6] * world_size and world.barriers == [6] * world_size
