"""MoE pieces that need no process group: routing, capacity, row plans, seed-format lines, the CLI."""

import re
import subprocess
import sys

import pytest
import torch

from qbench.benches.moe import MoEBenchConfig, seed_flops, seed_lines
from qbench.layers.moe import plan as comm
from qbench.layers.moe.reference import reference_keep
from qbench.layers.moe.routing import capacity_limit, forced_choices, parse_routing, route
from tests.helpers import env_without_interpreter

# The seeds' own line formats (copied from seed 002), used to parse what --seed-format prints.
SEED_STEP = re.compile(r"STEP-(\d+): step_time = ([\d.]+) ms, foward_time = ([\d.]+), "
                       r"backward_time = ([\d.]+), perf = ([\d.]+) tflops\.")
SEED_SUMMARY = re.compile(r"\[Summary\] Average synchronized step_time = ([\d.]+) ms, "
                          r"forward = ([\d.]+), backward = ([\d.]+)\.")


def test_seed_lines_from_the_fixture_parse():
    text = (__import__("pathlib").Path(__file__).parent / "fixtures" / "seed_moe_baseline.log").read_text()
    assert SEED_STEP.search(text) and SEED_SUMMARY.search(text)


def test_parse_routing_accepts_the_kinds_and_names_bad_ones():
    assert parse_routing("zipf:1.5").zipf_s == 1.5 and parse_routing("rand-skew").kind == "rand-skew"
    assert parse_routing("trace:a.txt").trace == "a.txt"
    for bad, word in [("gauss", "unknown routing"), ("zipf:x", "exponent"), ("zipf:-1", "> 0"), ("trace:", "file")]:
        with pytest.raises(ValueError, match=word):
            parse_routing(bad)


@pytest.mark.parametrize("cf", [0.0, 1.0, 0.5, -0.75, -2.0])
def test_route_drops_match_the_reference_loop(cf):
    gen = torch.Generator().manual_seed(int(abs(cf) * 100) + 3)
    T, E, k = 53, 7, 2
    logits = torch.rand(T, E, generator=gen) + torch.linspace(0, 2, E)  # skewed on purpose
    r = route(logits, k, cf)
    want = reference_keep(r.idx, cf, E)
    got = r.keep.view(k, T).t()
    mismatch = (got != want).nonzero()
    assert mismatch.numel() == 0, f"first mismatches (token, choice): {mismatch[:5].tolist()}"
    assert int(r.kept.sum()) + int((~r.keep).sum()) == T * k  # kept + dropped = assignments
    if cf != 0:
        assert int(r.kept.max()) <= capacity_limit(cf, T, k, E)
    assert torch.allclose(r.weights.sum(1), torch.ones(T))


