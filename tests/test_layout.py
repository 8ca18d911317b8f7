"""The house's layering (see README, Code layout): imports only run downwards (commands -> benches ->
layers -> kernels; model pure arithmetic; kernels import nothing of qbench) and no module of qbench/
or kernels/ takes part in an import loop, counting imports inside functions too; the execution modes and
the tolerance table are defined once; and the tidy-record contract (qbench/metrics): every bench family
declares its metrics, no metric name spells an exec, timing or variant, and every metric a CPU run of
every bench command writes is declared."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent
# layer -> packages it must never import
FORBIDDEN = {
    "kernels": ("qbench",),
    "qbench.model": ("qbench.benches", "qbench.commands", "qbench.layers", "qbench.plots", "qbench.store",
                     "qbench.timing", "click", "rich", "torch"),
    "qbench.layers": ("qbench.benches", "qbench.commands", "qbench.store", "click"),
    "qbench.benches": ("qbench.commands", "click"),
}


def modules() -> dict[str, Path]:
    found = {}
    for path in [*(ROOT / "qbench").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module name an import statement of the file names (submodules where they exist)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_imports_only_run_downwards():
    bad = []
    for name, targets in graph().items():
        for layer, banned in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                bad += [f"{name} imports {t}" for t in targets if any(t == b or t.startswith(b + ".") for b in banned)]
    assert not bad, "; ".join(sorted(bad))


def _resolve(target: str, known) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def test_no_import_loops():
    edges = graph()
    deps = {n: {r for t in ts if (r := _resolve(t, edges)) and r != n} for n, ts in edges.items()}
    state: dict[str, int] = {}
    loops = []

    def visit(node, path):
        state[node] = 1
        for nxt in deps[node]:
            if state.get(nxt) == 1:
                loops.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in deps:
        if node not in state:
            visit(node, [node])
    assert not loops, "import loops: " + "; ".join(loops)


def test_autograd_functions_are_module_level_classes():
    """A torch.autograd.Function subclass defined inside a function is built on its first call: a layer
    compiled before any eager call then makes Dynamo trace a class definition, which it cannot (fullgraph
    fails). Every such class in qbench/ and kernels/ sits at module level."""
    nested = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top:
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith("autograd.Function") or b == "Function" for b in bases):
                    nested.append(f"{name}.{node.name}")
    assert not nested, "autograd Functions built inside functions: " + ", ".join(nested)


def _literals(kind):
    """(module, node) of every literal of an AST kind in qbench/ and kernels/."""
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind):
                yield name, node


def test_the_execution_modes_are_listed_once():
    """("eager", "compile", "graph") is written in qbench/modes.py only; every family imports it."""
    from qbench.modes import EXECS

    found = [name for name, node in _literals(ast.Tuple)
             if all(isinstance(e, ast.Constant) for e in node.elts) and tuple(e.value for e in node.elts) == EXECS]
    assert found == ["qbench.modes"]


def _is_dtype_key(node) -> bool:
    from qbench.dtypes import DTYPE_ALIASES

    if isinstance(node, ast.Constant):
        return node.value in DTYPE_ALIASES
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"


def test_the_tolerance_table_is_defined_once():
    """No table of relative bounds (floats below 1) keyed by dtype (a name or a torch dtype) outside
    qbench/dtypes.py, whose TOLERANCE has an entry for every activation dtype and 8-bit format."""
    from qbench.dtypes import ACTIVATION_DTYPES, TOLERANCE

    found = [name for name, node in _literals(ast.Dict)
             if len(node.keys) > 1 and all(k is not None and _is_dtype_key(k) for k in node.keys)
             and all(isinstance(v, ast.Constant) and isinstance(v.value, float) and 0 < v.value < 1
                     for v in node.values)]
    assert found == []
    assert set(TOLERANCE) == {*ACTIVATION_DTYPES, "int8", "fp8"}


# ------------------------------------------------------------------ the tidy-record contract (qbench/metrics)
FAMILIES = ("switchback", "fragmented", "moe", "block", "train_check", "grouped_gemm", "model")
NO_VARIANTS = ("model",)  # the calibration measures the GPU's own rates: no implementation to choose
# family -> a small CPU run of its command (all started at once; TRITON_INTERPRET only where a kernel bench
# needs the interpreter on a CPU)
CPU_RUNS = {
    "switchback": (["switchback", "--pairs", "32x64", "--batch-sizes", "16", "--repeat", "1"], False),
    "fragmented": (["fragmented", "--sizes", "64", "--batch-sizes", "1", "--fragments", "2", "--steps", "1",
                    "--warmup", "0"], False),
    "moe": (["moe", "--world-size", "1", "--steps", "1", "--warmup", "0", "--samples", "16", "--model-dim", "16",
             "--hidden-size", "16", "--num-local-experts", "2"], False),
    "block": (["block", "--preset", "tiny", "--batch-sizes", "2", "--layers", "1", "--steps", "1"], False),
    "train_check": (["train-check", "--preset", "lm-tiny", "--steps", "2", "--layers", "1"], False),
    "grouped_gemm": (["grouped", "--dtype", "bf16", "--model-dim", "32", "--hidden-size", "48", "--samples", "20",
                      "--num-local-experts", "2"], True),
    "model": (["model", "calibrate", "--file", "{out}.yaml"], False),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_declares_its_metrics_and_no_name_spells_a_field(family):
    """Declarations exist (qbench/metrics/<family>.py), and no metric name spells an exec, a timing or one of
    the family's variants as whole words: those are record params."""
    from qbench.metrics.registry import declared, hidden_dimension

    names = declared().get(family)
    assert names, f"qbench/metrics declares no metric of {family}"
    spelt = {name: word for name in names if (word := hidden_dimension(family, name))}
    assert not spelt, f"{family} metric names that spell a record field: {spelt}"


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """family -> (exit code, stderr, records) of its CPU run, every command run at once."""
    import subprocess
    import sys

    from qbench import store

    root = tmp_path_factory.mktemp("cpu-runs")
    base = env_without_interpreter()
    started = {}
    for family, (args, interpret) in CPU_RUNS.items():
        out = root / family
        command = [a.format(out=out) for a in args] + ["--device", "cpu", "--out", str(out)]
        env = {**base, "PYTHONPATH": str(ROOT), **({"TRITON_INTERPRET": "1"} if interpret else {})}
        started[family] = (out, subprocess.Popen([sys.executable, "-m", "qbench", *command], cwd=root, env=env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    runs = {}
    for family, (out, proc) in started.items():
        _, err = proc.communicate(timeout=300)
        runs[family] = (proc.returncode, err, store.read_records(out) if proc.returncode == 0 else [])
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_metric_a_cpu_run_writes_is_declared(family, cpu_runs):
    """A small CPU run of the family's command: its records are of the family's bench, hold exec and variant
    as params (where the family has variants), and every metric they carry is declared."""
    from qbench.metrics.registry import declared

    code, err, records = cpu_runs[family]
    assert code == 0, err[-2000:]
    assert records and {r["bench"] for r in records} == {family}
    if family not in NO_VARIANTS:
        assert all({"exec", "variant"} <= set(r["params"]) for r in records), [r["params"] for r in records][:3]
    undeclared = sorted({m for r in records for m in r["metrics"]} - set(declared().get(family, {})))
    assert not undeclared, f"{family} records undeclared metrics: {undeclared}"


@pytest.mark.parametrize("bench", sorted(__import__("qbench.contract", fromlist=["FAMILIES"]).FAMILIES))
def test_every_family_implements_the_bench_contract(bench):
    """qbench/contract.py: each family's module has BENCH (its records' bench name, with declared metrics),
    measured_id, resolve, pending, run and table, and its bench command runs through qbench.runner."""
    from qbench.contract import Bench, family
    from qbench.metrics.registry import declared

    module = family(bench)
    assert isinstance(module, Bench), [m for m in ("BENCH", "measured_id", "resolve", "pending", "run", "table")
                                       if not hasattr(module, m)]
    assert module.BENCH == bench and declared().get(bench)


def test_bench_commands_run_through_the_one_runner():
    """No bench command calls run_and_store itself: run_bench (qbench/runner.py) resumes, counts and stores."""
    commands = ("switchback", "fragmented", "moe", "block", "train_check", "grouped")
    direct = [name for name in commands
              if "run_and_store" in (ROOT / "qbench" / "commands" / f"{name}.py").read_text()]
    assert not direct, f"commands storing records past the runner: {direct}"
