"""Padding-free GRPO/RLOO need trl >= 1.16 (trl_padfree/_compat.py); older TRL in the supported window is refused in
one line naming the fix, and ``padding_free=False`` stays TRL's trainer. Runs in both CI environments (``make test``
on the newest TRL, ``make test-lowest`` on trl 1.8)."""

from __future__ import annotations

import pytest
import trl

import trl_padfree
from trl_padfree._compat import MIN_TRL_RL, TRL_VERSION, rl_padding_free_unavailable, trl_at_least


@pytest.mark.parametrize("name", ["GRPO", "RLOO"])
def test_padding_free_rl_is_refused_below_trl_1_16_with_the_fix(tmp_path, name):
    problem = rl_padding_free_unavailable()
    cls = getattr(trl_padfree, f"{name}Trainer")
    assert issubclass(cls, getattr(trl, f"{name}Trainer"))
    if trl_at_least(MIN_TRL_RL):
        assert problem is None
        return
    assert problem is not None and f"trl {TRL_VERSION}" in problem and "upgrade trl" in problem
    config = getattr(trl, f"{name}Config")(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="padding-free GRPO/RLOO needs trl >= 1.16"):
        cls("unused", reward_funcs=[], args=config, padding_free=True)
