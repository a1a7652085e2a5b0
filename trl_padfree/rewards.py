"""Deprecated alias of :mod:`trl_padfree.reward_functions` (``trl_padfree.rewards:exact_match`` keeps working)."""

from .reward_functions import *  # noqa: F403
from .reward_functions import __all__  # noqa: F401
