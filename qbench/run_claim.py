"""Who owns a run directory: the lock a writer holds on it, a claim abandoned by a killed run, and whether
files can be made in it at all (qbench.store.RunWriter asks these before it writes anything).

The lock is an flock on the directory itself (its inode never changes, unlike env.json, which is replaced
atomically): the kernel releases it when the holder dies, so a held lock means a live run.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from qbench.errors import QbenchUsageError


def lock_dir(path: Path) -> int | None:
    """An open descriptor of the directory `path` holding an exclusive flock, or None when another writer
    holds it. The kernel releases the lock when its holder dies (SIGKILL, the OOM killer), so a held lock
    means a live run; where flock is missing (not POSIX) the descriptor is returned unlocked."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise QbenchUsageError(f"cannot open run directory {path} ({exc.strerror}); choose another --out") from None
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def abandoned(path: Path, env_file: str) -> bool:
    """A run directory claimed by a run that died before its first record: its env file (and perhaps that
    file's temporary copy) only, and (the caller holds the directory's lock) no live writer."""
    return {p.name for p in path.iterdir()} <= {env_file, Path(env_file).with_suffix(".tmp").name}


def probe_writable(path: Path, records_file: str) -> None:
    """A one-line error when files cannot be made in the run directory `path` or its records cannot be
    added to (a read-only run, a read-only mount): a file is created there and removed again, and
    its records file is opened for appending, which changes nothing."""
    probe = path / f".qbench-probe-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        probe.unlink()
        if (path / records_file).exists():
            open(path / records_file, "ab").close()
    except OSError as exc:
        raise QbenchUsageError(f"run directory {path} is read-only ({exc.strerror}); choose another --out") from None
