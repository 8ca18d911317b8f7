"""The options of `qbench moe`: one declaration per MoEBenchConfig field (the bench validates them)."""

from __future__ import annotations

import click

from qbench.benches.moe.config import GEMMS, KERNEL_BENCHES, TRANSPORTS
from qbench.metrics.moe import VARIANTS
from qbench.options import (
    MAX_SIZE,
    WARMUP_STEPS,
    FiniteFloat,
    backward_thread_option,
    callback,
    device_option,
    dtypes_option,
    exec_option,
    format_option,
    out_options,
    parse_names,
    parse_number_list,
    plot_option,
    resume_option,
    steps_option,
)
from qbench.options import parse_positive_ints as _sizes

_counts = parse_number_list(int, lambda n: n >= 0, "integers", "0,4", "counts must be >= 0")
_floats = parse_number_list(float, lambda p: True, "probabilities", "0.25,1.0", "")  # the bench checks [0, 1]
_words = lambda v: v if v is None else tuple(w.strip() for w in v.split(","))  # noqa: E731 - the bench checks them
_INT = click.IntRange(min=1, max=MAX_SIZE)


def _opt(name: str, dest: str | None = None, parser=None, **kw):
    """One option, stored under the config field `dest`; `parser` turns a comma list into a tuple."""
    if parser is not None:
        kw["callback"] = callback(parser)
    return click.option(name, *([dest] if dest else []), show_default=kw.get("default") is not None, **kw)


OPTIONS = [
    _opt("--world-size", type=_INT, help="Ranks (default: every visible GPU; 2 on the CPU; torchrun's size)."),
    _opt("--batch-size", type=_INT, default=16),
    _opt("--num-tokens", type=_INT, default=512, help="Tokens per sequence."),
    _opt("--samples", type=_INT, help="Tokens per rank (batch size x tokens; CPU: 256)."),
    _opt("--model-dim", type=_INT, help="d (1024; CPU: 64)."),
    _opt("--hidden-size", type=_INT, help="h of the expert FFN (4096; CPU: 128)."),
    _opt("--num-local-experts", parser=_sizes, default="8", help="Experts per rank (a list sweeps)."),
    _opt("--top-k", type=_INT, default=2),
    dtypes_option(None, help="Data types of activations [default: fp16; CPU: fp32]."),
    _opt("--activation", type=click.Choice(("gelu", "relu")), default="gelu"),
    _opt("--capacity-factor", type=FiniteFloat(), default=0.0,
         help="x > 0: capacity x*k*T/E, padded; 0: dropless; x < 0: capped at -x, no padding."),
    _opt("--fp32-gate", is_flag=True, help="Gate weights and logits in fp32."),
    _opt("--a2a-ffn-overlap-degree", "a2a_ffn_overlap_degrees", _sizes, default="1",
         help="Chunks pipelined across streams."),
    _opt("--replicate-hot", parser=_counts, default="0", help="Hot experts computed locally on every rank."),
    _opt("--routing", "routings", _words, default="randn", help="randn, rand-skew, uniform, zipf:S, trace:FILE."),
    _opt("--gemm", "gemms", parse_names(GEMMS), default="auto", help=f"Grouped GEMM: {', '.join(GEMMS)} (a list)."),
    click.option("--variant", "--system", "variants", callback=callback(parse_names(VARIANTS)), default="a2a",
                 show_default=True, help="a2a (all-to-all + grouped GEMM), blocks (block dispatch fused with the "
                 "GEMMs) or tutel (Tutel's layer, where it imports); a list sweeps. --system: the same."),
    _opt("--block-size", type=_INT, default=64, help="Rows per block of --variant blocks."),
    _opt("--locality", "localities", lambda v: _floats(v) or (None,),
         help="P[,P...]: each choice's expert lives on the token's own rank with probability P (forced routing)."),
    _opt("--transport", type=click.Choice(TRANSPORTS), default="auto",
         help="--variant blocks: symmetric memory where available (auto), or force one."),
    _opt("--model", type=click.Choice(("layer", "attn-moe")), default="layer"),
    steps_option("Timed steps (100; CPU: 10).", "--num-steps"),
    _opt("--warmup", type=WARMUP_STEPS, help="Untimed steps (10; CPU: 2)."), device_option,
    _opt("--backend", type=click.Choice(("auto", "nccl", "gloo")), default="auto"),
    _opt("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=600.0, metavar="S",
         help="Seconds a rank waits in a collective before the run fails (a frozen or lost rank)."),
    _opt("--eval", "eval", is_flag=True, help="Forward only, under no_grad."),
    format_option("'seed' also prints the seeds' [Benchmark]/STEP/[Summary] lines."),
    plot_option,
    _opt("--trace", "trace_dir", type=click.Path(file_okay=False),
         help="After timing, profile 3 more steps per configuration: per-rank traces and kernel CSVs here."),
    _opt("--kernels", type=click.Choice(KERNEL_BENCHES), hidden=True, help="Same as `qbench grouped`."),
]


def moe_options(fn):
    """Every option of `qbench moe`, in --help order."""
    for option in reversed([*OPTIONS, exec_option(), backward_thread_option, out_options, resume_option]):
        fn = option(fn)
    return fn
