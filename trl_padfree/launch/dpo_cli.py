"""``trl-padfree dpo --config configs/demo-dpo.yaml [--field value ...]``: the launch with TRL's ``DPOConfig``.

The same entry point as ``trl-padfree train`` (:func:`trl_padfree.launch.main`) with ``task="dpo"``: the same
validation, exit codes, defaults line, checkpoints, stop and resume (:mod:`.dpo` holds what differs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """Run ``trl-padfree dpo`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    from . import main as launch_main

    return launch_main(argv, callbacks, task="dpo")
