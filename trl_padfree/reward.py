"""Deprecated alias of :mod:`trl_padfree.reward_trainer` (the trainer; reward functions: :mod:`trl_padfree.reward_functions`)."""

from .reward_trainer import RewardConfig, RewardTrainer  # noqa: F401
