"""The demo from any directory: ``--config demo`` / ``demo-chat`` / ``demo-dpo`` is the config shipped in the package
(when no such file is here), and a missing relative ``trl_padfree/demo/...`` path is the installed package's file."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
BUILTIN_CONFIGS = {name: DEMO_DIR / "configs" / f"{name}.yaml" for name in ("demo", "demo-chat", "demo-dpo")}
_PREFIX = "trl_padfree/demo/"


def builtin_config(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--config NAME`` of a built-in config replaced by its packaged file's path (a file NAME wins).

    >>> builtin_config(["--config", "demo", "--max_steps", "3"])[1] == str(BUILTIN_CONFIGS["demo"])
    True
    """
    out = list(argv)
    at = out.index("--config") + 1 if "--config" in out[:-1] else None
    if at is not None and out[at] in BUILTIN_CONFIGS and not os.path.exists(out[at]):
        out[at] = str(BUILTIN_CONFIGS[out[at]])
    return out


def package_path(value: Any) -> Any:
    """``value``, or the installed package's file for a relative ``trl_padfree/demo/...`` path missing here."""
    if not isinstance(value, str) or os.path.isabs(value) or glob.glob(value):
        return value
    posix = value.replace(os.sep, "/")
    candidate = str(DEMO_DIR / posix[len(_PREFIX):])
    return candidate if posix.startswith(_PREFIX) and glob.glob(candidate) else value


def resolve_package_paths(cfg: Any) -> Any:
    for section, name in (("model", "model_name_or_path"), ("launch", "train_file"), ("launch", "eval_file"),
                          ("launch", "dataset_name"), ("training", "chat_template_path"),
                          ("launch", "chat_template_path")):
        value = getattr(getattr(cfg, section), name, None)
        if package_path(value) != value:
            setattr(getattr(cfg, section), name, package_path(value))
    return cfg
