"""The ``slow`` marker (run with ``TRL_PADFREE_SLOW=1``, as ``.ci/run`` does) and the shared fixtures; paths are in
``tests/paths.py``, helpers in modules named by what they hold (``tiny_*.py``, ...), never in a ``test_*.py``."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: several multi-process launches; run with TRL_PADFREE_SLOW=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TRL_PADFREE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow (multi-process launches): run with TRL_PADFREE_SLOW=1, as .ci/run does")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def tok():
    """The tiny byte-level BPE tokenizer (``trl_padfree.testing.tiny_byte_level_tokenizer``)."""
    from trl_padfree.testing import tiny_byte_level_tokenizer

    return tiny_byte_level_tokenizer()


@pytest.fixture(scope="module")
def demo_tokenizer():
    """The shipped demo model's tokenizer (``trl_padfree/demo/model``)."""
    from paths import DEMO_MODEL
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO_MODEL)


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test in the repository root: the demo configs name their files relative to it."""
    from paths import ROOT

    monkeypatch.chdir(ROOT)


@pytest.fixture
def flash_attention_2_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list:
    """transformers' real flash_attention_2 dispatch with flash-attn's varlen kernel replaced by a plain-PyTorch
    reference (``tests/flash_attention_cpu.py``); the list of the kernel's calls."""
    from flash_attention_cpu import use_reference_varlen

    return use_reference_varlen(monkeypatch)
