"""One case of `qbench block` (preset x batch size): inputs, the eager 16-bit reference, then every
execution mode x variant checked and timed (records as described in config.py)."""

from __future__ import annotations

from collections.abc import Iterator

from qbench.benches.block import steps as ms

# Relative error of output, loss and gradients (one flat vector) against the eager 16-bit stack,
# measured on the CPU at widths 32-256, 2-4 blocks, bf16: int8 ~1e-2, fp8 ~2-4e-2, fp8_all <= 6.5e-2.
# 16bit: only the mode differs (inductor keeps fused LayerNorm / GELU / residuals in fp32).
REL_ERROR = {"16bit": 0.03, "switchback": 0.05, "fp8": 0.1, "fp8_all": 0.15, "torchao": 0.15}
MAX_SAMPLES = 50  # raw samples kept per timed metric (keeps a committed run small)
TIMING = {"cuda": {"budget_ms": 1500.0, "repeat": None, "host": 10},  # ~20-30 samples of a 50 ms step
          "cpu": {"budget_ms": None, "repeat": 3, "host": 2}}  # CPU steps take seconds; they only check


def run_case(case, config) -> Iterator[dict]:
    from qbench.benches.block import config as bench

    note = _memory_note(case, config.device)
    if note:
        for exec in config.execs:
            for variant in config.variants:
                yield bench.record(case, config, variant, exec, status="skipped", error=note)
        return
    x, target, state = _inputs(case, config)
    reference = _reference(case, config, x, target, state)
    for exec in config.execs:
        base: dict = {}
        for variant in config.variants:
            rec = measure(case, config, variant, exec, (x, target, state, reference), base)
            if variant == "16bit" and rec["status"] == "ok":
                base = rec["metrics"]
            yield rec


def _memory_note(case, device: str) -> str | None:
    """A reason to skip a case that cannot fit (needs more than 85% of free memory), else None."""
    if device != "cuda":
        return None
    import torch

    from qbench.benches.block.config import memory_estimate_bytes

    need, (free, _) = memory_estimate_bytes(case), torch.cuda.mem_get_info()
    if need > 0.85 * free:
        return (f"a step needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free: "
                "lower --batch-sizes or --layers")
    return None


def _make(case, config):
    from qbench.dtypes import torch_dtype
    from qbench.layers.transformer import BlockStack, StackShape

    p = case.preset
    shape = StackShape(width=p.width, mlp=p.mlp, heads=p.heads, layers=case.layers, causal=p.causal)
    return lambda variant: BlockStack(shape, variant, device=config.device, dtype=torch_dtype(config.dtype))


def _inputs(case, config):
    """x [B, T, C], target [B, T, C]: N(0, 1) draws in the activation dtype; the 16-bit stack's
    seeded initial weights (on the host: every variant and mode starts from them)."""
    import torch

    from qbench.dtypes import torch_dtype

    gen = torch.Generator(device=config.device).manual_seed(config.seed)
    size = (case.batch_size, case.preset.tokens, case.preset.width)
    x, target = (torch.randn(size, generator=gen, device=config.device).to(torch_dtype(config.dtype))
                 for _ in range(2))
    torch.manual_seed(config.seed)
    state = {k: v.detach().cpu().clone() for k, v in _make(case, config)("16bit").state_dict().items()}
    return x, target, state


def _reference(case, config, x, target, state) -> dict:
    """Output, loss and gradients of one eager 16-bit step from the reference weights (host copies)."""
    from qbench.layers.transformer import build

    model, out = build(_make(case, config), "16bit", state), {}
    ms.train_step(ms.objective(model, "eager"), ms.optimizer_of(model, config.device), x, target, out)()
    return ms.results(model, out)


def _unavailable(case, config, variant: str) -> str | None:
    from qbench.layers.transformer import torchao_shape_reason, unavailable

    reason = unavailable(variant, config.device)
    if reason is None and variant == "torchao" and config.device == "cuda":
        tokens = case.batch_size * case.preset.tokens
        shape = torchao_shape_reason(tokens)
        reason = f"{tokens} tokens: {shape}" if shape else None
    return reason


