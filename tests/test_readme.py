"""The tables of results in README.md and docs/*.md are what the commands beside them print from the committed
runs (#17, #48: every number they quote comes from a command). Each markdown table follows, in the text since
the previous table or heading, the `qbench summary|compare|trace ... --markdown` command that prints it; each
fenced block whose first line is `$ qbench ...` holds that command's output. The commands run here, on
results/ as committed, and their tables must come out line for line as the pages show them. The README's
main job, run in a fresh clone, leaves the tree clean (#48: following the README in order passes)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text().splitlines()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
README_LINES = PAGES["README.md"]
MARKDOWN_COMMAND = re.compile(r"`(qbench (?:summary|compare|trace|explain) [^`]*--markdown[^`]*)`")
# an analysis command quoted in a page; one naming a user's runs (runs/...) or a placeholder (RUN, N, FILE,
# METRIC:PCT, ..., <...>) is a pattern, not runnable as written
QUOTED_COMMAND = re.compile(r"`(qbench (?:summary|compare|trace|explain) [^`]*)`")
PLACEHOLDER = re.compile(r"\.\.\.|<|(^|\s)runs/|(^|[\s=:])[A-Z][A-Z0-9_]*\b")


def _markdown_tables(lines: list[str]) -> list[tuple[int, list[str], str | None]]:
    """(first line number, the table's lines, the last markdown command in the text before it, or None); fenced
    blocks are skipped (their output is checked whole, below)."""
    tables, text, i = [], [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            i = lines.index("```", i + 1) + 1  # past the closing fence
            continue
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


TABLES = [(f"{page}:{line}", table, command) for page, lines in PAGES.items()
          for line, table, command in _markdown_tables(lines)]
BLOCKS = [(f"{page}:{line}", command, output) for page, lines in PAGES.items()
          for line, command, output in _console_blocks(lines)]
QUOTED = sorted({command for lines in PAGES.values() for command in QUOTED_COMMAND.findall("\n".join(lines))
                 if not PLACEHOLDER.search(command)})


def test_brace_expansion_as_the_shell_does_it():
    assert _expand_braces("results/x/run{1,2,3}") == ["results/x/run1", "results/x/run2", "results/x/run3"]
    assert _expand_braces("r/{a,b}{1,2}") == ["r/a1", "r/a2", "r/b1", "r/b2"]
    assert _expand_braces("-k") == ["-k"] and _expand_braces("x{1}") == ["x{1}"]


def test_the_pages_have_tables_of_both_kinds():
    """The scan finds what it checks (pages rewritten so that nothing matched would pass vacuously): the
    README's headline tables, tables on every docs/ page, console blocks, quoted commands."""
    pages_with_tables = {where.split(":")[0] for where, _, _ in TABLES}
    assert {"README.md", *(f"docs/{page}.md" for page in ("switchback", "fragmented", "moe", "model", "measuring"))} \
        <= pages_with_tables
    assert len(TABLES) >= 20 and len(BLOCKS) >= 1 and len(QUOTED) >= 20


def test_placeholders_tell_patterns_from_runnable_commands():
    patterns = ["qbench compare --group N", "qbench summary RUN --metric M", "qbench compare runs/A runs/B",
                "qbench compare A B --fail-on METRIC:PCT", "qbench summary r --ratio-to PARAM=REF",
                "qbench trace x/..."]
    runnable = ["qbench summary results/x/run{1,2} -k exec=graph --metric '*_time'", "qbench trace a.csv --by phase"]
    assert all(PLACEHOLDER.search(c) for c in patterns) and not any(PLACEHOLDER.search(c) for c in runnable)


def test_fenced_blocks_are_skipped_by_the_table_scan():
    lines = ["`qbench summary r --markdown`", "```", "| not a table |", "```", "| a |"]
    assert _markdown_tables(lines) == [(5, ["| a |"], "qbench summary r --markdown")]


@pytest.mark.parametrize("where, table, command", TABLES, ids=[t[0] for t in TABLES])
def test_markdown_table_is_its_commands_output(where, table, command):
    assert command is not None, f"{where}: no `qbench summary|compare|trace ... --markdown` before this table"
    printed = [row for row in _run(command) if row.startswith("|")]
    assert printed == table, f"{where} is not what `{command}` prints"


@pytest.mark.parametrize("where, command, output", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_console_block_is_its_commands_output(where, command, output):
    width = max(len(row) for row in output)  # the width the block was printed at
    printed = [row.rstrip() for row in _run(command, columns=width)]
    while printed and not printed[-1]:
        printed.pop()
    assert printed == [row.rstrip() for row in output], f"{where} is not what `{command}` prints"


@pytest.mark.parametrize("command", QUOTED)
def test_every_quoted_analysis_command_runs_on_the_committed_runs(command):
    """A command the README or docs/ quotes beside a number runs as written (exit 0) on results/."""
    assert _run(command)


def _index_problems(root: Path) -> list[str]:
    """What results/README.md (the index) and the folders under results/ disagree on: each folder has a row,
    and each row's folder is there (a run removed to git history leaves the table too)."""
    index = (root / "results" / "README.md").read_text()
    folders = {p.name for p in (root / "results").iterdir() if p.is_dir()}
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    indexed = {re.match(r"\| `([^`/]+)", row).group(1) for row in rows}
    return ([f"not in results/README.md: {sorted(folders - indexed)}"] if folders - indexed else []) + \
        ([f"indexed but not under results/: {sorted(indexed - folders)}"] if indexed - folders else [])


def test_every_results_folder_is_indexed_and_every_indexed_folder_exists():
    assert not _index_problems(ROOT)


def _main_job() -> str:
    """The one command in the first fenced block of the README's "Main job" section."""
    section = README_LINES[README_LINES.index("## Main job"):]
    start = section.index("```") + 1
    block = section[start:section.index("```", start)]
    assert len(block) == 1 and block[0].startswith("qbench "), block
    return block[0]


def test_ci_runs_the_readmes_main_job_before_the_suite():
    """.ci/run follows the README in order: set-up, the main job as the README prints it, then the tests."""
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert _main_job() in steps
    assert steps.index(_main_job()) < next(i for i, s in enumerate(steps) if s.startswith("python3 -m pytest"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_main_job_in_a_fresh_clone_leaves_the_tree_clean(tmp_path):
    """#48: the README's main job, run in a fresh clone of the committed tree, writes only where git ignores
    (runs/), so the tree stays clean and the results index still matches results/."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    args = shlex.split(_main_job())[1:]
    # as a user's shell runs it: without the interpreter switch the test set-up sets for the kernel tests (on a
    # CPU the main job then takes the torch references, seconds on an idle 2-core machine)
    env = env_without_interpreter(PYTHONPATH=str(clone))
    done = subprocess.run([sys.executable, "-m", "qbench", *args], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert list((clone / "runs").iterdir()), "the main job wrote no run under runs/"
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", f"the main job left the tree dirty:\n{status}"
    assert not _index_problems(clone)


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


def test_every_committed_file_the_pages_and_the_help_examples_name_exists():
    """#17: the pages and the examples name files that ship (a run moved to git history must leave the README,
    docs/ and the --help examples too)."""
    from qbench import cli

    texts = {page: "\n".join(lines) for page, lines in PAGES.items()}
    for name in cli.COMMANDS:
        texts[f"qbench {name} --help"] = "\n".join(_run(f"qbench {name} --help"))
    named = [(source, path) for source, text in texts.items() for path in _shipped_paths(text)]
    assert len(named) > 100  # the scan finds what it checks
    missing = [(source, path) for source, path in named if not (ROOT / path).exists()]
    assert not missing, missing
