"""``trl-padfree rloo``: :class:`trl_padfree.RLOOTrainer` (TRL's, padding-free); the GRPO task (:mod:`.grpo`) with
``RLOOConfig``: the same fields of its own, rewards, data, probe, summary and preview."""

from __future__ import annotations

from trl_padfree.rloo import RLOOTrainer

from ..trainer_setup import LaunchTrainer
from .grpo import GRPOTask

__all__ = ["TASK", "LaunchRLOOTrainer", "RLOOTask"]


class LaunchRLOOTrainer(LaunchTrainer, RLOOTrainer):
    """The launch's ``RLOOTrainer`` (:class:`~..trainer_setup.LaunchTrainer`)."""


class RLOOTask(GRPOTask):
    name = "rloo"
    command = "rloo"
    trainer_name = "RLOOTrainer"
    trainer_class = LaunchRLOOTrainer


TASK = RLOOTask()
