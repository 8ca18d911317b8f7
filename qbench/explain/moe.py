"""Predictions of `qbench moe` records (tidy: variant a2a | blocks | ..., *_ms metrics, timing per_step or
loop): the phases of the busiest rank and the whole step.

T tokens (samples) of width d, top-k routing to E = world_size x num_local_experts experts of hidden size h;
the busiest rank computes `rows` rows (the record's routing counts: computed_rows / world size x the
rank-load imbalance, else T x k, capped by the capacity factor). Routing counts are counts of the run, not
times.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernels.moe_route import io_bytes
from qbench.layers.moe.plan import segments_from_routing, step_chunks
from qbench.model.predict import Prediction, Rates, chain, matmul, stream, transfer, with_host

INDEX_BYTES = 4  # an int32 token index per routed row


def _rows(params: Mapping, metrics: Mapping) -> float:
    n, T, k = int(params["world_size"]), params["samples"], params["top_k"]
    if metrics.get("computed_rows"):
        return metrics["computed_rows"] / n * max(1.0, float(metrics.get("rank_load_max_over_mean") or 1.0))
    cf = float(params.get("capacity_factor") or 0)
    return T * k * (min(1.0, cf) if cf > 0 else 1.0)


def phases(params: Mapping, metrics: Mapping, rates: Rates) -> dict[str, Prediction]:
    """The forward's phases and the backward's expert part (backward_experts_ms) of the busiest rank (the plan
    phase only where it launches work: plan_launches)."""
    n, dtype = int(params["world_size"]), str(params["dtype"])
    d, h, T, k = params["model_dim"], params["hidden_size"], params["samples"], params["top_k"]
    e = 4 if dtype == "fp32" else 2
    clock, rows = metrics.get("sm_clock_mhz"), _rows(params, metrics)
    experts = int(params["num_local_experts"])
    per_expert = rows / experts

    def product(m, kk, nn, groups=1, kind=dtype):
        return matmul(m, kk, nn, kind, rates, clock, in_bytes=e, out_bytes=e, cublas=dtype, groups=groups)

    def grouped(m, kk, nn, kind="grouped"):  # qbench's grouped kernels, one launch over the local experts
        return product(m, kk, nn, experts, f"{kind}_{dtype}")

    sent = float(metrics.get("sent_rows") or T * k)
    exchange = chain({"permute": stream(2 * sent * d * e, "copy", rates),
                      "all_to_all": transfer(sent * d * e, n, rates)})
    # the gate: its product, then the routing launches over the T x E logits (top-k, weights, positions and send
    # rows: kernels/moe_route.py), at their calibrated rate (the copy rate where the calibration has none)
    route = stream(io_bytes(T, n * experts, k, e), "moe_route", rates)
    activation = rows * h * e  # bytes of one [rows, h] tensor: gelu reads one and writes one, its backward 3
    forward = {"up": grouped(per_expert, d, h), "activation": stream(2 * activation, "gelu", rates),
               "down": grouped(per_expert, h, d)}
    input_grad = {"down_t": grouped(per_expert, d, h), "activation": stream(3 * activation, "gelu_backward", rates),
                  "up_t": grouped(per_expert, h, d)}
    weight_grad = {"down": grouped(h, per_expert, d, "grouped_wgrad"), "up": grouped(d, per_expert, h, "grouped_wgrad")}
    out = {"gate_ms": chain({"product": product(T, d, n * experts), "route": route}),
           "dispatch_ms": exchange,
           "experts_ms": chain(forward),
           "combine_ms": exchange,
           "backward_experts_ms": chain({"input_grad": chain(input_grad), "weight_grad": chain(weight_grad)}),
           "backward_gate": chain({"dx": product(T, n * experts, d), "dw": product(d, T, n * experts)})}
    if plan_launches(params):
        out["plan_ms"] = stream(T * k * INDEX_BYTES * 2, "copy", rates)
    return out


def plan_launches(params: Mapping) -> bool:
    """Whether the step's plan phase runs GPU work. Where the routing kernel writes the send rows (no replication)
    and its send offsets are the expert segments (plan.segments_from_routing), the
    plan launches nothing: its measured time is its two events' own gap, nothing to predict, and an eager step's
    host time there counts with the forward's untracked host time."""
    ranks = int(params["world_size"])
    chunks = step_chunks(ranks, int(params.get("a2a_ffn_overlap_degree") or 1))
    return not (int(params.get("replicate_hot") or 0) == 0 and params.get("variant", "a2a") == "a2a"
                and segments_from_routing(ranks, chunks))


