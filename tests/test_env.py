import re
import shutil
from pathlib import Path

import pytest

import qbench
from qbench import env


def test_environment_block_has_what_compare_and_readers_need():
    block = env.capture_env(["qbench", "switchback", "--dims", "1024"], config={"dims": [1024]})
    assert block["command"] == "qbench switchback --dims 1024"
    assert block["config"] == {"dims": [1024]}
    for key in ("time_utc", "python", "host", "cpu", "torch", "triton", "gpu_name", "git_commit", "git_dirty"):
        assert key in block, key
    assert block["torch"] and block["python"].count(".") == 2
    assert block["git_commit"] is None or len(block["git_commit"]) == 40


def test_optional_peers_are_named_with_their_installed_version():
    """env.json says which torchao (if any) a run's peer was: the installed version, or None."""
    from importlib import metadata

    block = env.capture_env(["qbench", "switchback"])
    try:
        installed = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        installed = None
    assert block["peers"] == {"torchao": installed}


def test_command_line_reads_as_qbench_however_it_was_started():
    assert env.command_line(["/x/qbench/__main__.py", "moe", "--world-size", "4"]) == "qbench moe --world-size 4"
    assert env.command_line(["/usr/bin/qbench", "compare", "a b"]) == "qbench compare 'a b'"


def _copy_source(root: Path, target: Path) -> Path:
    """The package's own source as a plain copy, without .git (as a tarball or a copied tree would be)."""
    for package in env.SOURCE_PACKAGES:
        shutil.copytree(root / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_env_json_names_the_source_and_version():
    block = env.capture_env(["qbench", "compare", "a", "b"])
    digest = block["source_hash"]
    assert re.fullmatch(r"[0-9a-f]{64}", digest) and block["source_hash_short"] == digest[:12]
    assert digest == env.source_hash(env.CHECKOUT) == env.own_source_hash()
    assert block["qbench_version"] == qbench.__version__
    files = {p.relative_to(env.CHECKOUT).as_posix() for p in env.source_files()}
    assert {"qbench/store.py", "qbench/env.py", "kernels/_common/__init__.py", "kernels/_common/launch.py"} <= files
    assert all(f.endswith(".py") and f.split("/")[0] in env.SOURCE_PACKAGES for f in files)


def test_a_copy_without_git_is_traceable_by_its_hash(tmp_path):
    copy = _copy_source(env.CHECKOUT, tmp_path / "copy")
    assert env.source_hash(copy) == env.own_source_hash()
    assert env.git_info(copy) == {"git_commit": None, "git_dirty": None}
    (copy / "qbench" / "extra_notes.txt").write_text("not source")  # only *.py counts
    assert env.source_hash(copy) == env.own_source_hash()
    store_py = copy / "qbench" / "store.py"
    store_py.write_bytes(store_py.read_bytes() + b"\n")
    edited = env.source_hash(copy)
    assert edited != env.own_source_hash()
    store_py.rename(copy / "qbench" / "store2.py")  # same bytes under another path
    assert env.source_hash(copy) not in (edited, env.own_source_hash())


def test_version_is_set_in_one_place():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((env.CHECKOUT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "qbench.__version__"}


def test_autotune_picks_are_collected_per_mark():
    env.note_autotune("before", {"M": 1}, {"BLOCK": 16})
    mark = env.autotune_mark()
    env.note_autotune("int8_matmul", {"M": 8192, "N": 4096, "K": 1024}, {"BLOCK_M": 64, "num_warps": 4})
    env.note_autotune("int8_matmul", {"K": 1024, "N": 4096, "M": 8192}, {"BLOCK_M": 128, "num_warps": 8})
    env.note_autotune("quantize_rowwise", {"M": 8192, "dims": (1024, 4096)}, {"BLOCK": 1024})
    picks = env.autotune_picks(mark)
    assert [p["kernel"] for p in picks] == ["int8_matmul", "quantize_rowwise"]  # the re-pick replaced the first
    assert picks[0]["config"] == {"BLOCK_M": 128, "num_warps": 8}
    assert picks[1]["key"] == {"M": 8192, "dims": [1024, 4096]}  # stored as plain JSON
    assert env.autotune_picks(env.autotune_mark()) == []
    env.note_autotune("before", {"M": 1}, {"BLOCK": 16})  # noted again during a later run: it belongs to it too
    assert [p["kernel"] for p in env.autotune_picks(mark)] == ["before", "int8_matmul", "quantize_rowwise"]
