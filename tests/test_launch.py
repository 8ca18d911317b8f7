"""The launch fast path's coupling to Triton's generated launcher, said out loud: the versions it knows
(REPLAY_TRITON), the launcher layout it reads, and the path every run records in env.json."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
import triton

from kernels._common import interpreting
from kernels._common import launch as L
from qbench import env, store
from tests.test_switchback_kernels import _compiled_with_descriptor_wrapper

# the arguments the replay passes CompiledKernel.run before the kernel's own (kernels._common.launch._replay)
RUN_ARGS = ["gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
            "launch_enter_hook", "launch_exit_hook"]


def _installed_descriptor_wrapper():
    """The installed Triton's own wrapper around a raw launcher, for a kernel whose first argument is a
    tensor descriptor (what CompiledKernel.run.launch is for the TMA kernels)."""
    from triton.backends.nvidia import driver

    signature = {"a_desc": "tensordesc<fp16[64, 64]>", "M": "i32"}
    return driver.wrap_handle_tensordesc(lambda *args: args, signature, [{"swizzle": 3}])


def test_the_version_table_matches_the_installed_launchers_layout():
    """The installed Triton is in REPLAY_TRITON exactly when its descriptor wrapper has the layout the
    replay reads and its launcher takes the arguments the replay passes: a Triton whose layout changed
    cannot be declared known (triton 3.9 here: not known, and its wrapper is not read)."""
    from triton.backends.nvidia.driver import CudaLauncher

    readable = L.launcher_layout(_installed_descriptor_wrapper()) is not None
    params = list(inspect.signature(CudaLauncher.__call__).parameters)[1:len(RUN_ARGS) + 1]
    assert L.replay_known() == (readable and params == RUN_ARGS), \
        f"triton {triton.__version__}: REPLAY_TRITON {L.REPLAY_TRITON}, wrapper read: {readable}, run args {params}"


def test_launcher_layout_reads_triton_36s_wrapper_and_nothing_else():
    """The layout check accepts the wrapper as Triton 3.6 builds it (a stand-in with its closure cells and
    module globals) and refuses a raw launcher, a closure over other names, and another argument count."""
    compiled = _compiled_with_descriptor_wrapper({0}, [{"swizzle": 3}], [], [])
    cells, names = L.launcher_layout(compiled.run.launch)
    assert cells["tensordesc_indices"] == {0} and names["_BASE_ARGS_FORMAT_LEN"] == 13
    assert L.launcher_layout(print) is None

    def other(launcher, signature):
        def inner(*args):
            return launcher(signature, *args)
        return inner

    assert L.launcher_layout(other(print, {})) is None
    compiled.run.launch.__globals__["_BASE_ARGS_FORMAT_LEN"] = 14
    assert L.launcher_layout(compiled.run.launch) is None


@pytest.mark.parametrize("version, known", [("3.6.0", True), ("3.6.1", True), ("3.5.1", False), ("3.9.0", False),
                                            ("4.0.0", False)])
def test_replay_is_declared_for_the_listed_triton_versions_only(version, known):
    assert L.replay_known(version) is known


class _Compiled:
    """A compiled kernel stand-in: its raw launcher and Triton's own launch path each note their calls."""

    def __init__(self, calls: list):
        self.calls = calls
        self.function, self.packed_metadata = "fn", "meta"
        self.src = type("Src", (), {"signature": {"x_ptr": "*fp32", "M": "i32"}})()
        self.run = lambda *args: calls.append(("run", args))

    def _init_handles(self):
        pass

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("triton", grid, args))


@pytest.mark.parametrize("version, path", [("3.6.0", L.REPLAY), ("9.1.0", L.PLAIN)])
def test_a_triton_the_table_lacks_launches_through_triton_and_says_so(monkeypatch, version, path):
    """On a Triton not in REPLAY_TRITON a cached launch goes through Triton's own launch path (never the
    raw launcher, whose arguments may have moved), and the path noted for the run is "plain"."""
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    calls: list = []
    replay, noted = L._replay(_Compiled(calls), (4, 1, 1), ("C",))
    replay("x", 64)
    assert noted == path
    if path == L.PLAIN:
        assert calls == [("triton", (4, 1, 1), ("x", 64, "C"))]
    else:
        assert calls == [("run", (4, 1, 1, 7, "fn", "meta", None, None, None, "x", 64, "C"))]


def test_launch_paths_sum_up_per_run():
    assert env.launch_summary({}) == "none"
    assert env.launch_summary({"a": "replay", "b": "replay"}) == "replay"
    assert env.launch_summary({"a": "replay", "b": "plain"}) == "mixed"


def test_a_run_records_the_launch_path_that_ran(tmp_path):
    """env.json names the path each kernel's launches took while the run was open: under the interpreter
    (these tests on a CPU) "interpreter", for the quantizer the run launched; with a GPU, replay or plain."""
    from kernels.switchback_quantize import quantize_rowwise

    device = "cpu" if interpreting() else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no Triton kernel runs without a GPU or the interpreter")
    with store.RunWriter(tmp_path / "run", env.capture_env(config=None)) as writer:
        quantize_rowwise(torch.randn(33, 40, device=device, dtype=torch.float16))
        writer.write(store.make_record("launch", {"n": 1}, {"t_ms": 1.0}, units={"t_ms": "ms"}))
    stored = json.loads((tmp_path / "run" / store.ENV_FILE).read_text())
    want = L.INTERPRETER if interpreting() else (L.REPLAY if L.replay_known() else L.PLAIN)
    assert stored["launch_paths"]["switchback_quantize_rowwise"] == want
    assert stored["launch_path"] == want


@pytest.mark.gpu
def test_the_installed_triton_replays_its_kernels():
    """On a GPU, a repeated launch replays through the compiled kernel's own launcher: a Triton whose launcher
    this module does not know fails here (check launcher_layout and the replay's run arguments against it,
    then add it to REPLAY_TRITON) instead of its runs timing Triton's slower launch path unnoticed."""
    from kernels.switchback_quantize import quantize_rowwise

    x = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
    quantize_rowwise(x)
    quantize_rowwise(x)
    assert env.launch_paths().get("switchback_quantize_rowwise") == L.REPLAY, \
        f"triton {triton.__version__} is not in REPLAY_TRITON {L.REPLAY_TRITON}"
