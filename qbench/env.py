"""The environment block, captured once per run and stored as env.json.

Everything a reader needs to judge whether two runs are comparable: GPU name and count, SM clock
and power limit (when nvidia-smi answers), driver, CUDA, torch, triton, python, host, CPU, the command
line and the UTC time, the versions of the optional peers a bench times when they are installed (torchao);
and what code produced the numbers (provenance()): the qbench version, a hash
of the package's own source (traceable without .git) and, in a checkout, the git commit and dirty flag.
Autotuner picks noted during a run (note_autotune) are added under "autotune", and the path each kernel's
launches took under "launch_paths" (summed up in "launch_path"), as the run's records are written.
The device a command runs on is resolved here too (resolve_device, usable_device).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qbench import __version__

CHECKOUT = Path(__file__).resolve().parent.parent
# The package's own source: the two top-level packages pyproject.toml ships (beside each other both in
# a checkout and in site-packages).
SOURCE_PACKAGES = ("qbench", "kernels")
SHORT_HASH = 12  # hex digits of the short form: 48 bits, ample to tell source trees apart
# Keys that make two runs not directly comparable; `qbench compare` warns when they differ.
COMPARABILITY_KEYS = ("gpu_name", "driver", "torch", "triton", "cuda")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info(root: Path = CHECKOUT) -> dict[str, Any]:
    """Commit and dirty flag of the checkout at root; both None where root is no checkout (a copied tree,
    site-packages), rather than the commit of some repository that happens to contain it."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root) if (root / ".git").exists() else None
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"git_commit": commit, "git_dirty": bool(status)}


def source_files(root: Path = CHECKOUT) -> list[Path]:
    """Every *.py of the package's own source under root, sorted by its path relative to root."""
    found = [p for package in SOURCE_PACKAGES if (root / package).is_dir() for p in (root / package).rglob("*.py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def source_hash(root: Path = CHECKOUT) -> str:
    """sha256 (hex) of the source files under root: for each file in path order, its relative path, NUL,
    its length in bytes, NUL, its bytes. Renaming, moving or editing any file changes it."""
    digest = hashlib.sha256()
    for path in source_files(root):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def own_source_hash() -> str:
    """source_hash of the running package, computed once per process (so env.json and every record of
    a run name the same tree even if a file is edited while it runs)."""
    return source_hash(CHECKOUT)


def provenance() -> dict[str, Any]:
    """What code made a run: version, source hash (full and short) and, in a checkout, git commit + dirty."""
    digest = own_source_hash()
    return {"qbench_version": __version__, "source_hash": digest, "source_hash_short": digest[:SHORT_HASH],
            **git_info()}


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


OPTIONAL_PEERS = ("torchao",)  # packages a bench times as peers where installed, never dependencies


def peer_versions() -> dict[str, str | None]:
    """Installed version of each optional peer (None: not installed), read from its metadata, not imported."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in OPTIONAL_PEERS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _pick_log():
    """The kernels' log of launch configurations (kernels._common.launch.PICKS), or None when no kernel module
    was imported (then no kernel launched, and `qbench --help` never pays for importing triton)."""
    launch = sys.modules.get("kernels._common.launch")
    return launch.PICKS if launch is not None else None


def note_autotune(kernel: str, key: Any, config: Mapping[str, Any]) -> None:
    """Note that `kernel` launched with `config` (e.g. {"BLOCK_M": 128, "num_warps": 8, "num_stages": 3})
    for `key` (what it tunes on). Kernel launchers note their picks in kernels._common.launch.PICKS
    themselves; this is the same log for code outside kernels/. The run writer stores the picks noted
    while it is open in env.json under "autotune" when it closes."""
    from kernels._common.launch import PICKS

    PICKS.note(str(kernel), key if not isinstance(key, Mapping) else _jsonable(key), _jsonable(config))


def _jsonable(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A plain JSON object (tuples -> lists, dtypes and other objects -> their str)."""
    return json.loads(json.dumps(dict(mapping), sort_keys=True, default=str))


def autotune_mark() -> int:
    """A mark to pass to autotune_picks: only picks noted after it are returned."""
    log = _pick_log()
    return log.seq if log is not None else 0


def autotune_picks(since: int = 0) -> list[dict[str, Any]]:
    """[{"kernel", "key", "config"}, ...] noted after the mark `since`, sorted by kernel and key."""
    log = _pick_log()
    return [json.loads(json.dumps(p, default=str)) for p in log.since(since)] if log is not None else []


def launch_paths(since: int = 0) -> dict[str, str]:
    """{kernel: "replay" | "plain" | "interpreter" | "mixed"} noted after the mark `since` (an autotune_mark):
    how each kernel's launches ran (kernels._common.launch: replay needs a Triton in REPLAY_TRITON)."""
    log = _pick_log()
    return log.paths_since(since) if log is not None else {}


def launch_summary(paths: Mapping[str, str]) -> str:
    """A run's launch_path: the path every kernel took, "mixed" where they differ, "none" where no Triton
    kernel launched through the launch cache (torch code only)."""
    kinds = set(paths.values())
    if not kinds:
        return "none"
    return kinds.pop() if len(kinds) == 1 else "mixed"


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
    env["launch_path"] = launch_summary({})  # until a kernel launches (the run writer updates it)
    env["peers"] = peer_versions()
    env.update(nvidia_smi())
    env.update(provenance())
    env["config"] = _config_dict(config)
    return env


def _config_dict(config: Any) -> Any:
    import dataclasses

    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if hasattr(config, "items") else str(config)


def current_gpu_preset(device: str = "cuda"):
    """The hardware (qbench.model.hardware) the benches' roofline floors read the CUDA device they run on
    against: its committed calibration where one exists for this GPU (results/model-calibration-<gpu>.yaml),
    else its datasheet preset; None off CUDA or for a part without a preset. Here, not in the model: the model
    does no device queries."""
    if device != "cuda":
        return None
    import torch

    from qbench.benches.model.config import hardware_for_gpu

    return hardware_for_gpu(torch.cuda.get_device_name()) if torch.cuda.is_available() else None


def resolve_device(device: str | None = None) -> str:
    """'cuda' when a CUDA device is present (or asked for), else 'cpu'."""
    if device not in (None, "auto"):
        return "cuda" if str(device).startswith("cuda") else "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


NO_CUDA = "--device cuda was asked for but no CUDA device is visible; use --device cpu"


def usable_device(device: str | None) -> str:
    """resolve_device of a command's --device, or a one-line usage error when CUDA was asked for and none is
    visible."""
    resolved = resolve_device(device)
    if resolved == "cuda" and device not in (None, "auto"):
        import torch

        if not torch.cuda.is_available():
            from qbench.errors import QbenchUsageError

            raise QbenchUsageError(NO_CUDA)
    return resolved
