"""Files the model reads: DeepFlow YAML configs and hardware descriptions (custom or calibrated).

The model parses text (qbench.model.deepflow.config.parse_yaml, qbench.model.hardware.from_text);
this module is where the files are opened, so a missing file is named here. A config that is not a
file may name one shipped with the package (qbench/model/configs/<name>.yaml): `deepflow` is
DeepFlow's seed configuration (reference: deepflow-lstm-model.md, section 1.2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qbench import errors
from qbench.model import hardware
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
