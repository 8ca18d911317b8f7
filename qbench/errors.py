"""Errors that the command line turns into a one-line message and exit code 2."""


class QbenchUsageError(ValueError):
    """Bad input from the user (a malformed flag, a missing or corrupt run, ...).

    The message names the problem and the fix; the CLI prints it on one line, never a traceback.
    """
