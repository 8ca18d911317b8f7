"""Shared click options and value parsers, defined once for every subcommand.

Parsers raise click.BadParameter with a message that names the problem and the fix; the CLI turns
it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import math

import click

from qbench.dtypes import ACTIVATION_DTYPES as DTYPES
from qbench.dtypes import canonical_dtype
from qbench.modes import EXECS

# Largest size a list option takes: kernels index a dimension with 32-bit integers, and anything larger
# would overflow a seed or a tensor shape long before it could fit in memory.
MAX_SIZE = 2**31 - 1
# Most steps or repeats an iteration-count option takes: a median and its p20-p80 settle within a few hundred
# samples, and 100,000 steps of even a 1 ms step is half an hour of one configuration; more is a typo
# (--steps 100000000) that would run for days with a progress bar that never moves.
MAX_STEPS = 100_000
STEPS = click.IntRange(min=1, max=MAX_STEPS)
WARMUP_STEPS = click.IntRange(min=0, max=MAX_STEPS)


def _split(value: str) -> list[str]:
    items = [v.strip() for v in str(value).split(",")]
    if not value or any(not v for v in items):
        raise click.BadParameter(f"{value!r} has an empty item; give a comma-separated list like 1024,4096")
    return items


def parse_positive_ints(value: str | tuple | None) -> tuple[int, ...] | None:
    """'1024,4096' -> (1024, 4096); every item a positive integer."""
    if value is None or isinstance(value, tuple):
        return value
    out = []
    for item in _split(value):
        try:
            number = int(item)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not an integer; give a list like 1024,4096") from None
        if number <= 0:
            raise click.BadParameter(f"{number} is not a positive size; sizes must be > 0")
        if number > MAX_SIZE:
            raise click.BadParameter(f"{number} is too large; sizes must be at most {MAX_SIZE}")
        out.append(number)
    return tuple(out)


def parse_pairs(value: str | tuple | None) -> tuple[tuple[int, int], ...] | None:
    """'1408x6144,6144x1408' -> ((1408, 6144), (6144, 1408))."""
    if value is None or isinstance(value, tuple):
        return value
    pairs = []
    for item in _split(value):
        parts = [part.strip() for part in item.lower().split("x")]
        if len(parts) != 2 or not all(parts):
            raise click.BadParameter(f"{item!r} is not an IN x OUT pair; write pairs like 1408x6144")
        pairs.append((*parse_positive_ints(parts[0]), *parse_positive_ints(parts[1])))
    return tuple(pairs)


class FiniteFloat(click.FloatRange):
    """A float in a range that is also finite: click's FloatRange lets nan (every comparison with it is
    false) and inf through, and neither is a size, a ratio or a timeout."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def parse_names(choices: tuple[str, ...]):
    """A parser for a comma-separated subset of `choices`."""

    def parse(value: str | tuple | None) -> tuple[str, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        items = tuple(_split(value))
        unknown = [i for i in items if i not in choices]
        if unknown:
            raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return items

    return parse


def parse_number_list(convert, valid, kind: str, example: str, rule: str):
    """A parser of comma lists: 'a,b' -> (convert(a), convert(b)), each passing valid(x); errors say
    '<value> is not a list of <kind> like <example>' or '<value>: <rule>'."""
    def parse(value):
        if value is None or isinstance(value, tuple):
            return value
        try:
            numbers = tuple(convert(v) for v in str(value).split(","))
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a list of {kind} like {example}") from None
        if not all(valid(n) for n in numbers):
            raise click.BadParameter(f"{value!r}: {rule}")
        return numbers

    return parse


def callback(parser):
    """Wrap a value parser as a click callback."""
    return lambda ctx, param, value: parser(value)


def out_options(fn):
    """--out, --append, --force, --json: where records go and how they are shown."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print the records as JSON on stdout.")(fn)
    fn = click.option("--force", is_flag=True, help="Replace the records of an existing run directory.")(fn)
    fn = click.option("--append", is_flag=True, help="Add records to an existing run directory.")(fn)
    fn = click.option(
        "--out",
        type=click.Path(file_okay=False),
        default=None,
        help="Run directory (default: runs/<bench>-<UTC time>).",
    )(fn)
    return fn


def resume_option(fn):
    """--resume: finish a run cut short (a crash, an interrupt, a lost machine) in its --out directory."""
    return click.option(
        "--resume", is_flag=True,
        help="Run only what the --out run lacks: its configurations recorded ok or skipped are kept, the rest "
             "(missing, or recorded as errors) run and are added to it.")(fn)


def parse_dtype(choices: tuple[str, ...] = DTYPES):
    """A parser of one dtype name: fp16, bf16, fp32 (aliases such as float16 or bfloat16 accepted),
    returned in its canonical spelling."""

    def parse(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            name = canonical_dtype(value)
        except ValueError:
            name = None
        if name not in choices:
            raise click.BadParameter(f"unknown {value}; choose a dtype from {', '.join(choices)}")
        return name

    return parse


def parse_dtype_list(choices: tuple[str, ...] = DTYPES):
    """A parser of a comma-separated list of dtypes ('fp32,bfloat16' -> ('fp32', 'bf16'))."""
    one = parse_dtype(choices)

    def parse(value: str | tuple | None) -> tuple[str, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        return tuple(one(item) for item in _split(value))

    return parse


def dtype_option(default: str | None = "fp16", choices: tuple[str, ...] = DTYPES,
                 help: str = "Data type of activations."):
    """--dtype in the one vocabulary of qbench (fp16, bf16, fp32; float16 etc. accepted as aliases)."""
    return click.option(
        "--dtype", default=default, show_default=default is not None, callback=callback(parse_dtype(choices)),
        metavar="|".join(choices), help=f"{help} ({', '.join(choices)}; aliases like float16 accepted)",
    )


def device_option(fn):
    return click.option(
        "--device",
        type=click.Choice(("auto", "cuda", "cpu")),
        default="auto",
        show_default=True,
        help="Where to run: a CUDA GPU when present, otherwise the CPU.",
    )(fn)


def exec_option(fn=None, *, default: str = "all the device supports (GPU: all three; CPU: eager)"):
    """--exec: the ways a layer runs in training (eager, torch.compile, CUDA-graph replay); `default`
    says what the bench runs without it."""

    def add(f):
        return click.option("--exec", "execs", callback=callback(parse_names(EXECS)),
                            help=f"Execution modes, e.g. eager,compile,graph. [default: {default}]")(f)

    return add(fn) if fn is not None else add


BACKWARD_THREADS = ("device", "calling")


def backward_thread_option(fn):
    """--backward-thread: which thread runs autograd's backward in eager and compiled steps: 'device' (PyTorch's
    default: one engine thread per GPU) or 'calling' (the thread that calls backward(), what
    torch.autograd.set_multithreading_enabled(False) asks for); a comma list sweeps both."""
    return click.option(
        "--backward-thread", "backward_threads", default="device", show_default=True,
        callback=callback(parse_names(BACKWARD_THREADS)),
        help="Thread that runs autograd's backward: device (PyTorch's default, one engine thread per GPU) or "
             "calling (the thread that calls backward(), torch.autograd.set_multithreading_enabled(False)); "
             "device,calling sweeps both.")(fn)


def strict_option(fn):
    """--strict on a command that reads runs: a run holding a line that is not a valid record is an error
    (exit 2) instead of being read without that line (and named on stderr). The command runs inside
    store.strict_reading, so every loader it calls applies the choice."""
    import functools

    @functools.wraps(fn)
    def run(*args, strict: bool, **kwargs):
        from qbench import store

        with store.strict_reading(strict):
            return fn(*args, **kwargs)

    return click.option("--strict", is_flag=True,
                        help="Refuse a run with lines that are not valid records (default: leave them out and "
                             "name them on stderr).")(run)


# ------------------------------------------------------------------------------ the shared dialect
# Every bench command spells these alike; the spellings of earlier qbench versions and of the seeds stay
# accepted as aliases (`--repeat`, `--num-steps`, `--seed-format`, a bare `--plot`).

RUN_FIGURE = "-"  # what a bare --plot stands for: the run's own figure, <run>/<bench>.png


def plot_option(fn):
    """--plot [FILE]: draw the run's figure into FILE (.png, .svg, .pdf) after the run; a bare --plot
    draws <run>/<bench>.png. figure_path(value) turns the value into plot_run's out_path."""
    return click.option(
        "--plot", is_flag=False, flag_value=RUN_FIGURE, default=None, metavar="[FILE]",
        help="Draw the run's figure afterwards into FILE (.png, .svg, .pdf); alone: <run>/<bench>.png.")(fn)


