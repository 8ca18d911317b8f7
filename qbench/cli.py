"""The qbench command line: a click group whose subcommands live in qbench/commands/.

Each subcommand is loaded only when it runs (or when help lists it), and command modules import
torch and triton inside their functions, so `qbench --help` starts fast. Adding a family is one
line in COMMANDS.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import warnings

import click

from qbench import __version__
from qbench.errors import QbenchUsageError, QbenchWarning

# name -> module under qbench.commands that defines `command`
COMMANDS = {
    "switchback": "switchback",
    "block": "block",
    "train-check": "train_check",
    "fragmented": "fragmented",
    "moe": "moe",
    "grouped": "grouped",
    "model": "model",
    "explain": "explain",
    "compare": "compare",
    "summary": "summary",
    "trace": "trace",
    "import": "import_run",
    "plot": "plot",
    "history": "history",
    "report": "report",
    "export": "export",
}

EPILOG = """\b
Examples:
  qbench switchback --dims 1024,4096
  qbench block --preset vit-h --exec compile
  qbench fragmented --sizes 2048,4096
  qbench moe --world-size 4
  qbench model lstm --config deepflow
  qbench compare results/moe-h200x4-static-8518c40/run{1,2} --fail-on step_ms:5
  qbench summary results/switchback-h200-modes-c4c2232/run{1,2,3} --metric kernels_speedup --by variant
  qbench trace results/moe-h200-ws1/trace-a1036c8/traces/a2a-L8-D1-hot0-randn-triton-rank0.csv --by phase
"""


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"qbench.commands.{COMMANDS[name]}")
        return module.command


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qbench")
def cli() -> None:
    """Is this low-precision or sparse layer actually faster, by how much, and how far from the
    hardware limit? Benchmarks that store every sample, compare runs, and explain times with a
    roofline model."""
    # torch's one-time notice when cuBLAS is the first CUDA call of a thread without a current context (the
    # autograd engine's device thread, when a backward starts with a matmul); torch then sets the primary
    # context itself, so the notice says nothing about the run
    warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")
    if warnings.showwarning is not _show_warning:
        _show_warning.default = warnings.showwarning
        warnings.showwarning = _show_warning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """What qbench itself warns of (a run's left-out lines) as one line on stderr, without the source
    location Python's format adds; any other warning as Python shows it."""
    if issubclass(category, QbenchWarning):
        click.echo(f"qbench: warning: {message}", err=True)
    else:
        _show_warning.default(message, category, filename, lineno, file, line)


def _fail(prog: str, message: str, code: int) -> None:
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, so no per-configuration error handler takes
    it for a failed configuration): the run writer closes as after Ctrl-C, writing its CSV and autotuner
    picks. `timeout`, batch schedulers at their time limit and `kill` send SIGTERM, which would otherwise
    end the process on the spot."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _on_sigterm(handler):
    """Install handler for SIGTERM (only the main thread may); returns the previous one, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr and exit 2, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    prog = "qbench" + (f" {args[0]}" if args and args[0] in COMMANDS else "")
    previous = _on_sigterm(_raise_terminated)
    try:
        _run(args, prog)
    finally:
        if previous is not None:
            _on_sigterm(previous)


def _run(args: list[str], prog: str) -> None:
    try:
        code = cli.main(args=args, prog_name="qbench", standalone_mode=False)
    except click.UsageError as exc:
        hint = exc.ctx.command_path if exc.ctx else "qbench"
        param = exc.param.get_error_hint(exc.ctx) if getattr(exc, "param", None) and exc.ctx else None
        detail = f"{param}: {exc.message}" if param else exc.format_message()
        if isinstance(exc, click.MissingParameter):  # click leaves its message empty: say what is missing
            kind = exc.param_type or (exc.param.param_type_name if exc.param else "parameter")
            detail = f"missing {kind} {param or ''}".strip()
        _fail(prog, f"{detail} (see '{hint} --help')", 2)
    except click.ClickException as exc:
        _fail(prog, exc.format_message(), exc.exit_code)
    except QbenchUsageError as exc:
        _fail(prog, str(exc), 2)
    except click.Abort:
        _fail(prog, "interrupted", 130)
    except KeyboardInterrupt:
        _fail(prog, "interrupted; records measured so far are kept", 130)
    except Terminated:
        _fail(prog, "terminated (SIGTERM); records measured so far are kept", 128 + signal.SIGTERM)
    except Exception as exc:  # noqa: BLE001 - a bug still ends in one line; its traceback goes to a file
        _fail(prog, f"internal error: {type(exc).__name__}: {_first_line(exc)} (a bug; traceback in "
                    f"{_save_traceback(exc)})", 1)
    sys.exit(code if isinstance(code, int) else 0)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else ""


def _save_traceback(exc: BaseException) -> str:
    """Write the traceback of an unexpected error to a temporary file, for a bug report."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="qbench-traceback-", suffix=".txt", delete=False) as fh:
        traceback.print_exception(exc, file=fh)
    return fh.name
