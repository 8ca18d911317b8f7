"""Correctness before timing: FragmentedLinear's train, eval and inference outputs against the float64
reference definition (qbench.layers.fragmented.reference_output)."""

from __future__ import annotations

from qbench.dtypes import tolerance

TIE_GAP = 1e-4  # rows whose top-2 fp64 scores are closer than this may legitimately pick either fragment


def relative_error(out, ref, rows=None) -> float:
    diff, ref = out.double() - ref, ref
    if rows is not None:
        diff, ref = diff[rows], ref[rows]
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def gate(model, x, dtype: str) -> tuple[dict, str | None]:
    """Train, eval and inference outputs of a FragmentedLinear against the float64 reference.
    Returns ({rel_error_train, rel_error_eval}, error text or None)."""
    import torch

    from qbench.layers.fragmented import reference_output

    was_training = model.training
    with torch.no_grad():
        scores = model.scores(x).double()
        top2 = scores.topk(min(2, scores.shape[1]), dim=1).values
        clear = (top2[:, 0] - top2[:, -1] >= TIE_GAP) if scores.shape[1] > 1 else None
        soft, hard = reference_output(model, x, hard=False), reference_output(model, x, hard=True)
        errors = {"rel_error_train": relative_error(model.train()(x), soft),
                  "rel_error_eval": relative_error(model.eval()(x), hard, clear),
                  "rel_error_inference": relative_error(model.infer(x), hard, clear)}
    model.train(was_training)
    bound = tolerance(dtype).layer  # ||out - ref|| / ||ref|| against float64
    bad = {k: v for k, v in errors.items() if not v <= bound}
    if bad:
        name, value = next(iter(bad.items()))
        return errors, f"{name} = {value:.2e} exceeds the {dtype} bound {bound:.0e}"
    return errors, None
