"""The options of `qbench switchback` (the layer bench; the hidden --model and --train-check forward to
`qbench block` and `qbench train-check`), and the checks that keep the layer bench's flags and theirs apart."""

from __future__ import annotations

import click

from qbench.metrics.block import VARIANTS as BLOCK_VARIANTS  # noqa: F401  (block, train-check import it)
from qbench.options import (
    FiniteFloat,
    backward_thread_option,
    callback,
    device_option,
    dtypes_option,
    exec_option,
    format_option,
    out_options,
    parse_names,
    parse_pairs,
    parse_positive_ints,
    plot_option,
    resume_option,
    steps_option,
)

# = sweep.VARIANTS
KERNEL_VARIANTS = ("global", "rowwise", "fp8", "fp8_all", "fp8_cublas", "int8_cublas", "module", "torchao")
MODEL_PRESETS = ("vit-h", "vit-l", "gpt2-xl")  # shown in help; a hidden test size "tiny" exists too
TRAIN_SIZES = ("lm-small", "lm-tiny")


def block_options(fn):
    """--model, --layers, --train-check: the spellings that ran the block-stack benches before they got
    their own commands (`qbench block`, `qbench train-check`); hidden, and forwarded to those."""
    for option in reversed((
        click.option("--model", "models", callback=callback(split_names), hidden=True,
                     help="Same as `qbench block --preset` (with --train-check: `qbench train-check --preset`)."),
        click.option("--layers", type=click.IntRange(min=1), hidden=True, help="With --model or --train-check."),
        click.option("--train-check", is_flag=True, hidden=True, help="Same as `qbench train-check`."),
    )):
        fn = option(fn)
    return fn


def split_names(value):
    """'vit-h,vit-l' -> ('vit-h', 'vit-l'); the names are checked by the path that uses them."""
    if value is None or isinstance(value, tuple):
        return value
    items = tuple(v.strip() for v in value.split(","))
    if not all(items):
        raise click.BadParameter(f"{value!r} has an empty item; give names like vit-h,vit-l")
    return items


def check_flags(flags: dict) -> None:
    """One-line usage errors for flags that belong to another path."""
    block = flags["models"] or flags["train_check"]
    if block and (flags["dims"] or flags["pairs"]):
        raise click.UsageError("--dims/--pairs size the layer bench; --model/--train-check use presets")
    if not block and flags["layers"]:
        raise click.UsageError("--layers sizes a block stack: use qbench block or qbench train-check")
    if block and flags["fmt"] == "seed":
        raise click.UsageError("--format seed writes the layer bench's info.jsonl; drop --model/--train-check")
    if flags["fmt"] == "seed" and len(flags["backward_threads"]) > 1:
        raise click.UsageError("--format seed writes one line per shape: give one --backward-thread")
    if block and flags["backward_threads"] != ("device",):
        raise click.UsageError("--backward-thread applies to the layer bench; drop --model/--train-check")
    if block and flags["resume"]:
        raise click.UsageError("--resume finishes a layer bench run; drop --model/--train-check")
    if flags["train_check"] and flags["execs"]:
        raise click.UsageError("--train-check trains eagerly and times nothing: drop --exec")
    if block and flags["trace_dir"]:
        raise click.UsageError("--trace profiles the layer bench's module steps; drop --model/--train-check")


def variants_of(value: str | None, choices: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return choices
    try:
        return parse_names(choices)(value)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="--variants") from None


def one_of(names, choices, flag: str) -> tuple[str, ...]:
    unknown = [n for n in names or () if n not in choices]
    if unknown:
        raise click.BadParameter(f"unknown {unknown[0]}; choose from {', '.join(choices)}", param_hint=flag)
    return names


def switchback_options(fn):
    """Every option of `qbench switchback`, in --help order."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


_OPTIONS = [
    click.option("--dims", callback=callback(parse_positive_ints),
                  help="Layer widths: each runs dim -> wm*dim and wm*dim -> dim. [default: the seed's pairs]"),
    click.option("--pairs", callback=callback(parse_pairs), help="Explicit IN x OUT pairs, e.g. 1408x6144,6144x1408."),
    click.option("--wm", type=FiniteFloat(min=0, min_open=True), default=4.0, show_default=True,
                  help="MLP ratio used with --dims."),
    click.option("--batch-sizes", callback=callback(parse_positive_ints),
                  help="Tokens M. [default: 1024 ... 131072 on a GPU, 64,256 on the CPU]"),
    dtypes_option(None, ("fp16", "bf16"), help="Data types of activations [default: fp16]."),
    click.option("--variants", help=f"What to time besides the 16-bit baseline [default: all of "
                                     f"{','.join(KERNEL_VARIANTS)}; torchao: its Float8Linear beside the modules "
                                     "(which it brings), only when importable and M, in and out are multiples of "
                                     "16]."),
    plot_option,
    format_option("'seed' also writes <run>/info.jsonl in the original benchmark's format."),
    click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
                 help="After timing each shape's eager module steps, profile 3 more of each layer (forward and "
                      "backward as ranges): Chrome traces and kernel CSVs here (print one with `qbench trace`)."),
    block_options,
    exec_option,
    backward_thread_option,
    steps_option("Timed repeats per configuration. [default: as many as fit a 250 ms budget]", "--repeat"),
    device_option,
    out_options,
    resume_option,
]
