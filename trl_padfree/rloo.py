"""``RLOOTrainer`` (one implementation with the other RL trainer: :mod:`trl_padfree.rl_trainer`)."""

from .rl_trainer import RLOOTrainer

__all__ = ["RLOOTrainer"]
