"""``trl-padfree rloo``: the GRPO recipe (:mod:`.grpo`) with :class:`trl_padfree.RLOOTrainer` and ``RLOOConfig``."""

from functools import partial

from trl_padfree.configs import RLOOConfig as CONFIG
from trl_padfree.rl_trainer import RLOOTrainer as TRAINER

from . import grpo
from .grpo import ARGUMENTS, RANGES, check, preview, settings

__all__ = ["ARGUMENTS", "CONFIG", "RANGES", "TRAINER", "check", "preview", "run", "settings"]

run = partial(grpo.run, trainer_class=TRAINER)