def measure(case, config, variant: str, exec: str, data, base: dict) -> dict:
    """The record of one variant in one mode: skipped, error (check failed or raised), or ok."""
    import torch

    from qbench.benches.block import config as bench

    reason = _unavailable(case, config, variant)
    if reason:
        return bench.record(case, config, variant, exec, status="skipped", error=reason)
    try:
        metrics, samples, failure = _measure(case, config, variant, exec, data)
    except torch.OutOfMemoryError:
        return bench.record(case, config, variant, exec, status="skipped", error="out of GPU memory")
    except Exception as exc:  # a mode that cannot run this variant (compile, capture) is a result too
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return bench.record(case, config, variant, exec, status="error", error=text[:300])
    finally:
        _release(config.device)
    if failure:
        return bench.record(case, config, variant, exec, metrics, status="error", error=failure)
    metrics.update(_derived(case, metrics, base))
    return bench.record(case, config, variant, exec, metrics, samples)


def _measure(case, config, variant: str, exec: str, data) -> tuple[dict, dict, str | None]:
    from qbench.benches.block.config import memory_estimate_bytes
    from qbench.benches.fragmented.steps import allocated, peak_mb, sync_and_reset
    from qbench.layers.transformer import block_linears, build
    from qbench.telemetry import GpuReadings
    from qbench.timing import host_time, time_fn

    x, target, state, reference = data
    device, timing = config.device, TIMING[config.device]
    baseline = allocated(device)
    model = build(_make(case, config), variant, state)
    # peak over one step after warm-up (compilation and autotuning allocate too), or over the capture
    step, out, _ = ms.prepared_step(model, x, target, exec, after_warmup=lambda: sync_and_reset(device))
    ms.restore(model, state)
    step()
    metrics = ms.relative_errors(ms.results(model, out), reference)
    if device == "cuda":
        metrics.update(peak_memory_mb=peak_mb(device, baseline), memory_estimate_mb=memory_estimate_bytes(case) / 2**20)
    failure = _check(metrics, variant, exec)
    if failure:
        return metrics, {}, failure
    kw = {"device": device, "repeat": config.repeat or timing["repeat"], "budget_ms": timing["budget_ms"]}
    readings = GpuReadings(device)  # the clock and power the steps ran at
    steps = time_fn(step, warmup=1, flush_l2=False, observe=readings, **kw)  # back to back, as training runs them
    # one timed step per record: its telemetry needs no `_step` suffix (sm_clock_mhz, power_w, throttle_reasons)
    metrics.update({k.removesuffix("_step"): v for k, v in readings.metrics("step").items()})
    metrics["host_ms"] = host_time(step, device=device, warmup=1, repeat=timing["host"]).median
    del step, out
    linears = block_linears(model)
    operands = ms.linear_operands(linears, case.batch_size * case.preset.tokens, x.device, x.dtype, config.seed + 1)
    alone = time_fn(ms.linears_step(linears, operands, exec), warmup=1, flush_l2=False, **kw)
    metrics.update(step_ms=steps.median, linear_ms=alone.median)
    return metrics, {"step_ms": list(steps.samples_ms[:MAX_SAMPLES]),
                     "linear_ms": list(alone.samples_ms[:MAX_SAMPLES])}, None


def _check(metrics: dict, variant: str, exec: str) -> str | None:
    bound = REL_ERROR[variant]
    for name in ("relerr_output", "relerr_loss", "relerr_grads"):
        if not metrics[name] <= bound:  # NaN fails too
            return f"{variant} ({exec}) vs eager 16bit: {name[7:]} relative error {metrics[name]:.2e} > {bound:g}"
    return None


def _derived(case, metrics: dict, base: dict) -> dict:
    from qbench.benches.block.config import step_flop

    step_s = metrics["step_ms"] / 1e3
    out = {"tokens_per_s": case.batch_size * case.preset.tokens / step_s,
           "linear_share": metrics["linear_ms"] / metrics["step_ms"],
           "tflops": step_flop(case) / step_s / 1e12}
    if base.get("step_ms"):
        out["step_speedup"] = base["step_ms"] / metrics["step_ms"]
        out["linears_speedup"] = base["linear_ms"] / metrics["linear_ms"]
    return out


def _release(device: str) -> None:
    import gc

    import torch

    gc.collect()  # the model, its optimizer and a captured graph's pool go before the next variant
    if device == "cuda":
        torch.cuda.empty_cache()


def run(config, done: frozenset[str] = frozenset()) -> Iterator[dict]:
    """Records of a resolved BlockConfig in the order: case, execution mode, variant (16bit first)."""
    from qbench.benches.block.config import plan

    for case in plan(config):
        yield from run_case(case, config)
