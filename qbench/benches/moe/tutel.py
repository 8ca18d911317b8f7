"""`--variant tutel`: Tutel's moe_layer (github.com/microsoft/tutel; optional, never a dependency) timed beside
qbench's layer at the same configuration, on the same inputs, with the same timer and the same check.

Tutel's layer takes the weights of the qbench MoELayer that variant a2a builds (same seed), with the gate's
bias zero (Tutel's gate has none), so that both compute the same function:
    gates[0].wg.weight [E, d] = gate.weight          experts.batched_fc1_w [L, h, d] = w1 [L, d, h] transposed
    experts.batched_fc1_bias [L, h] = b1             experts.batched_fc2_w [L, h, d] = w2
    experts.batched_fc2_bias [L, d] = b2
and its output and gradients are checked against the dense fp32 reference of that twin layer, over the
experts Tutel chose (recorded from its extract_critical during the check): Tutel takes its top-k of the
softmax scores in the gate's dtype, so in fp16 two experts whose logits differ by less than a score's
rounding tie there and may go either way, while qbench's layer ranks the logits. Tutel normalizes the k
chosen scores as qbench does, and qbench's capacity follows Tutel's. Tutel routes with its own gate: forced
routings (uniform, zipf, trace, locality) and replication are qbench options, not Tutel's (validate.py refuses
them).
The record's params carry tutel_version (the installed distribution's) and tutel_commit (a COMMIT file next
to the package, which scripts/gpu_moe.sh writes when it installs a carried source; "unknown" without it).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from qbench.layers.moe.hooks import HookList
from qbench.layers.moe.reference import TOLERANCE, CheckResult, reference, rel_error


def tutel_info() -> dict[str, str] | None:
    """{"tutel_version", "tutel_commit"} where Tutel's moe_layer imports, else None."""
    try:
        import tutel
        from tutel import moe  # noqa: F401 - what --variant tutel needs
    except Exception:  # noqa: BLE001 - any failure to import (missing, or built for another torch) means absent
        return None
    from importlib import metadata

    try:
        version = metadata.version("tutel")
    except metadata.PackageNotFoundError:
        version = "unknown"
    commit = Path(tutel.__file__).parent / "COMMIT"
    return {"tutel_version": version, "tutel_commit": commit.read_text().strip() if commit.is_file() else "unknown"}


class TutelLayer(nn.Module):
    """Tutel's moe_layer with the weights of `twin` (a qbench MoELayer), behind qbench's forward(x, choice)
    (choice must be None: Tutel's gate routes). phase_hooks / plan_hooks: empty lists (Tutel's phases are its
    own), so that the bench's instrumented passes time forward and backward only."""

    def __init__(self, twin, group=None):
        super().__init__()
        from tutel import moe as tutel_moe

        opts = twin.opts
        act = torch.nn.functional.gelu if opts.activation == "gelu" else torch.nn.functional.relu
        gate = {"type": "top", "k": opts.top_k, "fp32_gate": opts.fp32_gate, "capacity_factor": opts.capacity_factor}
        experts = {"type": "ffn", "num_experts_per_device": opts.num_local_experts,
                   "hidden_size_per_expert": opts.hidden_size, "activation_fn": act}
        self.layer = tutel_moe.moe_layer(gate_type=gate, experts=experts, model_dim=opts.model_dim,
                                         scan_expert_func=lambda name, p: setattr(p, "expert", True),
                                         a2a_ffn_overlap_degree=opts.a2a_ffn_overlap_degree,
                                         group=group).to(device=twin.w1.device, dtype=twin.w1.dtype)
        self.gate_weight.data = self.gate_weight.data.to(twin.gate.weight.dtype)  # fp32 with fp32_gate
        with torch.no_grad():
            e = self.layer.experts
            self.gate_weight.copy_(twin.gate.weight)
            e.batched_fc1_w.copy_(twin.w1.transpose(1, 2))
            e.batched_fc1_bias.copy_(twin.b1)
            e.batched_fc2_w.copy_(twin.w2)
            e.batched_fc2_bias.copy_(twin.b2)
        self.phase_hooks, self.plan_hooks = HookList(), HookList()
        self.twin = (twin,)  # in a tuple: not a submodule (its parameters are not this layer's)
        self.opts, self.num_experts = twin.opts, twin.num_experts

    @property
    def gate_weight(self):
        return self.layer.gates[0].wg.weight

    def forward(self, x, choice=None):
        if choice is not None:
            raise ValueError("Tutel's layer routes with its own gate: no forced choice")
        return self.layer(x)

    def grads(self) -> dict:
        """This rank's parameter gradients in qbench's layout: gate.weight, w1 [L, d, h], b1, w2, b2."""
        e = self.layer.experts
        return {"gate.weight": self.gate_weight.grad, "w1": e.batched_fc1_w.grad.transpose(1, 2),
                "b1": e.batched_fc1_bias.grad, "w2": e.batched_fc2_w.grad, "b2": e.batched_fc2_bias.grad}


def zero_gate_bias(twin) -> None:
    """The twin computes Tutel's function: a gate without bias."""
    with torch.no_grad():
        twin.gate.bias.zero_()


@contextmanager
def tutel_choices():
    """Within the block, every forward of a Tutel moe_layer appends the experts it chose, [T, k] int64 (choice
    j of token t at [t, j]), to the yielded list: Tutel's own extract_critical, wrapped for the duration."""
    from tutel.impls import moe_layer

    chosen, original = [], moe_layer.extract_critical

    def recording(scores, *args, **kwargs):
        crit, loss = original(scores, *args, **kwargs)
        chosen.append(torch.stack([i.long() for i in crit[1]], dim=1))  # crit[1]: k tensors [T] of expert ids
        return crit, loss

    moe_layer.extract_critical = recording
    try:
        yield chosen
    finally:
        moe_layer.extract_critical = original


def check_tutel(layer: TutelLayer, x, dy) -> CheckResult:
    """Tutel's forward + backward against the dense reference of `twin` (same weights, over the experts Tutel
    chose for these tokens). Rows conservation is Tutel's own affair: not counted here."""
    (twin,) = layer.twin
    for p in layer.parameters():
        p.grad = None
    xl = x.detach().clone().requires_grad_()
    with tutel_choices() as chosen:
        out = layer(xl)
    out.backward(dy)
    ref_out, ref_dx, ref_gate, ref_experts, ref_dropped = reference(twin, x, dy, chosen[-1])
    errors = {"out": rel_error(out, ref_out), "dx": rel_error(xl.grad, ref_dx)}
    want = {"gate.weight": ref_gate[0], **dict(zip(("w1", "b1", "w2", "b2"), ref_experts))}
    errors.update({name: rel_error(got, want[name]) for name, got in layer.grads().items()})
    # Tutel does not say which assignments it dropped: its drops are checked through the output and the
    # gradients (an assignment dropped on one side only changes both), so the drop counts are the reference's
    return CheckResult(errors, TOLERANCE[x.dtype], ref_dropped, ref_dropped)