def test_forced_uniform_is_balanced_and_zipf_is_skewed():
    T, k, E = 96, 2, 8
    uni = forced_choices(parse_routing("uniform"), T, k, E, rank=1, step=0)
    assert torch.bincount(uni.flatten(), minlength=E).tolist() == [T * k // E] * E
    assert (uni[:, 0] != uni[:, 1]).all()
    z = forced_choices(parse_routing("zipf:2.0"), T, k, E, rank=0, step=0)
    counts = torch.bincount(z.flatten(), minlength=E).float()
    assert counts.max() / counts.mean() > 2.0


def test_chunk_parts_match_parts_and_send_rows_are_a_permutation():
    assert comm.parts(7, 3) == [3, 2, 2] and comm.parts(1, 4) == [1, 0, 0, 0] and comm.parts(0, 2) == [0, 0]
    counts = torch.tensor([7, 1, 0, 5, 13])
    for D in (1, 2, 3, 4):
        got = comm.chunk_parts(counts, D).tolist()
        assert got == [comm.parts(c, D) for c in counts.tolist()], f"degree {D}: {got}"
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(37, 6, generator=gen)
    r = route(logits, 2, 0.0)
    for D in (1, 3):
        rows = comm.send_rows(r, comm.chunk_parts(r.kept, D), None)
        assert sorted(rows.tolist()) == list(range(74)), f"degree {D}: rows are not a permutation"


def test_segment_offsets_follow_the_received_order():
    D = 2  # 3 ranks x 2 local experts
    got = comm.chunk_parts(torch.tensor([2, 0, 3, 1, 1, 2]), D)  # (source, expert) received rows
    offsets, offsets_all = comm.segment_offsets(got)
    # chunk 0 receives (s, l) parts 1, 0, 2, 1, 1, 1; chunk 1 receives 1, 0, 1, 0, 0, 1
    assert offsets.tolist() == [[0, 1, 1, 3, 4, 5, 6], [0, 1, 1, 2, 2, 2, 3]]
    assert offsets_all.tolist() == [0, 1, 1, 3, 4, 5, 6, 7, 7, 8, 8, 8, 9]


def test_one_chunk_send_rows_are_sorted_by_expert():
    r = route(torch.randn(41, 5, generator=torch.Generator().manual_seed(3)), 2, 0.0)
    rows = comm.send_rows(r, comm.chunk_parts(r.kept, 1), None)
    order = r.flat_e[rows.argsort()]
    assert (order[1:] >= order[:-1]).all(), f"experts in send order: {order.tolist()}"


def test_hottest_device_matches_host():
    for kept in ([5, 9, 9, 1], [3, 3, 3], [0, 4, 4, 7, 1]):
        for n in (1, 2, 5):
            got = comm.hottest_device(torch.tensor(kept), n).tolist()
            assert got == comm.hottest(kept, n), f"{kept}, n={n}: {got}"


def test_hottest_breaks_ties_to_the_lower_id():
    assert comm.hottest([5, 9, 9, 1], 2) == [1, 2]
    assert comm.hottest([3, 3, 3], 5) == [0, 1, 2]


def test_seed_format_lines_parse_with_the_seed_pattern():
    record = {"params": {"world_size": 4, "dtype": "float16", "model_dim": 1024, "hidden_size": 4096,
                         "samples": 8192, "num_local_experts": 8, "top_k": 2, "a2a_ffn_overlap_degree": 1},
              "samples": {"step_ms": [27.462656, 3.1], "forward_ms": [25.060352, 1.0],
                          "backward_ms": [2.301952, 2.0]}, "device": "cuda"}
    lines = seed_lines([record])
    assert lines[0].startswith("[Benchmark] world_size = 4, dtype = float16") and "device = `cuda:0`" in lines[0]
    steps = [SEED_STEP.match(line) for line in lines[1:3]]
    assert all(steps) and steps[0].group(5) == "30.03"  # the seeds' own check: 824.6 GFLOP / 27.46 ms
    assert SEED_SUMMARY.match(lines[3])


def test_seed_flops_formula():
    config = MoEBenchConfig(world_size=4, backend="nccl", device="cuda")
    assert seed_flops(config) == 8192 * 1024 * 4096 * 4 * 2 * 3


def _qbench(*args):
    return subprocess.run([sys.executable, "-m", "qbench", "moe", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, word", [
    (["--routing", "gauss"], "unknown routing"),
    (["--device", "cuda"], "no CUDA device"),
    (["--top-k", "9", "--num-local-experts", "2", "--world-size", "2", "--device", "cpu"], "exceeds"),
    (["--replicate-hot", "-1"], ">= 0"),
    (["--routing", "trace:/nonexistent.txt", "--device", "cpu"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, word):
    if "--device" in args and "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = _qbench(*args)
    assert proc.returncode == 2, proc.stderr
    assert word in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_help_ends_with_examples_and_does_not_import_torch():
    code = ("import sys; from qbench.cli import main\n"
            "try:\n    main(['moe', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Examples:" in proc.stdout and "torchrun" in proc.stdout


def test_resolve_fills_the_cpu_defaults_and_the_flag_accepts_dtype_aliases():
    from qbench.benches.moe import MoEBenchConfig, resolve
    from qbench.commands.moe import command

    none = dict.fromkeys(("dtype", "model_dim", "hidden_size", "samples", "num_steps", "warmup"))
    config = resolve(MoEBenchConfig(world_size=None, backend="auto", device="cpu", **none))
    assert (config.world_size, config.backend, config.dtype, config.model_dim, config.samples) == (2, "gloo", "fp32",
                                                                                                   64, 256)
    for spelling in ("float16", "fp16", "half"):
        assert command.make_context("moe", ["--dtype", spelling]).params["dtypes"] == ("fp16",)


def test_world_size_1_without_triton_matches_the_reference():
    """Where no Triton kernel can run (a CPU without the interpreter), torch routes and the world-size-1 node
    builds the send buffer's tokens itself: its outputs and gradients still match the dense reference."""
    code = ("import torch\n"
            "from qbench.layers.moe import MoELayer, MoEOptions\n"
            "from qbench.layers.moe.reference import check_layer\n"
            "for cf in (0.0, 1.0, -0.5):\n"
            "    layer = MoELayer(MoEOptions(32, 48, 4, 2, capacity_factor=cf), rank=0, world_size=1,\n"
            "                     dtype=torch.float32, device='cpu', seed=2)\n"
            "    gen = torch.Generator().manual_seed(3)\n"
            "    x, dy = torch.randn(96, 32, generator=gen), torch.randn(96, 32, generator=gen)\n"
            "    r = check_layer(layer, x, dy)\n"
            "    bad = {k: v for k, v in r.errors.items() if not v <= r.tolerance}\n"
            "    assert not bad and r.dropped == r.dropped_reference, (cf, bad, r)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=env_without_interpreter())
    assert proc.returncode == 0, proc.stderr
