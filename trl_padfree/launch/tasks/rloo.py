"""``trl-padfree rloo``: :class:`trl_padfree.RLOOTrainer` (TRL's, padding-free); the GRPO task (:mod:`.grpo`) with
TRL's ``RLOOConfig``: the same fields of its own, rewards, data, probe, summary and preview."""

from __future__ import annotations

from .grpo import GRPOTask

__all__ = ["TASK", "RLOOTask"]


class RLOOTask(GRPOTask):
    name = "rloo"
    command = "rloo"
    trainer_name = "RLOOTrainer"

    def config_class(self) -> type:
        from trl import RLOOConfig

        return RLOOConfig

    def trainer_class(self) -> type:
        from trl_padfree.rloo import RLOOTrainer

        return RLOOTrainer


TASK = RLOOTask()
