"""``trl-padfree grpo`` / ``trl-padfree rloo``: the entry point of ``trl-padfree train``
(:func:`trl_padfree.launch.main`) with the RL tasks (:mod:`.tasks.grpo`, :mod:`.tasks.rloo`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import main as launch_main

__all__ = ["grpo_main", "rloo_main"]


def grpo_main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """``trl-padfree grpo --config FILE.yaml [--field value ...]``; returns the exit code."""
    return launch_main(argv, callbacks, task="grpo")


def rloo_main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """``trl-padfree rloo --config FILE.yaml [--field value ...]``; returns the exit code."""
    return launch_main(argv, callbacks, task="rloo")
