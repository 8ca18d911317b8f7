"""Output files named on the command line (a figure, a calibration file), checked before any work.

A run that measures for minutes and then cannot write its output has wasted those minutes, so the
commands check each output file first: its folder is made, and the file is opened for appending and
removed again if the check created it.
"""

from __future__ import annotations

from pathlib import Path

from qbench.errors import QbenchUsageError


def check_writable_file(path: str | Path, what: str) -> Path:
    """`path` as a Path once it is known that a file can be written there; QbenchUsageError otherwise."""
    target = Path(path)
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
