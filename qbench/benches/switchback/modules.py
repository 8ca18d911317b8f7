"""Module-level training steps of `qbench switchback`, in the three ways training runs.

SwitchBackLinear (global), with the fp8 variants Fp8Linear (recipes switchback and all), and with the
torchao variant torchao's Float8Linear (recipe rowwise; only where torchao is importable, never a
dependency), against nn.Linear, each doing forward + backward (dX, dW, db) on the same X [M, K] and
output gradient G [M, N], run
  eager    layer(x).backward(g) as written;
  compile  torch.compile(layer, fullgraph=True) (inductor, static shapes: one compilation per shape,
           so the recompile limit never sends a shape back to eager);
  graph    the whole eager step captured into one CUDA graph and replayed (GPU only).
Metrics (ms; eager keeps the historic names):
  module_<layer>_ms, speedup_module[_fp8|_fp8_all|_torchao]                   eager
  module_<layer>_<m>_ms, speedup_module[_fp8|_fp8_all|_torchao]_<m>            m = compile, graph
  host_<layer>_<m>_ms   CPU time spent issuing one step (every mode)
  host_call_<layer>_<call>_ms, host_calls_<layer>_ms   with eager: each call the eager steps make, timed
                        alone, and their sum (benches/switchback/host_calls.py)
  module_kernel_ratio_<m>   speedup_module_<m> / speedup_global: how much of the kernel-sum speed-up
                            the module keeps (1.0: all of it)
  chain_<total>_<m>_ms      the kernels of a total (time_standard, time_global) run back to back as one
                            CUDA graph, timed in the same rounds as the mode's module steps
  speedup_chain_<m>         chain_standard_<m>_ms / chain_global_<m>_ms: the kernel-sum speed-up in the
                            module steps' regime
  module_chain_ratio_<m>    speedup_module_<m> / speedup_chain_<m>
  sm_clock_mhz_<m>, power_w_<m>   the GPU's SM clock and power over the mode's rounds (medians, NVML;
                            qbench.telemetry), beside sm_clock_mhz_kernels / power_w_kernels of the
                            components timed alone
  loop_<layer>_<m>_ms, loop_chain_<total>_<m>_ms   the same steps and chains timed as a training loop
                            runs them (qbench.timing.time_loops: blocks of steps issued back to back, so
                            a host faster than the GPU stays hidden, each block in its own layer's regime
                            of clocks and power); the module_* times above start every step on an idle
                            device, one step of each layer per round
  speedup_loop[_fp8|_fp8_all]_<m>, speedup_loop_chain_<m>, loop_kernel_ratio_<m>, loop_chain_ratio_<m>
                            the speed-ups and ratios above, from the loop times
Why the chains: the components are timed one at a time with the GPU idling in between, the module steps
back to back, and an H200 runs the int8 kernels markedly slower under sustained load than isolated (the
16-bit ones less so; README, switchback section), so module_kernel_ratio mixes the layer's own overhead
with the GPU's clocks under load; module_chain_ratio compares like with like.
Before a mode is timed its step is checked: eager SwitchBack against nn.Linear (relative error of the
output and of dX within the int8 bound), compiled and graphed against eager (same kernels).
"""

from __future__ import annotations

from qbench.dtypes import tolerance
from qbench.modes import EXECS

# the 8-bit format of each low-precision module, whose qbench.dtypes tolerance bounds its output and
# grad-input against nn.Linear's (torchao's rowwise recipe keeps gradients in e4m3)
FORMAT_OF = {"switchback": "int8", "fp8": "fp8", "fp8_all": "fp8", "torchao": "fp8"}
SAME_KERNELS_REL_ERROR = 1e-2  # compile/graph vs eager: same kernels, the 16-bit dW may reorder sums