def predict(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    """Forward = gate + plan + dispatch + experts + combine (overlapped with degree > 1: the exchanges run
    under the experts); backward = both exchanges again, the experts' input and weight gradients, the gate's.
    Tutel's layer (variant tutel) runs kernels of its own, which the calibration does not measure: not predicted."""
    params, metrics = record["params"], record["metrics"]
    if params.get("variant") == "tutel":
        return {}
    out = phases(params, metrics, rates)
    overlap = int(params.get("a2a_ffn_overlap_degree") or 1) > 1
    fwd = _forward(out, overlap)
    exchange = chain({"dispatch": out["dispatch_ms"], "combine": out["combine_ms"]})
    bwd = chain({"gate": out.pop("backward_gate"), "experts": out["backward_experts_ms"], "exchange": exchange})
    out.update(forward_ms=fwd, backward_ms=bwd, backward_exchange_ms=exchange)
    step = fwd if params.get("eval") else chain({"forward": fwd, "backward": bwd, "optimizer": _sgd(params, rates)})
    out["step_ms"] = step
    if params.get("exec", "eager") == "eager" and params.get("timing", "per_step") == "per_step":
        return _waiting_on_the_host(out, metrics)
    return out


def _sgd(params: Mapping, rates: Rates) -> Prediction:
    """The step's SGD update (qbench moe: learning rate 0, no momentum) over this rank's parameters: each read
    with its gradient and written back (3 passes of e bytes per parameter), at the copy rate."""
    d, h, e = params["model_dim"], params["hidden_size"], 4 if params["dtype"] == "fp32" else 2
    experts = int(params["num_local_experts"])
    count = experts * (2 * d * h + h + d) + (d + 1) * experts * int(params["world_size"])
    return stream(3 * count * e, "copy", rates)


FORWARD = ("gate_ms", "plan_ms", "dispatch_ms", "experts_ms", "combine_ms")  # the forward's phases, in order
BACKWARD = ("backward_exchange_ms", "backward_experts_ms")


def _waiting_on_the_host(out: dict[str, Prediction], metrics: Mapping) -> dict[str, Prediction]:
    """An eager step as the GPU runs it behind the host. A phase's events are recorded as the host reaches them,
    so a phase lasts from when both the host has reached it and the GPU has finished the work before it, to when
    both the host has issued it (host_<phase>_ms: the record's host time of each call, a measured input like its
    clock) and the GPU has run it. The forward starts on an idle GPU; the backward behind what the forward left
    queued. A phase's host time that no inner phase holds (host_forward_ms less its phases', ...) is issued first."""
    timed = dict(out)
    fwd, ready = _timeline("forward_ms", FORWARD, out, metrics, 0.0, 0.0)
    bwd, _ = _timeline("backward_ms", BACKWARD, out, metrics, *ready)
    timed.update(fwd)
    timed.update(bwd)
    timed["step_ms"] = with_host(out["step_ms"], metrics.get("host_ms"))
    return timed


def _timeline(whole: str, names: tuple[str, ...], out: Mapping[str, Prediction], metrics: Mapping, host: float,
              gpu: float) -> tuple[dict[str, Prediction], tuple[float, float]]:
    """({phase: Prediction} of `whole` and its phases `names` run as the module docstring says, from host clock
    `host` and a GPU busy until `gpu` (ms); (host, gpu) at the end)."""
    inner = [n for n in names if n in out]
    issued = {n: float(metrics.get(f"host_{n}") or 0.0) for n in inner}
    rest_host = max(0.0, float(metrics.get(f"host_{whole}") or 0.0) - sum(issued.values()))
    rest_gpu = max(0.0, out[whole].ms - sum(out[n].ms for n in inner))
    start = max(host, gpu)
    host, gpu = host + rest_host, max(host + rest_host, start + rest_gpu)  # the untracked part first
    timed = {}
    for n in inner:
        begin = max(host, gpu)
        host += issued[n]
        gpu = max(host, begin + out[n].ms)
        timed[n] = _behind(out[n], gpu - begin, host == gpu and issued[n] > out[n].ms)
    timed[whole] = _behind(out[whole], gpu - start, host == gpu and host - start > out[whole].ms)
    return timed, (host, gpu)


def _behind(gpu: Prediction, ms: float, host_bound: bool) -> Prediction:
    """The phase's GPU prediction lasting `ms` as the host lets it: host-bound where the host's issuing ends it."""
    if host_bound:
        return Prediction(ms, "host", f"the host issues it after {ms:.3f} ms, the GPU needs {gpu.ms:.3f} ms",
                          gpu.bound_ms)
    return Prediction(ms, gpu.limit, gpu.reason, gpu.bound_ms, gpu.path)


def _forward(p: Mapping[str, Prediction], overlap: bool) -> Prediction:
    if not overlap:
        return chain({k: p[k] for k in FORWARD if k in p})
    exchange = chain({"dispatch": p["dispatch_ms"], "combine": p["combine_ms"]})
    hidden = p["experts_ms"] if p["experts_ms"].ms >= exchange.ms else exchange
    return chain({"gate": p["gate_ms"], **({"plan": p["plan_ms"]} if "plan_ms" in p else {}), "overlapped": hidden})
