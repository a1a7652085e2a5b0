"""Deprecated alias: :func:`trl_padfree.probe.check_layout_packing` with ``layout="group"``."""

from functools import partial

from .probe import assert_layout_packing_safe, check_layout_packing

check_group_packing = partial(check_layout_packing, layout="group")
assert_group_packing_safe = partial(assert_layout_packing_safe, layout="group")
