"""Which calibration file describes which GPU (pure naming; reading the files is qbench.benches.model.config's).

`qbench model calibrate` on a GPU writes results/model-calibration-<name>.yaml, <name> the short name of the
GPU's preset (h200, h100, a100-80gb: 'NVIDIA H100 80GB HBM3' is h100), or for a part without a preset its
device name in lower case with 'nvidia' dropped and spaces as '-'; without a GPU, 'cpu'. The benches' roofline
floors then take the committed file of the GPU they run on (qbench.env.current_gpu_preset).
"""

from __future__ import annotations

from qbench.model.hardware import preset_key_for_gpu

PREFIX, SUFFIX = "model-calibration-", ".yaml"


def gpu_slug(gpu_name: str | None) -> str:
    if not gpu_name:
        return "cpu"
    return preset_key_for_gpu(gpu_name) or gpu_name.lower().replace("nvidia", "").strip().replace(" ", "-")


def file_name(gpu_name: str | None) -> str:
    """'model-calibration-h100.yaml' for 'NVIDIA H100 80GB HBM3' (see the module docstring)."""
    return f"{PREFIX}{gpu_slug(gpu_name)}{SUFFIX}"
