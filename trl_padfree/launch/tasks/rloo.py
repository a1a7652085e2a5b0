"""``trl-padfree rloo``: the GRPO recipe (:mod:`.grpo`) with :class:`trl_padfree.RLOOTrainer` and ``RLOOConfig``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl_padfree.configs import RLOOConfig as CONFIG
from trl_padfree.rl_trainer import RLOOTrainer as TRAINER

from . import grpo
from .grpo import ARGUMENTS, RANGES, check, preview, settings

__all__ = ["ARGUMENTS", "CONFIG", "RANGES", "TRAINER", "check", "preview", "run", "settings"]


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """:func:`.grpo.run` with RLOO's trainer."""
    return grpo.run(cfg, callbacks, TRAINER)
