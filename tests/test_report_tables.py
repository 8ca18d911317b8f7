"""Tables that fit the console (report.FittedTable, the one mechanism every table uses): too many columns
split into several tables that each repeat the key columns, status reasons numbered below the table instead
of wrapped inside a cell, and every command's table at COLUMNS=120 within 120 characters, no cell cut to '…'."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from qbench import report, store, units
from tests.helpers import env_without_interpreter, timed_record, write_run

FIXTURES = Path(__file__).parent / "fixtures"
WIDTH = 120
ELLIPSIS = "\u2026"
TOP = "\u250f"  # the top-left corner of a rich table (its heavy header box)


def _render(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, no_color=True)
    console.print(renderable)
    return console.file.getvalue()


def _tables(text: str) -> list[str]:
    """The text of each table printed, from its top border to the line before the next one's."""
    lines, starts = text.splitlines(), [i for i, line in enumerate(text.splitlines()) if line.startswith(TOP)]
    return ["\n".join(lines[a:b]) for a, b in zip(starts, [*starts[1:], len(lines)])]


def _records(n_metrics: int = 9) -> list[dict]:
    """Records of two varying params (and one shared), many metrics, one skipped and one failed with reasons."""
    metrics = {f"a_fairly_long_metric_{i}": 1.0 + i / 7 for i in range(n_metrics)}
    out = [store.make_record("toy", {"size": s, "layer": layer, "dtype": "fp32"},
                             {m: v * s for m, v in metrics.items()}, units=dict.fromkeys(metrics, units.MS))
           for s in (64, 4096) for layer in ("linear", "fragmented")]
    reason = "relative error [1e-1] > bound 1e-2 at row 3 (a reason of many words that no narrow cell holds)"
    out[1].update(status="error", error=reason, metrics={})
    out[2].update(status="skipped", error="needs a CUDA device", metrics={})
    out[3].update(status="skipped", error="needs a CUDA device", metrics={})
    return out


def test_a_wide_table_splits_into_tables_that_repeat_the_key_columns_and_fit():
    metrics = [f"a_fairly_long_metric_{i}" for i in range(9)]
    table = report.records_table(_records(), ["size", "layer", "dtype"], metrics)
    text = _render(table, 100)
    parts = _tables(text)
    assert len(parts) > 1 and max(map(len, text.splitlines())) <= 100 and ELLIPSIS not in text
    for part in parts:  # each table names its rows: the varying params and the status, in every table
        header = part.splitlines()[1:4]
        assert all(any(name in line for line in header) for name in ("size", "layer", "status"))
    assert all(f"a_fairly_long_metric_{i}" in text for i in range(9))
    cells = [line for line in text.splitlines() if line[:1] in ("\u2503", "\u2502")]  # header and row lines
    assert text.count("fixed: dtype=fp32") == 1 and not any("dtype" in line for line in cells)  # once, below
    one = _render(table, 1000)
    assert len(_tables(one)) == 1


def test_status_reasons_are_numbered_below_the_table_not_inside_a_cell():
    records = _records()
    table = report.records_table(records, ["size", "layer"], ["a_fairly_long_metric_0"])
    text = _render(table, WIDTH)
    rows = [line for line in _tables(text)[0].splitlines() if line.startswith("\u2502")]
    assert len(rows) == 4  # one line per record: no reason wraps a row onto a dozen lines
    assert "error [1]" in rows[1] and "skipped [2]" in rows[2] and "skipped [2]" in rows[3]  # equal reasons: one note
    notes = text[text.index("\n[1] ") + 1:]  # below the table
    assert notes.startswith(f"[1] {records[1]['error'][:40]}")  # printed as written: '[1e-1]' is not rich markup
    assert "[2] needs a CUDA device" in text and text.count("needs a CUDA device") == 1


