"""Test-suite settings: the ``slow`` marker, and the fixtures test modules share.

Tests marked ``slow`` (several multi-process launches each, minutes on a 2-core machine: ``tests/test_multinode.py``)
run only with ``TRL_PADFREE_SLOW=1``; ``make test`` stays within about ten minutes without them, and ``.ci/run``
runs them after ``make test``.

Shared fixtures: ``tok`` (the tiny byte-level tokenizer, ``trl_padfree.testing``) and ``demo_tokenizer`` (the
shipped demo model's tokenizer), one per test module; ``in_root`` (the test runs in the repository root, where the
demo configs' relative paths start); ``flash_attention_2_on_cpu`` (transformers' flash_attention_2 path with a
recording reference kernel, ``tests/flash_attention_cpu.py``). Paths of the checkout (``ROOT``, ``DEMO``, ...) are
constants in ``tests/paths.py``; the tiny Llama's config and model are ``trl_padfree.testing.tiny_llama_config`` /
``tiny_llama``.

Helper modules, each named by what it holds: ``tiny_models.py`` (other families' tiny configs and checkpoints),
``tiny_sft.py`` / ``tiny_dpo.py`` / ``tiny_kto.py`` / ``tiny_reward.py`` / ``tiny_rl.py`` (each trainer's tiny
set-up), ``layout_runs.py`` (training in the padded, padding-free and prompt-once layouts and comparing the runs),
``two_ranks.py`` (the ``ddp_*.py`` scripts under torchrun), ``launch_runs.py`` (running the launch and the preview
from a test), ``launch_inputs.py`` (the command lines and small data several launch test modules run on),
``launch_hooks.py`` (faults a launch run can be given), ``real_cases.py`` (the real-tokenizer cases). A test module
imports its helpers from these, never from another ``test_*.py``.
"""

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
