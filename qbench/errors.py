"""Errors that the command line turns into a one-line message and exit code 2."""


class QbenchUsageError(ValueError):
    """Bad input from the user (a malformed flag, a missing or corrupt run, ...).

    The message names the problem and the fix; the CLI prints it on one line, never a traceback.
    """


def read_text(path, error: type[ValueError] = QbenchUsageError, not_text: str = "is not UTF-8 text") -> str:
    """The UTF-8 text of the file at path (a pathlib.Path), or `error` with one line naming it:
    "<path> <not_text>" for a binary file, "cannot read <path> (<reason>)" otherwise; never a traceback."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} {not_text}") from None
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror})") from None


class QbenchWarning(UserWarning):
    """Something qbench read and left out (a run's bad lines, say): the CLI prints it as one line on stderr."""