def test_without_a_width_one_table_and_cells_print_literally():
    table = report.FittedTable([report.Column("case", key=True), report.Column("note", justify="left")],
                               [["[bold]x[/bold]", "a [red]b[/red]"]], title="[t]", notes=["[n] as written"])
    (only,) = table.tables(None)
    text = _render(table, 60)
    assert "[bold]x[/bold]" in text and "a [red]b[/red]" in text and "[t]" in text and "[n] as written" in text
    assert [str(c.header) for c in only.columns] == ["case", "note"]


# ---- every command's table at COLUMNS=120 ------------------------------------------------------------------


def _qbench(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qbench", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env_without_interpreter(COLUMNS=str(WIDTH)), timeout=300)


def _fits(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    too_long = [line for line in lines if len(line) > WIDTH]
    assert TOP in done.stdout and not too_long, too_long[:3]
    assert ELLIPSIS not in done.stdout  # nothing cut: a column too narrow for its words splits off instead
    return done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A fragmented CPU run (its table is the fragmented command's) and two hand-made runs to compare: long
    case labels, one failing record, different GPUs (every row's note the same long sentence)."""
    root = tmp_path_factory.mktemp("runs")
    done = _qbench("fragmented", "--device", "cpu", "--sizes", "96", "--batch-sizes", "4", "--fragments", "2,8",
                   "--steps", "2", "--warmup", "0", "--out", root / "frag", cwd=root)
    params = [{"batch_size": b, "dim_in": d, "dim_out": 4 * d, "dtype": "fp16", "exec": ex}
              for b in (8192, 32768) for d in (1024, 4096) for ex in ("eager", "graph")]
    reference = [timed_record(p, [1.0, 1.1, 1.2, 1.05, 0.98], tflops=100.0) for p in params]
    candidate = [timed_record(p, [1.3, 1.2, 1.25, 1.4, 1.33], tflops=90.0) for p in params]
    candidate[0].update(status="error", error="relative error 0.3 > bound 0.01 at element (17, 4) of the output")
    return {"frag_out": done, "frag": root / "frag", "a": write_run(root / "a", reference),
            "b": write_run(root / "b", candidate, gpu="NVIDIA H100 80GB HBM3")}


LSTM = ("model", "lstm", "--config", FIXTURES / "deepflow_seed_config.yaml", "--sweep", "scheduling_param.dp=1,2,4",
        "--set", "scheduling_param.topology=mesh")
MODEL_COMMANDS = {
    "lstm": LSTM,
    "quirks": ("model", "quirks", "--config", FIXTURES / "deepflow_seed_config.yaml"),
    "search": ("model", "search", "--config", FIXTURES / "deepflow_seed_config.yaml", "--devices", "8",
               "--topologies", "ring,mesh"),
    "search-hw": ("model", "search-hw", "--config", FIXTURES / "deepflow_seed_config.yaml", "--starts", "2",
                  "--no-must-fit"),
    "gemm": ("model", "gemm", "--m", "8192", "--k", "4096", "--n", "4096", "--dtype", "bf16", "--gpu", "h200"),
    "floors": ("model", "floors", "moe", "world_size=4", "dtype=fp16", "model_dim=1024", "hidden_size=4096",
               "samples=8192", "top_k=2", "num_local_experts=2", "--gpu", "h200"),
    "calibrate": ("model", "calibrate", "--device", "cpu", "--file", "cal.yaml"),
    "import": ("import", FIXTURES / "seed_bnb_info.jsonl"),
    "import-moe": ("import", FIXTURES / "seed_moe_mixmoe_trimmed.log"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODEL_COMMANDS))
def test_model_and_import_tables_fit(name, tmp_path):
    args = MODEL_COMMANDS[name]
    out = () if name in ("quirks", "search", "gemm", "floors") else ("--out", tmp_path / "run")
    _fits(_qbench(*args, *out, cwd=tmp_path))


@pytest.mark.slow
def test_bench_tables_fit(runs, tmp_path):
    """switchback and fragmented on the CPU at tiny sizes, and --against the fragmented run."""
    _fits(runs["frag_out"])
    _fits(_qbench("switchback", "--device", "cpu", "--pairs", "48x96", "--batch-sizes", "40,56", "--repeat", "2",
                  "--out", tmp_path / "sb", cwd=tmp_path))
    _fits(_qbench("model", "--against", runs["frag"], "--gpu", "h200", cwd=tmp_path))


@pytest.mark.slow
@pytest.mark.dist
def test_moe_table_fits_and_its_skip_reason_is_a_note(tmp_path):
    """The 2-rank gloo run whose 22-column table once wrapped a one-line reason into a dozen rows."""
    text = _fits(_qbench("moe", "--world-size", "2", "--num-steps", "2", "--warmup", "1", "--samples", "32",
                         "--exec", "eager,compile", "--out", tmp_path / "moe", cwd=tmp_path))
    rows = [line for part in _tables(text) for line in part.splitlines() if line.startswith("\u2502")]
    assert len(_tables(text)) > 1 and all("eager" in line or "compile" in line for line in rows)  # exec repeated
    assert sum("skipped [1]" in line for line in rows) == len(_tables(text))
    assert [line for line in text.splitlines() if line.startswith("[1] ")]


@pytest.mark.slow
def test_analysis_tables_fit(runs, tmp_path):
    """compare (long case labels, a failing record, different GPUs), summary and its spreads."""
    text = _fits(_qbench("compare", runs["a"], runs["b"], "--cross-env", cwd=tmp_path))
    assert any(line.startswith("[") and "relative error 0.3" in line for line in text.splitlines())  # a note
    _fits(_qbench("compare", runs["a"], runs["b"], cwd=tmp_path))  # every row not comparable: one numbered note
    _fits(_qbench("summary", runs["frag"], cwd=tmp_path))
    _fits(_qbench("summary", runs["frag"], runs["frag"], "--across-runs", "median", "--spreads", cwd=tmp_path))


def test_block_and_train_check_tables_fit():
    """Their runs take minutes on a CPU (tests/test_block.py makes them): tables of records like theirs, a
    skipped variant among them, rendered at the width."""
    from qbench.benches import block, train_check
    from qbench.benches.block.table import COLUMNS as BLOCK_COLUMNS
    from qbench.benches.train_check.table import COLUMNS as TRAIN_COLUMNS

    base = {"preset": "vit-h", "batch_size": 256, "layers": 32, "dtype": "bf16"}
    stack = [store.make_record("block", {**base, "exec": ex, "variant": v},
                               {k: 1234.5678 for k, _, _ in BLOCK_COLUMNS})
             for ex in ("eager", "compile", "graph") for v in ("16bit", "switchback", "fp8_all", "torchao")]
    stack[3].update(status="skipped", error="torchao is not installed (optional peer: pip install torchao)",
                    metrics={})
    train = [store.make_record("train_check", {"preset": "lm-tiny", "steps": 20, "dtype": "bf16", "variant": v},
                               {k: 1.0481 for k, _ in TRAIN_COLUMNS})
             for v in ("16bit", "switchback", "fp8")]
    for table in (block.table(stack), train_check.table(train)):
        text = _render(table, WIDTH)
        assert max(map(len, text.splitlines())) <= WIDTH and ELLIPSIS not in text
    assert "[1] torchao is not installed" in _render(block.table(stack), WIDTH)


@pytest.mark.slow
def test_history_table_of_many_revisions_fits(tmp_path):
    """One column per revision: nine revisions of two cases split into tables that each repeat the case."""
    runs = []
    for i in range(9):
        records = [timed_record({"dim_in": d, "exec": "eager"}, [1.0 + i / 50 + j / 1000 for j in range(5)])
                   for d in (1024, 4096)]
        env = {"git_commit": f"{i + 1:x}" * 40, "time_utc": f"2026-11-1{i}T00:00:00+00:00"}
        runs.append(write_run(tmp_path / f"rev{i}", records, **env))
    text = _fits(_qbench("history", *runs, "--metric", "time", cwd=tmp_path))
    parts = _tables(text)
    assert len(parts) > 1 and all("dim_in" in part.splitlines()[1] for part in parts)
