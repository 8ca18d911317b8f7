"""Files the model reads: DeepFlow YAML configs and hardware descriptions (custom or calibrated).

The model parses text (qbench.model.deepflow.config.parse_yaml, qbench.model.hardware.from_text);
this module is where the files are opened, so a missing file is named here. A config that is not a
file may name one shipped with the package (qbench/model/configs/<name>.yaml): `deepflow` is
DeepFlow's seed configuration (reference: deepflow-lstm-model.md, section 1.2).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from qbench import errors
from qbench.model import calibrations, hardware
from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow.config import ConfigError
from qbench.paths import check_name

SHIPPED = Path(__file__).resolve().parents[2] / "model" / "configs"  # qbench/model/configs


def shipped_configs() -> list[str]:
    """Names of the configs shipped with the package."""
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def resolve(path: str | Path) -> Path:
    """The file a --config names: a path if it exists, else a bare name (`deepflow`, `deepflow.yaml`) of a
    shipped config; ConfigError naming both otherwise."""
    path = check_name(path, "config file", "give a DeepFlow YAML file")
    if path.is_file():
        return path
    shipped = SHIPPED / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    problem = "is not a regular file" if path.exists() else "does not exist"
    raise ConfigError(f"config file {path} {problem} (shipped configs, usable by name: "
                      f"{', '.join(shipped_configs())})")


def read_text(path: Path, what: str) -> str:
    """The text of a file the model reads, or a ConfigError naming it (a binary or unreadable file)."""
    return errors.read_text(path, ConfigError, f"is not a text file; give a {what} (YAML text)")


def read_yaml(path: str | Path) -> dict:
    """The raw mapping of a DeepFlow config file or shipped config (ConfigError if missing or malformed)."""
    path = resolve(path)
    return deepflow_config.parse_yaml(read_text(path, "DeepFlow config"), str(path))


def load(path: str | Path) -> dict[str, dict[str, Any]]:
    """A normalized DeepFlow config from a file."""
    return deepflow_config.normalize(read_yaml(path))


def load_hardware(path: str | Path) -> hardware.Hardware:
    """A device from a YAML or JSON file (custom device or `qbench model calibrate` output)."""
    path = check_name(path, "hardware file", "give a YAML or JSON file")
    if not path.is_file():
        raise ValueError(f"hardware file {path} does not exist")
    return hardware.from_text(read_text(path, "hardware file"), str(path), is_json=path.suffix == ".json")


# The calibrations committed beside the reference runs: results/ of the checkout this package runs from (absent
# in an installed copy, where the datasheet presets stand alone).
CALIBRATIONS = Path(__file__).resolve().parents[3] / "results"


def hardware_for_gpu(gpu_name: str, root: str | Path | None = None) -> hardware.Hardware | None:
    """The device a GPU's roofline floors are read against: its committed calibration
    (qbench.model.calibrations names the file, under root, default CALIBRATIONS) where one exists, else its
    datasheet preset, else None (a part no preset describes)."""
    base = hardware.preset_for_gpu(gpu_name)
    if base is None:
        return None
    return _committed(str(Path(root or CALIBRATIONS) / calibrations.file_name(gpu_name))) or base


@functools.lru_cache(maxsize=8)
def _committed(path: str) -> hardware.Hardware | None:
    """A calibration file read once per process (benches ask once per record); None where it is absent."""
    return load_hardware(path) if Path(path).is_file() else None

