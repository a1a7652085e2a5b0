"""The demo from any directory: ``--config demo`` / ``demo-chat`` / ``demo-dpo`` is the config shipped in the package
(when no such file is here), and a missing relative ``trl_padfree/demo/...`` path is the installed package's file."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BUILTIN_CONFIGS", "DEMO_DIR", "builtin_config", "package_path", "resolve_package_paths"]

#: The demo assets inside the installed package.
DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
#: Config names ``--config`` accepts without a file: the demo configs shipped in the package.
BUILTIN_CONFIGS = {name: DEMO_DIR / "configs" / f"{name}.yaml" for name in ("demo", "demo-chat", "demo-dpo")}
_PREFIX = "trl_padfree/demo/"


def builtin_config(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--config NAME`` of a built-in config replaced by its packaged file's path (a file NAME here
    wins).

    >>> builtin_config(["--config", "demo", "--max_steps", "3"])[1] == str(BUILTIN_CONFIGS["demo"])
    True
    >>> builtin_config(["--config=configs/demo.yaml"])
    ['--config=configs/demo.yaml']
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            name, at, prefix = out[i + 1], i + 1, ""
        elif arg.startswith("--config="):
            name, at, prefix = arg.split("=", 1)[1], i, "--config="
        else:
            continue
        if name in BUILTIN_CONFIGS and not os.path.exists(name):
            out[at] = prefix + str(BUILTIN_CONFIGS[name])
        break
    return out


def _in_package(value: Any) -> str | None:
    if not isinstance(value, str) or os.path.isabs(value):
        return None
    posix = value.replace(os.sep, "/")
    if not posix.startswith(_PREFIX) or glob.glob(value):
        return None
    candidate = DEMO_DIR / posix[len(_PREFIX):]
    return str(candidate) if glob.glob(str(candidate)) else None


def package_path(value: str) -> str:
    """``value``, or the installed package's file when it is a relative ``trl_padfree/demo/...`` path missing from
    here (``trl-padfree check --model trl_padfree/demo/model`` from any directory).

    >>> package_path("trl_padfree/demo/model") == "trl_padfree/demo/model" or package_path(
    ...     "trl_padfree/demo/model") == str(DEMO_DIR / "model")
    True
    """
    return _in_package(value) or value


def resolve_package_paths(cfg: Any) -> Any:
    """``cfg`` with its ``trl_padfree/demo/...`` paths that are missing from here pointed at the installed package."""
    from dataclasses import replace

    from .config import with_fields

    sections: dict[str, dict[str, str]] = {}
    for section, name in (("model", "model_name_or_path"), ("launch", "train_file"), ("launch", "eval_file"),
                          ("launch", "dataset_name"), ("training", "chat_template_path"),
                          ("launch", "chat_template_path")):
        resolved = _in_package(getattr(getattr(cfg, section), name, None))
        if resolved is not None:
            sections.setdefault(section, {})[name] = resolved
    return replace(cfg, **{section: with_fields(getattr(cfg, section), **changes)
                           for section, changes in sections.items()})
