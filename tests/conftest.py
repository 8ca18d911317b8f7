"""Test set-up: Triton kernels run through the Triton interpreter on machines without a GPU.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection
time, unless a GPU is present (nvidia-smi on PATH) or the variable is already set.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

if "TRITON_INTERPRET" not in os.environ and shutil.which("nvidia-smi") is None:
    os.environ["TRITON_INTERPRET"] = "1"

FIXTURES = Path(__file__).parent / "fixtures"
# spawned worker processes import helper modules of tests/ by their plain name
sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests without CUDA."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def torch_path(monkeypatch):
    """helpers.env_without_interpreter for the processes a test's own process starts (a bench's spawned ranks):
    they run the layers' torch path on the CPU."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
