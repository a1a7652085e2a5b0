"""``trl-padfree reward`` / ``trl-padfree kto``: the entry point of ``trl-padfree train``
(:func:`trl_padfree.launch.main`) with the reward-model and KTO tasks (:mod:`.tasks.reward`, :mod:`.tasks.kto`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import main as launch_main

__all__ = ["kto_main", "reward_main"]


def reward_main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """``trl-padfree reward --config FILE.yaml [--field value ...]``; returns the exit code."""
    return launch_main(argv, callbacks, task="reward")


def kto_main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """``trl-padfree kto --config FILE.yaml [--field value ...]``; returns the exit code."""
    return launch_main(argv, callbacks, task="kto")
