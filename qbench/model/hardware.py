"""Hardware descriptions for rooflines: datasheet presets, custom YAML devices, calibrated ceilings.

A `Hardware` holds the ceilings a roofline needs: dense peak rate per dtype (TFLOP/s, or TOP/s for
int8), HBM capacity and bandwidth, L2 size, SM count, NVLink bandwidth per direction and a per-kernel
launch overhead. Presets use the dense datasheet figures (the datasheets print sparse ones, twice
these). A calibrated device (`qbench model calibrate`) replaces the peaks and the bandwidth by
measured values, so fractions of roofline read against what the device actually reaches.

No torch import here: benches import this module on machines without a GPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qbench.dtypes import DTYPE_ALIASES, DTYPE_BYTES, canonical_dtype  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Hardware:
    """One accelerator. Rates are dense peaks; bandwidths in decimal units (1 TB/s = 1e12 B/s)."""

    name: str
    peak_tflops: dict[str, float]  # canonical dtype -> TFLOP/s (TOP/s for int8)
    hbm_gb: float  # capacity, decimal GB
    hbm_tbps: float  # HBM bandwidth, TB/s (read + write together)
    l2_mb: float  # L2 cache, MB
    sm_count: int
    nvlink_gbps: float  # per direction, GB/s
    launch_us: float = 2.0  # fixed cost per kernel launch; small so that a floor stays a lower bound
    source: str = "datasheet"  # "datasheet", "custom" or "calibrated"
    notes: dict[str, Any] = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Peak rate in flop/s (op/s) for `dtype`; ValueError when this device has none."""
        key = canonical_dtype(dtype)
        if key not in self.peak_tflops:
            raise ValueError(f"{self.name} has no {key} peak; known: {', '.join(sorted(self.peak_tflops))}")
        return self.peak_tflops[key] * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12

    @property
    def nvlink_bytes_per_s(self) -> float:
        return self.nvlink_gbps * 1e9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Dense datasheet peaks (hardware reference table). fp32 is the non-tensor-core rate (torch's default
# for fp32 matmul); tf32 is the dense tensor-core rate.
_HOPPER_PEAKS = {"bf16": 989.0, "fp16": 989.0, "int8": 1979.0, "fp8": 1979.0, "tf32": 494.5, "fp32": 67.0}
_AMPERE_PEAKS = {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0, "fp32": 19.5}

PRESETS: dict[str, Hardware] = {
    "h100": Hardware("H100 SXM 80GB", dict(_HOPPER_PEAKS), 80.0, 3.35, 50.0, 132, 450.0),
    # the H200's L2 as its driver reports it (torch's L2_cache_size on an H200 SXM: 62914560 bytes, 60 MiB)
    "h200": Hardware("H200 SXM 141GB", dict(_HOPPER_PEAKS), 141.0, 4.8, 60.0, 132, 450.0),
    "a100-40gb": Hardware("A100 SXM 40GB", dict(_AMPERE_PEAKS), 40.0, 1.555, 40.0, 108, 300.0),
    "a100-80gb": Hardware("A100 SXM 80GB", dict(_AMPERE_PEAKS), 80.0, 2.039, 40.0, 108, 300.0),
}
ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100": "a100-80gb", "a100-40": "a100-40gb",
           "a100-80": "a100-80gb"}


def preset(name: str) -> Hardware:
    """A preset by its short name ('h200', 'h100', 'a100-40gb', 'a100-80gb'); ValueError otherwise."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise ValueError(f"unknown GPU {name!r}; choose from {', '.join(sorted(PRESETS))}")
    return PRESETS[key]


def preset_for_gpu(name: str) -> Hardware | None:
    """The preset matching torch's device name ('NVIDIA H200', 'NVIDIA H100 80GB HBM3',
    'NVIDIA A100-SXM4-40GB'), or None when no preset describes that part (PCIe and NVL boards have
    other clocks and bandwidths, so they are not guessed)."""
    key = preset_key_for_gpu(name)
    return None if key is None else PRESETS[key]


def preset_key_for_gpu(name: str) -> str | None:
    """The short name of the preset matching torch's device name (see preset_for_gpu), or None."""
    text = name.upper()
    if "PCIE" in text or "NVL" in text:
        return None
    if "H200" in text:
        return "h200"
    if "H100" in text and ("SXM" in text or "HBM3" in text):
        return "h100"
    if "A100" in text:
        return "a100-80gb" if "80G" in text else "a100-40gb" if "40G" in text else None
    return None


