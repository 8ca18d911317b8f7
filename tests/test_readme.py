"""The README's tables of results are what the commands beside them print from the committed runs (#17: every
number the README quotes comes from a command). Each markdown table follows, in the text since the previous
table or heading, the `qbench summary|compare ... --markdown` command that prints it; each fenced block whose
first line is `$ qbench ...` holds that command's output. The commands run here, on results/ as committed,
and their tables must come out line for line as the README shows them."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINES = (ROOT / "README.md").read_text().splitlines()
MARKDOWN_COMMAND = re.compile(r"`(qbench (?:summary|compare) [^`]*--markdown[^`]*)`")


def _markdown_tables(lines: list[str]) -> list[tuple[int, list[str], str | None]]:
    """(first line number, the table's lines, the last markdown command in the text before it, or None)."""
    tables, text, i = [], [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            commands = MARKDOWN_COMMAND.findall(" ".join(text))
            tables.append((i + 1, lines[i:end], commands[-1] if commands else None))
            text, i = [], end
            continue
        text = [] if lines[i].startswith("#") else [*text, lines[i]]
        i += 1
    return tables


def _console_blocks(lines: list[str]) -> list[tuple[int, str, list[str]]]:
    """(line number, command, output lines) of each fenced block whose first line is `$ qbench ...`."""
    blocks = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("```") and lines[i + 1].startswith("$ qbench "):
            end = lines.index("```", i + 2)
            blocks.append((i + 2, lines[i + 1][2:], lines[i + 2:end]))
    return blocks


def _expand_braces(word: str) -> list[str]:
    """The shell's brace expansion of one word: run{1,2} -> run1 run2 (nested and repeated groups too)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if match is None:
        return [word]
    head, tail = word[:match.start()], word[match.end():]
    return [w for part in match.group(1).split(",") for w in _expand_braces(head + part + tail)]


def _run(command: str, columns: int | None = None) -> list[str]:
    """stdout lines of `qbench ...` run in the repository root, as a shell would split its words."""
    args = [w for token in shlex.split(command)[1:] for w in _expand_braces(token)]
    env = dict(os.environ, **({"COLUMNS": str(columns)} if columns else {}))
    done = subprocess.run([sys.executable, "-m", "qbench", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    return done.stdout.splitlines()


TABLES = _markdown_tables(README_LINES)
BLOCKS = _console_blocks(README_LINES)


def test_brace_expansion_as_the_shell_does_it():
    assert _expand_braces("results/x/run{1,2,3}") == ["results/x/run1", "results/x/run2", "results/x/run3"]
    assert _expand_braces("r/{a,b}{1,2}") == ["r/a1", "r/a2", "r/b1", "r/b2"]
    assert _expand_braces("-k") == ["-k"] and _expand_braces("x{1}") == ["x{1}"]


def test_the_readme_has_tables_of_both_kinds():
    """The scan finds what it checks (a README rewritten so that nothing matched would pass vacuously)."""
    assert len(TABLES) >= 10 and len(BLOCKS) >= 1


@pytest.mark.parametrize("line, table, command", TABLES, ids=[f"README:{t[0]}" for t in TABLES])
def test_markdown_table_is_its_commands_output(line, table, command):
    assert command is not None, f"README line {line}: no `qbench summary|compare ... --markdown` before this table"
    printed = [row for row in _run(command) if row.startswith("|")]
    assert printed == table, f"README line {line} is not what `{command}` prints"


@pytest.mark.parametrize("line, command, output", BLOCKS, ids=[f"README:{b[0]}" for b in BLOCKS])
def test_console_block_is_its_commands_output(line, command, output):
    width = max(len(row) for row in output)  # the width the block was printed at
    printed = [row.rstrip() for row in _run(command, columns=width)]
    while printed and not printed[-1]:
        printed.pop()
    assert printed == [row.rstrip() for row in output], f"README line {line} is not what `{command}` prints"


def test_every_results_folder_is_indexed_and_every_indexed_folder_exists():
    """results/README.md indexes the committed runs: each folder under results/ has a row, and each row's
    folder is there (a run removed to git history leaves the table too)."""
    index = (ROOT / "results" / "README.md").read_text()
    folders = {p.name for p in (ROOT / "results").iterdir() if p.is_dir()}
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    indexed = {re.match(r"\| `([^`/]+)", row).group(1) for row in rows}
    assert not folders - indexed, f"not in results/README.md: {sorted(folders - indexed)}"
    assert not indexed - folders, f"indexed but not under results/: {sorted(indexed - folders)}"


# a committed path: results/..., tests/fixtures/..., qbench/model/configs/...; an option before it is kept, so
# that paths a command writes (--out results/sb) are told from those it reads
SHIPPED_PATH = re.compile(r"(?<![\w/.])(--[\w-]+[ =])?((?:results|tests/fixtures|qbench/model/configs)/"
                          r"(?:\{[^}\s]*\}|[^\s`'\"),;{])*)")
OUTPUT_OPTIONS = ("--out", "--file", "--trace", "--trace-dir", "--plot")


def _shipped_paths(text: str) -> list[str]:
    """The committed paths a text names as inputs: brace groups and ranges (run1..3) expanded, placeholders
    (<...>, *, ...) and the paths of output options left out."""
    paths = []
    for option, path in SHIPPED_PATH.findall(text):
        path = path.rstrip(".:")
        if option.strip(" =") in OUTPUT_OPTIONS or any(mark in path for mark in ("<", ">", "*", "...")):
            continue
        span = re.fullmatch(r"(.*\D)(\d+)\.\.(\d+)", path)
        paths += ([f"{span.group(1)}{i}" for i in range(int(span.group(2)), int(span.group(3)) + 1)] if span
                  else _expand_braces(path))
    return paths


def test_every_committed_file_the_readme_and_the_help_examples_name_exists():
    """#17: the examples name files that ship (a run moved to git history must leave the README and the
    --help examples too)."""
    from qbench import cli

    texts = {"README.md": "\n".join(README_LINES)}
    for name in cli.COMMANDS:
        texts[f"qbench {name} --help"] = "\n".join(_run(f"qbench {name} --help"))
    named = [(source, path) for source, text in texts.items() for path in _shipped_paths(text)]
    assert len(named) > 100  # the scan finds what it checks
    missing = [(source, path) for source, path in named if not (ROOT / path).exists()]
    assert not missing, missing