def figure_path(plot: str | None) -> str | None:
    """plot_run's out_path for a --plot value (None: the run's default figure file)."""
    return None if plot in (None, RUN_FIGURE) else plot


FORMATS = ("table", "seed")


def format_option(help: str):
    """--format table|seed (the value reaches the command as `fmt`), with the hidden flag --seed-format
    as an alias of --format seed."""

    def add(fn):
        @functools.wraps(fn)
        def command(*args, fmt: str, seed_format: bool, **kwargs):
            return fn(*args, fmt="seed" if seed_format else fmt, **kwargs)

        command = click.option("--seed-format", is_flag=True, hidden=True, help="Same as --format seed.")(command)
        return click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                            help=help)(command)

    return add


def steps_option(help: str, *aliases: str, default: int | None = None):
    """--steps N (the value reaches the command as `steps`): timed steps or repeats per configuration;
    aliases: the spellings a command took before (--repeat, --num-steps)."""
    return click.option("--steps", *aliases, "steps", type=STEPS, default=default,
                        help=help)


def dtypes_option(default: str | None, choices: tuple[str, ...] = DTYPES, help: str = "Data types of activations."):
    """--dtype as a comma list (the value reaches the command as `dtypes`, a tuple of canonical names)."""
    return click.option(
        "--dtype", "dtypes", default=default, show_default=default is not None,
        callback=callback(parse_dtype_list(choices)), metavar="|".join(choices),
        help=f"{help} One or more, e.g. {','.join(choices[:2])} ({', '.join(choices)}; aliases like float16 "
             "accepted).")


# ------------------------------------------------------------------------------ the commands that read runs
# (summary, compare, history, report) spell and mean these alike

def metrics_option(help: str):
    """--metric (repeatable; the value reaches the command as `metrics`, a tuple of names or patterns)."""
    return click.option("--metric", "metrics", multiple=True, help=help)


def case_filter_option(what: str = "cases whose 'bench/case'"):
    """-k REGEX (repeatable; the value reaches the command as `pattern`, a tuple): every -k must match."""
    return click.option("-k", "pattern", multiple=True, metavar="REGEX",
                        help=f"Keep {what} matches this regex; name=value matches that whole parameter (variant=fp8, "
                             "not fp8_all) (repeatable: kept only where every -k matches).")


def digits_option(fn):
    """--digits N: significant digits of the printed numbers (more where rounding would end on a zero)."""
    return click.option("--digits", type=click.IntRange(1, 15), default=4, show_default=True,
                        help="Significant digits (more where rounding would end on a zero: 1.39996, never 1.400).")(fn)