_REQUIRED = ("name", "peak_tflops", "hbm_gb", "hbm_tbps", "l2_mb", "sm_count", "nvlink_gbps")


def from_dict(data: dict[str, Any], *, source: str = "custom", where: str = "hardware") -> Hardware:
    """Build a Hardware from a mapping (a custom YAML device or a calibration file).

    A custom file may start from a preset (`base: h200`) and override any field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of hardware fields")
    data = dict(data)
    base = data.pop("base", None)
    merged = preset(base).to_dict() if base else {}
    given = data.pop("peak_tflops", {})
    if not isinstance(given, dict):
        raise ValueError(f"{where}: peak_tflops must map dtypes to TFLOP/s, e.g. {{bf16: 989}}")
    peaks = {**merged.get("peak_tflops", {}), **given}
    merged.update(data)
    merged["peak_tflops"] = {canonical_dtype(k): _rate(v, f"{where}: peak_tflops.{k}") for k, v in peaks.items()}
    missing = [k for k in _REQUIRED if k not in merged]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r} (needs {', '.join(_REQUIRED)})")
    known = set(Hardware.__dataclass_fields__)
    extra = sorted(set(merged) - known)
    if extra:
        raise ValueError(f"{where}: unknown key {extra[0]!r}")
    for key in ("hbm_gb", "hbm_tbps", "l2_mb", "sm_count", "nvlink_gbps"):
        if not _positive(merged[key]):
            raise ValueError(f"{where}: {key} must be a positive number, not {merged[key]!r}")
    if not merged["peak_tflops"]:
        raise ValueError(f"{where}: peak_tflops must give a positive rate per dtype")
    launch = merged.get("launch_us", 0.0)
    if not (_positive(launch) or launch == 0):
        raise ValueError(f"{where}: launch_us must be a number >= 0, not {launch!r}")
    merged["source"] = data.get("source", source)  # a custom file over a preset is no longer a datasheet
    return Hardware(**merged)


def _positive(value: Any) -> bool:
    """A finite number > 0 (nan and inf pass a plain `<= 0` test; a bool is not a rate)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _rate(value: Any, where: str) -> float:
    if not _positive(value):
        raise ValueError(f"{where} must be a positive number, not {value!r}")
    return float(value)


def from_text(text: str, where: str, *, is_json: bool = False) -> Hardware:
    """A device from the text of a YAML or JSON file (custom device or `qbench model calibrate` output)."""
    from qbench.safe_yaml import YamlRefused, load

    try:
        data = json.loads(text) if is_json else load(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {str(exc).splitlines()[0]}") from None
    except YamlRefused as exc:
        raise ValueError(f"{where} {exc}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply") from None
    if isinstance(data, dict) and "hardware" in data:
        data = data["hardware"]  # a calibration file keeps its measurements beside the device
    return from_dict(data, source="custom", where=where)


def calibrated(base: Hardware, peaks_tflops: dict[str, float], hbm_tbps: float,
               launch_us: float | None = None, notes: dict | None = None) -> Hardware:
    """`base` with measured ceilings replacing the datasheet's (dtypes not measured keep theirs)."""
    peaks = {**base.peak_tflops, **{canonical_dtype(k): v for k, v in peaks_tflops.items()}}
    return replace(base, name=f"{base.name} (calibrated)", peak_tflops=peaks, hbm_tbps=hbm_tbps,
                   launch_us=base.launch_us if launch_us is None else launch_us,
                   source="calibrated", notes=dict(notes or {}))