def _layers(ops, variants):
    """name -> layer with the operands' W and one bias: SwitchBack (global), nn.Linear, the fp8 layers
    when asked for and the GPU runs fp8 matmuls (peers.fp8_supported), and torchao's Float8Linear when
    asked for and it can run (qbench.layers.transformer.unavailable) at this shape (torchao_takes)."""
    import copy

    import torch

    from qbench.benches.switchback.peers import fp8_supported
    from qbench.layers.fp8 import Fp8Linear
    from qbench.layers.switchback import SwitchBackLinear
    from qbench.layers.transformer import torchao_linear, unavailable

    K, N = ops.x.shape[1], ops.w.shape[0]
    kw = {"device": ops.device, "dtype": ops.dtype}
    layers = {"switchback": SwitchBackLinear(K, N, **kw), "linear": torch.nn.Linear(K, N, **kw)}
    if fp8_supported(ops):
        layers.update({name: Fp8Linear(K, N, **kw, recipe=recipe) for name, recipe in
                       (("fp8", "switchback"), ("fp8_all", "all")) if name in variants})
    with torch.no_grad():
        for layer in layers.values():
            layer.weight.copy_(ops.w)
            layer.bias.copy_(torch.linspace(-1, 1, N, device=ops.device, dtype=ops.dtype))
    if "torchao" in variants and unavailable("torchao", ops.device) is None and torchao_takes(ops):
        # its own copy of the parameters: a layer's step (and its graph) owns its gradients
        layers["torchao"] = torchao_linear(copy.deepcopy(layers["linear"]))
    return layers


def torchao_takes(ops) -> bool:
    """Whether torchao's Float8Linear runs at the operands' shape (M, K, N; transformer.torchao_shape_reason)."""
    from qbench.layers.transformer import torchao_shape_reason

    return torchao_shape_reason(*ops.x.shape, ops.w.shape[0]) is None


def _step(layer, x, g, out: dict, reset: bool = True):
    """One training step of the layer, its output kept in out["y"]; reset: grads set to None first
    (eager and compiled steps; a graph capture gets them reset outside it, see _clear)."""

    def run():
        if reset:
            _clear(layer, x)
        out["y"] = layer(x)
        out["y"].backward(g)

    return run


def _clear(layer, x, out: dict | None = None):
    """Drop the gradients (and the kept output): tensors freed inside a capture invalidate it."""
    x.grad = layer.weight.grad = layer.bias.grad = None
    if out is not None:
        out.clear()


def _rel(a, b) -> float:
    import torch

    diff = torch.linalg.vector_norm(a.float() - b.float())
    return float(diff / torch.linalg.vector_norm(b.float()).clamp_min(1e-30))


def _mismatch(got: list, want: list, bound: float, names=("output", "dX", "dW", "db")) -> str | None:
    for name, a, b in zip(names, got, want):
        err = _rel(a, b)
        if not err <= bound:
            return f"{name} relative error {err:.2e} > {bound:.0e}"
    return None


def _prepare(mode: str, layer, x, g):
    """(the step to time, the step's results [y, dX, dW, db]) in one execution mode. The step takes X as a
    leaf of its own: a leaf shared by every layer's step would keep one gradient accumulator for X, made on
    the stream of whichever step ran first, and a later capture (another stream) that reused it would fail."""
    import torch

    from qbench.modes import compiled, prepared_step

    x = x.detach().requires_grad_(True)
    layer = compiled(layer, mode, reset=False)  # _measure_mode resets dynamo once per mode
    out: dict = {}
    step = prepared_step(mode, lambda reset: _step(layer, x, g, out, reset), warmup=3,
                         drop=lambda: _clear(layer, x, out))
    step()
    if x.is_cuda:
        torch.cuda.synchronize()
    return step, [t.detach().clone() for t in (out["y"], x.grad, layer.weight.grad, layer.bias.grad)]


