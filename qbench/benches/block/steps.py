"""Training steps of `qbench block`, in each execution mode, with their checks.

One training step of the block stack (qbench.layers.transformer.BlockStack), x [B, T, C] -> y:
    optimizer.zero_grad(set_to_none=True); loss = sum over tokens of mean_c (y - target)^2;
    loss.backward(); AdamW step (fused on CUDA; capturable, so the graph mode can capture it)
The loss sums over the B*T tokens (the mean over C only): a static loss scale, so fp16 gradients
(~ 2 (y - t) / C per element) stay normal numbers; AdamW's update does not depend on that scale.
Modes, as in the layer bench (modules.py):
    eager    the step as written
    compile  model + loss through torch.compile(fullgraph=True, dynamic=False); the optimizer eager
    graph    the whole eager step (forward, backward, optimizer) captured into one CUDA graph
Linear-layer time (linear_ms): the forward + backward (dX, dW, db) of the stack's own linear layers
alone, in the same mode, on inputs [B*T, in] and output gradients [B*T, out] of the step's shapes
(fresh N(0, 1) draws); compiled as one graph of all of them in compile mode, captured in graph mode.
It leaves out what fusion across a layer boundary can save in the full step, so linear_ms / step_ms
is the share of the step those layers' work would take on its own, not a profile of the step.
"""

from __future__ import annotations

from torch import nn

from qbench import modes

WARMUP_STEPS = 3  # compilation, Triton autotuning, AdamW state and allocator warm-up; never timed


class Objective(nn.Module):
    """(loss, y) of the stack on x against target: the region torch.compile sees in compile mode."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        y = self.model(x)
        loss = (y.float() - target.float()).square().mean(dim=-1).sum()
        return loss, y


def optimizer_of(model, device: str):
    import torch

    cuda = device == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda or None, capturable=cuda)


def objective(model, mode: str):
    """The step's loss region as `mode` runs it (compiled afresh per model in compile mode)."""
    return modes.compiled(Objective(model), mode)


def train_step(fn, optimizer, x, target, out: dict, reset: bool = True):
    """One training step; out keeps its loss and output. reset: gradients set to None first (a
    graph capture gets that outside the capture instead)."""

    def run():
        if reset:
            optimizer.zero_grad(set_to_none=True)
        loss, y = fn(x, target)
        loss.backward()
        optimizer.step()
        out["loss"], out["y"] = loss, y

    return run


def prepared_step(model, x, target, mode: str, after_warmup=lambda: None):
    """(the step to time, out, optimizer) after warm-up and, in graph mode, capture. after_warmup()
    runs in between: a peak-memory reset there covers the capture, where a graph allocates."""
    optimizer, out = optimizer_of(model, x.device.type), {}
    fn = objective(model, mode)

    def drop():
        optimizer.zero_grad(set_to_none=True)
        out.clear()

    step = modes.prepared_step(mode, lambda reset: train_step(fn, optimizer, x, target, out, reset),
                               warmup=WARMUP_STEPS, drop=drop, after_warmup=after_warmup)
    return step, out, optimizer


def restore(model, state: dict) -> None:
    """Copy the reference weights back in place (a captured graph keeps reading the same tensors)."""
    import torch

    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])


def results(model, out: dict) -> dict:
    """Host copies (fp32) of the step's output, loss and all gradients (one flat vector)."""
    import torch

    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    return {"output": out["y"].detach().float().cpu(), "loss": out["loss"].detach().float().cpu(),
            "grads": torch.cat(grads).float().cpu()}


def relative_errors(got: dict, want: dict) -> dict:
    """relerr_<name> = ||got - want|| / ||want|| for output, loss and gradients."""
    import torch

    return {f"relerr_{k}": float(torch.linalg.vector_norm(got[k] - want[k])
                                 / torch.linalg.vector_norm(want[k]).clamp_min(1e-30)) for k in want}


def linear_operands(linears, tokens: int, device, dtype, seed: int):
    """Per linear layer (x leaf [tokens, in] needing grad, g [tokens, out]); one draw per distinct
    shape, shared by the layers of that shape (each layer gets its own leaf, so its own dX)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    drawn = {}
    for layer in linears:
        shape = (layer.in_features, layer.out_features)
        if shape not in drawn:
            drawn[shape] = tuple(torch.randn(tokens, n, generator=gen, device=device, dtype=torch.float32).to(dtype)
                                 for n in shape)
    return [(drawn[(m.in_features, m.out_features)][0].detach().requires_grad_(True),
             drawn[(m.in_features, m.out_features)][1]) for m in linears]


class LinearsAlone(nn.Module):
    """Forward of every linear layer on its own input: the region compiled in compile mode."""

    def __init__(self, linears):
        super().__init__()
        self.linears = nn.ModuleList(linears)

    def forward(self, xs):
        return tuple(layer(x) for layer, x in zip(self.linears, xs))


def linears_step(linears, operands, mode: str):
    """The step that times the linear layers alone (see the module docstring), warmed up."""
    import torch

    xs, gs = [x for x, _ in operands], [g for _, g in operands]
    params = [p for layer in linears for p in layer.parameters()]
    fn = modes.compiled(LinearsAlone(linears), mode)

    def clear():
        for t in (*xs, *params):
            t.grad = None

    def step_of(reset: bool):
        def run():
            if reset:
                clear()
            torch.autograd.backward(fn(xs), gs)

        return run

    return modes.prepared_step(mode, step_of, warmup=WARMUP_STEPS, drop=clear)
