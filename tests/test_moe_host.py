"""What the bench sees of the MoE layer's host side: the layer's hook lists (the layer holds no bench
state) and the per-phase host times of an eager step, from a pass of their own. World size 1, no
process group (qbench.dist's reductions return a rank's own values)."""

from types import SimpleNamespace

import pytest
import torch

from qbench.benches.moe import MoEBenchConfig
from qbench.benches.moe.observe import Routed, last_plan, observed
from qbench.benches.moe.steps import host_phases
from qbench.layers.moe import MoELayer, MoEOptions
from qbench.layers.moe.routing import forced_choices, parse_routing
from qbench.timing import PhaseTimer, host_time

T, D, H, L = 37, 16, 24, 3  # odd sizes


def _layer(cf: float = 0.0, gemm: str = "reference") -> MoELayer:
    opts = MoEOptions(D, H, L, 2, capacity_factor=cf, gemm=gemm)
    return MoELayer(opts, rank=0, world_size=1, dtype=torch.float32, device="cpu", seed=1)


def _x(seed: int = 5):
    return torch.randn(T, D, generator=torch.Generator().manual_seed(seed))


def test_the_layer_keeps_no_bench_state():
    layer = _layer()
    for name in ("timer", "forced", "last"):
        assert not hasattr(layer, name), name


def test_phase_hooks_see_every_phase_in_order_until_removed():
    layer, seen = _layer(), []

    class Mark:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(("enter", self.name))

        def __exit__(self, *exc):
            seen.append(("exit", self.name))

    x = _x().requires_grad_()
    with observed(layer, Mark):
        layer(x).sum().backward()
    entered = [name for kind, name in seen if kind == "enter"]
    assert entered == ["gate", "plan", "experts", "combine", "backward_experts"], entered
    assert [name for kind, name in seen if kind == "exit"] == entered
    seen.clear()
    layer(x).sum().backward()  # the handle is removed: nothing more is seen
    assert seen == []


def test_two_phase_hooks_both_see_the_phases():
    layer, a, b = _layer(), PhaseTimer("cpu"), PhaseTimer("cpu")
    with observed(layer, a.phase), observed(layer, b.phase):
        layer(_x())
    assert sorted(a.results_ms()) == sorted(b.results_ms()) == ["combine", "experts", "gate", "plan"]


def test_a_routed_model_passes_its_forced_choice_and_the_plan_hook_sees_it():
    layer = _layer(cf=1.0)
    choice = forced_choices(parse_routing("uniform"), T, 2, layer.num_experts, rank=0, step=0)
    (routing, plan), out = last_plan(layer, lambda: Routed(layer, choice)(_x()))
    assert torch.equal(routing.idx, choice) and out.shape == (T, D)
    assert routing.weights.grad_fn is None  # the hook gets the detached routing
    assert list(Routed(layer, choice).parameters()) == list(layer.parameters())
    (gate_routing, _), _ = last_plan(layer, lambda: layer(_x()))
    assert not torch.equal(gate_routing.idx, choice)  # without the wrapper the gate routes


def test_host_time_keeps_the_phases_of_its_timed_calls_only():
    clocks, calls = PhaseTimer("cpu"), []

    def call():
        calls.append(1)
        with clocks.phase("a"):
            pass

    timing = host_time(call, device="cpu", warmup=2, repeat=5, phases=clocks)
    assert len(timing.samples_ms) == 5 and len(calls) > 5  # warm-up and settling calls ran too
    assert len(clocks.results_ms()["a"]) == 5


@pytest.mark.parametrize("cf", [0.0, 1.0], ids=["dropless", "capacity1"])
def test_host_phases_name_every_phase_in_ms(cf):
    layer, x = _layer(cf), _x()
    dy = torch.randn(T, D, generator=torch.Generator().manual_seed(6))
    config = MoEBenchConfig(world_size=1, backend="gloo", device="cpu", dtype="fp32", model_dim=D, hidden_size=H,
                            samples=T, num_steps=4, warmup=1, capacity_factor=cf)
    got = host_phases(SimpleNamespace(device="cpu", rank=0, world_size=1), config, layer, layer, x, dy)
    want = {"forward", "backward", "gate", "plan", "experts", "combine", "backward_experts"}
    assert set(got) == {f"host_{name}_ms" for name in want} | {"host_ms_instrumented"}
    assert all(v > 0 for v in got.values()), got
    # every phase nests inside its step's forward or backward, so its median is at most theirs
    for name in ("gate", "plan", "experts", "combine"):
        assert got[f"host_{name}_ms"] <= got["host_forward_ms"], name
    assert got["host_backward_experts_ms"] <= got["host_backward_ms"]
    assert not layer.phase_hooks  # the pass removed its hook
