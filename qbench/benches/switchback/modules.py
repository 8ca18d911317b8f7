"""Module-level training steps of `qbench switchback`, in the three ways training runs.

SwitchBackLinear (global) against nn.Linear, each doing forward + backward (dX, dW, db) on the same X
[M, K] and output gradient G [M, N], run
  eager    layer(x).backward(g) as written;
  compile  torch.compile(layer, fullgraph=True) (inductor, static shapes: one compilation per shape,
           so the recompile limit never sends a shape back to eager);
  graph    the whole eager step captured into one CUDA graph and replayed (GPU only).
Metrics (ms; eager keeps the historic names):
  module_switchback_ms, module_linear_ms, speedup_module                 eager
  module_switchback_<m>_ms, module_linear_<m>_ms, speedup_module_<m>     m = compile, graph
  host_switchback_<m>_ms, host_linear_<m>_ms   CPU time spent issuing one step (every mode)
  module_kernel_ratio_<m>   speedup_module_<m> / speedup_global: how much of the kernel-sum speed-up
                            the module keeps (1.0: all of it)
Before a mode is timed its step is checked: eager SwitchBack against nn.Linear (relative error of the
output and of dX within the int8 bound), compiled and graphed against eager (same kernels).
"""

from __future__ import annotations

EXECS = ("eager", "compile", "graph")
INT8_REL_ERROR = 0.05  # int8 forward / grad-input against 16-bit: ~1e-2 on N(0, 1) data
SAME_KERNELS_REL_ERROR = 1e-2  # compile/graph vs eager: same kernels, the 16-bit dW may reorder sums


def supported_execs(device: str) -> tuple[str, ...]:
    return EXECS if device == "cuda" else ("eager", "compile")


def _layers(ops):
    import torch

    from qbench.layers.switchback import SwitchBackLinear

    K, N = ops.x.shape[1], ops.w.shape[0]
    sb = SwitchBackLinear(K, N, device=ops.device, dtype=ops.dtype)
    ref = torch.nn.Linear(K, N, device=ops.device, dtype=ops.dtype)
    with torch.no_grad():
        for layer in (sb, ref):
            layer.weight.copy_(ops.w)
            layer.bias.copy_(torch.linspace(-1, 1, N, device=ops.device, dtype=ops.dtype))
    return {"switchback": sb, "linear": ref}


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
    """(the step to time, the step's results [y, dX, dW, db]) in one execution mode."""
    import torch

    from qbench.timing import graph_replay

    if mode == "compile":
        torch._dynamo.reset()
        layer = torch.compile(layer, fullgraph=True, dynamic=False)
    out: dict = {}
    step = _step(layer, x, g, out)
    for _ in range(3):  # compilation, autotuning and allocator warm-up, outside any capture
        step()
    if mode == "graph":
        torch.cuda.synchronize()
        step = graph_replay(_step(layer, x, g, out, reset=False), lambda: _clear(layer, x, out))
    step()
    if x.is_cuda:
        torch.cuda.synchronize()
    return step, [t.detach().clone() for t in (out["y"], x.grad, layer.weight.grad, layer.bias.grad)]


def measure(ops, execs, *, repeat, budget_ms) -> tuple[dict, dict, str | None]:
    """(metrics, samples, first failure or None) of the module steps in each execution mode. Eager
    results are taken first: SwitchBack against nn.Linear, then every mode against eager."""
    from qbench.timing import host_time, time_fn

    x = ops.x.detach().requires_grad_(True)
    layers = _layers(ops)
    eager = {name: _prepare("eager", layer, x, ops.g)[1] for name, layer in layers.items()}
    # SwitchBack's int8 output and dX against the 16-bit layer (dW and db are 16-bit in both)
    failure = _mismatch(eager["switchback"][:2], eager["linear"][:2], INT8_REL_ERROR)
    if failure:
        return {}, {}, f"SwitchBackLinear vs nn.Linear: {failure}"
    metrics, samples = {}, {}
    for mode in execs:
        for name, layer in layers.items():
            step, got = _prepare(mode, layer, x, ops.g)
            failure = _mismatch(got, eager[name], SAME_KERNELS_REL_ERROR)
            if failure:
                return metrics, samples, f"{mode} {name} differs from eager: {failure}"
            timing = time_fn(step, device=ops.device, repeat=repeat, budget_ms=budget_ms, flush_l2=True)
            key = f"module_{name}_ms" if mode == "eager" else f"module_{name}_{mode}_ms"
            metrics[key], samples[key] = timing.median, list(timing.samples_ms)
            metrics[f"host_{name}_{mode}_ms"] = host_time(step, device=ops.device).median
            del step
    return metrics, samples, None


def derive(metrics: dict) -> dict:
    """Speed-ups of the module over nn.Linear per mode, and their ratio to the kernel-sum speed-up."""
    out = {}
    for mode in EXECS:
        suffix = "" if mode == "eager" else f"_{mode}"
        sb, ref = metrics.get(f"module_switchback{suffix}_ms"), metrics.get(f"module_linear{suffix}_ms")
        if sb and ref:
            out[f"speedup_module{suffix}"] = ref / sb
            if metrics.get("speedup_global"):
                out[f"module_kernel_ratio_{mode}"] = out[f"speedup_module{suffix}"] / metrics["speedup_global"]
    return out
