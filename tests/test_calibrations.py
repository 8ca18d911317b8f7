"""Which committed calibration applies to which GPU: `qbench model calibrate` names its file for the GPU,
and the benches' roofline floors take the file of the GPU they run on (here a fake H100) where one is
committed, else the datasheet preset."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from qbench import env
from qbench.benches.model import calibrate, config
from qbench.model import calibrations, hardware
from qbench.model.roofline import floor_ms, roofline_fraction

H100_NAME = "NVIDIA H100 80GB HBM3"  # torch's name of an H100 SXM
RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.mark.parametrize("name, file", [(H100_NAME, "model-calibration-h100.yaml"),
                                        ("NVIDIA H200", "model-calibration-h200.yaml"),
                                        ("NVIDIA H100 PCIe", "model-calibration-h100-pcie.yaml"),
                                        (None, "model-calibration-cpu.yaml")])
def test_a_calibration_is_named_for_its_gpu(name, file):
    assert calibrations.file_name(name) == file


def h100_calibration(root: Path) -> Path:
    """An H100 calibration as `qbench model calibrate` writes it (its writer), bf16 measured at 700 TFLOP/s."""
    base = hardware.preset("h100")
    record = {"params": {"workload": "calibrate", "op": "matmul", "dtype": "bf16", "n": 8192},
              "metrics": {"time_ms": 1.57, "tflops": 700.0}, "status": "ok"}
    cal = calibrate.calibrated_hardware([record], base)
    return calibrate.save(cal, [record], root / calibrations.file_name(H100_NAME))


def test_the_committed_calibration_wins_over_the_preset(tmp_path):
    assert config.hardware_for_gpu(H100_NAME, tmp_path) is hardware.PRESETS["h100"]  # none committed
    h100_calibration(tmp_path)
    config._committed.cache_clear()
    got = config.hardware_for_gpu(H100_NAME, tmp_path)
    assert got.source == "calibrated" and got.peak("bf16") == pytest.approx(700e12)
    assert config.hardware_for_gpu("NVIDIA H200", tmp_path) is hardware.PRESETS["h200"]  # another GPU's file
    assert config.hardware_for_gpu("NVIDIA H100 PCIe", tmp_path) is None  # no preset: not guessed


@pytest.mark.parametrize("name", ["NVIDIA H200", H100_NAME])
def test_a_committed_calibration_is_the_one_its_gpu_takes(name):
    if not (RESULTS / calibrations.file_name(name)).is_file():
        pytest.skip(f"no calibration committed for {name}")
    config._committed.cache_clear()
    got = config.hardware_for_gpu(name)
    assert got.source == "calibrated" and got.name.startswith(hardware.preset_for_gpu(name).name)


@pytest.fixture
def on_fake_h100(monkeypatch, tmp_path):
    import torch

    props = SimpleNamespace(L2_cache_size=50 * 2**20, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H100_NAME)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    monkeypatch.setattr(config, "CALIBRATIONS", tmp_path)
    config._committed.cache_clear()
    yield tmp_path
    config._committed.cache_clear()


def test_calibrate_on_an_h100_writes_the_h100_file(on_fake_h100):
    _, base, default_file = calibrate.setup("cuda")
    assert default_file == "results/model-calibration-h100.yaml"
    assert base.name == hardware.PRESETS["h100"].name and base.l2_mb == 50.0


def test_bench_floors_on_an_h100_take_its_committed_calibration(on_fake_h100):
    from qbench.benches.fragmented import cost

    assert env.current_gpu_preset("cuda") is hardware.PRESETS["h100"]
    h100_calibration(on_fake_h100)
    config._committed.cache_clear()
    hw = env.current_gpu_preset("cuda")
    assert hw.source == "calibrated" and env.current_gpu_preset("cpu") is None
    flops, moved = 2 * 8192**3, 3 * 8192 * 8192 * 2
    want = roofline_fraction(floor_ms(flops, moved, hw, "bf16"), 2.0)
    assert cost.roofline(flops, moved, "bf16", 2.0, "cuda") == pytest.approx(want)
    assert want != pytest.approx(roofline_fraction(floor_ms(flops, moved, hardware.PRESETS["h100"], "bf16"), 2.0))
