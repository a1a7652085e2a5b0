"""Deprecated alias: :func:`trl_padfree.probe.check_layout_packing` with ``layout="reward"``."""

from functools import partial

from .probe import assert_layout_packing_safe, check_layout_packing

check_reward_packing = partial(check_layout_packing, layout="reward")
assert_reward_packing_safe = partial(assert_layout_packing_safe, layout="reward")
