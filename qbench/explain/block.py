"""Predictions of `qbench block` records (a stack of ViT blocks; tidy: preset, variant, exec): the linears
alone and the whole training step.

Per block, M = batch_size x tokens rows of width w, MLP width f, `heads` heads: four linears (qkv w -> 3w,
proj w -> w, fc1 w -> f, fc2 f -> w) as the switchback layer of the record's variant runs them; attention
4 M T w flops forward and 2.5x that backward (flash attention recomputes its scores); layer norms, GELU and
residual adds as memory passes (forward 14 M w + 2 M f elements read or written, backward twice that).
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.explain import switchback
from qbench.model.predict import Prediction, Rates, chain, stream, with_host, work

BACKWARD_ATTENTION = 2.5  # flash attention's backward over its forward flops (recomputes the scores)


def _linears(params: Mapping, rates: Rates, clock: float | None) -> Prediction:
    M, w, f = params["batch_size"] * params["tokens"], params["width"], params["mlp"]
    shapes = {"qkv": (w, 3 * w), "proj": (w, w), "fc1": (w, f), "fc2": (f, w)}
    return chain({name: switchback.step({"batch_size": M, "dim_in": k, "dim_out": n, "dtype": params["dtype"],
                                         "variant": params["variant"]}, rates, clock)
                  for name, (k, n) in shapes.items()})


def predict(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    params, metrics = record["params"], record["metrics"]
    layers, dtype, clock = int(params["layers"]), str(params["dtype"]), metrics.get("sm_clock_mhz")
    M, T, w, f = params["batch_size"] * params["tokens"], params["tokens"], params["width"], params["mlp"]
    e = 4 if dtype == "fp32" else 2
    linears = _linears(params, rates, clock)
    attention = work((1 + BACKWARD_ATTENTION) * 4 * M * T * w, 3 * 4 * M * w * e, dtype, rates, clock,
                     cublas=dtype, what="attention")
    elementwise = stream(3 * (14 * M * w + 2 * M * f) * e, "copy", rates)
    block = chain({"linears": linears, "attention": attention, "elementwise": elementwise})
    stack = chain({f"block{i}": block for i in range(layers)})
    host = metrics.get("host_ms") if params.get("exec") == "eager" else None
    return {"linear_ms": chain({f"block{i}": linears for i in range(layers)}), "step_ms": with_host(stack, host)}
