"""Output files named on the command line (a figure, a calibration file), checked before any work.

A run that measures for minutes and then cannot write its output has wasted those minutes, so the
commands check each output file first: its folder is made, and the file is opened for appending and
removed again if the check created it.
"""

from __future__ import annotations

import os
from pathlib import Path

from qbench.errors import QbenchUsageError

NAME_MAX = 255  # bytes in one name of a path on Linux and macOS file systems (a smaller limit is caught on use)
PATH_MAX = 4096  # bytes in a whole path


def name_problem(path: str | Path) -> str | None:
    """Why the file system cannot take `path` as a name (a NUL byte, a name or path too long), or None.
    Checked before the path is used: pathlib's exists() and is_dir() raise on such a name instead of
    answering False."""
    text = os.fsencode(os.fspath(path))
    if b"\0" in text:
        return "it holds a NUL byte"
    longest = max((len(part) for part in text.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"a name of {longest} bytes; the file system takes at most {NAME_MAX}"
    if len(text) > PATH_MAX:
        return f"a path of {len(text)} bytes; the file system takes at most {PATH_MAX}"
    return None


def check_name(path: str | Path, what: str, fix: str = "choose a shorter name") -> Path:
    """`path` as a Path when the file system can take its name; QbenchUsageError naming it otherwise."""
    why = name_problem(path)
    if why is not None:
        raise QbenchUsageError(f"cannot use {what} {_short(path)} ({why}); {fix}")
    return Path(path)


def _short(path: str | Path) -> str:
    """A path as an error shows it: a name too long to read is cut in the middle."""
    text = os.fspath(path).replace("\0", "\\0")
    return text if len(text) <= 120 else f"{text[:60]}...{text[-50:]}"


def check_writable_file(path: str | Path, what: str) -> Path:
    """`path` as a Path once it is known that a file can be written there; QbenchUsageError otherwise."""
    target = check_name(path, what, "choose another path")
    blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise QbenchUsageError(f"cannot write {what} {target} ({blocker} is a file); choose another path")
    if target.is_dir():
        raise QbenchUsageError(f"cannot write {what} {target} (it is a folder); give a file name")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        existed = target.exists()
        with open(target, "ab"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        raise QbenchUsageError(f"cannot write {what} {target} ({exc.strerror}); choose another path") from None
    return target