def measure(ops, execs, variants, *, repeat, budget_ms, trace=None) -> tuple[dict, dict, str | None]:
    """(metrics, samples, first failure or None) of the module steps in each execution mode. Eager
    results are taken first: SwitchBack against nn.Linear, then every mode against eager. trace: (directory,
    label) to profile each layer's eager step after its timing (see trace), or None."""
    from qbench.benches.switchback import host_calls

    layers = _layers(ops, variants)
    eager = {name: _prepare("eager", layer, ops.x, ops.g)[1] for name, layer in layers.items()}
    # the low-precision outputs and dX against the 16-bit layer (dW and db are 16-bit in SwitchBack)
    for name in (n for n in layers if n != "linear"):
        failure = _mismatch(eager[name][:2], eager["linear"][:2], tolerance(FORMAT_OF[name]).vs_16bit)
        if failure:
            return {}, {}, f"{name} layer vs nn.Linear: {failure}"
    metrics, samples = {}, {}
    chains = _chains(ops)
    for mode in execs:
        failure = _measure_mode(mode, layers, eager, chains, ops, metrics, samples, repeat=repeat,
                                budget_ms=budget_ms, trace=trace)
        if failure:
            return metrics, samples, failure
    if "eager" in execs:  # where the eager steps' host time goes: each of their calls alone
        call_metrics, call_samples = host_calls.measure(ops)
        metrics.update(call_metrics)
        samples.update(call_samples)
    return metrics, samples, None


def _measure_mode(mode, layers, eager, chains, ops, metrics, samples, *, repeat, budget_ms, trace) -> str | None:
    """One execution mode's module steps, checked against eager and timed beside the kernel chains, into
    metrics and samples; the first mismatch, or None. The mode's steps are local to this call, so they are
    gone before the next mode's are made: each keeps its last output, whose autograd graph holds the
    parameters' gradient accumulators, made on this mode's stream; a capture reusing them from its own
    stream fails ("operation failed due to a previous error during capture")."""
    import torch

    from qbench.telemetry import GpuReadings
    from qbench.timing import DEFAULT_BUDGET_MS, host_time, time_interleaved, time_loops

    if mode == "compile":
        torch._dynamo.reset()  # fresh caches once per mode: every layer's compiled step stays valid
    steps = {}
    for name, layer in layers.items():
        steps[name], got = _prepare(mode, layer, ops.x, ops.g)
        failure = _mismatch(got, eager[name], SAME_KERNELS_REL_ERROR)
        if failure:
            return f"{mode} {name} differs from eager: {failure}"
    # the layers' steps and the kernel chains interleaved, so their ratios do not move with the
    # machine's drift and every one runs in the same (sustained) regime
    readings = GpuReadings(ops.device)  # the clock and power of the mode's rounds
    calls, budget = {**steps, **chains}, (budget_ms or DEFAULT_BUDGET_MS) * (len(steps) + len(chains))
    timings = time_interleaved(calls, device=ops.device, repeat=repeat, budget_ms=budget, observe=readings)
    metrics.update(readings.metrics(mode))
    for name, timing in timings.items():
        key = f"{name}_{mode}_ms" if name in chains else (
            f"module_{name}_ms" if mode == "eager" else f"module_{name}_{mode}_ms")
        metrics[key], samples[key] = timing.median, list(timing.samples_ms)
        if name in steps:  # its samples kept: host time varies from run to run (README, reruns)
            host, key = host_time(steps[name], device=ops.device), f"host_{name}_{mode}_ms"
            metrics[key], samples[key] = host.median, list(host.samples_ms)
    for name, timing in time_loops(calls, device=ops.device, repeat=repeat, budget_ms=budget).items():
        key = f"loop_{name}_{mode}_ms"
        metrics[key], samples[key] = timing.median, list(timing.samples_ms)
    if trace and mode == "eager":
        for name, layer in layers.items():
            _trace(layer, ops, trace[0], f"{name}-{trace[1]}")
    return None


