"""The style kept by a tool: `ruff check` with the rules configured in pyproject.toml (pycodestyle,
pyflakes, isort, bugbear, pyupgrade and McCabe complexity at most 10) passes on every Python file of the
project, so the README's test command (and CI) fails on a style finding as on a failing test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    found = shutil.which("ruff")
    if found:
        return [found]
    pytest.importorskip("ruff")  # the test extra installs it; a checkout without it cannot check the style
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes_on_the_project():
    done = subprocess.run([*_ruff(), "check", "--no-cache", "qbench", "kernels", "tests", "scripts"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_complexity_rule_is_configured():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"C90"' in text and "max-complexity = 10" in text
