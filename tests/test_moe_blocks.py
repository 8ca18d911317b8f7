"""`qbench moe --variant blocks`: the block plan against plain loops, locality statistics, the blocks
layer and its fallback transport over gloo against the dense reference at world sizes 2 and 4, the
CLI's usage errors, and one end-to-end sweep whose seed-format lines the importer reads back."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels._common import interpreting
from qbench import dist
from qbench.layers.moe.blocks import build_plan
from qbench.layers.moe.routing import locality_choices
from tests import test_moe_blocks_workers as workers  # spawned ranks import it by this name too
from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent


def _loop_plan(counts, rank, L, B):
    """The plan's blocks by the definition: for l, then s, then i, rows src_off + i*B ..., landing at the
    next free row of the packed local layout (plain ints)."""
    W, E = len(counts), len(counts[0])
    src_off = [[sum(counts[s][:e]) for e in range(E)] for s in range(W)]
    blocks, offsets, filled = [], [], 0
    for l in range(L):
        offsets.append(filled)
        for s in range(W):
            c = counts[s][rank * L + l]
            for i in range(math.ceil(c / B)):
                n = min(B, c - i * B)
                blocks.append((s, src_off[s][rank * L + l] + i * B, n, l, filled))
                filled += n
    return blocks, offsets + [filled]


@pytest.mark.parametrize("W, L, B", [(1, 3, 4), (2, 1, 1), (3, 3, 7), (3, 2, 64), (4, 3, 5)])
def test_plan_matches_a_plain_loop(W, L, B):
    gen = torch.Generator().manual_seed(W * 100 + L * 10 + B)
    counts = torch.randint(0, 20, (W, W * L), generator=gen) * (torch.rand(W, W * L, generator=gen) > 0.25)
    for rank in range(W):
        plan, _ = build_plan(counts, rank, L, B)
        blocks, offsets = _loop_plan(counts.tolist(), rank, L, B)
        got = list(zip(plan.block_src.tolist(), plan.block_row.tolist(), plan.block_rows.tolist(),
                       plan.block_expert.tolist(), plan.block_start.tolist()))
        first_bad = next((i for i, (a, b) in enumerate(zip(got, blocks)) if a != b), None)
        assert len(got) == len(blocks) == plan.num_blocks and first_bad is None, (
            f"rank {rank}: block {first_bad}: {got[first_bad] if first_bad is not None else ''} vs "
            f"{blocks[first_bad] if first_bad is not None else ''} ({len(got)} vs {len(blocks)} blocks)")
        assert plan.offsets_local.tolist() == offsets
        assert plan.blocks_remote == sum(1 for s, *_ in blocks if s != rank)
        assert plan.src_rows == int(counts[rank].sum())
        assert plan.max_src_rows == int(counts.sum(1).max())
        assert plan.send_splits == [int(counts[rank, o * L:(o + 1) * L].sum()) for o in range(W)]
        assert plan.recv_splits == [int(counts[s, rank * L:(rank + 1) * L].sum()) for s in range(W)]
        assert plan.gathered_rows == int(counts[:, rank * L:(rank + 1) * L].sum())
        home = sum(int(counts[s, s * L:(s + 1) * L].sum()) for s in range(W))
        assert plan.remote_rows == int(counts.sum()) - home and plan.all_local == (plan.remote_rows == 0)


def test_plan_of_no_rows_and_extra_values():
    counts = torch.zeros(2, 4, dtype=torch.int64)
    plan, (extra,) = build_plan(counts, 1, 2, 64, extra=(torch.tensor([3, 5]),))
    assert plan.num_blocks == 0 and plan.offsets_local.tolist() == [0, 0, 0] and extra == [3, 5]


@pytest.mark.parametrize("p", [0.0, 0.3, 0.75, 1.0])
def test_locality_fraction_is_binomial(p):
    T, k, L, W, rank = 3001, 2, 4, 4, 2
    idx = locality_choices(T, k, L, W, p, rank=rank, step=5)
    n = T * k
    local = float(((idx // L) == rank).float().mean())
    # each choice is local independently with probability p: |fraction - p| <= 5 binomial sigmas
    # (false alarm ~6e-7), plus 1/n for rounding
    bound = 5 * math.sqrt(p * (1 - p) / n) + 1 / n
    assert abs(local - p) <= bound, f"local fraction {local:.4f} vs p = {p} (bound {bound:.4f})"
    assert bool((idx[:, 0] != idx[:, 1]).all()), "a token's experts must be distinct"
    assert idx.min() >= 0 and idx.max() < W * L
    remote = idx[(idx // L) != rank] // L
    if p < 1:  # other ranks drawn uniformly: each gets a third of the remote choices within 5 sigmas
        share = torch.bincount(remote, minlength=W).float() / remote.numel()
        others = [r for r in range(W) if r != rank]
        sigma = math.sqrt((1 / 3) * (2 / 3) / remote.numel())
        assert all(abs(float(share[r]) - 1 / 3) <= 5 * sigma for r in others), share.tolist()


@pytest.mark.dist
@pytest.mark.parametrize("world_size, gemm", [(2, "auto"), (4, "reference")])
def test_blocks_layer_matches_dense_reference(world_size, gemm):
    """Every case of the workers against the dense reference, then the fallback transport against the
    interface. World size 2 runs the grouped GEMMs in Triton (the interpreter on CPU); world size 4
    their torch reference (the interpreter at 4 ranks on 2 cores would take a minute)."""
    everything = list(dist.launch(workers.check_cases, (gemm,), world_size=world_size, backend="gloo",
                                  device="cpu"))
    results, contract = everything[:len(workers.CASES)], everything[len(workers.CASES):]
    bad = [(case, text) for case, ok, text, _, _ in results if not ok]
    assert not bad, f"{len(bad)} cases differ from the reference; first: {bad[0]}"
    assert all(info[2] == "a2a" for *_, info in results)  # the fallback transport ran
    assert any(r[3] > 0 for r in results if r[0][1] != 0.0), "no case dropped: capacity not exercised"
    assert any(info[1] for *_, info in results), "no case replicated an expert"
    assert [b for b, _ in contract] == [1, 4, 7, 64]
    assert all(m is None for _, m in contract), f"transport contract broken: {contract}"


def _qbench(*args, timeout=240):
    # the command's CPU path (torch reference GEMMs), as a user without a GPU runs it
    env = env_without_interpreter(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "qbench", "moe", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("args, word", [
    (["--locality", "1.5"], "[0, 1]"),
    (["--locality", "x"], "probabilities"),
    (["--locality", "0.5", "--routing", "zipf:1.2", "--device", "cpu"], "randn or uniform"),
    (["--locality", "0.5", "--num-local-experts", "1", "--device", "cpu"], ">= --top-k"),
    (["--variant", "fused"], "choose from a2a, blocks"),
    (["--system", "fused"], "choose from a2a, blocks"),  # the flag's other spelling
    (["--block-size", "0"], "0"),
    (["--transport", "symm", "--device", "cpu"], "needs CUDA"),
])
def test_bad_blocks_input_is_one_line_and_exit_2(args, word):
    proc = _qbench(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert word in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.dist
def test_sweep_end_to_end_and_seed_lines_read_back(tmp_path):
    out = tmp_path / "run"
    proc = _qbench("--variant", "a2a,blocks", "--locality", "0.5,1.0", "--world-size", "2", "--device", "cpu",
                   "--num-local-experts", "3", "--model-dim", "32", "--hidden-size", "48", "--samples", "45",
                   "--num-steps", "3", "--warmup", "1", "--block-size", "8", "--seed-format", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    steps = [r for r in records if r["params"]["timing"] == "per_step" and "rank" not in r["params"]]
    assert [(r["params"]["variant"], r["params"]["locality"]) for r in steps] == [
        ("a2a", 0.5), ("blocks", 0.5), ("a2a", 1.0), ("blocks", 1.0)]
    blocks = [r for r in steps if r["params"]["variant"] == "blocks"]
    assert all(r["params"]["transport"] == "a2a" and r["params"]["block_size"] == 8 for r in blocks)
    half, full = (r["metrics"] for r in blocks)
    assert full["remote_fraction"] == 0 and full["remote_block_count"] == 0  # locality 1: nothing crosses ranks
    assert half["remote_fraction"] > 0 and half["block_count"] >= half["remote_block_count"] > 0
    for name in ("ag_ms", "ga_ms", "backward_ag_ms", "backward_ga_ms", "plan_ms"):
        assert half[name] > 0, name
    ranks = [[r for r in records if "rank" in r["params"] and r["params"]["locality"] == b["params"]["locality"]]
             for b in blocks]  # each blocks measurement's per-rank records
    assert [[r["params"]["rank"] for r in found] for found in ranks] == [[0, 1], [0, 1]]
    _read_back(proc.stdout, ranks)


def _read_back(stdout, blocks):
    """The importer reads the printed block_info / AG / GA lines back into the per-rank records' numbers
    (blocks: each blocks measurement's per-rank records)."""
    from qbench.importers.moe import read_moe_log

    _, imported = read_moe_log(stdout)
    got_ranks = [r for r in imported if "rank" in r["params"]]
    assert len(imported) - len(got_ranks) == 4 and len(got_ranks) == 4  # 4 blocks; 2 ranks each of 2 blocks runs
    for measured, got in zip(blocks, (got_ranks[:2], got_ranks[2:])):
        for mine, read in zip(measured, got):
            m, g = mine["metrics"], read["metrics"]
            assert read["params"]["rank"] == mine["params"]["rank"]
            assert (g["block_count"], g["remote_block_count"]) == (m["block_count"], m["remote_block_count"])
            for name in ("ag_ms", "backward_ga_ms"):
                kept = mine["samples"][name][1:]  # the importer skips the first of 3 steps
                assert g[name] == pytest.approx(statistics.median(kept), abs=1e-6), (name, mine["params"]["rank"])
            assert g["remote_fraction"] == pytest.approx(m["remote_fraction"])


@pytest.mark.parametrize("W,L,B", [(1, 3, 4), (3, 2, 5), (4, 5, 64)])
def test_plan_kernels_match_the_tensor_op_plan(W, L, B):
    from qbench.layers.moe import blocks as moe_blocks

    gen = torch.Generator().manual_seed(W + L + B)
    counts = torch.randint(0, 150, (W, W * L), generator=gen) * (torch.rand(W, W * L, generator=gen) > 0.2)
    counts = counts.to("cpu" if interpreting() else "cuda")  # where the plan kernels run
    for rank in range(W):
        extra = (torch.arange(3, device=counts.device),)
        fast, got_extra = moe_blocks._build_plan_kernels(counts, rank, L, B, extra)
        slow, want_extra = moe_blocks._build_plan_ops(counts, rank, L, B, extra)
        assert got_extra == want_extra
        for name in ("num_blocks", "src_rows", "max_src_rows", "blocks_remote", "send_splits", "recv_splits",
                     "remote_rows"):
            assert getattr(fast, name) == getattr(slow, name), f"rank {rank}: {name}"
        for name in ("block_src", "block_row", "block_rows", "block_expert", "block_start", "offsets_local", "src_off"):
            a, b = getattr(fast, name), getattr(slow, name)
            assert a.tolist() == b.tolist(), f"rank {rank}: {name} {a.tolist()[:8]} vs {b.tolist()[:8]}"
