"""Where an eager step's host time goes: the host time of each call that an eager training step of
SwitchBackLinear (global) makes, and of the torch calls behind nn.Linear's step, each timed alone.

    SwitchBack  forward   quantize_x (rowwise), quantize_w (global, both layouts), forward_matmul (int8,
                          with the bias)
                backward  weight_grad (16-bit G^T X), quantize_g (rowwise, with the bias gradient),
                          input_grad_matmul (int8, the forward's W^T)
    nn.Linear   forward (addmm), input_grad (G W), weight_grad (G^T X), bias_grad (G summed over rows)
Metrics (ms, medians of qbench.timing.host_time): host_call_<layer>_<call>_ms, and host_calls_<layer>_ms, the
sum over a layer's calls. What host_<layer>_eager_ms adds to that sum is the step's own cost: the module
call, the autograd Function or node, the backward's hand-over to autograd's engine thread and the gradient
accumulation. nn.Linear's calls are timed from Python, while autograd makes its backward calls from C++, so its
sum includes a little binding cost that its steps do not pay.
"""

from __future__ import annotations

from collections.abc import Callable


def calls(ops) -> dict[str, dict[str, Callable[[], object]]]:
    """layer -> call name -> the call, with the operands' X [M, K], G [M, N], W [N, K], a bias [N], and for the
    int8 products the operands' quantized X, G and W (ops.q: the same values the layer's quantizers give)."""
    import torch

    from kernels import switchback_matmul as sm
    from kernels import switchback_quantize as sq

    x, g, w, q = ops.x, ops.g, ops.w, ops.q
    bias = torch.linspace(-1, 1, w.shape[0], device=x.device, dtype=x.dtype)
    (xq, sx), (gq, sg), (wq, sw), (wtq, _) = q["x"], q["g"], q["w_global"], q["w_global_t"]
    return {
        "switchback": {
            "quantize_x": lambda: sq.quantize_rowwise(x),
            "quantize_w": lambda: sq.quantize_global_both(w),
            "forward_matmul": lambda: sm.int8_matmul_rowwise_global(xq, sx, wq, sw, bias, x.dtype),
            "weight_grad": lambda: g.t() @ x,
            "quantize_g": lambda: sq.quantize_rowwise_colsum(g),
            "input_grad_matmul": lambda: sm.int8_matmul_rowwise_global(gq, sg, wtq, sw, None, g.dtype),
        },
        "linear": {
            "forward": lambda: torch.nn.functional.linear(x, w, bias),
            "input_grad": lambda: g @ w,
            "weight_grad": lambda: g.t() @ x,
            "bias_grad": lambda: g.sum(dim=0),
        },
    }


def measure(ops) -> tuple[dict, dict]:
    """(metrics, samples): each call's host time, and each layer's sum over its calls (the sum of the
    calls' medians; its samples the i-th samples summed)."""
    from qbench.timing import host_time

    metrics, samples = {}, {}
    for layer, fns in calls(ops).items():
        timings = {name: host_time(fn, device=ops.device) for name, fn in fns.items()}
        for name, timing in timings.items():
            key = f"host_call_{layer}_{name}_ms"
            metrics[key], samples[key] = timing.median, list(timing.samples_ms)
        n = min(len(t.samples_ms) for t in timings.values())
        key = f"host_calls_{layer}_ms"
        metrics[key] = sum(t.median for t in timings.values())
        samples[key] = [sum(t.samples_ms[i] for t in timings.values()) for i in range(n)]
    return metrics, samples
