"""Padding-free DPO needs trl >= 1.16 (trl_padfree/_compat.py); older TRL in the supported window is refused in one
line naming the fix, and ``padding_free=False`` stays TRL's trainer. Runs in both CI environments (``make test`` on
the newest TRL, ``make test-lowest`` on trl 1.8)."""

from __future__ import annotations

import pytest
import tiny_dpo as T

from trl_padfree._compat import MIN_TRL_DPO, TRL_VERSION, dpo_padding_free_unavailable, trl_at_least


def test_padding_free_dpo_is_refused_below_trl_1_16_with_the_fix(tmp_path):
    problem = dpo_padding_free_unavailable()
    if trl_at_least(MIN_TRL_DPO):
        assert problem is None
        return
    assert problem is not None and f"trl {TRL_VERSION}" in problem and "upgrade trl" in problem
    with pytest.raises(ValueError, match="padding-free DPO needs trl >= 1.16"):
        T.trainer("padfree", T.pairs(8), T.tokenizer(), str(tmp_path))
