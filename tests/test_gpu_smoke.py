"""scripts/gpu_smoke.txt (the end-to-end GPU tests to run after a change to a bench or a layer) names tests
that exist, each marked `gpu`, and covers every bench's command."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "scripts" / "gpu_smoke.txt"
BENCH_TESTS = ("tests/test_switchback_cli.py", "tests/test_block.py", "tests/test_fragmented_bench.py",
               "tests/test_moe_records.py")  # the end-to-end tests of qbench switchback, block, fragmented, moe


def _ids() -> list[tuple[str, str]]:
    return [tuple(line.split("::")) for line in SMOKE.read_text().splitlines() if "::" in line]


def test_every_smoke_test_exists_and_is_marked_gpu():
    ids = _ids()
    assert len(ids) >= len(BENCH_TESTS)
    for path, name in ids:
        tree = ast.parse((ROOT / path).read_text())
        tests = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert name in tests, f"{path}::{name} does not exist"
        marks = {ast.unparse(d) for d in tests[name].decorator_list}
        assert "pytest.mark.gpu" in marks, f"{path}::{name} is not marked gpu"


def test_every_bench_command_is_in_the_smoke_set():
    paths = {path for path, _ in _ids()}
    assert [b for b in BENCH_TESTS if b not in paths] == []
