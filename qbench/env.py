"""The environment block, captured once per run and stored as env.json.

Everything a reader needs to judge whether two runs are comparable: GPU name and count, SM clock
and power limit (when nvidia-smi answers), driver, CUDA, torch, triton, python, host, CPU, the git
commit (and dirty flag) of the qbench checkout, the command line and the UTC time.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent
# Keys that make two runs not directly comparable; `qbench compare` warns when they differ.
COMPARABILITY_KEYS = ("gpu_name", "driver", "torch", "triton", "cuda")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info() -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "HEAD"], cwd=CHECKOUT)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=CHECKOUT)
    return {"git_commit": commit, "git_dirty": bool(status)}


def nvidia_smi() -> dict[str, Any]:
    """SM clock, power limit and driver of GPU 0 from nvidia-smi, or nothing when it does not answer."""
    fields = "name,driver_version,clocks.sm,clocks.max.sm,power.limit"
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if not out:
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    keys = ("smi_name", "driver", "sm_clock_mhz", "sm_clock_max_mhz", "power_limit_w")
    return dict(zip(keys, values))


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
        )
    else:
        info.update(gpu_name=None, gpu_count=0)
    return info


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def command_line(argv: list[str]) -> str:
    """The command as a user would retype it: 'python -m qbench' and the script path read as 'qbench'."""
    words = list(argv)
    if words and (words[0].endswith("__main__.py") or Path(words[0]).name == "qbench"):
        words[0] = "qbench"
    return shlex.join(words)


def capture_env(argv: list[str] | None = None, config: Any = None) -> dict[str, Any]:
    """The full environment block for env.json (config: a dataclass or mapping, stored as given)."""
    env: dict[str, Any] = {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(argv if argv is not None else sys.argv),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    env.update(torch_info())
    env["triton"] = triton_version()
    env.update(nvidia_smi())
    env.update(git_info())
    env["config"] = _config_dict(config)
    return env


def _config_dict(config: Any) -> Any:
    import dataclasses

    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if hasattr(config, "items") else str(config)
