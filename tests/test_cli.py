import subprocess
import sys

import click
import pytest

from qbench import cli, options

NO_TORCH = (
    "import sys; from qbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    "sys.stderr.write('TORCH' if 'torch' in sys.modules or 'triton' in sys.modules else 'LEAN')"
)


def test_help_lists_every_subcommand_without_importing_torch():
    result = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True)
    assert result.stderr.strip().endswith("LEAN"), result.stderr
    for name in cli.COMMANDS:
        assert f"  {name}" in result.stdout


def test_every_subcommand_help_loads_without_torch_and_ends_with_examples():
    for name in cli.COMMANDS:
        code = NO_TORCH.replace("['--help']", f"[{name!r}, '--help']")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.stderr.strip().endswith("LEAN"), (name, result.stderr)
        if name in ("compare",):
            assert "Examples:" in result.stdout


@pytest.mark.parametrize(
    "text, expected",
    [("1024,4096", (1024, 4096)), (" 7 ", (7,)), ("1,2,3", (1, 2, 3))],
)
def test_positive_int_lists(text, expected):
    assert options.parse_positive_ints(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [("10x,4", "not an integer"), ("0,4", "positive"), ("-8", "positive"), ("4,,8", "empty item"), ("", "empty item")],
)
def test_bad_int_lists_name_the_problem(text, fragment):
    with pytest.raises(click.BadParameter, match=fragment):
        options.parse_positive_ints(text)


def test_pairs_and_names():
    assert options.parse_pairs("1408x6144,6144X1408") == ((1408, 6144), (6144, 1408))
    with pytest.raises(click.BadParameter, match="IN x OUT"):
        options.parse_pairs("1408-6144")
    parse = options.parse_names(("train", "eval"))
    assert parse("eval,train") == ("eval", "train")
    with pytest.raises(click.BadParameter, match="unknown infer"):
        parse("infer")


def test_unknown_command_and_option_exit_2_in_one_line():
    for args in (["nosuch"], ["compare", "--bogus"]):
        result = subprocess.run([sys.executable, "-m", "qbench", *args], capture_output=True, text=True)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
