"""The supported TRL / transformers window: declared the same everywhere, and TRL 1.15 without Triton refused."""

from __future__ import annotations

import re

import pytest
from paths import ROOT

from trl_padfree import _compat


def test_declared_window_is_the_one_the_code_and_the_lowest_run_use():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"trl>={_compat.MIN_TRL},<2",' in pyproject
    assert f'"transformers>={_compat.MIN_TRANSFORMERS},<6",' in pyproject
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(rf"LOWEST_PINS\s*:=.*trl=={re.escape(_compat.MIN_TRL)}\.0 "
                     rf"transformers=={re.escape(_compat.MIN_TRANSFORMERS)}\.0", makefile)
    window = f"trl ≥ {_compat.MIN_TRL}, < 2 with transformers ≥ {_compat.MIN_TRANSFORMERS}, < 6"
    for doc in ("README.md", "docs/usage.md"):
        assert window in (ROOT / doc).read_text(encoding="utf-8"), doc
    assert _compat.trl_at_least(_compat.MIN_TRL)
    assert _compat.TRANSFORMERS_VERSION >= _compat.Version(_compat.MIN_TRANSFORMERS)


@pytest.fixture
def trl_1_15_without_triton(monkeypatch):
    from trl.trainer import utils

    monkeypatch.setattr(_compat, "TRL_VERSION", _compat.Version("1.15.0"))
    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", None, raising=False)


def test_trl_1_15_without_triton_is_refused_with_the_fix(trl_1_15_without_triton):
    assert _compat.trl_cannot_train() == (
        "trl 1.15.0's SFTTrainer cannot train without Triton (its fused LM head needs it, and Triton is not "
        "installed here): upgrade trl to >= 1.16 (pip install -U 'trl>=1.16')"
    )


def test_trl_1_15_with_triton_and_other_versions_are_not_refused(monkeypatch):
    from trl.trainer import utils

    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", object(), raising=False)
    monkeypatch.setattr(_compat, "TRL_VERSION", _compat.Version("1.15.0"))
    assert _compat.trl_cannot_train() is None
    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", None)
    for other in ("1.8.0", "1.14.2", "1.16.0"):
        monkeypatch.setattr(_compat, "TRL_VERSION", _compat.Version(other))
        assert _compat.trl_cannot_train() is None


def test_sft_trainer_refuses_before_building_anything(trl_1_15_without_triton):
    from trl_padfree import SFTTrainer

    with pytest.raises(ValueError, match=r"^trl 1\.15\.0's SFTTrainer cannot train without Triton .*>= 1\.16"):
        SFTTrainer(None)
