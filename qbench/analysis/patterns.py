"""`-k REGEX` of `qbench summary` and `qbench compare`: given more than once, a record (or row) is kept only
where every pattern matches, so `-k exec=eager -k layer=linear` narrows twice instead of the last one winning.
A pattern that is one parameter and a plain value (`variant=fp8`) matches that whole parameter of a case id
(`.../variant=fp8/...`), not a longer value that starts alike (fp8_all, fp8_cublas); any other is a regex."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from qbench.errors import QbenchUsageError

PARAMETER = re.compile(r"^[A-Za-z_]\w*=[\w.+-]+$")  # name=value, as a case id spells one parameter


def matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of a text against every pattern (re.search); no pattern keeps everything. An invalid regex is a
    usage error naming it."""
    regexes = []
    for pattern in patterns:
        try:
            regexes.append(re.compile(_whole(pattern) if PARAMETER.match(pattern) else pattern))
        except re.error as exc:
            raise QbenchUsageError(f"-k {pattern!r} is not a valid regular expression ({exc})") from None
    return lambda text: all(regex.search(text) for regex in regexes)


def _whole(parameter: str) -> str:
    """The regex of one whole parameter: after the start or a '/', before a '/', a ' ' (compare's rows add
    the metric after a space) or the end."""
    return rf"(?:^|/){re.escape(parameter)}(?=[/ ]|$)"


def described(patterns: Sequence[str]) -> str:
    """' -k A -k B' as a message names the patterns ('' without any)."""
    return "".join(f" -k {pattern!r}" for pattern in patterns)
