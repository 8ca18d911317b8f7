"""`-k REGEX` of `qbench summary` and `qbench compare`: given more than once, a record (or row) is kept only
where every pattern matches, so `-k exec=eager -k layer=linear` narrows twice instead of the last one winning."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from qbench.errors import QbenchUsageError


def matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of a text against every pattern (re.search); no pattern keeps everything. An invalid regex is a
    usage error naming it."""
    regexes = []
    for pattern in patterns:
        try:
            regexes.append(re.compile(pattern))
        except re.error as exc:
            raise QbenchUsageError(f"-k {pattern!r} is not a valid regular expression ({exc})") from None
    return lambda text: all(regex.search(text) for regex in regexes)


def described(patterns: Sequence[str]) -> str:
    """' -k A -k B' as a message names the patterns ('' without any)."""
    return "".join(f" -k {pattern!r}" for pattern in patterns)
