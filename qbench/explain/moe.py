"""Predictions of `qbench moe` records (tidy: variant a2a | blocks | ..., *_ms metrics, timing per_step or
loop): the phases of the busiest rank and the whole step.

T tokens (samples) of width d, top-k routing to E = world_size x num_local_experts experts of hidden size h;
the busiest rank computes `rows` rows (the record's routing counts: computed_rows / world size x the
rank-load imbalance, else T x k, capped by the capacity factor). Routing counts are counts of the run, not
times.
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.model.predict import Prediction, Rates, chain, matmul, stream, transfer, with_host

INDEX_BYTES = 4  # an int32 token index per routed row


def _rows(params: Mapping, metrics: Mapping) -> float:
    n, T, k = int(params["world_size"]), params["samples"], params["top_k"]
    if metrics.get("computed_rows"):
        return metrics["computed_rows"] / n * max(1.0, float(metrics.get("rank_load_max_over_mean") or 1.0))
    cf = float(params.get("capacity_factor") or 0)
    return T * k * (min(1.0, cf) if cf > 0 else 1.0)


def phases(params: Mapping, metrics: Mapping, rates: Rates) -> dict[str, Prediction]:
    n, dtype = int(params["world_size"]), str(params["dtype"])
    d, h, T, k = params["model_dim"], params["hidden_size"], params["samples"], params["top_k"]
    e = 4 if dtype == "fp32" else 2
    clock, rows = metrics.get("sm_clock_mhz"), _rows(params, metrics)
    experts = int(params["num_local_experts"])
    per_expert = rows / experts

    def product(m, kk, nn, groups=1):
        return matmul(m, kk, nn, dtype, rates, clock, in_bytes=e, out_bytes=e, cublas=dtype, groups=groups)

    sent = float(metrics.get("sent_rows") or T * k)
    exchange = chain({"permute": stream(2 * sent * d * e, "copy", rates),
                      "all_to_all": transfer(sent * d * e, n, rates)})
    # the local experts' products as one grouped launch each (up: rows x d -> h, down: rows x h -> d)
    up, down = product(per_expert, d, h, experts), product(per_expert, h, d, experts)
    # the gate: its product, then softmax and top-k over the T x E scores (read once, k ids and weights written)
    scores = stream(T * n * experts * e + T * k * (INDEX_BYTES + e), "copy", rates)
    return {"gate_ms": chain({"product": product(T, d, n * experts), "top_k": scores}),
            "plan_ms": stream(T * k * INDEX_BYTES * 2, "copy", rates),
            "dispatch_ms": exchange,
            "experts_ms": chain({"up": up, "activation": stream(2 * rows * h * e, "copy", rates), "down": down}),
            "combine_ms": exchange}


def predict(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    """Forward = gate + plan + dispatch + experts + combine (overlapped with degree > 1: the exchanges run
    under the experts); backward = both exchanges again and twice the expert and gate products."""
    params, metrics = record["params"], record["metrics"]
    out = phases(params, metrics, rates)
    overlap = int(params.get("a2a_ffn_overlap_degree") or 1) > 1
    fwd = _forward(out, overlap)
    # input and weight gradients: each twice the forward products' flops, in as many grouped launches
    bwd_experts = chain({"input_grad": out["experts_ms"], "weight_grad": out["experts_ms"]})
    bwd = chain({"gate": chain({"dx": out["gate_ms"], "dw": out["gate_ms"]}), "experts": bwd_experts,
                 "exchange": chain({"dispatch": out["dispatch_ms"], "combine": out["combine_ms"]})})
    out.update(forward_ms=fwd, backward_ms=bwd, backward_experts_ms=bwd_experts,
               backward_exchange_ms=chain({"dispatch": out["dispatch_ms"], "combine": out["combine_ms"]}))
    step = fwd if params.get("eval") else chain({"forward": fwd, "backward": bwd})
    eager = params.get("exec", "eager") == "eager" and params.get("timing", "per_step") == "per_step"
    out["step_ms"] = with_host(step, metrics.get("host_ms") if eager else None)
    return out


def _forward(p: Mapping[str, Prediction], overlap: bool) -> Prediction:
    if not overlap:
        return chain({k: p[k] for k in ("gate_ms", "plan_ms", "dispatch_ms", "experts_ms", "combine_ms")})
    exchange = chain({"dispatch": p["dispatch_ms"], "combine": p["combine_ms"]})
    hidden = p["experts_ms"] if p["experts_ms"].ms >= exchange.ms else exchange
    return chain({"gate": p["gate_ms"], "plan": p["plan_ms"], "overlapped": hidden})
