"""Rank bodies for the launcher fault tests (no tests here: spawned ranks import this module by name)."""

import os
import time
from pathlib import Path


def note_pid_and_wait(ctx, folder):
    """Each rank writes its pid into `folder`, then waits (as a long sweep would) until it is ended."""
    Path(folder, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)
    yield "unreachable"
