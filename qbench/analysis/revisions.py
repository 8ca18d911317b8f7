"""The order of the code revisions runs were made on: git's order where the repository is at hand.

A revision is a run's commit (env.json's git_commit) or, for a run that names no commit (an imported file, a
copied tree), the run itself at its recorded time. A run made in a checkout with uncommitted changes (git_dirty)
ran code that is not its commit: it is the revision `<commit>+dirty:<source hash>` (env.json's source_hash, the
hash of the code that ran, where recorded), so two different trees on one commit never merge, and it sits at
its commit's place in git's order. Revisions are ordered by git (`git rev-list --topo-order`, oldest first: a
commit comes after every commit it descends from) when every commit is known to the checkout qbench runs
from, and otherwise by their earliest run's UTC time (env.json's time_utc), the order they were measured in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qbench.analysis.compare import Run
from qbench.env import CHECKOUT

SHORT = 7  # hex digits of a commit as tables print it (git's own short form)


@dataclass(frozen=True)
class Revision:
    label: str  # short commit ('+dirty:<source hash>' where the tree had changes), or the run's label without one
    commit: str | None
    time: str  # earliest time_utc of its runs ('' when none is recorded)


def revision_of(run: Run) -> Revision:
    commit = run.env.get("git_commit") or None
    time = str(run.env.get("time_utc") or "")
    if commit is None:
        return Revision(run.label, None, time)
    if not run.env.get("git_dirty"):
        return Revision(commit[:SHORT], commit, time)
    source = str(run.env.get("source_hash") or "")[:SHORT]
    return Revision(f"{commit[:SHORT]}+dirty" + (f":{source}" if source else ""), commit, time)


def git_positions(commits: Sequence[str], root: Path = CHECKOUT) -> dict[str, int] | None:
    """commit -> position in git's topological order (oldest first), or None when root is not a checkout,
    git is missing, or some commit is unknown to it."""
    if not commits or not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-list", "--topo-order", "--reverse", *sorted(set(commits))], cwd=root,
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    order = {sha: i for i, sha in enumerate(out.split())}
    return order if all(c in order for c in commits) else None


def ordered(runs: Sequence[Run], root: Path = CHECKOUT) -> tuple[list[Revision], dict[str, Revision], str]:
    """(revisions oldest first, run label -> its revision, 'git' or 'time': how they were ordered)."""
    of_run = {run.label: revision_of(run) for run in runs}
    first: dict[str, Revision] = {}
    for rev in of_run.values():
        known = first.get(rev.label)
        first[rev.label] = rev if known is None or (rev.time or "~") < (known.time or "~") else known
    of_run = {label: first[rev.label] for label, rev in of_run.items()}
    revisions = list(first.values())
    commits = [r.commit for r in revisions]
    positions = git_positions(commits, root) if all(commits) else None
    if positions is not None:
        return sorted(revisions, key=lambda r: (positions[r.commit], r.time, r.label)), of_run, "git"
    return sorted(revisions, key=lambda r: (r.time or "~", r.label)), of_run, "time"