def _trace(layer, ops, out_dir: str, label: str):
    """3 eager training steps of the layer under the profiler (qbench.traces.record_training_steps):
    <label>-rank0.json.gz and .csv in out_dir."""
    from qbench.traces import record_training_steps

    x = ops.x.detach().requires_grad_(True)
    return record_training_steps(lambda: layer(x), lambda y: y.backward(ops.g), out_dir, label,
                                 before=lambda: _clear(layer, x))


CHAINS = ("standard", "global")  # the totals re-timed as chains (components.TOTALS["time_<name>"])


def _chains(ops) -> dict:
    """chain_<name> -> the step running the kernels of TOTALS["time_<name>"] back to back: one CUDA graph
    replay on a GPU (no host time between kernels), the plain calls elsewhere."""
    from qbench.benches.switchback.components import TOTALS, components
    from qbench.timing import graph_replay

    fns = components(ops, ("global",))
    chains = {}
    for name in CHAINS:
        parts = [fns[key] for key in TOTALS[f"time_{name}"]]

        def run(parts=parts):
            for part in parts:
                part()

        run()  # compilation and autotuning outside the capture
        chains[f"chain_{name}"] = graph_replay(run) if ops.device == "cuda" else run
    return chains


def _speedup_key(name: str, mode: str) -> str:
    return "speedup_module" + ("" if name == "switchback" else f"_{name}") + ("" if mode == "eager" else f"_{mode}")


def derive(metrics: dict) -> dict:
    """Speed-ups of each module over nn.Linear per mode, and SwitchBack's ratio to the kernel-sum
    speed-up, isolated (module_kernel_ratio_<mode>) and chained (module_chain_ratio_<mode>); the same
    from the loop times (speedup_loop..., loop_kernel_ratio_<mode>, loop_chain_ratio_<mode>)."""
    out = {}
    for mode in EXECS:
        suffix = "" if mode == "eager" else f"_{mode}"
        times = {name: metrics.get(f"module_{name}{suffix}_ms") for name in LAYERS}
        out.update(_ratios(times, {n: metrics.get(f"chain_{n}_{mode}_ms") for n in CHAINS}, metrics, mode,
                           speedup=lambda name, m=mode: _speedup_key(name, m), prefix="module",
                           chain_key=f"speedup_chain_{mode}"))
        times = {name: metrics.get(f"loop_{name}_{mode}_ms") for name in LAYERS}
        out.update(_ratios(times, {n: metrics.get(f"loop_chain_{n}_{mode}_ms") for n in CHAINS}, metrics, mode,
                           speedup=lambda name, m=mode: _loop_speedup_key(name, m), prefix="loop",
                           chain_key=f"speedup_loop_chain_{mode}"))
    return out


LAYERS = ("linear", "switchback", "fp8", "fp8_all", "torchao")


def _loop_speedup_key(name: str, mode: str) -> str:
    return "speedup_loop" + ("" if name == "switchback" else f"_{name}") + f"_{mode}"


def _ratios(times: dict, chain_times: dict, metrics: dict, mode: str, speedup, prefix: str, chain_key: str) -> dict:
    """Each layer's speed-up over nn.Linear (times: layer -> ms; speedup(layer): its key), and SwitchBack's
    speed-up over the kernel sum's (<prefix>_kernel_ratio_<mode>) and over the chained kernels'
    (<prefix>_chain_ratio_<mode>, with the chains' own speed-up under chain_key)."""
    out, ref = {}, times["linear"]
    for name in LAYERS[1:]:
        if times[name] and ref:
            out[speedup(name)] = ref / times[name]
    module = out.get(speedup("switchback"))
    if module and metrics.get("speedup_global"):
        out[f"{prefix}_kernel_ratio_{mode}"] = module / metrics["speedup_global"]
    if chain_times["standard"] and chain_times["global"]:
        out[chain_key] = chain_times["standard"] / chain_times["global"]
        if module:
            out[f"{prefix}_chain_ratio_{mode}"] = module / out[chain_key]
    return out
