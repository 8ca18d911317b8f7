"""Files the model reads: DeepFlow YAML configs and hardware descriptions (custom or calibrated).

The model parses text (qbench.model.deepflow.config.parse_yaml, qbench.model.hardware.from_text);
this module is where the files are opened, so a missing file is named here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qbench.model import hardware
from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow.config import ConfigError


def read_yaml(path: str | Path) -> dict:
    """The raw mapping of a DeepFlow config file (ConfigError for a missing or malformed file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return deepflow_config.parse_yaml(path.read_text(encoding="utf-8"), str(path))


def load(path: str | Path) -> dict[str, dict[str, Any]]:
    """A normalized DeepFlow config from a file."""
    return deepflow_config.normalize(read_yaml(path))


def load_hardware(path: str | Path) -> hardware.Hardware:
    """A device from a YAML or JSON file (custom device or `qbench model calibrate` output)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"hardware file {path} does not exist")
    return hardware.from_text(path.read_text(encoding="utf-8"), str(path), is_json=path.suffix == ".json")
