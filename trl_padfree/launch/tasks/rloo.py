"""``trl-padfree rloo``: the GRPO task (:mod:`.grpo`) with :class:`trl_padfree.RLOOTrainer` and ``RLOOConfig``."""

from __future__ import annotations

from trl_padfree.rl_trainer import RLOOTrainer

from .grpo import GRPOTask

__all__ = ["TASK", "RLOOTask"]


class RLOOTask(GRPOTask):
    name = "rloo"
    command = "rloo"
    trainer_name = "RLOOTrainer"
    trainer_class = RLOOTrainer


TASK = RLOOTask()
