"""What the `qbench model` commands share: examples, option groups and the rule that model errors
(ValueErrors naming the problem: ConfigError, QbenchUsageError) become one line, exit 2."""

from __future__ import annotations

import contextlib

import click

from qbench.errors import QbenchUsageError
from qbench.options import FiniteFloat

EPILOG = """\b
Examples:
  qbench model lstm --config deepflow --debug      # the shipped seed config, by name
  qbench model lstm --config deepflow --set model_param.batch_size=64 --tokens 7.7e10 --hours 24
  qbench model lstm --config deepflow --sweep scheduling_param.dp=1,2,4,8 --set scheduling_param.topology=mesh
  qbench model lstm --config deepflow --deepflow corrected
  qbench model quirks --config deepflow
  qbench model search --config deepflow --devices 8 --topologies ring,mesh --time-budget 0.5
  qbench model search-hw --config deepflow --set model_param.vocab_size=100000 --starts 4
  qbench model search-hw --config deepflow --workload transformer --shape layers=24 --shape batch=32
  qbench model gemm --m 8192 --k 4096 --n 4096 --dtype bf16 --gpu h200
  qbench model floors switchback batch_size=32768 dim_in=1024 dim_out=4096 dtype=bf16
  qbench model --against results/switchback-h200-modes-c4c2232/run1 --gpu h200
  qbench model gemm --m 8192 --k 4096 --n 4096 --calibrated results/model-calibration-h200.yaml
  qbench model calibrate --file calibration.yaml   # on a GPU: this device's ceilings, for --calibrated
"""
GPUS = ("h100", "h200", "a100-40gb", "a100-80gb")


@contextlib.contextmanager
def usage_errors():
    """Model errors (bad config keys, unknown GPUs) become one-line usage errors, exit 2; so does an
    overflow of the model's arithmetic, which only out-of-range config or option values cause."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, QbenchUsageError):
            raise
        raise QbenchUsageError(str(exc)) from None
    except ArithmeticError as exc:
        raise QbenchUsageError(f"the model's arithmetic failed ({type(exc).__name__}: {exc}); a config or "
                               "option value is out of range") from None


def gpu_options(fn):
    fn = click.option("--calibrated", type=click.Path(dir_okay=False), help="A `qbench model calibrate` file.")(fn)
    return click.option("--gpu", type=click.Choice(GPUS, case_sensitive=False), help="Datasheet preset.")(fn)


def config_options(fn):
    """--config and --set: a DeepFlow YAML (a path, or the name of a shipped config) and overrides."""
    fn = click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                      help="Override a config value.")(fn)
    return click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
                        help="DeepFlow YAML: a path, or a shipped config by name (deepflow).")(fn)


def deepflow_option(default: str):
    """--deepflow exact|corrected: DeepFlow with its quirks, or each quirk of `qbench model quirks` fixed."""
    return click.option("--deepflow", "mode", type=click.Choice(("exact", "corrected")), default=default,
                        show_default=True, help="exact: DeepFlow as published, quirks included; corrected: "
                        "each quirk listed by `qbench model quirks` fixed.")


def budget_options(fn):
    """--time-budget, or --tokens with --hours: seconds allowed per step."""
    fn = click.option("--hours", type=FiniteFloat(min=0, min_open=True),
                      help="Wall-clock target (with --tokens).")(fn)
    fn = click.option("--tokens", type=FiniteFloat(min=1), help="Training tokens: budget = hours / steps.")(fn)
    return click.option("--time-budget", type=FiniteFloat(min=0, min_open=True),
                        help="Seconds allowed per step.")(fn)


def workload_options(fn):
    """--config, --set, --workload, --shape and the time budget, shared by search and search-hw."""
    fn = budget_options(fn)
    fn = click.option("--shape", multiple=True, metavar="KEY=VALUE",
                      help="Transformer shape: batch, seq, layers, hidden, heads, vocab, ffn, recompute.")(fn)
    fn = click.option("--workload", type=click.Choice(("lstm", "transformer")), default="lstm", show_default=True,
                      help="The config's LSTM, or a dense transformer on the config's hardware.")(fn)
    return config_options(fn)
