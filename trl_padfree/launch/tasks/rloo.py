"""``trl-padfree rloo``: :class:`trl_padfree.RLOOTrainer` (TRL's, padding-free); the GRPO task (:mod:`.grpo`) with
TRL's ``RLOOConfig``: the same fields of its own, rewards, data, probe, summary and preview."""

from __future__ import annotations

from trl_padfree.rloo import RLOOTrainer

from ..trainer_setup import LaunchTrainer
from .grpo import GRPOTask


class LaunchRLOOTrainer(LaunchTrainer, RLOOTrainer):
    """The launch's ``RLOOTrainer`` (:class:`~..trainer_setup.LaunchTrainer`)."""

__all__ = ["TASK", "LaunchRLOOTrainer", "RLOOTask"]


class RLOOTask(GRPOTask):
    name = "rloo"
    command = "rloo"
    trainer_name = "RLOOTrainer"

    def config_class(self) -> type:
        from trl import RLOOConfig

        return RLOOConfig

    trainer_class = LaunchRLOOTrainer


TASK = RLOOTask()
