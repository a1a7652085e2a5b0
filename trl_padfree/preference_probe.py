"""Deprecated alias: :func:`trl_padfree.probe.check_layout_packing` with ``layout="preference"``."""

from functools import partial

from .probe import assert_layout_packing_safe, check_layout_packing

check_preference_packing = partial(check_layout_packing, layout="preference")
assert_preference_packing_safe = partial(assert_layout_packing_safe, layout="preference")
