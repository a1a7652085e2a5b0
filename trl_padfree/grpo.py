"""``GRPOTrainer`` (one implementation with the other RL trainer: :mod:`trl_padfree.rl_trainer`)."""

from .rl_trainer import GRPOTrainer

__all__ = ["GRPOTrainer"]
