"""The machine a benchmark runs on: CPU/GPU, threads, library versions, load average."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine_info(device: str, threads: int = 0) -> dict[str, Any]:
    """CPU/GPU name, core count, torch threads (``threads`` if set, else torch's default) and library versions."""
    import torch
    import transformers

    from trl_padfree import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads or torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": _version("trl"),
        "trl_padfree": __version__,
        "gpu": None,
        "load_average_start": _load_average(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    try:
        git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=_project_root(), capture_output=True,
                             text=True, timeout=10)
        info["git"] = git.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["git"] = None
    try:
        import flash_attn

        info["flash_attn"] = flash_attn.__version__
    except Exception:
        info["flash_attn"] = None
    return info
